//! Server-sent events: the framer that reads the event-stream format from byte chunks (without
//! I/O), the [`SseStream`] that applies the idle timeout and event budget to a live body, and
//! `sse()`, the one entry point every provider's streamed call goes through.
//!
//! A body whose last event lacks its closing blank line still dispatches that event, on every
//! provider: `sse` appends the blank line, and so does the in-memory path.

use std::fmt;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agentloop::{ModelError, model::ModelErrorKind};
use bytes::Bytes;
use futures::{Stream, StreamExt, stream};

use crate::http::HttpClient;

/// A blank line appended to every event stream: a body whose last event lacks the closing blank
/// line (a server that closes right after its final `data:` line, or a recording trimmed of its
/// trailing newline) still dispatches that event. The data is complete JSON or it fails to parse,
/// so nothing half-received is ever applied.
const FINAL_BLANK_LINE: &[u8] = b"\n\n";

/// Reads a streamed response's body chunks (some of them possibly read already, to see what the
/// body is) as server-sent events with the client's idle timeout and event budget, dispatching a
/// final event that lacks its closing blank line.
pub(crate) fn sse<S>(client: &HttpClient, chunks: S) -> SseStream
where
    S: Stream<Item = Result<Bytes, ModelError>> + Send + 'static,
{
    let bytes = chunks.chain(stream::once(async {
        Ok(Bytes::from_static(FINAL_BLANK_LINE))
    }));
    let config = client.config();
    SseStream::new(
        bytes,
        client.provider(),
        Some(config.idle_timeout),
        config.max_event_bytes,
    )
    .with_max_bytes(config.max_stream_bytes)
    .with_keepalive_limit(config.keepalive_timeout)
}

/// Reads a whole event-stream body held in memory, without a runtime, with the same final blank
/// line as [`sse`]: the parsing path of a streamed response, for fuzzing, benchmarks and replay.
pub(crate) fn sse_of_body(body: &[u8], provider: &str) -> SseStream {
    let chunks = [
        Ok(Bytes::copy_from_slice(body)),
        Ok(Bytes::from_static(FINAL_BLANK_LINE)),
    ];
    SseStream::new(stream::iter(chunks), provider, None, usize::MAX)
}

/// One server-sent event: its `event:` name (`message` when absent, as the SSE standard says) and
/// its joined `data:` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The event name.
    pub event: String,
    /// The data.
    pub data: String,
}

type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, ModelError>> + Send>>;

/// Server-sent events read from a byte stream. A silence longer than the idle timeout fails with
/// [`ModelErrorKind::Timeout`], and so does a time longer than the keep-alive limit without an
/// event (comment and blank lines, sent to keep a connection open, are none); a transport
/// failure with its own kind; a malformed stream (bad UTF-8, an over-long line) with
/// [`ModelErrorKind::Stream`]. After an error the stream ends.
pub struct SseStream {
    bytes: ByteStream,
    framer: SseFramer,
    idle: Option<Duration>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// How long keep-alives alone may hold the stream (see [`SseStream::with_keepalive_limit`]).
    keepalive: Option<Duration>,
    /// Since the last event: the keep-alive limit's timer.
    quiet: Option<Pin<Box<tokio::time::Sleep>>>,
    provider: String,
    done: bool,
    /// The bytes the body may still carry (see [`SseStream::with_max_bytes`]).
    budget: usize,
}

impl fmt::Debug for SseStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseStream")
            .field("provider", &self.provider)
            .field("done", &self.done)
            .finish()
    }
}

impl SseStream {
    /// Reads events from `bytes`. `idle` needs a tokio runtime with time enabled; pass `None`
    /// to parse without one (fuzzing, benchmarks).
    pub fn new<S>(bytes: S, provider: &str, idle: Option<Duration>, max_event_bytes: usize) -> Self
    where
        S: Stream<Item = Result<Bytes, ModelError>> + Send + 'static,
    {
        SseStream {
            bytes: Box::pin(bytes),
            framer: SseFramer::new(max_event_bytes),
            idle,
            sleep: None,
            keepalive: None,
            quiet: None,
            provider: provider.to_owned(),
            done: false,
            budget: usize::MAX,
        }
    }

    /// Fails the stream (with [`ModelErrorKind::Decode`], as a whole body over its budget does)
    /// once its body has carried more than `max` bytes in all: the bound on a stream that never
    /// ends, which the idle timeout and the event budget alone do not give.
    #[must_use]
    pub fn with_max_bytes(mut self, max: usize) -> Self {
        self.budget = max;
        self
    }

    /// Fails the stream (with [`ModelErrorKind::Timeout`]) once `limit` passes without an event,
    /// however many keep-alive lines come: a relay whose upstream stalled sends them for ever.
    /// Needs a tokio runtime with time enabled.
    #[must_use]
    pub fn with_keepalive_limit(mut self, limit: Duration) -> Self {
        self.keepalive = Some(limit);
        self
    }

    /// Reads events from bytes already in memory, without a runtime: the parsing path that
    /// streamed responses take, for fuzzing and benchmarks.
    pub fn from_bytes(bytes: Bytes, provider: &str) -> Self {
        Self::new(
            futures::stream::iter([Ok(bytes)]),
            provider,
            None,
            usize::MAX,
        )
    }

    fn time_out(&mut self, message: String) -> Poll<Option<Result<SseEvent, ModelError>>> {
        self.done = true;
        self.sleep = None;
        self.quiet = None;
        Poll::Ready(Some(Err(
            ModelError::new(ModelErrorKind::Timeout, message).with_provider(self.provider.clone())
        )))
    }

    fn fail(&mut self, message: &str) -> Poll<Option<Result<SseEvent, ModelError>>> {
        self.done = true;
        Poll::Ready(Some(Err(
            ModelError::new(ModelErrorKind::Stream, message).with_provider(self.provider.clone())
        )))
    }
}

impl Stream for SseStream {
    type Item = Result<SseEvent, ModelError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            // Events already received go out before the next chunk is read.
            match self.framer.next_event() {
                Ok(Some(event)) => {
                    // Only an event restarts the keep-alive limit: comment lines and blank lines
                    // keep a connection open without saying anything, and a relay whose upstream
                    // stalled sends them for ever (earendil-works/pi#5558). So does a comment
                    // sent as data (`data: : keepalive`, Vertex's partner models): no API's
                    // event data begins with a colon.
                    if !event.data.starts_with(':') {
                        self.quiet = None;
                    }
                    return Poll::Ready(Some(Ok(event)));
                }
                Ok(None) => {}
                Err(message) => return self.fail(message),
            }
            match self.bytes.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    self.sleep = None;
                    let Some(left) = self.budget.checked_sub(chunk.len()) else {
                        self.done = true;
                        return Poll::Ready(Some(Err(ModelError::new(
                            ModelErrorKind::Decode,
                            "the event stream is larger than the budget of its response \
                             (max_stream_bytes)",
                        )
                        .with_provider(self.provider.clone()))));
                    };
                    self.budget = left;
                    if let Err(message) = self.framer.feed(&chunk) {
                        return self.fail(message);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if self.framer.inside_character() {
                        return self.fail("the event stream ends inside a UTF-8 character");
                    }
                    // An event without its closing blank line is never dispatched.
                    self.done = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    if let Some(limit) = self.keepalive {
                        let quiet = self
                            .quiet
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                        if quiet.as_mut().poll(cx).is_ready() {
                            return self.time_out(format!(
                                "no event came for {} s, only keep-alives (keepalive_timeout)",
                                limit.as_secs_f64()
                            ));
                        }
                    }
                    let Some(idle) = self.idle else {
                        return Poll::Pending;
                    };
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                    if sleep.as_mut().poll(cx).is_ready() {
                        return self
                            .time_out(format!("the stream was idle for {} s", idle.as_secs_f64()));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

/// The event-stream format (WHATWG HTML, "interpreting an event stream") read from byte chunks,
/// without I/O: lines end in CR, LF or CRLF (also split across chunks), a leading byte-order mark
/// is dropped, `:` lines are comments, `data` lines join with LF, `event` names the event and a
/// blank line dispatches it (unless its data is empty). `id` and `retry` are not used here.
///
/// One field outside the format is read: `error: <value>`, which llama.cpp's `llama-server` sent
/// in place of `data:` for a failure mid-stream (a context overflow among them) before
/// ggml-org/llama.cpp#16109, is an event named `error` with that value as its data. Dropped as the
/// format says, it would leave only the `[DONE]` that follows it, an empty answer that looks
/// complete.
///
/// It also guards the stream: invalid UTF-8 fails as soon as its chunk arrives (rather than once
/// its line ends), and so does a line that grows past the event budget (rather than without
/// bound). Each chunk is checked once, as it is appended to the text still to read.
struct SseFramer {
    /// Checked text not yet read to its end: from `read` on, the start of the line being read.
    text: String,
    read: usize,
    /// `text[read..scanned]` holds no line end (a long line is not scanned again per chunk).
    scanned: usize,
    /// The last line ended with a CR that closed the text: an LF opening the next chunk belongs
    /// to that line end.
    after_cr: bool,
    fields: EventFields,
    max_line: usize,
    /// The length of the last, unfinished line of the chunks checked so far.
    line_len: usize,
    /// The start of a UTF-8 character that the last chunk cut.
    utf8_carry: Vec<u8>,
}

/// The buffers of the event being read.
#[derive(Default)]
struct EventFields {
    /// No line has been read yet (a byte-order mark opening the first line is dropped).
    started: bool,
    event: String,
    data: String,
}

const NOT_UTF8: &str = "the event stream is not valid UTF-8";
/// The non-standard field of llama.cpp's failures, and the name of the event it makes.
pub(crate) const ERROR_FIELD: &str = "error";
const EVENT_TOO_LARGE: &str =
    "an event of the stream is larger than the event budget (max_event_bytes)";

impl SseFramer {
    fn new(max_line: usize) -> Self {
        SseFramer {
            text: String::new(),
            read: 0,
            scanned: 0,
            after_cr: false,
            fields: EventFields::default(),
            max_line,
            line_len: 0,
            utf8_carry: Vec::new(),
        }
    }

    /// Takes the next chunk, failing on invalid UTF-8 (an incomplete character at its end waits
    /// for the next chunk) and on a line longer than the event budget.
    fn feed(&mut self, chunk: &[u8]) -> Result<(), &'static str> {
        // What was read goes; the start of an unfinished line stays.
        self.text.drain(..self.read);
        self.scanned = self.scanned.saturating_sub(self.read);
        self.read = 0;
        let carried = !self.utf8_carry.is_empty();
        let joined;
        let bytes = if carried {
            let mut j = std::mem::take(&mut self.utf8_carry);
            j.extend_from_slice(chunk);
            joined = j;
            joined.as_slice()
        } else {
            chunk
        };
        match std::str::from_utf8(bytes) {
            Ok(text) => self.text.push_str(text),
            Err(e) if e.error_len().is_none() => {
                if carried && e.valid_up_to() == 0 {
                    // Still inside the carried character.
                    self.utf8_carry = bytes.to_vec();
                    return Ok(());
                }
                let (valid, cut) = bytes.split_at(e.valid_up_to());
                self.text
                    .push_str(std::str::from_utf8(valid).map_err(|_| NOT_UTF8)?);
                self.utf8_carry = cut.to_vec();
            }
            Err(_) => return Err(NOT_UTF8),
        }
        match memchr::memrchr2(b'\n', b'\r', chunk) {
            Some(p) => self.line_len = chunk.len() - p - 1,
            None => self.line_len = self.line_len.saturating_add(chunk.len()),
        }
        if self.line_len > self.max_line {
            return Err(EVENT_TOO_LARGE);
        }
        Ok(())
    }

    /// Whether the bytes so far end inside a UTF-8 character.
    fn inside_character(&self) -> bool {
        !self.utf8_carry.is_empty()
    }

    /// The next event that the chunks fed so far complete, if any; an error when the event being
    /// read grows past the budget (many lines, each under it, add up).
    fn next_event(&mut self) -> Result<Option<SseEvent>, &'static str> {
        loop {
            let rest = self.text.as_bytes().get(self.read..).unwrap_or_default();
            if self.after_cr && !rest.is_empty() {
                self.after_cr = false;
                if rest.first() == Some(&b'\n') {
                    self.read += 1;
                    continue;
                }
            }
            let from = self.scanned.max(self.read);
            let unscanned = self.text.as_bytes().get(from..).unwrap_or_default();
            let Some(p) = memchr::memchr2(b'\n', b'\r', unscanned) else {
                self.scanned = self.text.len();
                return Ok(None);
            };
            let end = from + p;
            // A line ends at an ASCII byte, so both ends are character boundaries.
            let line = self.text.get(self.read..end).unwrap_or_default();
            self.read = end + 1;
            if unscanned.get(p) == Some(&b'\r') {
                match unscanned.get(p + 1) {
                    Some(b'\n') => self.read += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if let Some(event) = self.fields.line(line) {
                return Ok(Some(event));
            }
            if self.fields.data.len() + self.fields.event.len() > self.max_line {
                return Err(EVENT_TOO_LARGE);
            }
        }
    }
}

impl EventFields {
    /// Applies one line (without its line end); a blank line dispatches the event.
    fn line(&mut self, mut line: &str) -> Option<SseEvent> {
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None; // a comment
        }
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match name {
            "data" => {
                self.data.reserve(value.len() + 1);
                self.data.push_str(value);
                self.data.push('\n');
            }
            "event" => {
                self.event.clear();
                self.event.push_str(value);
            }
            ERROR_FIELD => {
                self.event.clear();
                self.event.push_str(ERROR_FIELD);
                self.data.reserve(value.len() + 1);
                self.data.push_str(value);
                self.data.push('\n');
            }
            _ => {} // id, retry and unknown fields
        }
        None
    }

    /// The event read so far, unless its data is empty; the buffers start over either way.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        Some(SseEvent {
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn events(chunks: Vec<&'static [u8]>, max_event: usize) -> Vec<Result<SseEvent, ModelError>> {
        events_of(
            chunks.into_iter().map(Bytes::from_static).collect(),
            max_event,
        )
    }

    fn events_of(chunks: Vec<Bytes>, max_event: usize) -> Vec<Result<SseEvent, ModelError>> {
        let stream = futures::stream::iter(chunks.into_iter().map(Ok));
        futures::executor::block_on(SseStream::new(stream, "p", None, max_event).collect())
    }

    #[test]
    fn a_character_split_across_chunks_is_read_whole() {
        let got = events(
            vec![b"event: x\ndata: caf\xc3", b"\xa9\n\ndata: 2\n\n"],
            1024,
        );
        let got: Vec<SseEvent> = got.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            got,
            [
                SseEvent {
                    event: "x".into(),
                    data: "café".into()
                },
                SseEvent {
                    event: "message".into(),
                    data: "2".into()
                }
            ]
        );
    }

    #[test]
    fn invalid_utf8_fails_the_stream_at_once() {
        let got = events(
            vec![b"data: 1\n\n", b"data: \xff\xfe\n\n", b"data: 3\n\n"],
            1024,
        );
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].as_ref().unwrap_err().kind, ModelErrorKind::Stream);
    }

    #[test]
    fn a_line_longer_than_the_event_budget_fails_the_stream() {
        let got = events(
            vec![b"data: 0123456789", b"0123456789", b"0123456789\n\n"],
            20,
        );
        assert_eq!(
            got.last().unwrap().as_ref().unwrap_err().kind,
            ModelErrorKind::Stream
        );
    }

    #[test]
    fn an_event_of_many_short_lines_past_the_budget_fails_the_stream() {
        // Every line is under the 64-byte budget; together the event is not, and it never ends:
        // a hostile server must not grow one event without bound.
        let line: &[u8] = b"data: 0123456789\n";
        let mut chunks: Vec<&[u8]> = vec![b"data: ok\n\n"];
        chunks.extend(std::iter::repeat_n(line, 1000));
        let got = events(chunks, 64);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap().data, "ok");
        let err = got[1].as_ref().unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
        assert!(err.message.contains("event budget"), "{err}");
        // An event just under the budget is read whole.
        let got = events(vec![b"data: 0123456789\ndata: 0123456789\n\n"], 64);
        assert_eq!(got[0].as_ref().unwrap().data, "0123456789\n0123456789");
    }

    #[test]
    fn a_stream_opening_with_a_byte_order_mark_is_read_without_it() {
        // The mark cut across chunks too; eventsource-stream, the reader before, panicked here.
        let got = events(vec![b"\xef\xbb", b"\xbfdata: 1\n\n"], 1024);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap().data, "1");
    }

    #[test]
    fn a_line_spanning_many_chunks_is_read_whole() {
        let line = format!("data: {}\n\r\n", "x".repeat(64 * 1024));
        let chunks = line.as_bytes().chunks(100).map(Bytes::copy_from_slice);
        let got = events_of(chunks.collect(), 128 * 1024);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap().data.len(), 64 * 1024);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_longer_than_the_idle_timeout_is_a_timeout_error() {
        let stream = futures::stream::iter([Ok(Bytes::from_static(b"data: 1\n\n"))])
            .chain(futures::stream::pending());
        let mut sse = SseStream::new(stream, "p", Some(Duration::from_secs(5)), 1024);
        assert_eq!(sse.next().await.unwrap().unwrap().data, "1");
        let err = sse.next().await.unwrap().unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Timeout);
        assert!(sse.next().await.is_none());
    }
}
