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
    /// What abandoned attempts of the call spent, and which model the attempt under way asks.
    /// Boxed: only a retried call has any, and the accumulator is in every waiting run's future.
    retries: Option<Box<Retries>>,
}

/// An abandoned attempt's tokens, with the model that spent them (`None`: the call's own).
pub(crate) type AttemptSpend = (Option<String>, Usage);

/// What a retried call's abandoned attempts spent: added to the answer's own usage (which each
/// attempt's usage events replace), and priced each at its own model's rate.
#[derive(Debug, Default)]
struct Retries {
    /// Each abandoned attempt's tokens, as its retry reported them, with the model that spent
    /// them: the name its provider gave, else the one its retry asked (`None`: the call's own).
    spent: Vec<AttemptSpend>,
    /// The model the attempt under way asks, as the last retry named it (a fallback's next).
    asking: Option<String>,
}

impl Retries {
    fn usage(&self) -> Usage {
        let mut sum = Usage::default();
        for (_, usage) in &self.spent {
            sum.add(usage);
        }
        sum
    }
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
        let mut spent = self
            .retries
            .as_deref()
            .map(Retries::usage)
            .unwrap_or_default();
        spent.add(self.attempt_usage());
        spent
    }

    /// The last usage report of the attempt under way.
    fn attempt_usage(&self) -> &Usage {
        self.whole.as_ref().map_or(&self.usage, |w| &w.usage)
    }

    /// The model the attempt under way is from: the name its provider gave, else the one the
    /// last retry asked; `None` for the call's own model.
    fn attempt_model(&self) -> Option<&str> {
        self.whole
            .as_ref()
            .and_then(|w| w.model.as_deref())
            .or(self.model.as_deref())
            .or_else(|| self.retries.as_ref()?.asking.as_deref())
    }

    /// What each attempt of the call spent so far, by the model that spent it (`None`: the
    /// call's own): the abandoned attempts', then the one under way's. What a failed call is
    /// priced by.
    pub(crate) fn spent_by_model(&self) -> impl Iterator<Item = (Option<&str>, &Usage)> {
        let abandoned = self.retries.iter().flat_map(|r| r.spent.iter());
        abandoned
            .map(|(model, usage)| (model.as_deref(), usage))
            .chain(std::iter::once((
                self.attempt_model(),
                self.attempt_usage(),
            )))
    }

    /// What the call's abandoned attempts spent, each by the model that spent it, and the last
    /// usage report of the attempt under way: `None` when no attempt was abandoned. What an
    /// answer after a retry is priced by, taken before [`Self::finish`] sums them.
    pub(crate) fn retried(&self) -> Option<(&[AttemptSpend], Usage)> {
        let retries = self.retries.as_deref()?;
        Some((&retries.spent, *self.attempt_usage()))
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
                // The attempt so far is void; only what its provider reported spending stays,
                // with the model that spent it (after a fallback, not the one that answers).
                let spent = retry
                    .usage
                    .map(|usage| (self.attempt_model().map(str::to_owned), usage));
                let mut retries = self.retries.take().unwrap_or_default();
                retries.spent.extend(spent);
                retries.asking = Some(retry.model);
                *self = ResponseAccumulator {
                    retries: Some(retries),
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
        if let Some(whole) = self.take_whole() {
            return Ok(*whole);
        }
        let (reason, raw) = self.ending()?;
        Ok(self.assemble(reason, raw))
    }

    /// [`Self::finish`], boxed: a whole response comes in the box it was kept in.
    pub fn finish_boxed(self) -> Result<Box<ModelResponse>, ModelError> {
        self.finish_or_keep().map_err(|(error, _)| error)
    }

    /// [`Self::finish_boxed`], giving the accumulator back with the error: what the attempts
    /// spent is read only when the call failed.
    pub(crate) fn finish_or_keep(mut self) -> Result<Box<ModelResponse>, (ModelError, Self)> {
        if let Some(whole) = self.take_whole() {
            return Ok(whole);
        }
        match self.ending() {
            Ok((reason, raw)) => Ok(Box::new(self.assemble(reason, raw))),
            Err(error) => Err((error, self)),
        }
    }

    /// A whole response, with what retries abandoned before it.
    fn take_whole(&mut self) -> Option<Box<ModelResponse>> {
        let mut whole = self.whole.take()?;
        whole.cached |= self.cached;
        if let Some(retries) = &self.retries {
            whole.usage.add(&retries.usage());
            if whole.model.is_none() {
                whole.model.clone_from(&retries.asking);
            }
        }
        Some(whole)
    }

    /// How the stream's pieces end, when they make a response.
    fn ending(&mut self) -> Result<(FinishReason, Option<String>), ModelError> {
        let Some(ending) = self.finish.take() else {
            return Err(ModelError::new(
                ModelErrorKind::Stream,
                "the model's stream ended before the response was complete",
            ));
        };
        let nameless = self.calls.iter().filter(|c| c.name.is_empty());
        if let Some(index) = nameless.map(|c| c.index).min() {
            self.finish = Some(ending);
            return Err(ModelError::new(
                ModelErrorKind::Stream,
                format!("tool call at index {index} has no name"),
            ));
        }
        // An answer that says it is tool calls, with no call and no text: the calls were lost
        // before they reached the client (a server whose parser read none yet said so, vLLM's
        // required tool choice among them, or a gateway relaying it). Taken as it is, it would
        // be an empty final answer that ends the run as a success.
        let no_calls = self.calls.is_empty() && self.whole_calls.is_empty();
        if ending.0 == FinishReason::ToolCalls && no_calls && self.text.trim().is_empty() {
            let raw = ending.1.as_deref().unwrap_or("none").to_owned();
            self.finish = Some(ending);
            return Err(ModelError::new(
                ModelErrorKind::Stream,
                format!(
                    "the answer finished for tool calls (finish reason {raw:?}) but carried no \
                     tool call and no text"
                ),
            ));
        }
        Ok(ending)
    }

    /// The response the stream's pieces make, once [`Self::ending`] found it whole.
    fn assemble(
        mut self,
        finish_reason: FinishReason,
        raw_finish_reason: Option<String>,
    ) -> ModelResponse {
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
        let mut model = self.model;
        if let Some(retries) = &self.retries {
            self.usage.add(&retries.usage());
            if model.is_none() {
                model.clone_from(&retries.asking);
            }
        }
        ModelResponse {
            message: AssistantMessage {
                reasoning: self.reasoning,
                text: self.text,
                tool_calls,
            },
            usage: self.usage,
            finish_reason,
            raw_finish_reason,
            id: self.id,
            model,
            truncated,
            cut_calls,
            warnings: self.warnings,
            cached: self.cached,
        }
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
    fn a_finish_for_tool_calls_without_a_call_or_text_is_an_error() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::ReasoningDelta("thinking".into()))
            .unwrap();
        acc.push(ModelEvent::TextDelta(" \n".into())).unwrap();
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        let err = acc.finish().unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
        assert!(err.message.contains("no tool call"), "{err}");
        // With text, the text is the answer, whatever the finish says.
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::TextDelta("Sunny.".into())).unwrap();
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        assert_eq!(acc.finish().unwrap().message.text, "Sunny.");
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

    #[test]
    fn each_abandoned_attempt_keeps_the_model_that_spent_it() {
        let mut acc = ResponseAccumulator::new();
        // The first attempt names its model; the second, asked of "m" by the retry, names none.
        acc.push(ModelEvent::Start {
            id: None,
            model: Some("primary-2025-01-01".into()),
        })
        .unwrap();
        acc.push(ModelEvent::Usage(tokens(3, 2))).unwrap();
        acc.push(retrying(Some(tokens(3, 2)))).unwrap();
        acc.push(ModelEvent::Usage(tokens(4, 1))).unwrap();
        let spent: Vec<_> = acc.spent_by_model().map(|(m, u)| (m, *u)).collect();
        assert_eq!(
            spent,
            vec![
                (Some("primary-2025-01-01"), tokens(3, 2)),
                (Some("m"), tokens(4, 1))
            ]
        );
        acc.push(retrying(Some(tokens(4, 1)))).unwrap();
        let (abandoned, _) = acc.retried().unwrap();
        assert_eq!(
            abandoned,
            &[
                (Some("primary-2025-01-01".to_owned()), tokens(3, 2)),
                (Some("m".to_owned()), tokens(4, 1))
            ]
        );
        acc.push(ModelEvent::TextDelta("Whole".into())).unwrap();
        acc.push(ModelEvent::Usage(tokens(5, 5))).unwrap();
        assert_eq!(acc.retried().unwrap().1, tokens(5, 5), "the answer's own");
        acc.push(finish(FinishReason::Stop)).unwrap();
        let r = acc.finish().unwrap();
        assert_eq!(r.usage, tokens(12, 8));
        assert_eq!(
            r.model.as_deref(),
            Some("m"),
            "the model the retry asked answered"
        );
    }

    #[test]
    fn a_call_with_no_retry_is_its_own_models_alone() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::Usage(tokens(3, 2))).unwrap();
        assert!(acc.retried().is_none());
        let spent: Vec<_> = acc.spent_by_model().map(|(m, u)| (m, *u)).collect();
        assert_eq!(spent, vec![(None, tokens(3, 2))]);
        acc.push(finish(FinishReason::Stop)).unwrap();
        assert_eq!(acc.finish().unwrap().model, None);
    }

    #[test]
    fn a_failed_finish_gives_the_accumulator_back_with_what_it_spent() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::Usage(tokens(3, 2))).unwrap();
        acc.push(ModelEvent::ToolCallDelta {
            index: 1,
            arguments: "{}".into(),
        })
        .unwrap();
        let (error, acc) = acc.finish_or_keep().err().unwrap();
        assert!(error.message.contains("ended before"), "{}", error.message);
        assert_eq!(acc.spent(), tokens(3, 2));
        let mut acc = acc;
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        let (error, acc) = acc.finish_or_keep().err().unwrap();
        assert_eq!(error.message, "tool call at index 1 has no name");
        assert_eq!(acc.spent(), tokens(3, 2));
    }
}
