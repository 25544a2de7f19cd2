//! One property harness for the three providers' in-memory stream paths (SSE reader, event
//! parser, accumulator): arbitrary bytes, and streams assembled from real event pieces, give a
//! response or an error, never a panic, and a response keeps the accumulator's promises.

use agentloop::{ModelResponse, model::FinishReason};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::ParseStream;

/// What a provider's stream properties are checked with.
pub(crate) struct StreamProps {
    /// The in-memory entry point (`parse_stream_bytes`).
    pub parse: ParseStream,
    /// Pieces real streams are made of, so random streams get past the framing.
    pub pieces: &'static [&'static str],
    /// Words of which a stream must hold one to give a response (the events that complete it).
    pub complete: &'static [&'static str],
    /// Whole streams once found by shrinking, checked on every run.
    pub known: &'static [&'static str],
    /// A provider's own check of a response, after the shared ones.
    pub extra: fn(&ModelResponse) -> Result<(), TestCaseError>,
}

/// No check beyond the shared ones.
pub(crate) fn nothing_more(_: &ModelResponse) -> Result<(), TestCaseError> {
    Ok(())
}

impl StreamProps {
    /// Runs both properties, 512 cases each.
    pub(crate) fn check(&self) {
        let runner = || {
            TestRunner::new(Config {
                cases: 512,
                failure_persistence: None,
                ..Config::default()
            })
        };
        let bytes = proptest::collection::vec(any::<u8>(), 0..2048);
        runner()
            .run(&bytes, |bytes| {
                let _ = (self.parse)(&bytes);
                Ok(())
            })
            .unwrap();
        for stream in self.known {
            self.stream(stream).unwrap();
        }
        let piece = Union::new_weighted(vec![
            (
                self.pieces.len() as u32,
                proptest::sample::select(self.pieces)
                    .prop_map(str::to_owned)
                    .boxed(),
            ),
            (1, "[ -~]{0,12}".boxed()),
        ]);
        let streams = proptest::collection::vec(piece, 0..40);
        runner()
            .run(&streams, |pieces| self.stream(&pieces.concat()))
            .unwrap();
    }

    fn stream(&self, stream: &str) -> Result<(), TestCaseError> {
        let Ok(response) = (self.parse)(stream.as_bytes()) else {
            return Ok(());
        };
        // A response only for a stream that said it was complete.
        prop_assert!(
            self.complete.iter().any(|w| stream.contains(w)),
            "{stream:?}"
        );
        for call in &response.message.tool_calls {
            prop_assert!(!call.tool.is_empty());
            // A blank call id is handed on blank: the run's id source fills it, so that a run
            // with fixed ids replays exactly.
            // With a length stop, no call with incomplete JSON is ever handed on.
            if response.finish_reason == FinishReason::Length && !call.arguments.is_empty() {
                prop_assert!(serde_json::from_str::<serde_json::Value>(&call.arguments).is_ok());
            }
        }
        if response.truncated {
            prop_assert_eq!(response.finish_reason, FinishReason::Length);
        }
        (self.extra)(&response)
    }
}
