//! The glue between a provider's pure stream parser and the [`ModelStream`] the loop reads: a
//! [`StreamDecoder`] turns each server-sent event's data into [`ModelEvent`]s, and the helpers here
//! drive it over an [`SseStream`] (live) or over bytes in memory (fuzzing, benchmarks, replay).
//!
//! A whole (non-streamed) body takes the same path: the decoder turns it into the events a stream
//! of it would have carried, and the core's accumulator builds the response, so each provider has
//! one set of rules (truncated calls, finish reasons, usage) whichever way it answers.
//!
//! After the first error the stream ends: a malformed event or an early end is never followed by
//! more events, so a half-applied response cannot reach the caller.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use agentloop::{
    ModelError, ModelResponse,
    model::{ModelErrorKind, ModelEvent, ModelStream, ResponseAccumulator},
};
use bytes::Bytes;
use futures::{StreamExt, stream};

use crate::error::redraw_unparsed;
use crate::gist::{BOM, Gist, content_start, gist};
use crate::http::HttpClient;
use crate::sse::{ERROR_FIELD, SseEvent, SseStream, sse, sse_of_body};

/// A pure parser of one provider's event stream.
pub(crate) trait StreamDecoder: Send {
    /// Applies one event's data, pushing what it means onto `out`.
    fn event(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError>;
    /// Applies the data of an event named `error` (an API's own error event, or llama.cpp's
    /// non-standard `error:` field, see [`crate::sse`]): by default as any other event's data,
    /// for an API whose error events say what they are in their data.
    fn error_event(
        &mut self,
        data: &str,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        self.event(data, out)
    }
    /// The byte stream ended: an error unless the response was complete (or already failed).
    fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError>;
    /// The stream's own last event came (`[DONE]`, `message_stop`, a final `response.*`): the
    /// response is whole, and nothing after it counts.
    fn over(&self) -> bool;
    /// The last event the stream still lacks, when the answer is whole without it (Chat
    /// Completions: a `finish_reason` came, `[DONE]` has not): a silence then ends the stream as
    /// its end would, rather than failing an answer that is all there.
    fn whole_before_last_event(&self) -> Option<&'static str> {
        None
    }
    /// Applies a whole (non-streamed) response body: the events its stream would have carried,
    /// through its `Finish`.
    fn whole(&mut self, body: &[u8], out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError>;
}

/// Applies one server-sent event, by its name.
fn apply_event<D: StreamDecoder + ?Sized>(
    decoder: &mut D,
    event: &SseEvent,
    out: &mut VecDeque<ModelEvent>,
) -> Result<(), ModelError> {
    if event.event == ERROR_FIELD {
        return decoder.error_event(&event.data, out);
    }
    // Data of one line, every event of a server that keeps to the format, goes straight on.
    if memchr::memchr(b'\n', event.data.as_bytes()).is_some()
        && let Some(lines) = run_together(&event.data)
    {
        for line in lines {
            decoder.event(line, out)?;
            if decoder.over() {
                break;
            }
        }
        return Ok(());
    }
    decoder.event(&event.data, out)
}

/// The events in one event's data, when a server ended each `data:` line with one line end
/// rather than a blank line (servers and proxies written against line-by-line readers): the
/// format joins such lines into one event, whose data is then no JSON, and every call failed.
/// Each line is its own event when the joined data is no JSON and each line is JSON (or
/// `[DONE]`); data split over lines as the format allows (a JSON document laid over several
/// `data:` lines) joins into JSON and is read as one.
fn run_together(data: &str) -> Option<Vec<&str>> {
    let is_json = |text: &str| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
    if is_json(data) {
        return None;
    }
    let lines: Vec<&str> = data
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let each = lines.len() > 1 && lines.iter().all(|l| *l == "[DONE]" || is_json(l));
    each.then_some(lines)
}

struct Decoding<D> {
    sse: SseStream,
    decoder: D,
    queue: VecDeque<ModelEvent>,
    done: bool,
}

/// The model events a decoder makes of a live event stream.
pub(crate) fn decoded_events<'a, D: StreamDecoder + 'a>(
    sse: SseStream,
    decoder: D,
) -> ModelStream<'a> {
    let state = Decoding {
        sse,
        decoder,
        queue: VecDeque::new(),
        done: false,
    };
    Box::pin(stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.queue.pop_front() {
                return Some((Ok(event), st));
            }
            if st.done {
                return None;
            }
            let step = match st.sse.next().await {
                Some(Ok(event)) => {
                    let applied = apply_event(&mut st.decoder, &event, &mut st.queue);
                    // The answer ends at its last event, not when the server closes the body:
                    // a server or proxy that keeps the connection open after it would hold the
                    // whole answer until the idle timeout, then fail it (and a retry would throw
                    // it away and ask again).
                    if applied.is_ok() && st.decoder.over() {
                        st.done = true;
                    }
                    applied
                }
                // The server went quiet after a whole answer, without its last event and without
                // ending the body: the answer is read as if it had ended there. Failed, it was
                // lost, and a retry layer paid for it again.
                Some(Err(e)) if e.kind == ModelErrorKind::Timeout => {
                    match st.decoder.whole_before_last_event() {
                        Some(last) => {
                            st.done = true;
                            st.queue.push_back(ModelEvent::Warning(format!(
                                "the answer was whole, but {last} never came and the server \
                                 held the stream open ({}): read as ended there",
                                e.message
                            )));
                            st.decoder.end(&mut st.queue)
                        }
                        None => Err(e),
                    }
                }
                Some(Err(e)) => Err(e),
                None => {
                    st.done = true;
                    st.decoder.end(&mut st.queue)
                }
            };
            if let Err(e) = step {
                st.done = true;
                st.queue.clear();
                return Some((Err(e), st));
            }
        }
    }))
}

/// One model call: POSTs `body` to `path`, then reads the answer with `decoder`: as events when
/// `stream` is set, else as one whole body turned into one [`ModelEvent::Response`].
///
/// The answer is read as what the server sent, not as what was asked: servers and gateways that
/// ignore `stream: true` answer one JSON body, read whole, and some answer a non-streamed request
/// with an event stream, read as events to its last one and given as one response; either with
/// a warning, rather than failed. An answer is told by its first bytes as much as by its label:
/// one that opens as a JSON document is read whole whatever its label (so an error object keeps
/// its kind), and one labelled JSON or neither JSON nor events is events only when it opens as
/// they do.
///
/// `sampled` says the request samples (see [`crate::error::samples`]): then a local server's
/// refusal of the model's tool call, whether as an HTTP error or inside the answer, is retryable,
/// as a retry is a new draw.
pub(crate) fn post_and_decode<'a, D: StreamDecoder + 'a>(
    client: &'a HttpClient,
    path: &'a str,
    body: Result<Vec<u8>, ModelError>,
    decoder: D,
    stream: bool,
    sampled: bool,
) -> ModelStream<'a> {
    let answer = opened(async move {
        let response = client.post_json_of(path, body?, sampled).await?;
        let answer = read_answer(client, response, decoder, stream);
        if !sampled {
            return answer.await;
        }
        // An error inside the answer carries no `x-should-retry` to overrule the new draw.
        let redraw = |mut e: ModelError| {
            redraw_unparsed(&mut e);
            e
        };
        let events = answer.await.map_err(redraw)?;
        Ok(Box::pin(events.map(move |item| item.map_err(redraw))) as ModelStream<'a>)
    });
    // Whatever failed, the key goes before the error leaves: an error event or an error body
    // under a 200 is the server's text as much as a 401's body is, and may quote the request.
    Box::pin(answer.map(move |item| {
        item.map_err(|mut e| {
            client.scrub(&mut e);
            e
        })
    }))
}

/// Reads a 2xx answer with `decoder`, as events or as one whole body (see [`post_and_decode`]).
async fn read_answer<'a, D: StreamDecoder + 'a>(
    client: &'a HttpClient,
    response: reqwest::Response,
    decoder: D,
    stream: bool,
) -> Result<ModelStream<'a>, ModelError> {
    let media = media_type(&response);
    let declared = response.content_length();
    let mut chunks = client.body_chunks(response);
    // The label is a claim; the first bytes say what the body is. An event stream opens with
    // a field or a comment, never with `{`, `[` or `<`: a body that does is a JSON document (a
    // gateway's error object under a 200, which read as events would carry none and end as a
    // bare "stream ended early", its kind and message lost) or an HTML page. Labelled JSON or
    // unlabelled (text/plain, no label), a body is events only when it opens as they do. Events
    // are read as they arrive, within the stream's limits, whatever was asked and however they
    // are labelled: held whole until the body ends, an answer whose server keeps the connection
    // open after its last event would wait out the idle timeout and fail. Labelled as events,
    // one byte decides, so no event waits on the peek.
    let labelled = media == Media::EventStream;
    let enough = if labelled { 1 } else { SSE_PREFIX_BYTES };
    let head = first_bytes(&mut chunks, enough, client).await?;
    let events = match media {
        Media::EventStream => !opens_as_document(&head),
        Media::Json => starts_like_sse(&head),
        // Asked for a stream, an unlabelled body of nothing but whitespace ends as a stream
        // that ended early would.
        Media::Other => {
            starts_like_sse(&head) || (stream && head.iter().all(u8::is_ascii_whitespace))
        }
    };
    let chunks = stream::iter([Ok(head)]).chain(chunks);
    if events {
        let mut events = decoded_events(sse(client, chunks), decoder);
        if stream {
            return Ok(events);
        }
        let mut acc = ResponseAccumulator::new();
        while let Some(event) = events.next().await {
            acc.push(event?)?;
        }
        let mut response = acc.finish()?;
        response
            .warnings
            .push("asked for one JSON body, the server answered with an event stream".to_owned());
        return Ok(one_event(ModelEvent::Response(response)));
    }
    let bytes = client.collect_body(chunks, declared).await?;
    // A byte order mark is no JSON, but says nothing against the document after it.
    let body = bytes.strip_prefix(BOM).unwrap_or(&bytes);
    let mut response = accumulate_whole(body, decoder).map_err(|e| not_json(e, body))?;
    if stream {
        response
            .warnings
            .push("asked for a stream, the server answered with one JSON body".to_owned());
    }
    Ok(one_event(ModelEvent::Response(response)))
}

#[derive(Debug, PartialEq, Eq)]
enum Media {
    Json,
    EventStream,
    Other,
}

/// What the answer's `content-type` says it is.
fn media_type(response: &reqwest::Response) -> Media {
    let Some(value) = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return Media::Other;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Media::Json,
        "text/event-stream" => Media::EventStream,
        _ => Media::Other,
    }
}

/// True when a body mislabelled (or unlabelled) starts as an event stream does.
fn starts_like_sse(bytes: &[u8]) -> bool {
    let start = content_start(bytes);
    [b"data:".as_slice(), b"event:", b":", b"id:", b"retry:"]
        .iter()
        .any(|p| start.starts_with(p))
}

/// The longest prefix [`starts_like_sse`] looks for (`retry:`).
const SSE_PREFIX_BYTES: usize = 6;

/// True when a body opens (after whitespace) as a JSON document or an HTML page does, which an
/// event stream never does.
fn opens_as_document(bytes: &[u8]) -> bool {
    matches!(content_start(bytes).first(), Some(b'{' | b'[' | b'<'))
}

/// A whole body that failed to decode and is no JSON at all (a captive portal's page, a proxy's
/// login page, a wrong base_url's site or plain-text 404): the error says what came, by an HTML
/// page's title or the body's first words, rather than the parser's "expected value at line 1
/// column 1". Still [`ModelErrorKind::Decode`], and so not retried: every attempt gets the page.
fn not_json(mut error: ModelError, body: &[u8]) -> ModelError {
    if error.kind != ModelErrorKind::Decode {
        return error;
    }
    match gist(body) {
        Some(Gist::Html { title, start }) => {
            let title = title.unwrap_or(start);
            error.message = format!(
                "the server answered with an HTML page, not JSON: {title} (a captive portal, a \
                 proxy's login page, or a base_url that is not the API's?)"
            );
        }
        Some(Gist::Text(words)) => {
            error.message = format!("the server answered with a body that is not JSON: {words}");
        }
        None => {}
    }
    error
}

/// The body's first chunks, joined: read until they hold `enough` bytes other than leading
/// whitespace, open as a document does (see [`opens_as_document`]), the body ends, or
/// `max_event_bytes` are read. As the stream's first read, a silence is bounded by the idle
/// timeout; whitespace alone (a keep-alive before a slow JSON answer) by the keep-alive timeout,
/// as [`HttpClient::collect_body`] bounds it in a whole body.
async fn first_bytes<S>(
    chunks: &mut S,
    enough: usize,
    client: &HttpClient,
) -> Result<Bytes, ModelError>
where
    S: futures::Stream<Item = Result<Bytes, ModelError>> + Unpin,
{
    let config = client.config();
    let timeout = |what: String| {
        ModelError::new(ModelErrorKind::Timeout, what).with_provider(client.provider())
    };
    let keepalive_ends = tokio::time::Instant::now().checked_add(config.keepalive_timeout);
    let mut head: Vec<u8> = Vec::new();
    // Counted as the chunks come, each read once: a server that sends its whitespace a byte a
    // chunk must not make each chunk cost a scan of all before it.
    let mut seen = 0;
    let mut document = false;
    while seen < enough && !document && head.len() < config.max_event_bytes {
        let silence_ends = tokio::time::Instant::now().checked_add(config.idle_timeout);
        // Once something other than whitespace came, only a silence ends the wait.
        let keepalive_ends = keepalive_ends.filter(|_| seen == 0);
        let by_keepalive = match (silence_ends, keepalive_ends) {
            (Some(silence), Some(keepalive)) => keepalive < silence,
            (None, Some(_)) => true,
            _ => false,
        };
        let deadline = if by_keepalive {
            keepalive_ends
        } else {
            silence_ends
        };
        let next = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, chunks.next())
                .await
                .map_err(|_| {
                    timeout(if by_keepalive {
                        format!(
                            "nothing but whitespace came for {} s (keepalive_timeout)",
                            config.keepalive_timeout.as_secs_f64()
                        )
                    } else {
                        format!(
                            "the stream was idle for {} s",
                            config.idle_timeout.as_secs_f64()
                        )
                    })
                })?,
            None => chunks.next().await,
        };
        let Some(chunk) = next else {
            break;
        };
        let chunk = chunk?;
        if seen == 0 {
            let content = content_start(&chunk);
            document = opens_as_document(content);
            seen = content.len();
        } else {
            seen = seen.saturating_add(chunk.len());
        }
        head.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(head))
}

/// A stream of exactly one event.
fn one_event<'a>(event: ModelEvent) -> ModelStream<'a> {
    Box::pin(stream::once(async move { Ok(event) }))
}

/// A stream that first awaits `open` (the HTTP request), then yields the stream it opened, or
/// its error as the only item.
fn opened<'a, F>(open: F) -> ModelStream<'a>
where
    F: Future<Output = Result<ModelStream<'a>, ModelError>> + Send + 'a,
{
    Box::pin(
        stream::once(open)
            .map(|opened| match opened {
                Ok(events) => events,
                Err(e) => Box::pin(stream::once(async move { Err(e) })),
            })
            .flatten(),
    )
}

/// Runs a decoder over a whole event-stream body in memory and accumulates the response, without
/// a runtime: the path a streamed response takes, minus the socket.
pub(crate) fn accumulate_sse<D: StreamDecoder>(
    bytes: &[u8],
    provider: &str,
    mut decoder: D,
) -> Result<ModelResponse, ModelError> {
    let mut sse = sse_of_body(bytes, provider);
    let mut acc = ResponseAccumulator::new();
    let mut queue = VecDeque::new();
    futures::executor::block_on(async {
        while let Some(event) = sse.next().await {
            apply_event(&mut decoder, &event?, &mut queue)?;
            push_all(&mut acc, &mut queue)?;
            // As live: what follows the stream's last event is not read.
            if decoder.over() {
                break;
            }
        }
        decoder.end(&mut queue)?;
        push_all(&mut acc, &mut queue)
    })?;
    acc.finish()
}

/// Decodes a whole (non-streamed) body and accumulates the response: the rules of a stream, read
/// from one body.
pub(crate) fn accumulate_whole<D: StreamDecoder>(
    body: &[u8],
    mut decoder: D,
) -> Result<ModelResponse, ModelError> {
    let mut acc = ResponseAccumulator::new();
    let mut queue = VecDeque::new();
    decoder.whole(body, &mut queue)?;
    push_all(&mut acc, &mut queue)?;
    acc.finish()
}

fn push_all(
    acc: &mut ResponseAccumulator,
    queue: &mut VecDeque<ModelEvent>,
) -> Result<(), ModelError> {
    for event in queue.drain(..) {
        acc.push(event)?;
    }
    Ok(())
}

/// A token count as a server sends it, read leniently: usage is accounting beside the answer, and
/// it rides on the same chunk or body as the answer's end, so a count that is no non-negative
/// integer (`-1`, `12.0`, `1e30`, `1e400`, a number past `u64`, `"12"`) must not cost the answer.
/// A negative or non-numeric count reads as absent, a fraction is cut to its integer, a count
/// past `u64::MAX` saturates there (the core's sums saturate too).
pub(crate) fn lenient_count<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::Deserialize as _;
    // Read as its text: a number past f64's range (`1e400`) fails to parse as a number at all,
    // and would fail the whole chunk with it.
    let raw = <&serde_json::value::RawValue>::deserialize(deserializer)?;
    Ok(count_of(raw.get()))
}

/// The count a JSON value's text holds (see [`lenient_count`]).
fn count_of(text: &str) -> Option<u64> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(count), _) => Some(count),
            // `as` saturates at u64::MAX; a negative or non-finite number is no count.
            (None, Some(f)) if f.is_finite() && f >= 0.0 => Some(f as u64),
            _ => None,
        },
        Ok(serde_json::Value::String(s)) => s.trim().parse().ok(),
        Ok(_) => None,
        // Valid JSON that is no value here is a number past f64's range: huge, or a tiny
        // fraction (`1e-400`, no count), or negative (none).
        Err(_) => {
            let text = text.trim();
            let huge = !text.starts_with('-') && !text.contains("e-") && !text.contains("E-");
            huge.then_some(u64::MAX)
        }
    }
}

/// A call id read straight into the `Arc<str>` the call, its record and the run's set of ids
/// share: one allocation. (An `Option<Cow<str>>` never borrows, whatever `#[serde(borrow)]`
/// says: serde reads it into a `String`, which would then be copied into the `Arc`.)
pub(crate) fn shared_id<'de, D>(deserializer: D) -> Result<Option<Arc<str>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Id;
    impl<'de> serde::de::Visitor<'de> for Id {
        type Value = Option<Arc<str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or null")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(self)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Arc::from(v)))
        }
    }
    deserializer.deserialize_option(Id)
}

/// A usage object (or its details) read leniently: one of the wrong shape (`"usage": "n/a"`,
/// a list) reads as absent rather than failing the chunk or body that carries the answer.
pub(crate) fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::Deserialize as _;
    // Read as its text, then as `T`: a `Value` would fail on a number past f64's range
    // (`1e400`), which `T`'s own lenient counts read. (Not for text: a lone surrogate's error
    // must reach the repair, see [`lenient_value`].)
    let raw = <&serde_json::value::RawValue>::deserialize(deserializer)?;
    Ok(serde_json::from_str(raw.get()).ok())
}

/// A field of text read leniently: one of another shape reads as absent. Read through a
/// `Value`, so that a lone surrogate in it fails the event where it stands and is repaired.
#[cfg(feature = "openai-responses")]
pub(crate) fn lenient_value<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::Deserialize as _;
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}

/// Runs a decoder over event payloads and the end of the stream, collecting what it emits.
#[cfg(test)]
pub(crate) fn decode_all<D: StreamDecoder>(
    mut decoder: D,
    payloads: &[&str],
) -> Result<Vec<ModelEvent>, ModelError> {
    let mut out = VecDeque::new();
    for data in payloads {
        decoder.event(data, &mut out)?;
    }
    decoder.end(&mut out)?;
    Ok(out.into_iter().collect())
}

/// A tool call's arguments as a request sends them back to the server: as the model wrote them
/// when they are JSON, else `{}` (empty, cut by the output limit or a server's refusal, or
/// malformed). Servers that lay the conversation out through a chat template parse them, and
/// llama-server answers `500 Failed to parse tool call arguments as JSON` to every later request
/// of the run otherwise; the run rejected such a call, and its result says why to the model.
#[cfg(any(feature = "openai", feature = "openai-responses"))]
pub(crate) fn sent_arguments(arguments: &str) -> &str {
    if serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_ok() {
        arguments
    } else {
        "{}"
    }
}
