//! The `web_fetch` tool: fetches an http(s) URL and hands the model readable text (HTML turned
//! into text by `html2text`), within a size cap and a time cap.
//!
//! A model chooses the URL, so the tool refuses to be a door into the networks around it: every
//! address a host resolves to is checked before anything connects ([`is_refused_ip`]: loopback,
//! private, link-local, unique-local, CGNAT, multicast, unspecified and reserved ranges, the
//! other special-purpose blocks that are not globally reachable (Teredo, local-use NAT64,
//! benchmarking, documentation, SRv6, ...), and the IPv6 forms that embed an IPv4 address), and
//! the connection goes to the checked addresses only (the request's client is pinned to them,
//! so a second DNS answer cannot rebind the name).
//! Redirects are followed by the tool itself, each hop checked the same way, at most
//! [`MAX_REDIRECTS`]. Proxies from the environment are not used: they would connect for us.
//! An explicit allow list ([`WebFetchTool::allow`]) opens hosts or networks, for tests and
//! intranets.
//!
//! A page is turned into text off the async runtime, within the fetch's time (`web/text.rs`): a
//! hostile page cannot hold a runtime worker, nor outlast the timeout or a cancellation.

mod text;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{Tool, ToolContext, ToolError, ToolOutput};
use ipnet::IpNet;
use reqwest::Url;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

/// The most redirects one fetch follows.
pub const MAX_REDIRECTS: usize = 5;
/// The default cap on the bytes of a body read (1 MiB).
pub const DEFAULT_FETCH_MAX_BYTES: usize = 1024 * 1024;
/// The default cap on the text handed to the model (64 KiB).
pub const DEFAULT_FETCH_MAX_TEXT: usize = 64 * 1024;
/// The default time one fetch may take, redirects included (30 s).
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
pub use text::MAX_HTML_DEPTH;

/// Why a web fetch tool could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WebFetchError {
    /// An allow list entry is neither an address, a network nor a host name.
    #[error(
        "allow_private entry {entry:?} is not an IP address, a network (10.0.0.0/8) or a host name"
    )]
    InvalidAllow {
        /// The entry.
        entry: String,
    },
}

impl WebFetchError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            WebFetchError::InvalidAllow { .. } => "web_fetch.invalid_allow",
        }
    }
}

/// True for an address `web_fetch` refuses unless allowed: anything not plainly public.
pub fn is_refused_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_refused_v4(v4),
        IpAddr::V6(v6) => is_refused_v6(v6),
    }
}

/// The IPv4 side of [`is_refused_ip`]: every block of the IANA IPv4 Special-Purpose Address
/// Registry that is not globally reachable, multicast, and the deprecated 6to4 relay anycast.
fn is_refused_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // CGNAT, 100.64.0.0/10
        // IETF protocol assignments, 192.0.0.0/24, whole: the registry calls its PCP and TURN
        // anycast addresses (.9, .10) global, but an anycast address reaches the nearest server,
        // which is commonly the local network's own router.
        || (a == 192 && b == 0 && c == 0)
        // 6to4 relay anycast, 192.88.99.0/24: deprecated (RFC 7526), and anycast as above.
        || (a == 192 && b == 88 && c == 99)
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240 // reserved
}

/// Global unicast, 2000::/3: the rest of the IPv6 space is reserved by the IETF or has a use of
/// its own (unique local, link-local, multicast, ...), none of it routed on the internet.
const GLOBAL_UNICAST: (u16, u16, u16, u8) = (0x2000, 0, 0, 3);

/// The IPv6 prefixes refused whole (outside [`GLOBAL_UNICAST`] too, to name them): the blocks
/// of the IANA IPv6 Special-Purpose Address Registry that are not globally reachable. The IETF
/// protocol assignments (2001::/23) are refused apart from [`GLOBAL_IN_IETF_BLOCK`].
const REFUSED_V6: [(u16, u16, u16, u8); 10] = [
    // Local-use IPv4/IPv6 translation (RFC 8215): a network's own NAT64, to its own IPv4.
    (0x0064, 0xff9b, 0x0001, 48),
    // Discard-only (RFC 6666); 100:0:0:1::/64, the dummy prefix (RFC 9780), is beside it.
    (0x0100, 0, 0, 63),
    // IETF protocol assignments (RFC 2928): Teredo (2001::/32, whose server and client IPv4
    // addresses are inside: refused whole), benchmarking (2001:2::/48), ORCHID (2001:10::/28),
    // and the anycast PCP, TURN and DNS-SD addresses (2001:1::1, 2, 3: the nearest server is
    // commonly the local network's router).
    (0x2001, 0, 0, 23),
    (0x2001, 0x0db8, 0, 32), // documentation (RFC 3849)
    (0x3fff, 0, 0, 20),      // documentation (RFC 9637)
    (0x5f00, 0, 0, 16),      // segment routing (SRv6) SIDs (RFC 9602)
    (0xfc00, 0, 0, 7),       // unique local
    (0xfe80, 0, 0, 10),      // link-local
    (0xfec0, 0, 0, 10),      // site-local (deprecated)
    (0xff00, 0, 0, 8),       // multicast
];

/// The blocks inside 2001::/23 that the registry marks globally reachable, and that are not
/// anycast to a nearby server: AMT (2001:3::/32, RFC 7450), AS112-v6 (2001:4:112::/48, RFC
/// 7535), ORCHIDv2 (2001:20::/28, RFC 7343) and drone remote ID tags (2001:30::/28, RFC 9374).
const GLOBAL_IN_IETF_BLOCK: [(u16, u16, u16, u8); 4] = [
    (0x2001, 0x0003, 0, 32),
    (0x2001, 0x0004, 0x0112, 48),
    (0x2001, 0x0020, 0, 28),
    (0x2001, 0x0030, 0, 28),
];

/// True when `ip` is inside the prefix `(first three segments, length)`.
fn in_prefix(ip: Ipv6Addr, (a, b, c, len): (u16, u16, u16, u8)) -> bool {
    let net = Ipv6Addr::new(a, b, c, 0, 0, 0, 0, 0);
    ipnet::Ipv6Net::new(net, len).is_ok_and(|n| n.contains(&ip))
}

/// The IPv6 side of [`is_refused_ip`]. An address that carries an IPv4 one (see
/// [`embedded_v4`]) is judged by that address; the rest of the space outside global unicast is
/// refused, the unspecified and loopback addresses with it.
fn is_refused_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_refused_v4(v4);
    }
    if GLOBAL_IN_IETF_BLOCK.iter().any(|p| in_prefix(ip, *p)) {
        return false;
    }
    !in_prefix(ip, GLOBAL_UNICAST) || REFUSED_V6.iter().any(|p| in_prefix(ip, *p))
}

/// The IPv4 address an IPv6 address carries: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:aabb:ccdd::`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(tail(hi, lo)),
        // `::` and `::1` stay IPv6 (unspecified, loopback), refused as such.
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 => Some(tail(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(tail(hi, lo)),
        [0x2002, hi, lo, ..] => Some(tail(hi, lo)),
        _ => None,
    }
}

/// The hosts and networks a fetch may reach although they are not public.
#[derive(Debug, Clone, Default)]
struct AllowList {
    nets: Vec<IpNet>,
    hosts: Vec<String>,
}

impl AllowList {
    fn add(&mut self, entry: &str) -> Result<(), WebFetchError> {
        let e = entry.trim();
        let bare = e.trim_start_matches('[').trim_end_matches(']');
        if let Ok(net) = bare.parse::<IpNet>() {
            self.nets.push(net);
        } else if let Ok(ip) = bare.parse::<IpAddr>() {
            self.nets.push(IpNet::from(ip));
        } else if !e.is_empty()
            && e.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            self.hosts.push(e.to_ascii_lowercase());
        } else {
            return Err(WebFetchError::InvalidAllow {
                entry: entry.to_owned(),
            });
        }
        Ok(())
    }

    fn allows_host(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

/// The `web_fetch` tool's definition. Build it, then turn it into a [`Tool`] with
/// [`WebFetchTool::into_tool`].
#[must_use]
#[derive(Debug, Clone)]
pub struct WebFetchTool {
    allow: AllowList,
    max_bytes: usize,
    max_text: usize,
    timeout: Duration,
}

impl Default for WebFetchTool {
    fn default() -> Self {
        WebFetchTool::new()
    }
}

impl WebFetchTool {
    /// A fetch tool with the defaults: public addresses only.
    pub fn new() -> Self {
        WebFetchTool {
            allow: AllowList::default(),
            max_bytes: DEFAULT_FETCH_MAX_BYTES,
            max_text: DEFAULT_FETCH_MAX_TEXT,
            timeout: DEFAULT_FETCH_TIMEOUT,
        }
    }

    /// Lets fetches reach a host (`intranet.example`, every address it resolves to), an address
    /// (`127.0.0.1`, `::1`) or a network (`10.1.0.0/16`) that is not public.
    pub fn allow(mut self, entry: &str) -> Result<Self, WebFetchError> {
        self.allow.add(entry)?;
        Ok(self)
    }

    /// The most body bytes read; the rest is not downloaded.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The most bytes of text the model reads.
    pub fn max_text(mut self, bytes: usize) -> Self {
        self.max_text = bytes;
        self
    }

    /// The time one fetch may take, DNS, redirects and body included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The tool, named `name`.
    pub fn into_tool(self, name: impl Into<String>) -> Tool {
        let description = format!(
            "Fetches a web page or text document over http(s) and answers its text (HTML is \
             turned into plain text with links kept as footnotes). Private and local addresses \
             are refused; at most {} bytes are read and {} s spent. Example: {{\"url\": \
             \"https://www.rust-lang.org/\"}}",
            self.max_bytes,
            self.timeout.as_secs_f64()
        );
        let fetcher = Arc::new(self);
        Tool::builder(name)
            .description(description)
            .idempotent(true)
            .handler(move |args: WebFetchArgs, ctx: ToolContext| {
                let fetcher = fetcher.clone();
                async move {
                    tokio::select! {
                        () = ctx.cancel.cancelled() => Err(ToolError::new("cancelled", "the fetch was cancelled")),
                        r = tokio::time::timeout(fetcher.timeout, fetcher.fetch(&args.url)) => r.unwrap_or_else(|_| {
                            Err(ToolError::new("timeout", format!("the fetch did not finish within {} s", fetcher.timeout.as_secs_f64())))
                        }),
                    }
                }
            })
    }
}

// `web_fetch`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebFetchArgs {
    /// The http:// or https:// URL to fetch.
    url: String,
}

fn refused(message: String) -> ToolError {
    ToolError::new("address_refused", message).permanent()
}

impl WebFetchTool {
    /// The addresses `url` may be fetched from, every one checked: its IP, or what its host
    /// resolves to, minus the refused ones (a host with none left is refused).
    async fn checked_addrs(&self, url: &Url) -> Result<Vec<SocketAddr>, ToolError> {
        let port = url
            .port_or_known_default()
            .ok_or_else(|| ToolError::new("invalid_url", "the URL has no port").permanent())?;
        let host = url.host().ok_or_else(|| {
            ToolError::new("invalid_url", format!("{url} has no host")).permanent()
        })?;
        let (name, addrs): (String, Vec<SocketAddr>) = match host {
            url::Host::Ipv4(ip) => (ip.to_string(), vec![SocketAddr::new(ip.into(), port)]),
            url::Host::Ipv6(ip) => (ip.to_string(), vec![SocketAddr::new(ip.into(), port)]),
            url::Host::Domain(d) => {
                let found = tokio::net::lookup_host((d, port)).await.map_err(|e| {
                    ToolError::new("dns_failed", format!("cannot resolve {d}: {e}"))
                })?;
                (d.to_owned(), found.collect())
            }
        };
        if self.allow.allows_host(&name) {
            return Ok(addrs);
        }
        let (ok, bad): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs
            .into_iter()
            .partition(|a| !is_refused_ip(a.ip()) || self.allow.allows_ip(a.ip()));
        if ok.is_empty() {
            let which = bad
                .first()
                .map_or_else(|| "no address".to_owned(), |a| a.ip().to_string());
            return Err(refused(format!(
                "{name} is refused: it resolves to {which}, a private, local or reserved \
                 address that web_fetch does not reach"
            )));
        }
        Ok(ok)
    }

    /// One GET of `url` from `addrs` only, no redirect followed, no proxy.
    async fn get(&self, url: &Url, addrs: &[SocketAddr]) -> Result<reqwest::Response, ToolError> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("agentloop-web-fetch/", env!("CARGO_PKG_VERSION")));
        if let Some(url::Host::Domain(d)) = url.host() {
            builder = builder.resolve_to_addrs(d, addrs);
        }
        let client = builder.build().map_err(|e| {
            ToolError::new("fetch_failed", format!("cannot build the HTTP client: {e}"))
        })?;
        client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| ToolError::new("fetch_failed", format!("{url}: {}", e.without_url())))
    }

    async fn fetch(&self, raw: &str) -> Result<ToolOutput, ToolError> {
        // The handler's timeout ends this future; the thread that makes the page's text is
        // told the same deadline, as it outlives the future only until its next read.
        let deadline = Instant::now() + self.timeout;
        let mut url = Url::parse(raw).map_err(|e| {
            ToolError::new("invalid_url", format!("{raw:?} is not a URL: {e}")).permanent()
        })?;
        let mut hops: Vec<String> = Vec::new();
        let response = loop {
            if !matches!(url.scheme(), "http" | "https") {
                return Err(ToolError::new(
                    "invalid_url",
                    format!("{url}: only http:// and https:// URLs are fetched"),
                )
                .permanent());
            }
            let addrs = self.checked_addrs(&url).await?;
            let response = self.get(&url, &addrs).await?;
            if !response.status().is_redirection() {
                break response;
            }
            let Some(location) = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
            else {
                break response;
            };
            if hops.len() == MAX_REDIRECTS {
                return Err(ToolError::new(
                    "too_many_redirects",
                    format!("more than {MAX_REDIRECTS} redirects, starting at {raw}"),
                ));
            }
            let next = url.join(location).map_err(|e| {
                ToolError::new("invalid_url", format!("a redirect to {location:?}: {e}"))
            })?;
            hops.push(url.to_string());
            url = next;
        };
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let (body, cut) = self.read_body(response).await?;
        let bytes = body.len();
        let page = text::page_text(&content_type, body, deadline)
            .await?
            .ok_or_else(|| {
                ToolError::new(
                    "not_text",
                    format!("{url} answered {content_type:?}, which is not text"),
                )
                .permanent()
            })?;
        let mut text = page.text.trim().to_owned();
        let mut notes: Vec<String> = page.note.into_iter().collect();
        if cut {
            notes.push(format!("[the body was cut at {} bytes]", self.max_bytes));
        }
        if text.len() > self.max_text {
            let mut end = self.max_text;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            notes.push(format!("[the text was cut at {} bytes]", self.max_text));
        }
        let header = format!(
            "URL: {url}\nstatus: {}\ncontent-type: {content_type}\n\n",
            status.as_u16()
        );
        let full = format!(
            "{header}{text}{}{}",
            if notes.is_empty() { "" } else { "\n" },
            notes.join("\n")
        );
        if !status.is_success() {
            return Err(ToolError::new("http_status", full));
        }
        Ok(ToolOutput::text(full).with_details(json!({
            "url": url.as_str(),
            "status": status.as_u16(),
            "redirects": hops,
            "bytes": bytes,
            "cut": cut,
        })))
    }

    /// The body, at most `max_bytes` of it; true when there was more.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
    ) -> Result<(Vec<u8>, bool), ToolError> {
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            ToolError::new(
                "fetch_failed",
                format!("reading the body: {}", e.without_url()),
            )
        })? {
            let room = self.max_bytes - body.len();
            if chunk.len() >= room {
                body.extend_from_slice(chunk.get(..room).unwrap_or_default());
                // Stop reading: dropping the response closes the connection.
                let more = chunk.len() > room || response.chunk().await.ok().flatten().is_some();
                return Ok((body, more));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, false))
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )]
    use super::*;
    use crate::testing::{call, code};
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    #[test]
    fn non_public_addresses_are_refused_in_all_their_forms() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:a00:1::",
        ] {
            assert!(is_refused_ip(ip.parse().unwrap()), "{ip} is not refused");
        }
        for ip in [
            "93.184.215.14",
            "1.1.1.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert!(!is_refused_ip(ip.parse().unwrap()), "{ip} is refused");
        }
    }

    #[test]
    fn special_purpose_blocks_that_are_not_globally_reachable_are_refused() {
        for ip in [
            // IPv4: IETF protocol assignments (DS-Lite, PCP anycast), deprecated 6to4 relay
            // anycast, benchmarking, the three documentation nets, reserved, "this network".
            "192.0.0.1",
            "192.0.0.9",
            "192.0.0.170",
            "192.88.99.1",
            "198.18.0.1",
            "198.19.255.254",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "250.1.2.3",
            "0.1.2.3",
            // Teredo: the server's IPv4 address follows the prefix, the client's comes
            // obfuscated at the end (a server of 127.0.0.1, then RFC 4380's public example):
            // the prefix is refused whole, whatever they are.
            "2001:0:7f00:1::",
            "2001:0:4136:e378:8000:63bf:f5ff:fffe",
            "2001::1",
            // Local-use NAT64 (RFC 8215), whatever IPv4 address it carries.
            "64:ff9b:1::101:101",
            "64:ff9b:1:ffff::a00:1",
            // Discard-only and the dummy prefix.
            "100::1",
            "100::1:0:0:1",
            // PCP, TURN and DNS-SD anycast; benchmarking; ORCHID (deprecated).
            "2001:1::1",
            "2001:1::3",
            "2001:2::1",
            "2001:2:0:ffff::1",
            "2001:10::1",
            "2001:1f:ffff::1",
            // The rest of the IETF protocol assignments, 2001::/23.
            "2001:1ff::1",
            // Documentation, old and new; SRv6 SIDs; what is not global unicast.
            "2001:db8::1",
            "3fff::1",
            "3fff:fff::1",
            "5f00::1",
            "4000::1",
            "8000::1",
            "1::1",
            "::ffff:0:a00:1",
        ] {
            assert!(is_refused_ip(ip.parse().unwrap()), "{ip} is not refused");
        }
        // What the registry marks globally reachable, beside plain global unicast: the NAT64
        // well-known prefix to a public IPv4 address, AMT, AS112-v6, ORCHIDv2, drone tags, and
        // the IPv4 AS112 and AMT nets; and the addresses just past the refused blocks.
        for ip in [
            "64:ff9b::101:101",
            "2001:3::1",
            "2001:4:112::1",
            "2001:20::1",
            "2001:2f:ffff::1",
            "2001:30::1",
            "2001:200::1",
            "2001:db9::1",
            "3fff:1000::1",
            "2a00:1450:4001::200e",
            "192.31.196.1",
            "192.52.193.1",
            "192.175.48.1",
            "192.0.1.1",
            "198.20.0.1",
            "100.128.0.1",
        ] {
            assert!(!is_refused_ip(ip.parse().unwrap()), "{ip} is refused");
        }
    }

    async fn fetch(
        tool: &Tool,
        url: &str,
    ) -> Result<(String, Option<serde_json::Value>), ToolError> {
        call(tool, json!({"url": url})).await
    }

    #[tokio::test]
    async fn local_and_private_urls_are_refused_before_any_connection() {
        // Nothing listens on these; a refusal that came after a connect would read differently.
        let tool = WebFetchTool::new().into_tool("web_fetch");
        for url in [
            "http://127.0.0.1:9/",
            "http://[::1]:9/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
            "http://[::ffff:127.0.0.1]:9/",
            "http://localhost:9/",
            // Teredo (its server 127.0.0.1), local-use NAT64 (to 127.0.0.1), discard-only,
            // SRv6 and the new documentation prefix: refused before a connection is tried.
            "http://[2001:0:7f00:1::]:9/",
            "http://[64:ff9b:1::7f00:1]:9/",
            "http://[100::1]:9/",
            "http://[5f00::1]:9/",
            "http://[3fff::1]:9/",
            "http://192.88.99.1:9/",
        ] {
            let e = fetch(&tool, url).await.unwrap_err();
            assert_eq!(code(&e), "address_refused", "{url}: {e}");
        }
        for url in ["file:///etc/passwd", "ftp://example.com/", "not a url"] {
            let e = fetch(&tool, url).await.unwrap_err();
            assert_eq!(code(&e), "invalid_url", "{url}: {e}");
        }
    }

    #[test]
    fn allow_list_entries_are_addresses_networks_or_hosts() {
        assert!(WebFetchTool::new().allow("127.0.0.1").is_ok());
        assert!(WebFetchTool::new().allow("[::1]").is_ok());
        assert!(WebFetchTool::new().allow("10.1.0.0/16").is_ok());
        assert!(WebFetchTool::new().allow("intranet.local").is_ok());
        let e = WebFetchTool::new().allow("http://x/").unwrap_err();
        assert_eq!(e.code(), "web_fetch.invalid_allow");
    }

    /// A loopback server the tool is allowed to reach, and the tool.
    async fn allowed_server() -> (MockServer, Tool) {
        let server = MockServer::start().await;
        let tool = WebFetchTool::new()
            .allow("127.0.0.1")
            .unwrap()
            .max_bytes(4096)
            .into_tool("web_fetch");
        (server, tool)
    }

    #[tokio::test]
    async fn html_is_turned_into_text_and_the_body_is_capped() {
        let (server, tool) = allowed_server().await;
        Mock::given(method("GET"))
            .and(path("/page"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(
                "<html><head><title>T</title><script>var x = 1;</script></head><body><h1>Hello</h1><p>A <a href=\"/x\">link</a> here.</p></body></html>",
                "text/html; charset=utf-8",
            ))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/big"))
            .respond_with(
                ResponseTemplate::new(200).set_body_raw("y".repeat(100_000), "text/plain"),
            )
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/image"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(vec![0u8, 1, 2], "image/png"))
            .mount(&server)
            .await;
        let (text, _) = fetch(&tool, &format!("{}/page", server.uri()))
            .await
            .unwrap();
        assert!(text.contains("Hello"), "{text}");
        assert!(text.contains("link"), "{text}");
        assert!(!text.contains("<p>"), "{text}");
        assert!(!text.contains("var x"), "{text}");
        let (text, details) = fetch(&tool, &format!("{}/big", server.uri()))
            .await
            .unwrap();
        assert!(text.ends_with("[the body was cut at 4096 bytes]"), "{text}");
        assert_eq!(details.unwrap()["bytes"], 4096);
        let e = fetch(&tool, &format!("{}/image", server.uri()))
            .await
            .unwrap_err();
        assert_eq!(code(&e), "not_text");
    }

    #[tokio::test]
    async fn redirects_are_followed_and_each_hop_is_checked() {
        let (server, tool) = allowed_server().await;
        let uri = server.uri();
        Mock::given(method("GET"))
            .and(path("/a"))
            .respond_with(ResponseTemplate::new(302).insert_header("location", "/b"))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/b"))
            .respond_with(ResponseTemplate::new(200).set_body_raw("arrived", "text/plain"))
            .mount(&server)
            .await;
        for (route, target) in [
            ("/to-metadata", "http://169.254.169.254/latest/meta-data/"),
            ("/to-private", "http://10.0.0.1/"),
            ("/to-v6-loopback", "http://[::1]:9/"),
        ] {
            Mock::given(method("GET"))
                .and(path(route))
                .respond_with(ResponseTemplate::new(301).insert_header("location", target))
                .mount(&server)
                .await;
        }
        Mock::given(method("GET"))
            .and(path("/loop"))
            .respond_with(ResponseTemplate::new(302).insert_header("location", "/loop"))
            .mount(&server)
            .await;
        let (text, details) = fetch(&tool, &format!("{uri}/a")).await.unwrap();
        assert!(
            text.starts_with(&format!("URL: {uri}/b\nstatus: 200")),
            "{text}"
        );
        assert!(text.ends_with("arrived"), "{text}");
        assert_eq!(details.unwrap()["redirects"], json!([format!("{uri}/a")]));
        for route in ["/to-metadata", "/to-private", "/to-v6-loopback"] {
            let e = fetch(&tool, &format!("{uri}{route}")).await.unwrap_err();
            assert_eq!(code(&e), "address_refused", "{route}: {e}");
        }
        let e = fetch(&tool, &format!("{uri}/loop")).await.unwrap_err();
        assert_eq!(code(&e), "too_many_redirects");
        // The loop was cut after the allowed hops: one first request and five redirects.
        let loops = server
            .received_requests()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.url.path() == "/loop")
            .count();
        assert_eq!(loops, MAX_REDIRECTS + 1);
    }

    #[tokio::test]
    async fn a_host_allowed_by_name_is_fetched_from_the_addresses_it_resolved_to() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(200).set_body_raw("by name", "text/plain"))
            .mount(&server)
            .await;
        let port = server.address().port();
        let by_name = WebFetchTool::new()
            .allow("localhost")
            .unwrap()
            .into_tool("web_fetch");
        let (text, _) = fetch(&by_name, &format!("http://localhost:{port}/"))
            .await
            .unwrap();
        assert!(text.ends_with("by name"), "{text}");
        // Allowing the name opens that name only, not the addresses behind it.
        let e = fetch(&by_name, &format!("http://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert_eq!(code(&e), "address_refused");
    }

    #[tokio::test]
    async fn an_error_status_reaches_the_model_as_an_error_with_the_text() {
        let (server, tool) = allowed_server().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(404).set_body_raw("no such page", "text/plain"))
            .mount(&server)
            .await;
        let e = fetch(&tool, &format!("{}/missing", server.uri()))
            .await
            .unwrap_err();
        assert_eq!(code(&e), "http_status");
        assert!(e.to_string().contains("status: 404"), "{e}");
        assert!(e.to_string().contains("no such page"), "{e}");
    }

    /// One worker only: were a page's conversion run on it, nothing else would run meanwhile.
    #[tokio::test(flavor = "current_thread")]
    async fn a_deeply_nested_page_ends_with_text_and_the_runtime_goes_on_meanwhile() {
        let server = MockServer::start().await;
        let nested = format!("<html><body><h1>Deep</h1>{}bottom", "<div>".repeat(200_000));
        assert!(nested.len() > 1_000_000);
        Mock::given(method("GET"))
            .and(path("/nested"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(nested, "text/html"))
            .mount(&server)
            .await;
        let tool = WebFetchTool::new()
            .allow("127.0.0.1")
            .unwrap()
            .max_bytes(2 * 1024 * 1024)
            .timeout(Duration::from_secs(120))
            .into_tool("web_fetch");
        let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        let url = format!("{}/nested", server.uri());
        let started = Instant::now();
        // Two at once, as a model's batch would: each on a thread of its own.
        let (a, b) = tokio::join!(fetch(&tool, &url), fetch(&tool, &url));
        let took = started.elapsed();
        ticker.abort();
        assert!(took < Duration::from_secs(20), "took {took:?}");
        for result in [a, b] {
            let (text, details) = result.unwrap();
            assert!(text.contains("Deep\nbottom"), "{text}");
            assert!(
                text.contains("[the page nests its elements deeper than 512"),
                "{text}"
            );
            assert_eq!(details.unwrap()["cut"], false);
        }
        // The runtime's one worker ran the ticker all along, conversions included.
        let ticks = ticks.load(std::sync::atomic::Ordering::Relaxed);
        let ticked = Duration::from_millis(5) * u32::try_from(ticks).unwrap();
        assert!(ticked * 10 >= took, "{ticks} ticks in {took:?}");
    }
}
