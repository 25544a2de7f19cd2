//! A turn the server paused (`stop_reason: "pause_turn"`, when its own loop of server tools ran
//! long) is continued, not taken as the answer: the paused blocks go back unchanged as the last
//! assistant message and the API carries on with the same turn. The call's events are those of
//! one response: the parts' text and blocks in order, their usage summed, the last part's stop.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use agentloop::{
    ModelError, ModelResponse,
    model::{ModelErrorKind, ModelEvent, ModelRequest, ModelStream, Usage},
};
use futures::{StreamExt, stream};
use serde_json::Value;

use super::stream::{AnthropicStreamParser, PAUSE_TURN, PausedContent, take_paused};
use super::{Anthropic, PROVIDER, request};
use crate::decode::post_and_decode;
use crate::error::samples;

/// How many times one turn is continued; a turn still paused after them fails
/// ([`ModelErrorKind::Paused`]) rather than end the run on a turn that never finished.
pub const MAX_PAUSE_CONTINUATIONS: u32 = 8;

/// The call under way: its current part's events, and what the parts before it left.
struct Turn<'a> {
    model: &'a Anthropic,
    request: ModelRequest<'a>,
    /// Every paused part's blocks, as sent: the next request's last assistant message.
    paused: Vec<Value>,
    /// Continuations asked so far.
    continued: u32,
    part: Option<ModelStream<'a>>,
    sink: PausedContent,
    /// The part under way ended paused.
    pausing: bool,
    /// What the parts before this one spent.
    spent_before: Usage,
    /// The latest usage report of the part under way (each replaces the one before).
    part_usage: Usage,
    /// The blocks of the parts before: a later part's tool calls are indexed after them, so
    /// that a call keeps its own place in the one response.
    blocks_before: u32,
    /// The parts before, when they came whole (the server answered one JSON body).
    whole: Option<ModelResponse>,
    /// Some part came as events: the response is the events', and a whole part joins them.
    streamed: bool,
    queue: VecDeque<ModelEvent>,
    done: bool,
}

impl Anthropic {
    /// Opens one part of the turn: the request, with the paused blocks so far.
    fn open_part<'a>(
        &'a self,
        request: &ModelRequest<'a>,
        paused: &[Value],
        sink: &PausedContent,
    ) -> ModelStream<'a> {
        let body = self.encode_continuation(request, paused);
        let decoder = AnthropicStreamParser::keeping_content(Arc::clone(sink));
        let client = if request::uses_tool_search(request) {
            &self.search_client
        } else {
            &self.client
        };
        // The Messages API takes no seed: the server draws its own.
        let sampled = samples(request.settings.temperature, None);
        post_and_decode(client, "/v1/messages", body, decoder, self.stream, sampled)
    }

    /// The call's events, a paused turn continued until it ends (or the bound is met).
    pub(super) fn continued_turn<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let turn = Turn {
            model: self,
            request,
            paused: Vec::new(),
            continued: 0,
            part: None,
            sink: Arc::new(Mutex::new(None)),
            pausing: false,
            spent_before: Usage::default(),
            part_usage: Usage::default(),
            blocks_before: 0,
            whole: None,
            streamed: false,
            queue: VecDeque::new(),
            done: false,
        };
        Box::pin(stream::unfold(turn, |mut turn| async move {
            loop {
                if let Some(event) = turn.queue.pop_front() {
                    return Some((Ok(event), turn));
                }
                if turn.done {
                    return None;
                }
                let part = match &mut turn.part {
                    Some(part) => part,
                    None => turn.part.insert(turn.model.open_part(
                        &turn.request,
                        &turn.paused,
                        &turn.sink,
                    )),
                };
                match part.next().await {
                    Some(Ok(event)) => turn.event(event),
                    Some(Err(e)) => {
                        turn.done = true;
                        return Some((Err(e), turn));
                    }
                    None => {
                        if let Err(e) = turn.part_ended() {
                            turn.done = true;
                            return Some((Err(e), turn));
                        }
                    }
                }
            }
        }))
    }
}

impl Turn<'_> {
    /// One event of the part under way, as the call's.
    fn event(&mut self, event: ModelEvent) {
        let event = match event {
            // The first part's start names the response; a later one would name a part.
            ModelEvent::Start { .. } if self.continued > 0 => return,
            ModelEvent::Usage(usage) => {
                self.part_usage = usage;
                let mut sum = self.spent_before;
                sum.add(&usage);
                ModelEvent::Usage(sum)
            }
            ModelEvent::ToolCallStart { index, id, name } => ModelEvent::ToolCallStart {
                index: index.saturating_add(self.blocks_before),
                id,
                name,
            },
            ModelEvent::ToolCallDelta { index, arguments } => ModelEvent::ToolCallDelta {
                index: index.saturating_add(self.blocks_before),
                arguments,
            },
            ModelEvent::Finish { raw, .. } if raw.as_deref() == Some(PAUSE_TURN) => {
                self.pausing = true;
                return;
            }
            ModelEvent::Response(response) => return self.whole_part(response),
            other => other,
        };
        if let Some(whole) = self.whole.take() {
            // Parts before came whole, this one streams: they go first, as events.
            self.queue.extend(as_events(whole, false));
        }
        self.streamed = true;
        self.queue.push_back(event);
    }

    /// A part that came as one whole response.
    fn whole_part(&mut self, mut response: ModelResponse) {
        let paused = response.raw_finish_reason.as_deref() == Some(PAUSE_TURN);
        if paused {
            self.pausing = true;
            self.part_usage = response.usage;
        }
        if self.streamed {
            // After streamed parts: this one's pieces, as theirs came (its usage summed).
            response.usage.add(&self.spent_before);
            let events = as_events(response, !paused);
            self.queue.extend(events);
            return;
        }
        let joined = match self.whole.take() {
            Some(before) => join(before, response),
            None => response,
        };
        if paused {
            self.whole = Some(joined);
        } else {
            self.queue.push_back(ModelEvent::Response(joined));
        }
    }

    /// The part under way ended: the call too, or the turn goes on with the next part.
    fn part_ended(&mut self) -> Result<(), ModelError> {
        self.part = None;
        if !std::mem::take(&mut self.pausing) {
            self.done = true;
            return Ok(());
        }
        let Some(blocks) = take_paused(&self.sink) else {
            return Err(ModelError::new(
                ModelErrorKind::Stream,
                "the server paused the turn (pause_turn) but its blocks were not read",
            )
            .with_provider(PROVIDER));
        };
        if self.continued >= MAX_PAUSE_CONTINUATIONS {
            return Err(ModelError::new(
                ModelErrorKind::Paused,
                format!(
                    "the server paused the turn (pause_turn) {} times; continued {} times, it \
                     never finished",
                    self.continued.saturating_add(1),
                    MAX_PAUSE_CONTINUATIONS
                ),
            )
            .with_provider(PROVIDER));
        }
        self.continued = self.continued.saturating_add(1);
        self.blocks_before = self
            .blocks_before
            .saturating_add(u32::try_from(blocks.len()).unwrap_or(u32::MAX));
        self.paused.extend(blocks);
        self.spent_before.add(&self.part_usage);
        self.part_usage = Usage::default();
        Ok(())
    }
}

/// Two whole parts of one turn as one response: text, reasoning and calls in order, usage
/// summed, the later part's stop.
fn join(mut before: ModelResponse, after: ModelResponse) -> ModelResponse {
    before.message.text.push_str(&after.message.text);
    before.message.reasoning.extend(after.message.reasoning);
    before.message.tool_calls.extend(after.message.tool_calls);
    before.usage.add(&after.usage);
    before.finish_reason = after.finish_reason;
    before.raw_finish_reason = after.raw_finish_reason;
    before.model = before.model.or(after.model);
    before.truncated |= after.truncated;
    before.cut_calls.extend(after.cut_calls);
    before.warnings.extend(after.warnings);
    before
}

/// A whole part's pieces as the events of a stream, with its finish when `finish` is set. Its
/// calls go whole; a call the limit cut was already dropped from them, with its warning.
fn as_events(response: ModelResponse, finish: bool) -> Vec<ModelEvent> {
    let ModelResponse {
        message,
        usage,
        finish_reason,
        raw_finish_reason,
        warnings,
        ..
    } = response;
    let mut events = Vec::with_capacity(message.reasoning.len() + message.tool_calls.len() + 4);
    if !message.text.is_empty() {
        events.push(ModelEvent::TextDelta(message.text));
    }
    events.extend(message.reasoning.into_iter().map(ModelEvent::Reasoning));
    events.extend(message.tool_calls.into_iter().map(ModelEvent::ToolCall));
    events.extend(warnings.into_iter().map(ModelEvent::Warning));
    events.push(ModelEvent::Usage(usage));
    if finish {
        events.push(ModelEvent::Finish {
            reason: finish_reason,
            raw: raw_finish_reason,
        });
    }
    events
}
