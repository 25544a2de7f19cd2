//! Events into one response: the accumulator every provider uses, so that a stream and a whole
//! body end in the same [`ModelResponse`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{FinishReason, ModelError, ModelErrorKind, ModelEvent, ModelResponse, Usage};
use crate::message::{AssistantMessage, Reasoning, SmolStr, ToolCall};

struct PartialCall {
    index: u32,
    id: Arc<str>,
    name: SmolStr,
    arguments: String,
}

/// True when a call with these arguments, in a response that ended this way, was cut off by the
/// output limit: its arguments are not complete JSON, or it has none at all. Under the limit, a
/// call with no byte of its arguments was cut before they began, never made with none: an empty
/// string would validate against a schema with no required field, and the call would run with
/// arguments the model never wrote. Without the limit, empty arguments are a call made with none
/// (some servers send `""`).
pub fn cut_by_the_limit(finish: FinishReason, arguments: &str) -> bool {
    finish == FinishReason::Length
        && (arguments.trim().is_empty()
            || serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_err())
}

/// How much of an abandoned attempt had streamed when it was discarded
/// ([`ModelEvent::Retrying`]): what a UI that showed it has to take back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discarded {
    /// Characters of visible text.
    #[serde(default)]
    pub text_chars: usize,
    /// Characters of reasoning text.
    #[serde(default)]
    pub reasoning_chars: usize,
    /// Tool calls begun (none of them ran: calls run only after a response is complete).
    #[serde(default)]
    pub tool_calls: usize,
}

impl Discarded {
    /// True when nothing had streamed.
    pub fn is_empty(&self) -> bool {
        *self == Discarded::default()
    }
}

/// Turns a model's events into one [`ModelResponse`]. Every provider uses this one accumulator.
#[derive(Default)]
pub struct ResponseAccumulator {
    id: Option<String>,
    model: Option<String>,
    text: String,
    reasoning: Vec<Reasoning>,
    pending_reasoning: String,
    calls: Vec<PartialCall>,
    /// Where each index's call is in `calls`: a response of many calls is not scanned for each
    /// of their deltas.
    call_at: HashMap<u32, usize>,
    whole_calls: Vec<(usize, ToolCall)>,
    usage: Usage,
    finish: Option<(FinishReason, Option<String>)>,
    warnings: Vec<String>,
    /// Boxed: a whole response is boxed for the run anyway (see [`Self::finish_boxed`]), and
    /// inline it would double the accumulator, which is in every waiting run's future.
    whole: Option<Box<ModelResponse>>,
    cached: bool,
    /// What abandoned attempts of the call spent, as their retries reported it: added to the
    /// answer's own usage, which each attempt's usage events replace. Boxed: only a retried
    /// call has any, and the accumulator is in every waiting run's future.
    abandoned: Option<Box<Usage>>,
}

impl fmt::Debug for ResponseAccumulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseAccumulator")
            .field("text_len", &self.text.len())
            .field("calls", &(self.calls.len() + self.whole_calls.len()))
            .field("finished", &self.finish.is_some())
            .finish()
    }
}

impl ResponseAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// The text received so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How much the attempt under way has streamed: what a [`ModelEvent::Retrying`] now would
    /// discard.
    pub fn streamed(&self) -> Discarded {
        let reasoning = self
            .reasoning
            .iter()
            .map(|r| r.text.chars().count())
            .sum::<usize>()
            .saturating_add(self.pending_reasoning.chars().count());
        let whole_text = self
            .whole
            .as_ref()
            .map_or(0, |w| w.message.text.chars().count());
        Discarded {
            text_chars: self.text.chars().count().saturating_add(whole_text),
            reasoning_chars: reasoning,
            tool_calls: self.calls.len() + self.whole_calls.len(),
        }
    }

    /// The tokens the call's providers reported so far: each abandoned attempt's, and the last
    /// report of the attempt under way (what a failed call spent).
    pub fn spent(&self) -> Usage {
        let mut spent = self.abandoned.as_deref().copied().unwrap_or_default();
        match &self.whole {
            Some(whole) => spent.add(&whole.usage),
            None => spent.add(&self.usage),
        }
        spent
    }

    /// True once the response is complete.
    pub fn is_finished(&self) -> bool {
        self.finish.is_some() || self.whole.is_some()
    }

    /// Applies one event.
    pub fn push(&mut self, event: ModelEvent) -> Result<(), ModelError> {
        match event {
            ModelEvent::Start { id, model } => {
                if id.is_some() {
                    self.id = id;
                }
                if model.is_some() {
                    self.model = model;
                }
            }
            ModelEvent::TextDelta(t) => self.text.push_str(&t),
            ModelEvent::ReasoningDelta(t) => self.pending_reasoning.push_str(&t),
            ModelEvent::Reasoning(mut r) => {
                if r.text.is_empty() {
                    r.text = std::mem::take(&mut self.pending_reasoning);
                } else {
                    self.pending_reasoning.clear();
                }
                self.reasoning.push(r);
            }
            ModelEvent::ToolCallStart { index, id, name } => match self.call_mut(index) {
                Some(call) => {
                    if !id.is_empty() {
                        call.id = id;
                    }
                    if !name.is_empty() {
                        call.name = name;
                    }
                }
                None => self.open_call(PartialCall {
                    index,
                    id,
                    name,
                    arguments: String::new(),
                }),
            },
            ModelEvent::ToolCallDelta { index, arguments } => match self.call_mut(index) {
                Some(call) => call.arguments.push_str(&arguments),
                None => self.open_call(PartialCall {
                    index,
                    id: Arc::default(),
                    name: SmolStr::default(),
                    arguments,
                }),
            },
            ModelEvent::ToolCall(call) => {
                let position = self.calls.len() + self.whole_calls.len();
                self.whole_calls.push((position, call));
            }
            ModelEvent::Usage(u) => self.usage = u,
            ModelEvent::Warning(w) => self.warnings.push(w),
            ModelEvent::Cached => self.cached = true,
            ModelEvent::Finish { reason, raw } => self.finish = Some((reason, raw)),
            ModelEvent::Response(r) => self.whole = Some(Box::new(r)),
            ModelEvent::Retrying(retry) => {
                // The attempt so far is void; only what its provider reported spending stays.
                let mut abandoned = self.abandoned.take();
                if let Some(spent) = &retry.usage {
                    abandoned.get_or_insert_default().add(spent);
                }
                *self = ResponseAccumulator {
                    abandoned,
                    ..ResponseAccumulator::default()
                };
            }
        }
        Ok(())
    }

    fn call_mut(&mut self, index: u32) -> Option<&mut PartialCall> {
        let at = *self.call_at.get(&index)?;
        self.calls.get_mut(at)
    }

    fn open_call(&mut self, call: PartialCall) {
        self.call_at.insert(call.index, self.calls.len());
        self.calls.push(call);
    }

    /// Finishes the response. A stream that never said it was complete is an error, never a
    /// half-applied response.
    pub fn finish(mut self) -> Result<ModelResponse, ModelError> {
        match self.take_whole() {
            Some(whole) => Ok(*whole),
            None => self.assemble(),
        }
    }

    /// [`Self::finish`], boxed: a whole response comes in the box it was kept in.
    pub fn finish_boxed(mut self) -> Result<Box<ModelResponse>, ModelError> {
        match self.take_whole() {
            Some(whole) => Ok(whole),
            None => self.assemble().map(Box::new),
        }
    }

    fn take_whole(&mut self) -> Option<Box<ModelResponse>> {
        let mut whole = self.whole.take()?;
        whole.cached |= self.cached;
        if let Some(abandoned) = &self.abandoned {
            whole.usage.add(abandoned);
        }
        Some(whole)
    }

    /// The response the stream's pieces make.
    fn assemble(mut self) -> Result<ModelResponse, ModelError> {
        let Some((finish_reason, raw_finish_reason)) = self.finish.take() else {
            return Err(ModelError::new(
                ModelErrorKind::Stream,
                "the model's stream ended before the response was complete",
            ));
        };
        if !self.pending_reasoning.is_empty() {
            self.reasoning.push(Reasoning {
                text: std::mem::take(&mut self.pending_reasoning),
                ..Default::default()
            });
        }
        self.calls.sort_by_key(|c| c.index);
        let mut tool_calls: Vec<ToolCall> =
            Vec::with_capacity(self.calls.len() + self.whole_calls.len());
        let mut truncated = false;
        let mut cut_calls = Vec::new();
        for call in self.calls {
            if call.name.is_empty() {
                return Err(ModelError::new(
                    ModelErrorKind::Stream,
                    format!("tool call at index {} has no name", call.index),
                ));
            }
            if cut_by_the_limit(finish_reason, &call.arguments) {
                truncated = true;
                self.warnings.push(format!(
                    "tool call {} ({}) was cut off and dropped",
                    call.id, call.name
                ));
                cut_calls.push(ToolCall {
                    call_id: call.id,
                    tool: call.name,
                    arguments: call.arguments,
                });
                continue;
            }
            tool_calls.push(ToolCall {
                call_id: call.id,
                tool: call.name,
                arguments: call.arguments,
            });
        }
        // Each whole call goes back where it came among the calls (at its position, or last when
        // fewer came before it): a merge, not an insert per call, which would move every call
        // after it. A whole call is cut by the same rule as a streamed one: a decoder that reads
        // calls out of text sends one the limit cut with the text it was cut from.
        let mut streamed = tool_calls.into_iter();
        let mut tool_calls = Vec::with_capacity(streamed.len() + self.whole_calls.len());
        for (position, call) in self.whole_calls {
            if cut_by_the_limit(finish_reason, &call.arguments) {
                truncated = true;
                self.warnings.push(format!(
                    "tool call {} ({}) was cut off and dropped",
                    call.call_id, call.tool
                ));
                cut_calls.push(call);
                continue;
            }
            while tool_calls.len() < position {
                match streamed.next() {
                    Some(before) => tool_calls.push(before),
                    None => break,
                }
            }
            tool_calls.push(call);
        }
        tool_calls.extend(streamed);
        if let Some(abandoned) = &self.abandoned {
            self.usage.add(abandoned);
        }
        Ok(ModelResponse {
            message: AssistantMessage {
                reasoning: self.reasoning,
                text: self.text,
                tool_calls,
            },
            usage: self.usage,
            finish_reason,
            raw_finish_reason,
            id: self.id,
            model: self.model,
            truncated,
            cut_calls,
            warnings: self.warnings,
            cached: self.cached,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn finish(reason: FinishReason) -> ModelEvent {
        ModelEvent::Finish { reason, raw: None }
    }

    #[test]
    fn usage_sums_saturate_instead_of_wrapping_or_panicking() {
        // A hostile server's `"prompt_tokens": 18446744073709551615`.
        let hostile = Usage {
            input_tokens: u64::MAX,
            output_tokens: 5,
            cached_input_tokens: u64::MAX,
            ..Default::default()
        };
        assert_eq!(hostile.total_tokens(), u64::MAX);
        let mut run = Usage {
            input_tokens: 10,
            cached_input_tokens: 1,
            ..Default::default()
        };
        run.add(&hostile);
        run.add(&hostile);
        assert_eq!(run.input_tokens, u64::MAX);
        assert_eq!(run.cached_input_tokens, u64::MAX);
        assert_eq!(run.output_tokens, 10);
        assert_eq!(run.total_tokens(), u64::MAX);
    }

    #[test]
    fn deltas_keyed_by_index_assemble_calls_in_index_order() {
        let mut acc = ResponseAccumulator::new();
        for e in [
            ModelEvent::ToolCallStart {
                index: 2,
                id: "b".into(),
                name: "two".into(),
            },
            ModelEvent::ToolCallStart {
                index: 1,
                id: "a".into(),
                name: "one".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 1,
                arguments: "{\"x\":".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 2,
                arguments: "{}".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 1,
                arguments: "1}".into(),
            },
            ModelEvent::TextDelta("hi".into()),
            ModelEvent::Usage(Usage {
                input_tokens: 3,
                output_tokens: 4,
                ..Usage::default()
            }),
            finish(FinishReason::ToolCalls),
        ] {
            acc.push(e).unwrap();
        }
        let r = acc.finish().unwrap();
        assert_eq!(r.message.tool_calls[0].tool, "one");
        assert_eq!(r.message.tool_calls[0].arguments, "{\"x\":1}");
        assert_eq!(&*r.message.tool_calls[1].call_id, "b");
        assert_eq!(r.message.text, "hi");
        assert_eq!(r.usage.output_tokens, 4);
    }

    #[test]
    fn whole_calls_keep_their_place_among_the_streamed_ones() {
        let whole = |id: &str| {
            ModelEvent::ToolCall(ToolCall {
                call_id: id.into(),
                tool: "w".into(),
                arguments: "{}".into(),
            })
        };
        let start = |index: u32, id: &str| ModelEvent::ToolCallStart {
            index,
            id: id.into(),
            name: "s".into(),
        };
        let mut acc = ResponseAccumulator::new();
        for e in [
            whole("a"),
            start(0, "s1"),
            whole("b"),
            start(5, "s2"),
            start(6, "s3"),
            whole("c"),
            whole("d"),
            finish(FinishReason::ToolCalls),
        ] {
            acc.push(e).unwrap();
        }
        let r = acc.finish().unwrap();
        let ids: Vec<&str> = r.message.tool_calls.iter().map(|c| &*c.call_id).collect();
        assert_eq!(ids, ["a", "s1", "b", "s2", "s3", "c", "d"]);
    }

    #[test]
    fn a_stream_without_a_finish_is_an_error_not_a_half_response() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::TextDelta("partial".into())).unwrap();
        assert_eq!(acc.finish().unwrap_err().kind, ModelErrorKind::Stream);
    }

    #[test]
    fn a_call_cut_off_by_the_token_limit_is_dropped_and_flagged() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::ToolCallStart {
            index: 0,
            id: "ok".into(),
            name: "a".into(),
        })
        .unwrap();
        acc.push(ModelEvent::ToolCallDelta {
            index: 0,
            arguments: "{}".into(),
        })
        .unwrap();
        acc.push(ModelEvent::ToolCallStart {
            index: 1,
            id: "cut".into(),
            name: "b".into(),
        })
        .unwrap();
        acc.push(ModelEvent::ToolCallDelta {
            index: 1,
            arguments: "{\"text\": \"abc".into(),
        })
        .unwrap();
        acc.push(finish(FinishReason::Length)).unwrap();
        let r = acc.finish().unwrap();
        assert!(r.truncated);
        assert_eq!(r.message.tool_calls.len(), 1);
        assert!(!r.warnings.is_empty());
    }

    #[test]
    fn a_call_cut_before_any_byte_of_its_arguments_is_dropped_not_run_with_none() {
        let call = |acc: &mut ResponseAccumulator, index: u32, id: &str| {
            acc.push(ModelEvent::ToolCallStart {
                index,
                id: id.into(),
                name: "now".into(),
            })
            .unwrap();
        };
        let mut acc = ResponseAccumulator::new();
        call(&mut acc, 0, "cut");
        acc.push(finish(FinishReason::Length)).unwrap();
        let r = acc.finish().unwrap();
        assert!(r.truncated);
        assert!(r.message.tool_calls.is_empty());
        assert_eq!(r.cut_calls.len(), 1);
        assert_eq!(&*r.cut_calls[0].call_id, "cut");

        // Without the output limit, empty arguments are a call made with none.
        let mut acc = ResponseAccumulator::new();
        call(&mut acc, 0, "whole");
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        let r = acc.finish().unwrap();
        assert!(!r.truncated);
        assert_eq!(r.message.tool_calls.len(), 1);
    }

    #[test]
    fn empty_ids_stay_empty_for_the_run_to_fill_and_reasoning_blocks_keep_streamed_text() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::ReasoningDelta("think".into()))
            .unwrap();
        acc.push(ModelEvent::Reasoning(Reasoning {
            signature: Some("sig".into()),
            ..Default::default()
        }))
        .unwrap();
        acc.push(ModelEvent::ToolCallStart {
            index: 0,
            id: "".into(),
            name: "a".into(),
        })
        .unwrap();
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        let r = acc.finish().unwrap();
        // The run fills blank ids from its injected id source, so that a replay is exact.
        assert_eq!(&*r.message.tool_calls[0].call_id, "");
        assert_eq!(r.message.reasoning[0].text, "think");
        assert_eq!(r.message.reasoning[0].signature.as_deref(), Some("sig"));
    }

    #[test]
    fn a_whole_call_cut_off_by_the_token_limit_is_dropped_like_a_streamed_one() {
        let whole = |id: &str, arguments: &str| {
            ModelEvent::ToolCall(ToolCall {
                call_id: id.into(),
                tool: "shell".into(),
                arguments: arguments.into(),
            })
        };
        let mut acc = ResponseAccumulator::new();
        acc.push(whole("ok", r#"{"command":"ls"}"#)).unwrap();
        acc.push(whole("cut", r#"{"command": "rm -rf build""#))
            .unwrap();
        acc.push(finish(FinishReason::Length)).unwrap();
        let r = acc.finish().unwrap();
        assert!(r.truncated);
        let ids = |calls: &[ToolCall]| {
            calls
                .iter()
                .map(|c| c.call_id.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&r.message.tool_calls), ["ok"]);
        assert_eq!(ids(&r.cut_calls), ["cut"]);

        // Without the limit the same call is the model's, to be checked against its schema.
        let mut acc = ResponseAccumulator::new();
        acc.push(whole("bad", "{")).unwrap();
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        let r = acc.finish().unwrap();
        assert!(!r.truncated);
        assert_eq!(r.message.tool_calls.len(), 1);
    }

    #[test]
    fn a_call_without_a_name_is_an_error() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::ToolCallDelta {
            index: 0,
            arguments: "{}".into(),
        })
        .unwrap();
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        assert!(acc.finish().is_err());
    }

    fn retrying(usage: Option<Usage>) -> ModelEvent {
        ModelEvent::Retrying(Box::new(super::super::ModelRetry {
            retry: 1,
            model: "m".into(),
            error: ModelError::new(ModelErrorKind::Overloaded, "busy"),
            delay: std::time::Duration::ZERO,
            usage,
        }))
    }

    fn tokens(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn a_retry_voids_what_streamed_and_keeps_only_the_tokens_it_reported() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::Usage(tokens(10, 1))).unwrap();
        acc.push(ModelEvent::TextDelta("Half é".into())).unwrap();
        acc.push(ModelEvent::ReasoningDelta("hmm".into())).unwrap();
        acc.push(ModelEvent::ToolCallStart {
            index: 0,
            id: "c1".into(),
            name: "t".into(),
        })
        .unwrap();
        assert_eq!(
            acc.streamed(),
            Discarded {
                text_chars: 6,
                reasoning_chars: 3,
                tool_calls: 1
            }
        );
        acc.push(retrying(Some(tokens(10, 1)))).unwrap();
        assert!(acc.streamed().is_empty());
        // A retry before the first byte reports nothing.
        acc.push(retrying(None)).unwrap();
        acc.push(ModelEvent::Usage(tokens(12, 1))).unwrap();
        acc.push(ModelEvent::TextDelta("Whole".into())).unwrap();
        acc.push(ModelEvent::Usage(tokens(12, 5))).unwrap();
        acc.push(finish(FinishReason::Stop)).unwrap();
        let r = acc.finish().unwrap();
        assert_eq!(r.message.text, "Whole");
        assert!(r.message.reasoning.is_empty() && r.message.tool_calls.is_empty());
        assert_eq!(r.usage, tokens(22, 6), "each attempt's last report, once");
    }

    #[test]
    fn a_whole_response_after_a_retry_carries_the_abandoned_tokens() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::TextDelta("Half".into())).unwrap();
        acc.push(retrying(Some(tokens(3, 2)))).unwrap();
        let mut whole = ModelResponse::text("Whole");
        whole.usage = tokens(5, 5);
        acc.push(ModelEvent::Response(whole)).unwrap();
        let r = acc.finish().unwrap();
        assert_eq!((r.message.text.as_str(), r.usage), ("Whole", tokens(8, 7)));
    }
}
