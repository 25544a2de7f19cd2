#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A run's event stream and a slow reader: the run waits for the reader once the stream holds
//! `STREAM_BACKLOG` events, so memory stays bounded, and nothing is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop::model::{FinishReason, ModelEvent, ModelRequest, ModelStream};
use agentloop::{Agent, EventKind, Model, STREAM_BACKLOG, StopReason, StreamItem};
use futures::StreamExt;

/// A model that answers with `words` one-word deltas, counting those it has yielded.
struct Chatty {
    words: usize,
    yielded: Arc<AtomicUsize>,
}

impl Model for Chatty {
    fn id(&self) -> &str {
        "chatty"
    }
    fn provider(&self) -> &str {
        "test"
    }
    fn stream<'a>(&'a self, _request: ModelRequest<'a>) -> ModelStream<'a> {
        let yielded = Arc::clone(&self.yielded);
        let deltas = futures::stream::iter(0..self.words).map(move |_| {
            yielded.fetch_add(1, Ordering::SeqCst);
            Ok(ModelEvent::TextDelta("w ".into()))
        });
        let finish = futures::stream::once(async {
            Ok(ModelEvent::Finish {
                reason: FinishReason::Stop,
                raw: None,
            })
        });
        Box::pin(deltas.chain(finish))
    }
}

#[tokio::test]
async fn a_slow_reader_of_a_stream_holds_the_run_back_and_loses_no_event() {
    let words = 10 * STREAM_BACKLOG;
    let yielded = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder()
        .model(Chatty {
            words,
            yielded: Arc::clone(&yielded),
        })
        .build()
        .unwrap();
    let mut stream = agent.stream("talk");
    let Some(StreamItem::Event(first)) = stream.next().await else {
        panic!("the stream starts with an event");
    };
    assert!(
        matches!(first.kind, EventKind::RunStarted { .. }),
        "{first:?}"
    );
    // The reader looks away: an unbounded stream let the model run to its end (10 backlogs of
    // deltas held for nobody).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ahead = yielded.load(Ordering::SeqCst);
    assert!(
        (STREAM_BACKLOG / 2..=STREAM_BACKLOG + 8).contains(&ahead),
        "the model streamed {ahead} deltas ahead of a reader that took one event"
    );
    let rest: Vec<StreamItem> = stream.collect().await;
    let deltas = rest
        .iter()
        .filter(
            |i| matches!(i, StreamItem::Event(e) if matches!(e.kind, EventKind::TextDelta { .. })),
        )
        .count();
    assert_eq!(deltas, words);
    let Some(StreamItem::Outcome(out)) = rest.last() else {
        panic!("the stream ends with the outcome");
    };
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.output.as_deref().map(str::len), Some(2 * words));
}

#[tokio::test]
async fn a_dropped_stream_with_a_full_backlog_cancels_its_run() {
    let yielded = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder()
        .model(Chatty {
            words: 10 * STREAM_BACKLOG,
            yielded: Arc::clone(&yielded),
        })
        .build()
        .unwrap();
    let mut stream = agent.stream("talk");
    let _ = stream.next().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = yielded.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(yielded.load(Ordering::SeqCst), after, "the run went on");
    assert!(after < 10 * STREAM_BACKLOG, "{after}");
}
