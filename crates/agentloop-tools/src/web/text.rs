//! A fetched body turned into the text the model reads, without holding the async runtime and
//! within the fetch's time. html5ever's tree builder does work in proportion to the depth of the
//! open elements for each tag it meets, and html2text lays a page out by recursion, so a page of
//! nested elements (`<div>` 200,000 times in a MiB) would cost minutes of CPU on a runtime
//! worker, where no timeout nor cancellation is ever polled, and might overflow its stack.
//!
//! So HTML is turned into text on a thread of its own (with a large stack), the parser is fed a
//! little at a time and stops once the fetch's deadline passes or its caller is gone, and a page
//! nested deeper than [`MAX_HTML_DEPTH`] (by a linear count before parsing, and by the parsed
//! tree) is given as its bare text, without layout.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use agentloop::ToolError;

/// The deepest nesting of elements laid out as text; a deeper page is given as its bare text.
/// Blink's HTML parser stops nesting at the same depth.
pub const MAX_HTML_DEPTH: usize = 512;

/// The stack of the thread that lays a page out: html2text recurses about once a level.
const LAYOUT_STACK_BYTES: usize = 32 * 1024 * 1024;

/// How many bytes the parser is given at a time; the deadline is looked at between two.
const PACE_BYTES: usize = 1024;

/// The width text is wrapped to.
const WIDTH: usize = 100;

/// What the model reads of a body.
pub(super) struct PageText {
    /// The text.
    pub(super) text: String,
    /// How it was made, when that is worth saying after it.
    pub(super) note: Option<String>,
}

/// Readable text of a body by its content type; `Ok(None)` for what is not text. HTML is turned
/// into text on a thread of its own, which stops at `deadline` or when this future is dropped
/// (the fetch was cancelled or timed out).
pub(super) async fn page_text(
    content_type: &str,
    body: Vec<u8>,
    deadline: Instant,
) -> Result<Option<PageText>, ToolError> {
    if !is_html(content_type, &body) {
        return Ok(plain_text(content_type, &body).map(|text| PageText { text, note: None }));
    }
    let stop = Stop {
        deadline,
        abandoned: Arc::new(AtomicBool::new(false)),
    };
    // Dropped with this future, whoever drops it: the thread then stops at its next read.
    let _abandon = Abandon(stop.abandoned.clone());
    let (done, answer) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("web_fetch-text".into())
        .stack_size(LAYOUT_STACK_BYTES)
        .spawn(move || {
            // Nobody to tell when the fetch is gone.
            let _ = done.send(html_text(&body, &stop));
        })
        .map_err(|e| {
            ToolError::new(
                "fetch_failed",
                format!("cannot start turning the page into text: {e}"),
            )
        })?;
    answer.await.unwrap_or_else(|_| {
        Err(ToolError::new(
            "fetch_failed",
            "turning the page into text failed",
        ))
    })
}

/// True for a body read as HTML: by its type, or, without one, by how it starts.
fn is_html(content_type: &str, body: &[u8]) -> bool {
    let mime = mime(content_type);
    if mime == "text/html" || mime == "application/xhtml+xml" {
        return true;
    }
    mime.is_empty() && {
        let start = String::from_utf8_lossy(body.get(..body.len().min(512)).unwrap_or_default())
            .to_ascii_lowercase();
        start.contains("<html") || start.contains("<!doctype html")
    }
}

fn mime(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// A body that is not HTML, as text; `None` for what is not text.
fn plain_text(content_type: &str, body: &[u8]) -> Option<String> {
    let mime = mime(content_type);
    let texty = mime.is_empty()
        || mime.starts_with("text/")
        || mime.ends_with("+json")
        || mime.ends_with("+xml")
        || matches!(
            mime,
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-yaml"
        );
    if !texty || body.contains(&0) {
        return None;
    }
    Some(String::from_utf8_lossy(body).into_owned())
}

/// When the conversion must stop: the fetch's deadline, or its caller gone.
#[derive(Clone)]
struct Stop {
    deadline: Instant,
    abandoned: Arc<AtomicBool>,
}

impl Stop {
    fn now(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }

    fn timed_out() -> ToolError {
        ToolError::new(
            "timeout",
            "the fetch did not finish within its time: the page was still being turned into text",
        )
    }
}

/// Marks the conversion abandoned when dropped.
struct Abandon(Arc<AtomicBool>);

impl Drop for Abandon {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The page, handed to the parser [`PACE_BYTES`] at a time, failing once [`Stop::now`]: the
/// parser reads between the chunks it parses, so it stops there.
struct Paced<'a> {
    rest: &'a [u8],
    stop: &'a Stop,
}

impl io::Read for Paced<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.stop.now() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "out of time"));
        }
        let n = buf.len().min(PACE_BYTES).min(self.rest.len());
        let (now, rest) = self.rest.split_at(n);
        for (to, from) in buf.iter_mut().zip(now) {
            *to = *from;
        }
        self.rest = rest;
        Ok(n)
    }
}

/// HTML laid out as text, or as bare text when it nests too deep; `Ok(None)` when html2text
/// cannot make text of it.
fn html_text(html: &[u8], stop: &Stop) -> Result<Option<PageText>, ToolError> {
    if nests_deeper_than(html, MAX_HTML_DEPTH) {
        return Ok(Some(bare(html)));
    }
    let config = html2text::config::plain();
    let dom = match config.parse_html(Paced { rest: html, stop }) {
        Ok(dom) => dom,
        Err(_) if stop.now() => return Err(Stop::timed_out()),
        Err(_) => return Ok(None),
    };
    // The count before parsing is an estimate; the tree is what is laid out.
    if tree_deeper_than(&dom.document, MAX_HTML_DEPTH) {
        return Ok(Some(bare(html)));
    }
    if stop.now() {
        return Err(Stop::timed_out());
    }
    let Ok(tree) = config.dom_to_render_tree(&dom) else {
        return Ok(None);
    };
    if stop.now() {
        return Err(Stop::timed_out());
    }
    Ok(config
        .render_to_string(tree, WIDTH)
        .ok()
        .map(|text| PageText { text, note: None }))
}

/// A page's bare text, with the note that says so.
fn bare(html: &[u8]) -> PageText {
    PageText {
        text: bare_text(html),
        note: Some(format!(
            "[the page nests its elements deeper than {MAX_HTML_DEPTH}: its text is given \
             without layout]"
        )),
    }
}

/// Elements that hold nothing, so never nest.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta", "param",
    "source", "track", "wbr",
];

/// Elements whose content is text up to their end tag: skipped whole.
const RAW_TEXT: &[&str] = &["script", "style"];

/// Elements that a second of their kind closes (`<p>a<p>b`, `<li>a<li>b`): an unclosed run of
/// them is no nesting.
const CLOSED_BY_THEIR_KIND: &[&str] = &[
    "p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th", "rb", "rt", "rtc", "rp",
    "tbody", "thead", "tfoot",
];

/// Elements after which the bare text starts a line.
const BLOCKS: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "div",
    "dl",
    "dt",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "tr",
    "ul",
];

/// One tag of a page, as a linear scan reads it.
struct Tag<'a> {
    /// The name, lower case; empty for `<!…>` and `<?…>`.
    name: String,
    closing: bool,
    /// Ends in `/>`.
    self_closing: bool,
    /// What follows the tag.
    rest: &'a [u8],
}

/// The tag that `html` starts with (at a `<`), or `None` for a `<` that opens no tag (`a < b`).
/// A tag ends at the first `>` after it, quotes or not: where a parser reads on past a quoted
/// `>`, this reads the rest as more tags, which only counts more.
fn tag(html: &[u8]) -> Option<Tag<'_>> {
    let after = html.get(1..)?;
    let (closing, named) = match after.first() {
        Some(b'/') => (true, after.get(1..).unwrap_or_default()),
        Some(b'!' | b'?') => (false, &[][..]),
        Some(c) if c.is_ascii_alphabetic() => (false, after),
        _ => return None,
    };
    let name: String = named
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'-')
        .map(|c| char::from(c.to_ascii_lowercase()))
        .collect();
    let end = after.iter().position(|c| *c == b'>');
    let (inside, rest) = match end {
        Some(at) => (
            after.get(..at).unwrap_or_default(),
            after.get(at + 1..).unwrap_or_default(),
        ),
        None => (after, &[][..]),
    };
    Some(Tag {
        name,
        closing,
        self_closing: inside.last() == Some(&b'/'),
        rest,
    })
}

/// What follows the end tag of the raw-text element `name` (its content skipped), or nothing.
/// It ends at the first `</name`, where a parser ends it or reads on.
fn after_raw_text<'a>(rest: &'a [u8], name: &str) -> &'a [u8] {
    let close = format!("</{name}");
    let found = rest
        .windows(close.len())
        .position(|w| w.eq_ignore_ascii_case(close.as_bytes()));
    match found {
        Some(at) => {
            let from = rest.get(at..).unwrap_or_default();
            tag(from).map_or(&[][..], |t| t.rest)
        }
        None => &[][..],
    }
}

/// True when the elements of `html` may nest deeper than `limit`, by one linear scan: each
/// start tag of an element that holds content opens one level, and an end tag closes one of its
/// kind that is open. It counts more than a parser nests where the page is odd, and less only
/// where the parser makes elements no tag opens (the rows a table implies, a formatting element
/// reopened): then the parsed tree is measured too ([`tree_deeper_than`]).
fn nests_deeper_than(html: &[u8], limit: usize) -> bool {
    let mut open: HashMap<String, usize> = HashMap::new();
    let mut depth = 0usize;
    let mut rest = html;
    while let Some(at) = rest.iter().position(|c| *c == b'<') {
        let from = rest.get(at..).unwrap_or_default();
        let Some(tag) = tag(from) else {
            rest = from.get(1..).unwrap_or_default();
            continue;
        };
        rest = tag.rest;
        let name = tag.name.as_str();
        if name.is_empty() || VOID.contains(&name) {
            continue;
        }
        let count = open.entry(tag.name.clone()).or_default();
        if tag.closing {
            if *count > 0 {
                *count -= 1;
                depth = depth.saturating_sub(1);
            }
            continue;
        }
        if RAW_TEXT.contains(&name) {
            rest = after_raw_text(rest, name);
            continue;
        }
        if tag.self_closing || (*count > 0 && CLOSED_BY_THEIR_KIND.contains(&name)) {
            continue;
        }
        *count += 1;
        depth += 1;
        if depth > limit {
            return true;
        }
    }
    false
}

/// True when the parsed tree nests deeper than `limit`; walked without recursion.
fn tree_deeper_than(document: &html2text::Handle, limit: usize) -> bool {
    let mut stack = vec![(document.clone(), 0usize)];
    while let Some((node, depth)) = stack.pop() {
        if depth > limit {
            return true;
        }
        stack.extend(
            node.children
                .borrow()
                .iter()
                .map(|child| (child.clone(), depth + 1)),
        );
        if let html2text::Element {
            template_contents, ..
        } = &node.data
            && let Some(contents) = template_contents.borrow().as_ref()
        {
            stack.push((contents.clone(), depth + 1));
        }
    }
    false
}

/// The text of a page without its tags, in one linear pass: a script's or a style's content
/// dropped, a line started at a block element, the common character references read, runs of
/// white space made one.
fn bare_text(html: &[u8]) -> String {
    let mut text = Vec::with_capacity(html.len() / 2);
    let mut rest = html;
    while let Some(at) = rest.iter().position(|c| *c == b'<') {
        text.extend_from_slice(rest.get(..at).unwrap_or_default());
        let from = rest.get(at..).unwrap_or_default();
        let Some(tag) = tag(from) else {
            text.push(b'<');
            rest = from.get(1..).unwrap_or_default();
            continue;
        };
        rest = tag.rest;
        let name = tag.name.as_str();
        if !tag.closing && RAW_TEXT.contains(&name) {
            rest = after_raw_text(rest, name);
        }
        text.push(if BLOCKS.contains(&name) { b'\n' } else { b' ' });
    }
    text.extend_from_slice(rest);
    let decoded = decode_references(&String::from_utf8_lossy(&text));
    let mut out = String::with_capacity(decoded.len());
    for line in decoded.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if !words.is_empty() {
            out.push_str(&words.join(" "));
            out.push('\n');
        }
    }
    out
}

/// `text` with its common character references (`&amp;`, `&#60;`, `&#x3c;`, ...) read.
fn decode_references(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(rest.get(..at).unwrap_or_default());
        let from = rest.get(at..).unwrap_or_default();
        let reference = from
            .get(1..)
            .and_then(|r| r.find(';').filter(|end| *end <= 10).map(|end| (r, end)))
            .and_then(|(r, end)| Some((r.get(..end)?, end)));
        let read = reference.and_then(|(name, end)| Some((character(name)?, end)));
        match read {
            Some((c, end)) => {
                out.push(c);
                rest = from.get(end + 2..).unwrap_or_default();
            }
            None => {
                out.push('&');
                rest = from.get(1..).unwrap_or_default();
            }
        }
    }
    out.push_str(rest);
    out
}

/// The character a reference's name (between `&` and `;`) stands for, if it is a common one.
fn character(name: &str) -> Option<char> {
    let number = |digits: &str, radix: u32| {
        u32::from_str_radix(digits, radix)
            .ok()
            .and_then(char::from_u32)
    };
    match name {
        "amp" => Some('&'),
        "lt" => Some('<'),
        "gt" => Some('>'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        "nbsp" => Some(' '),
        _ => match name.strip_prefix('#') {
            Some(hex) if hex.starts_with(['x', 'X']) => number(hex.get(1..)?, 16),
            Some(decimal) => number(decimal, 10),
            None => None,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use std::time::Duration;

    fn stop_in(after: Duration) -> Stop {
        Stop {
            deadline: Instant::now() + after,
            abandoned: Arc::new(AtomicBool::new(false)),
        }
    }

    #[test]
    fn the_count_of_nesting_reads_past_what_does_not_nest() {
        let deep = |n: usize| "<div>".repeat(n);
        assert!(nests_deeper_than(deep(513).as_bytes(), 512));
        assert!(!nests_deeper_than(deep(512).as_bytes(), 512));
        // Closed, void, self-closed, run-on paragraphs and list items, a script's strings.
        let flat = format!(
            "{}{}{}{}<script>{}</script>",
            "<div><b>x</b></div>".repeat(1000),
            "<br><img src=x><path d=x/>".repeat(1000),
            "<p>para".repeat(1000),
            "<ul>".to_owned() + &"<li>item".repeat(1000) + "</ul>",
            "'<div>'+".repeat(1000),
        );
        assert!(!nests_deeper_than(flat.as_bytes(), 512));
        // An end tag of what is not open closes nothing.
        assert!(nests_deeper_than(
            "<div></span>".repeat(600).as_bytes(),
            512
        ));
        // Neither a comment nor a `<` in text hides a tag.
        let hidden = format!("{}{}", "a < b <!-- > -->".repeat(10), deep(600));
        assert!(nests_deeper_than(hidden.as_bytes(), 512));
    }

    #[test]
    fn a_page_too_deep_is_given_as_bare_text() {
        let deep = format!(
            "<html><body><h1>Title &amp; more</h1>{}deep text<script>var a = '<p>';</script>{}",
            "<div>".repeat(200_000),
            "</div>".repeat(200_000)
        );
        let page = html_text(deep.as_bytes(), &stop_in(Duration::from_secs(60)))
            .unwrap()
            .unwrap();
        assert_eq!(page.text, "Title & more\ndeep text\n");
        assert!(page.note.unwrap().contains("without layout"));
    }

    #[tokio::test]
    async fn a_page_nested_nearly_to_the_bound_is_laid_out_on_the_thread_s_stack() {
        let shallow = format!("<p>{}leaf{}</p>", "<div>".repeat(500), "</div>".repeat(500));
        let deadline = Instant::now() + Duration::from_secs(60);
        let page = page_text("text/html", shallow.into_bytes(), deadline)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(page.text.trim(), "leaf");
        assert!(page.note.is_none());
    }

    #[test]
    fn the_parse_stops_at_the_deadline_and_when_abandoned() {
        let page = "<p>text</p>".repeat(10_000);
        let e = html_text(page.as_bytes(), &stop_in(Duration::ZERO))
            .err()
            .unwrap();
        assert_eq!(crate::testing::code(&e), "timeout");
        let stop = stop_in(Duration::from_secs(60));
        drop(Abandon(stop.abandoned.clone()));
        assert!(html_text(page.as_bytes(), &stop).is_err());
    }

    #[test]
    fn references_are_read_and_a_bare_ampersand_kept() {
        assert_eq!(
            decode_references("a &lt;b&gt; &#65;&#x42; &amp;&amp; c & d &bogus; e"),
            "a <b> AB && c & d &bogus; e"
        );
    }
}
