//! What a body that is not the API's JSON is, in a few words, for the error that says so: an
//! HTML page by its title (a captive portal, a proxy's login or error page, a WAF's block page,
//! the site at a wrong base_url), other text by its first words, cut. Read from the body's first
//! 64 KiB only; the key is scrubbed from the error's message as from any other.

/// The most characters of a body quoted.
const QUOTED_CHARS: usize = 120;

/// UTF-8's byte order mark, which some proxies and Windows-hosted gateways put before a body.
pub(crate) const BOM: &[u8] = b"\xef\xbb\xbf";

/// `bytes` from their first byte of content: after a byte order mark and blanks.
pub(crate) fn content_start(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
    bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .and_then(|i| bytes.get(i..))
        .unwrap_or_default()
}

/// What a body is, when it is not JSON.
pub(crate) enum Gist {
    /// An HTML page: its title, if it has one, and its first words.
    Html {
        /// The page's `<title>`, folded and cut.
        title: Option<String>,
        /// The page's first words (its markup among them), folded and cut.
        start: String,
    },
    /// Other text: its first words.
    Text(String),
}

/// The gist of `body`; `None` when it is empty or opens as JSON does.
pub(crate) fn gist(body: &[u8]) -> Option<Gist> {
    let start = content_start(body);
    if matches!(start.first(), None | Some(b'{' | b'[')) {
        return None;
    }
    let head = String::from_utf8_lossy(start.get(..64 * 1024).unwrap_or(start));
    let lower = head.to_ascii_lowercase();
    let html = ["<!doctype html", "<html", "<head", "<title", "<body"]
        .iter()
        .any(|tag| lower.contains(tag));
    Some(if html {
        Gist::Html {
            title: html_title(&head, &lower).filter(|t| !t.is_empty()),
            start: quoted(&head),
        }
    } else {
        Gist::Text(quoted(&head))
    })
}

/// The text of a page's `<title>`, blanks folded and cut; `lower` is `page` lowercased.
fn html_title(page: &str, lower: &str) -> Option<String> {
    let open = lower.find("<title")?;
    let text_at = open + lower.get(open..)?.find('>')? + 1;
    let text_len = lower.get(text_at..)?.find("</title")?;
    Some(quoted(page.get(text_at..text_at + text_len)?))
}

/// `text` with its blanks and control characters folded to single spaces, cut to
/// [`QUOTED_CHARS`] characters (an ellipsis says it was cut).
fn quoted(text: &str) -> String {
    let words = text.split(|c: char| c.is_whitespace() || c.is_control());
    let mut out = String::new();
    for word in words.filter(|w| !w.is_empty()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
        if out.chars().count() > QUOTED_CHARS {
            let cut: String = out.chars().take(QUOTED_CHARS).collect();
            return cut + "…";
        }
    }
    out
}
