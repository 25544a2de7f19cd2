//! The HTTP plumbing every provider shares: client settings ([`HttpConfig`]) and a JSON POST that
//! enforces the request byte budget and classifies failures into [`ModelError`]s (the
//! classification itself is in [`crate::error`], the event-stream reader in [`crate::sse`]).
//!
//! Secrets stay here: the API key lives in a redacting wrapper, its header is marked sensitive, and
//! no error built in this module carries a header or the raw response body, only the provider's
//! own error type, code, message and parameter, the status and the request id.

use std::fmt;
use std::time::Duration;

use agentloop::{
    ModelError,
    model::{CacheIdentity, ModelErrorKind},
};
use bytes::Bytes;
use futures::future::Either;
use futures::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::content_coding::{self, Coding};
use crate::error::{classify_http_error_of, transport_error};

/// The environment variable OpenAI's key is read from by default (Chat Completions and Responses).
pub const OPENAI_API_KEY_ENV: &str = "OPENAI_API_KEY";
/// The environment variable Anthropic's key is read from by default.
pub const ANTHROPIC_API_KEY_ENV: &str = "ANTHROPIC_API_KEY";

/// The default longest silence from a server: 5 minutes.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long keep-alives alone may hold a call by default ([`HttpConfig::keepalive_timeout`]).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How a provider sends its API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthStyle {
    /// `Authorization: Bearer <key>` (OpenAI and the servers that speak its API).
    Bearer,
    /// The key as the value of this header (`x-api-key` for Anthropic).
    Header(String),
}

/// An API key. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for building the auth header.
    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where the API key comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeySource {
    /// No key (local servers such as Ollama or llama.cpp).
    #[default]
    None,
    /// This key.
    Value(ApiKey),
    /// The environment variable of this name, read at each request.
    Env(String),
}

/// Client settings shared by every provider.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The API's base URL, without a trailing slash (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Where the key comes from.
    pub key: KeySource,
    /// How the key is sent.
    pub auth: AuthStyle,
    /// Headers added to every request (organization, project, version headers...).
    pub extra_headers: Vec<(String, String)>,
    /// Time allowed to open the connection.
    pub connect_timeout: Duration,
    /// Time allowed for the whole request, body included (`None`: no limit, the default: a long
    /// answer streams for as long as it keeps talking, within the run's deadline).
    pub request_timeout: Option<Duration>,
    /// Longest silence allowed while waiting for the answer's head and between two chunks of its
    /// body. Reasoning models can think for minutes without a byte (DeepSeek, o-series behind
    /// gateways), so the default is generous.
    pub idle_timeout: Duration,
    /// Longest time keep-alives alone may hold a call: comment lines in a stream
    /// (`: OPENROUTER PROCESSING`, `: keepalive`, `data: : keepalive`) are no event, and spaces
    /// before a whole JSON body no content, so a server whose upstream stalled cannot hold the
    /// call for ever with them. Longer than the idle timeout: a gateway sends them while a model
    /// thinks for many minutes without a token (o-series behind OpenRouter), or while a request
    /// waits in its queue (DeepSeek, which gives up on a request after 30 minutes).
    pub keepalive_timeout: Duration,
    /// The largest encoded request body sent; a larger one fails before it is sent.
    pub max_request_bytes: usize,
    /// The largest error body read to classify a failed request.
    pub max_error_body_bytes: usize,
    /// The largest single server-sent event (a line longer than this fails the stream).
    pub max_event_bytes: usize,
    /// The largest whole (non-streamed) response body read; a larger one fails as it arrives,
    /// rather than being held in memory whole (a server that never ends its body).
    pub max_response_bytes: usize,
    /// The most bytes a streamed response's body may carry in all: a server that streams without
    /// end, each event within the idle timeout, fails once past it rather than growing the
    /// answer in memory for ever. Generous: an event stream repeats its envelope with every
    /// token, so a 128k-token answer is tens of MiB of events.
    pub max_stream_bytes: usize,
}

/// Defaults: 10 s to connect, no limit on the whole request, 5 min of silence, 8 MiB requests,
/// 16 MiB events, 32 MiB whole responses and 256 MiB streamed ones.
impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            base_url: String::new(),
            key: KeySource::None,
            auth: AuthStyle::Bearer,
            extra_headers: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            max_request_bytes: 8 * 1024 * 1024,
            max_error_body_bytes: 64 * 1024,
            max_event_bytes: 16 * 1024 * 1024,
            max_response_bytes: 32 * 1024 * 1024,
            max_stream_bytes: 256 * 1024 * 1024,
        }
    }
}

impl HttpConfig {
    /// Settings for this base URL, with the defaults above.
    pub fn new(base_url: impl Into<String>) -> Self {
        let base_url = base_url.into();
        // The slashes that end the path go (the API's paths start with one), before any query.
        let base_url = match base_url.split_once('?') {
            Some((path, query)) => format!("{}?{query}", path.trim_end_matches('/')),
            None => base_url.trim_end_matches('/').to_owned(),
        };
        HttpConfig {
            base_url,
            ..Default::default()
        }
    }
}

/// `base_url` with the API's `path` after its own path: before its query, which a gateway may
/// need on every request (`?key=...`, `?api-version=...`), rather than after it.
fn endpoint(base_url: &str, path: &str) -> String {
    match base_url.split_once('?') {
        Some((base, query)) => format!("{base}{path}?{query}"),
        None => format!("{base_url}{path}"),
    }
}

/// The HTTP setters every provider builder shares. The builder needs a `config: HttpConfig` field;
/// invoke `crate::http::http_builder_methods!();` inside its `impl` block.
macro_rules! http_builder_methods {
    () => {
        /// Sets the base URL (`http://localhost:11434/v1`); a trailing `/` is dropped.
        pub fn base_url(mut self, url: impl Into<String>) -> Self {
            self.config.base_url = $crate::http::HttpConfig::new(url).base_url;
            self
        }

        /// Uses this API key.
        pub fn api_key(mut self, key: impl Into<String>) -> Self {
            self.config.key = $crate::http::KeySource::Value($crate::http::ApiKey::new(key));
            self
        }

        /// Reads the API key from this environment variable at each request.
        pub fn api_key_env(mut self, var: impl Into<String>) -> Self {
            self.config.key = $crate::http::KeySource::Env(var.into());
            self
        }

        /// Sends no API key (local servers).
        pub fn no_api_key(mut self) -> Self {
            self.config.key = $crate::http::KeySource::None;
            self
        }

        /// Adds a header to every request.
        pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
            self.config.extra_headers.push((name.into(), value.into()));
            self
        }

        /// Replaces the HTTP settings (base URL, key, headers, timeouts, byte budget) at once.
        pub fn http_config(mut self, config: $crate::http::HttpConfig) -> Self {
            self.config = config;
            self
        }

        /// Sets the connect timeout.
        pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.config.connect_timeout = timeout;
            self
        }

        /// Sets the whole-request timeout (`None`: none).
        pub fn request_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
            self.config.request_timeout = timeout;
            self
        }

        /// Sets the longest silence allowed inside a stream.
        pub fn idle_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.config.idle_timeout = timeout;
            self
        }

        /// Sets the longest time keep-alives alone may hold a call
        /// ([`HttpConfig::keepalive_timeout`]).
        pub fn keepalive_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.config.keepalive_timeout = timeout;
            self
        }

        /// Sets the request byte budget: a larger encoded request fails before it is sent.
        pub fn max_request_bytes(mut self, bytes: usize) -> Self {
            self.config.max_request_bytes = bytes;
            self
        }
    };
}
#[allow(unused_imports)]
pub(crate) use http_builder_methods;

/// The most redirects a request follows.
const MAX_REDIRECTS: usize = 5;

/// Redirects within the same origin (scheme, host and port) only: a request carries the
/// provider's key (`Authorization`, `x-api-key`, the file's custom `headers`), and reqwest strips
/// only `Authorization` and cookies when a redirect leaves the host. A redirect elsewhere is not
/// followed: its 3xx answer is the provider's error, and the key never reaches the other host.
pub fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !same {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
}

/// A built HTTP client for one provider: cheap to clone.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    config: HttpConfig,
    provider: String,
}

impl HttpClient {
    /// Builds the client. `provider` names the provider in errors (`openai`, `anthropic`).
    pub fn new(config: HttpConfig, provider: impl Into<String>) -> Result<Self, ModelError> {
        let provider = provider.into();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            // The same silence bounds the wait for the answer's head and a whole body; a stream's
            // own idle timer (which names the silence) fires first.
            .read_timeout(config.idle_timeout.saturating_add(Duration::from_secs(1)))
            .redirect(same_origin_redirects());
        if let Some(t) = config.request_timeout {
            builder = builder.timeout(t);
        }
        let client = builder.build().map_err(|e| {
            ModelError::new(
                ModelErrorKind::Other,
                format!("cannot build the HTTP client: {}", e.without_url()),
            )
            .with_provider(provider.clone())
        })?;
        Ok(HttpClient {
            client,
            config,
            provider,
        })
    }

    /// The settings.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// The same client (its connections shared) sending one more header; a header of that name
    /// already set gets the value appended after a comma, as list-valued headers
    /// (`anthropic-beta`) take several.
    pub fn with_header(&self, name: &str, value: &str) -> Self {
        let mut out = self.clone();
        match out
            .config
            .extra_headers
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            Some((_, v)) => {
                v.push(',');
                v.push_str(value);
            }
            None => out
                .config
                .extra_headers
                .push((name.to_owned(), value.to_owned())),
        }
        out
    }

    /// What a request to `path` with `body` is on the wire, for a response cache's key
    /// ([`agentloop::Model::cache_identity`]): the URL it goes to, the headers added to every
    /// request and the body, as a digest (a key in the URL or a header is never kept in clear).
    /// The API key is left out: two keys of one account's server get the same answers.
    pub fn cache_identity(&self, path: &str, body: &[u8]) -> CacheIdentity {
        CacheIdentity::of(&serde_json::json!({
            "url": endpoint(&self.config.base_url, path),
            "headers": self.config.extra_headers,
            "body": String::from_utf8_lossy(body),
        }))
    }

    /// The provider name used in errors.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Sets the provider name used in errors.
    pub fn set_provider(&mut self, provider: impl Into<String>) {
        self.provider = provider.into();
    }

    fn error(&self, kind: ModelErrorKind, message: impl Into<String>) -> ModelError {
        ModelError::new(kind, message).with_provider(self.provider.clone())
    }

    fn auth_header(&self) -> Result<Option<(HeaderName, HeaderValue)>, ModelError> {
        let key = match &self.config.key {
            KeySource::None => return Ok(None),
            KeySource::Value(k) => k.expose().to_owned(),
            KeySource::Env(var) => match std::env::var(var) {
                Ok(k) if !k.trim().is_empty() => k,
                _ => {
                    return Err(self.error(
                        ModelErrorKind::Authentication,
                        format!("no API key: the environment variable {var} is not set"),
                    ));
                }
            },
        };
        let (name, value) = match &self.config.auth {
            AuthStyle::Bearer => (
                reqwest::header::AUTHORIZATION,
                format!("Bearer {}", key.trim()),
            ),
            AuthStyle::Header(h) => {
                let name = HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                    self.error(
                        ModelErrorKind::Other,
                        format!("invalid auth header name {h:?}"),
                    )
                })?;
                (name, key.trim().to_owned())
            }
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            self.error(
                ModelErrorKind::Authentication,
                "the API key holds characters a header cannot carry",
            )
        })?;
        value.set_sensitive(true);
        Ok(Some((name, value)))
    }

    /// POSTs an encoded JSON body to `base_url + path`. The body must fit the byte budget (checked
    /// before anything is sent). A non-2xx answer becomes a classified error; a 2xx answer is
    /// returned for the caller to read.
    pub async fn post_json(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<reqwest::Response, ModelError> {
        self.post_json_of(path, body, false).await
    }

    /// [`HttpClient::post_json`] for a request that samples or not: the error of a sampled
    /// request's unparseable tool call is retryable (see [`crate::error::redraw_unparsed`]).
    pub(crate) async fn post_json_of(
        &self,
        path: &str,
        body: Vec<u8>,
        sampled: bool,
    ) -> Result<reqwest::Response, ModelError> {
        check_budget(&self.provider, body.len(), self.config.max_request_bytes)?;
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // Said outright: a request without the header takes any coding (RFC 9110), and a
        // compressed event stream can sit in a compressor's buffer rather than reach the caller
        // event by event. A body compressed anyway is still decoded (`body_chunks`).
        headers.insert(
            reqwest::header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        for (name, value) in &self.config.extra_headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                self.error(
                    ModelErrorKind::Other,
                    format!("invalid header name {name:?}"),
                )
            })?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                self.error(
                    ModelErrorKind::Other,
                    format!("invalid value for header {name}"),
                )
            })?;
            headers.insert(name, value);
        }
        if let Some((name, value)) = self.auth_header()? {
            headers.insert(name, value);
        }
        let url = endpoint(&self.config.base_url, path);
        let response = self
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| transport_error(&self.provider, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers().clone();
        let body = read_limited(
            self.body_chunks(response),
            self.config.max_error_body_bytes,
            self.config.idle_timeout,
        )
        .await;
        let mut error =
            classify_http_error_of(&self.provider, status.as_u16(), &headers, &body, sampled);
        self.scrub(&mut error);
        Err(error)
    }

    /// Removes the API key, the values of the custom headers that carry a credential (a
    /// gateway's `x-portkey-api-key`, a proxy's `Proxy-Authorization`), and the credentials the base URL carries (its user info, its query
    /// values: some gateways take the key as `?key=`), from an error's text fields, should a
    /// server echo them back (a 401 body that quotes the key, or the URL it was sent to, or an
    /// error event in a stream that quotes the request's headers).
    pub(crate) fn scrub(&self, error: &mut ModelError) {
        let key = match &self.config.key {
            KeySource::None => String::new(),
            KeySource::Value(k) => k.expose().trim().to_owned(),
            KeySource::Env(var) => std::env::var(var).unwrap_or_default().trim().to_owned(),
        };
        let mut secrets = agentloop::url_secrets::secrets(&self.config.base_url);
        if key.len() >= 4 {
            secrets.push(key);
        }
        secrets.extend(
            self.config
                .extra_headers
                .iter()
                .filter(|(name, _)| is_credential_header(name))
                .flat_map(|(_, value)| credential_parts(value)),
        );
        // Longest first, so that a secret holding another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        if secrets.is_empty() {
            return;
        }
        let clean = |s: &mut String| *s = agentloop::url_secrets::scrub(s, &secrets);
        clean(&mut error.message);
        for field in [
            &mut error.error_type,
            &mut error.provider_code,
            &mut error.param,
            &mut error.request_id,
        ] {
            if let Some(s) = field.as_mut() {
                clean(s);
            }
        }
    }

    /// Reads a whole (non-streamed) response body, within the response budget: the idle timeout
    /// bounds a silence, not a server that keeps sending, so without a budget a body that never
    /// ends would be held in memory until the process runs out of it.
    pub async fn read_body(&self, response: reqwest::Response) -> Result<Bytes, ModelError> {
        let declared = response.content_length();
        self.collect_body(self.body_chunks(response), declared)
            .await
    }

    /// The chunks of a response body as they arrive, a transport failure classified, and a body
    /// compressed though asked for none decoded (see [`crate::content_coding`]).
    pub(crate) fn body_chunks(
        &self,
        response: reqwest::Response,
    ) -> impl Stream<Item = Result<Bytes, ModelError>> + Send + Unpin + 'static {
        let coding = content_coding::coding_of(response.headers());
        let provider = self.provider.clone();
        let raw = response
            .bytes_stream()
            .map(move |r| r.map_err(|e| transport_error(&provider, &e)));
        if coding == Coding::Identity {
            return Either::Left(raw);
        }
        Either::Right(Box::pin(content_coding::decoded(
            raw,
            coding,
            self.provider.clone(),
        )))
    }

    /// Collects body chunks within the response budget and the idle timeout (whitespace, a
    /// keep-alive, does not end a silence); `declared` is the body's `content-length`, if it has
    /// one (a length over the budget fails before a byte is read).
    pub(crate) async fn collect_body<S>(
        &self,
        mut chunks: S,
        declared: Option<u64>,
    ) -> Result<Bytes, ModelError>
    where
        S: Stream<Item = Result<Bytes, ModelError>> + Unpin,
    {
        let max = self.config.max_response_bytes;
        let too_large = || {
            self.error(
                ModelErrorKind::Decode,
                format!("the response body is larger than the budget of {max} bytes"),
            )
        };
        if declared.is_some_and(|n| n > u64::try_from(max).unwrap_or(u64::MAX)) {
            return Err(too_large());
        }
        // Whitespace is no content: servers send spaces or blank lines before the document to
        // keep a slow answer's connection open (omlx's JSON keep-alive during a long prefill), and
        // a stalled one sends them for ever. They hold the call for the keep-alive timeout at
        // most, counted from the last other byte (a silence is the client's read timeout).
        let idle = self.config.keepalive_timeout;
        let mut content_at = tokio::time::Instant::now();
        let mut body = Vec::new();
        loop {
            let next = match content_at.checked_add(idle) {
                Some(deadline) => tokio::time::timeout_at(deadline, chunks.next())
                    .await
                    .map_err(|_| {
                        self.error(
                            ModelErrorKind::Timeout,
                            format!(
                                "nothing but whitespace came for {} s (keepalive_timeout)",
                                idle.as_secs_f64()
                            ),
                        )
                    })?,
                None => chunks.next().await,
            };
            let Some(chunk) = next else {
                break;
            };
            let chunk = chunk?;
            if chunk.len() > max.saturating_sub(body.len()) {
                return Err(too_large());
            }
            if !chunk.iter().all(u8::is_ascii_whitespace) {
                content_at = tokio::time::Instant::now();
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(body))
    }
}

/// Encodes a request body as JSON. A failure (a map key that is not a string, say) is reported
/// before anything is sent.
pub(crate) fn json_body<T: serde::Serialize>(
    provider: &str,
    body: &T,
) -> Result<Vec<u8>, ModelError> {
    serde_json::to_vec(body).map_err(|e| {
        ModelError::new(
            ModelErrorKind::Other,
            format!("cannot encode the request: {e}"),
        )
        .with_provider(provider)
    })
}

/// Fails with [`ModelErrorKind::RequestTooLarge`] when `len` exceeds `max`.
pub fn check_budget(provider: &str, len: usize, max: usize) -> Result<(), ModelError> {
    if len > max {
        return Err(ModelError::new(
            ModelErrorKind::RequestTooLarge,
            format!("the encoded request is {len} bytes, over the budget of {max} bytes; it was not sent"),
        )
        .with_provider(provider));
    }
    Ok(())
}

/// At most `max` bytes of an error body, read for at most `within`: the body only names the
/// error, so a server that drips it (each byte inside the idle timeout, never ending) must not
/// hold the call, and its retry, for ever. What arrived by then (or before the body broke off)
/// is classified.
async fn read_limited<S>(mut chunks: S, max: usize, within: Duration) -> Vec<u8>
where
    S: Stream<Item = Result<Bytes, ModelError>> + Unpin,
{
    let mut out = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = chunks.next().await {
            let room = max.saturating_sub(out.len());
            out.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
            if out.len() >= max {
                break;
            }
        }
    };
    // `timeout` (unlike an `Instant` plus the duration) takes any duration without overflow.
    let _ = tokio::time::timeout(within, read).await;
    out
}
/// True when a word of a custom header's name says that it carries a credential
/// (`Authorization`, `Proxy-Authorization`, `Cookie`, `x-api-key`, `x-portkey-api-key`,
/// `X-Auth-Token`, `Ocp-Apim-Subscription-Key`): its value is then taken out of errors as the
/// key is. Others (`anthropic-version`, `x-portkey-provider`) are not, so that an error that
/// names them stays whole.
fn is_credential_header(name: &str) -> bool {
    const WORDS: &[&str] = &[
        "authorization",
        "auth",
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "cookie",
        "credential",
        "credentials",
        "signature",
    ];
    name.to_ascii_lowercase()
        .split(['-', '_'])
        .any(|word| WORDS.contains(&word))
}

/// What of a credential header's value a server may echo: the whole value, and its last word
/// alone (the token of `Bearer TOKEN`), each of at least 4 characters.
fn credential_parts(value: &str) -> Vec<String> {
    let value = value.trim();
    let mut parts = vec![value.to_owned()];
    if let Some(last) = value.split_whitespace().last()
        && last != value
    {
        parts.push(last.to_owned());
    }
    parts.retain(|p| p.len() >= 4);
    parts
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_budget_rejects_only_larger_bodies() {
        assert!(check_budget("p", 10, 10).is_ok());
        assert_eq!(
            check_budget("p", 11, 10).unwrap_err().kind,
            ModelErrorKind::RequestTooLarge
        );
    }

    #[test]
    fn api_keys_are_redacted_in_debug() {
        let mut config = HttpConfig::new("http://x/");
        config.key = KeySource::Value(ApiKey::new("sk-very-secret"));
        assert_eq!(config.base_url, "http://x");
        assert!(!format!("{config:?}").contains("sk-very-secret"));
    }
}
