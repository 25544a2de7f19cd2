//! The glue between a provider's pure stream parser and the [`ModelStream`] the loop reads: a
//! [`StreamDecoder`] turns each server-sent event's data into [`ModelEvent`]s, and the helpers here
//! drive it over an [`SseStream`] (live) or over bytes in memory (fuzzing, benchmarks, replay).
//!
//! After the first error the stream ends: a malformed event or an early end is never followed by
//! more events, so a half-applied response cannot reach the caller.

use std::collections::VecDeque;
use std::future::Future;

use agentloop::{ModelError, ModelEvent, ModelResponse, ModelStream, ResponseAccumulator};
use bytes::Bytes;
use futures::{StreamExt, stream};

use crate::http::HttpClient;
use crate::sse::{FINAL_BLANK_LINE, SseStream, sse};

/// A pure parser of one provider's event stream.
pub(crate) trait StreamDecoder: Send {
    /// Applies one event's data, pushing what it means onto `out`.
    fn event(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError>;
    /// The byte stream ended: an error unless the response was complete (or already failed).
    fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError>;
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
                Some(Ok(event)) => st.decoder.event(&event.data, &mut st.queue),
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

/// One model call: POSTs `body` to `path`, then reads the answer as events with `decoder` when
/// streaming, or as one whole response with `whole` when `decoder` is `None`.
pub(crate) fn post_and_decode<'a, D, W>(
    client: &'a HttpClient,
    path: &'a str,
    body: Result<Vec<u8>, ModelError>,
    decoder: Option<D>,
    whole: W,
) -> ModelStream<'a>
where
    D: StreamDecoder + 'a,
    W: FnOnce(&[u8]) -> Result<ModelResponse, ModelError> + Send + 'a,
{
    opened(async move {
        let response = client.post_json(path, body?).await?;
        match decoder {
            Some(decoder) => Ok(decoded_events(sse(client, response), decoder)),
            None => {
                let bytes = client.read_body(response).await?;
                Ok(one_event(ModelEvent::Response(whole(&bytes)?)))
            }
        }
    })
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
    let mut body = Vec::with_capacity(bytes.len() + FINAL_BLANK_LINE.len());
    body.extend_from_slice(bytes);
    body.extend_from_slice(FINAL_BLANK_LINE);
    let mut sse = SseStream::from_bytes(Bytes::from(body), provider);
    let mut acc = ResponseAccumulator::new();
    let mut queue = VecDeque::new();
    futures::executor::block_on(async {
        while let Some(event) = sse.next().await {
            decoder.event(&event?.data, &mut queue)?;
            for e in queue.drain(..) {
                acc.push(e)?;
            }
        }
        decoder.end(&mut queue)?;
        for e in queue.drain(..) {
            acc.push(e)?;
        }
        Ok::<(), ModelError>(())
    })?;
    acc.finish()
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
