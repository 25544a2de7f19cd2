//! Reading Responses answers: the borrowing wire types of stream events and whole responses, and
//! the pure [`ResponsesStreamParser`] that turns them into [`ModelEvent`]s for the live stream,
//! the in-memory path and whole bodies alike.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use agentloop::message::SmolStr;
use agentloop::{
    ModelError, ModelResponse,
    message::Reasoning,
    model::{FinishReason, ModelErrorKind, ModelEvent, Usage},
};
use serde::Deserialize;
use serde_json::Value;

use super::PROVIDER;
use crate::decode::{StreamDecoder, accumulate_sse, accumulate_whole};
use crate::digest::Digest;
use crate::error::{
    ProviderError, decode_error, error_envelope, in_body_error, reported_error, stream_cut,
    stream_error,
};
use crate::surrogates;
use crate::wire_text::{Channel, Pairs, WireText};

#[derive(Deserialize, Default, Clone, Copy)]
struct TokenDetails {
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    cached_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    input_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    output_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    input_tokens_details: Option<TokenDetails>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    output_tokens_details: Option<TokenDetails>,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Usage {
        Usage {
            input_tokens: u.input_tokens.unwrap_or(0),
            output_tokens: u.output_tokens.unwrap_or(0),
            cached_input_tokens: u
                .input_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: u
                .output_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
struct SummaryPart<'a> {
    #[serde(default, borrow)]
    text: Cow<'a, str>,
}

#[derive(Deserialize)]
struct OutputContent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
}

/// One output item (message, function_call, reasoning...), borrowed.
#[derive(Deserialize)]
struct InItem<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "crate::decode::shared_id")]
    call_id: Option<Arc<str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<ItemArguments<'a>>,
    #[serde(default, borrow)]
    execution: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    /// A `tool_search_output`'s loaded tools.
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default, borrow)]
    summary: Option<Vec<SummaryPart<'a>>>,
    #[serde(default, borrow)]
    encrypted_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    content: Option<Vec<OutputContent<'a>>>,
}

/// A function call's arguments are a JSON string; a tool search call's an object.
#[derive(Deserialize)]
#[serde(untagged)]
enum ItemArguments<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Json(Value),
}

impl InItem<'_> {
    /// A function call's argument string.
    fn arguments_text(&self) -> Option<&str> {
        match &self.arguments {
            Some(ItemArguments::Text(t)) => Some(t),
            _ => None,
        }
    }

    /// A `tool_search_call` or `tool_search_output` item as the API takes it back: the found
    /// tools load from it on later turns.
    fn search_item(&self) -> Value {
        let mut map = serde_json::Map::with_capacity(6);
        map.insert("type".to_owned(), Value::String(self.kind.to_string()));
        let strings = [
            ("id", self.id.as_deref()),
            ("call_id", self.call_id.as_deref()),
            ("execution", self.execution.as_deref()),
            ("status", self.status.as_deref()),
        ];
        for (key, value) in strings {
            if let Some(v) = value {
                map.insert(key.to_owned(), Value::String(v.to_string()));
            }
        }
        if self.kind == "tool_search_call" {
            let arguments = match &self.arguments {
                Some(ItemArguments::Json(v)) => v.clone(),
                Some(ItemArguments::Text(t)) => {
                    serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_string()))
                }
                None => Value::Object(serde_json::Map::new()),
            };
            map.insert("arguments".to_owned(), arguments);
        } else {
            let tools = self
                .tools
                .clone()
                .unwrap_or_else(|| Value::Array(Vec::new()));
            map.insert("tools".to_owned(), tools);
        }
        Value::Object(map)
    }

    fn summary_text(&self) -> String {
        let mut text = String::new();
        for part in self.summary.iter().flatten() {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&part.text);
        }
        text
    }

    /// The item as the API takes it back: type, id, summary and encrypted content.
    fn reasoning_item(&self) -> Value {
        let mut map = serde_json::Map::with_capacity(4);
        map.insert("type".to_owned(), Value::String("reasoning".to_owned()));
        if let Some(id) = &self.id {
            map.insert("id".to_owned(), Value::String(id.to_string()));
        }
        let summary = self
            .summary
            .iter()
            .flatten()
            .map(|p| {
                let mut part = serde_json::Map::with_capacity(2);
                part.insert("type".to_owned(), Value::String("summary_text".to_owned()));
                part.insert("text".to_owned(), Value::String(p.text.to_string()));
                Value::Object(part)
            })
            .collect();
        map.insert("summary".to_owned(), Value::Array(summary));
        if let Some(enc) = &self.encrypted_content {
            map.insert(
                "encrypted_content".to_owned(),
                Value::String(enc.to_string()),
            );
        }
        Value::Object(map)
    }

    /// The visible text of a message item (refusals included) and whether it was a refusal.
    fn message_text(&self) -> (String, bool) {
        let mut text = String::new();
        let mut refused = false;
        for c in self.content.iter().flatten() {
            match &*c.kind {
                "output_text" => text.push_str(c.text.as_deref().unwrap_or_default()),
                "refusal" => {
                    refused = true;
                    text.push_str(c.refusal.as_deref().unwrap_or_default());
                }
                _ => {}
            }
        }
        (text, refused)
    }

    fn reasoning(&self, text: String) -> Reasoning {
        Reasoning {
            text,
            signature: None,
            provider_data: Some(self.reasoning_item()),
        }
    }
}

#[derive(Deserialize)]
struct IncompleteDetails<'a> {
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
}

/// The `response` object of lifecycle events, without its output (the stream already carried
/// it: `O` skips it), or of a whole body, with it (`O` reads it).
#[derive(Deserialize)]
#[serde(bound(deserialize = "O: Deserialize<'de> + Default"))]
struct ResponseHead<'a, O = serde::de::IgnoredAny> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    usage: Option<WireUsage>,
    #[serde(default, borrow)]
    incomplete_details: Option<IncompleteDetails<'a>>,
    #[serde(default)]
    error: Option<Value>,
    /// `completed`, `incomplete`, `failed`: what the response says of itself, whatever the event
    /// that carries it is called.
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(default)]
    output: O,
}

/// One stream event, every kind in one borrowed shape.
#[derive(Deserialize)]
struct InEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    output_index: Option<u32>,
    #[serde(default)]
    summary_index: Option<u32>,
    #[serde(default, borrow)]
    delta: Option<WireText<'a>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    item: Option<InItem<'a>>,
    #[serde(default, borrow)]
    response: Option<ResponseHead<'a>>,
    /// The whole text of `response.output_text.done` (of another shape, none).
    #[serde(default, deserialize_with = "crate::decode::lenient_value")]
    text: Option<String>,
}

/// The output a final event's response carries, read only when the stream carried none of it.
#[derive(Deserialize)]
struct FinalOutput<'a> {
    #[serde(borrow)]
    response: FinalItems<'a>,
}

#[derive(Deserialize)]
struct FinalItems<'a> {
    #[serde(default, borrow)]
    output: Option<Vec<InItem<'a>>>,
}

#[derive(Deserialize)]
struct KindOnly<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

/// The events this parser reads; any other kind is skipped even when its shape is unfamiliar.
const HANDLED: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_part.added",
    "response.reasoning_text.delta",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

/// Maps a response's `status` (and the reason it is incomplete) to the common enum and the raw
/// word we keep (`completed`, `incomplete:max_output_tokens`).
fn finish_of(
    status: &str,
    incomplete_reason: Option<&str>,
    has_calls: bool,
) -> (FinishReason, String) {
    match status {
        "completed" if has_calls => (FinishReason::ToolCalls, "completed".to_owned()),
        "completed" => (FinishReason::Stop, "completed".to_owned()),
        "incomplete" => match incomplete_reason {
            Some(r @ "content_filter") => (FinishReason::ContentFilter, format!("incomplete:{r}")),
            Some(r) => (FinishReason::Length, format!("incomplete:{r}")),
            None => (FinishReason::Length, "incomplete".to_owned()),
        },
        "failed" => (FinishReason::Error, "failed".to_owned()),
        other => (FinishReason::Other, other.to_owned()),
    }
}

fn failure(error: Option<&Value>) -> ModelError {
    let mut error = match error {
        Some(e) => in_body_error(PROVIDER, e),
        None => ProviderError::default().into_model_error(PROVIDER, None),
    };
    if error.message == "the provider reported an error" {
        error.message = "the response failed".to_owned();
    }
    error
}

/// The error of a `failed` response. One whose `error` names nothing (null, absent, `{}`) is a
/// failure on the server's side, [`ModelErrorKind::Server`], retried: the API gives a failure the
/// request caused a code (`invalid_prompt`, `invalid_image`, ...), and the failures seen without
/// one are a bridge's or gateway's whose upstream dropped mid-generation, a 5xx in all but name.
/// It was `model.other`, never retried, and one such blip ended the run.
fn failed(error: Option<&Value>) -> ModelError {
    let named = error.filter(|e| e.as_object().is_none_or(|fields| !fields.is_empty()));
    if named.is_some() {
        return failure(named);
    }
    ModelError::new(
        ModelErrorKind::Server,
        "the response failed and the server said not why (its `error` is null): a failure on \
         its side",
    )
    .with_provider(PROVIDER)
}

/// The error a response that says it is over carries when its status is no answer: `failed`
/// (the provider's error), `cancelled` (cancelled on the server's side: an error, never an
/// empty answer), or a status that is not an end at all (`queued`, `in_progress`: a server that
/// broke the protocol, of kind `malformed`). `None` for `completed`, `incomplete` and statuses
/// this client does not know (their finish is [`FinishReason::Other`]).
fn unfinished(
    status: &str,
    error: Option<&Value>,
    malformed: ModelErrorKind,
) -> Option<ModelError> {
    match status {
        "failed" => Some(failed(error)),
        "cancelled" => {
            let mut error = failure(error);
            if error.message == "the response failed" {
                error.message = "the response was cancelled".to_owned();
            }
            Some(error)
        }
        "queued" | "in_progress" => Some(
            ModelError::new(
                malformed,
                format!(
                    "the response ended with status {status:?}, which is not an end: the server \
                     sent its final event before the response was done"
                ),
            )
            .with_provider(PROVIDER),
        ),
        _ => None,
    }
}

#[derive(Debug)]
struct CallState {
    got_arguments: bool,
    /// The id and name, for the warnings about its arguments.
    id: Arc<str>,
    name: SmolStr,
    /// What the call's deltas passed on: its `done` events' whole arguments are checked
    /// against it.
    streamed: Digest,
    /// A `done` event's arguments differed from the deltas' (said once, for both events).
    contradicted: bool,
}

/// Turns the Responses API's stream events into [`ModelEvent`]s. Pure: no I/O, no clock. Feed it
/// each event's `data` in order, then call [`ResponsesStreamParser::end`] when the stream ends.
#[derive(Debug, Default)]
pub struct ResponsesStreamParser {
    /// The function calls by output index: a stream of many calls is not scanned for each of
    /// their events.
    calls: HashMap<u32, CallState>,
    /// Output indexes of message items whose text was streamed as deltas.
    streamed_text: HashSet<u32>,
    reasoning_streamed: bool,
    refused: bool,
    started: bool,
    /// Some of the output came (an item, a delta, a call): a final event's own copy of the
    /// output is then not read.
    any_output: bool,
    finished: bool,
    failed: bool,
    /// Characters split between two deltas' escapes, half received.
    pairs: Pairs,
}

impl ResponsesStreamParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one event's `data`, pushing what it means onto `out`.
    pub fn push(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        if self.finished || self.failed {
            return Ok(());
        }
        // A lone half of a character in a field read whole (an item's text or arguments, the
        // `*.done` events' whole text) costs that character, not the event, nor a delta's half
        // of a split one.
        let mut repaired = None;
        let parsed = surrogates::event_from_str::<InEvent<'_>>(data, &mut repaired, |t| {
            serde_json::from_str::<InEvent<'_>>(t).map(drop)
        });
        let result = match parsed {
            Ok(event) => self.apply(event, data, out),
            Err(e) => match serde_json::from_str::<KindOnly<'_>>(data) {
                // An event we do not read may have any shape.
                Ok(k) if !HANDLED.contains(&&*k.kind) => Ok(()),
                // A gateway's error envelope in a 200 stream (`{"error": {...}}`, no `type`).
                Err(_) => match error_envelope(data.as_bytes()) {
                    Some(error) => Err(in_body_error(PROVIDER, &error)),
                    None => Err(decode_error(PROVIDER, "stream event", &e)),
                },
                _ => Err(decode_error(PROVIDER, "stream event", &e)),
            },
        };
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn call_mut(&mut self, output_index: u32) -> Option<&mut CallState> {
        self.calls.get_mut(&output_index)
    }

    fn start_call(&mut self, index: u32, item: &InItem<'_>, out: &mut VecDeque<ModelEvent>) {
        self.any_output = true;
        let name = item.name.as_deref().map(SmolStr::new).unwrap_or_default();
        // The id comes whole in this event, read into the `Arc` the call shares.
        let id: Arc<str> = item.call_id.clone().unwrap_or_default();
        out.push_back(ModelEvent::ToolCallStart {
            index,
            id: Arc::clone(&id),
            name: name.clone(),
        });
        self.calls.insert(
            index,
            CallState {
                got_arguments: false,
                id,
                name,
                streamed: Digest::default(),
                contradicted: false,
            },
        );
    }

    fn apply(
        &mut self,
        event: InEvent<'_>,
        data: &str,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        let index = event.output_index.unwrap_or(0);
        match &*event.kind {
            "response.created" | "response.in_progress" if !self.started => {
                self.started = true;
                let head = event.response;
                out.push_back(ModelEvent::Start {
                    id: head
                        .as_ref()
                        .and_then(|h| h.id.as_deref())
                        .map(str::to_owned),
                    model: head
                        .as_ref()
                        .and_then(|h| h.model.as_deref())
                        .map(str::to_owned),
                });
            }
            "response.output_item.added" => {
                let item = event
                    .item
                    .ok_or_else(|| stream_error(PROVIDER, "output_item.added without an item"))?;
                if item.kind == "function_call" {
                    if self.call_mut(index).is_some() {
                        return Err(stream_error(
                            PROVIDER,
                            format!("output item {index} was added twice"),
                        ));
                    }
                    self.start_call(index, &item, out);
                    if let Some(args) = item.arguments_text().filter(|a| !a.is_empty()) {
                        self.arguments(index, WireText::plain(args), out)?;
                    }
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                if event.kind == "response.refusal.delta" {
                    self.refused = true;
                }
                self.streamed_text.insert(index);
                if let Some(d) = event.delta.filter(|d| !d.is_empty()) {
                    self.delta(Channel::Text, d, out);
                }
            }
            // A text that came whole, without deltas (servers that send no others).
            "response.output_text.done" if !self.streamed_text.contains(&index) => {
                self.streamed_text.insert(index);
                if let Some(text) = event.text.filter(|t| !t.is_empty()) {
                    self.delta(Channel::Text, WireText::plain(text), out);
                }
            }
            "response.function_call_arguments.delta" => {
                if let Some(d) = event.delta.filter(|d| !d.is_empty()) {
                    self.arguments(index, d, out)?;
                }
            }
            "response.function_call_arguments.done" => {
                self.call_mut(index).ok_or_else(|| unknown_call(index))?;
                if let Some(args) = event.arguments.filter(|a| !a.is_empty()) {
                    self.whole_arguments(index, &args, out)?;
                }
            }
            "response.reasoning_summary_part.added" if event.summary_index.unwrap_or(0) > 0 => {
                self.delta(Channel::Reasoning, WireText::plain("\n\n"), out);
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                self.reasoning_streamed = true;
                if let Some(d) = event.delta.filter(|d| !d.is_empty()) {
                    self.delta(Channel::Reasoning, d, out);
                }
            }
            "response.output_item.done" => {
                let item = event
                    .item
                    .ok_or_else(|| stream_error(PROVIDER, "output_item.done without an item"))?;
                self.item_done(index, &item, out)?;
            }
            "response.completed" | "response.incomplete" => {
                let head = event
                    .response
                    .ok_or_else(|| stream_error(PROVIDER, "a final event without its response"))?;
                let named = if event.kind == "response.completed" {
                    "completed"
                } else {
                    "incomplete"
                };
                // Some servers name every end `response.completed`, whatever the status it
                // carries (`incomplete` after the output limit, `failed`): the status decides.
                let status = head.status.as_deref().unwrap_or(named).to_owned();
                if let Some(error) =
                    unfinished(&status, head.error.as_ref(), ModelErrorKind::Stream)
                {
                    return Err(error);
                }
                if !self.any_output {
                    // A stream of lifecycle events only, the answer in the final response's
                    // output (minimal servers and bridges): read as a whole response's items,
                    // rather than an empty answer.
                    let mut repaired = None;
                    let last: FinalOutput<'_> = surrogates::from_str(data, &mut repaired)
                        .map_err(|e| decode_error(PROVIDER, "stream event", &e))?;
                    for (index, item) in (0u32..).zip(last.response.output.iter().flatten()) {
                        self.item_done(index, item, out)?;
                    }
                }
                self.finish(&status, &head, out);
            }
            "response.failed" => {
                return Err(failed(
                    event.response.as_ref().and_then(|r| r.error.as_ref()),
                ));
            }
            "error" => return Err(reported_error(PROVIDER, data.as_bytes())),
            _ => {}
        }
        Ok(())
    }

    /// The response ended with this status: its usage, then its finish.
    fn finish<O>(
        &mut self,
        status: &str,
        head: &ResponseHead<'_, O>,
        out: &mut VecDeque<ModelEvent>,
    ) {
        // A character whose second half never came ends the text it was in.
        out.extend(self.pairs.flush_all());
        if let Some(u) = head.usage {
            out.push_back(ModelEvent::Usage(u.into()));
        }
        let reason = head
            .incomplete_details
            .as_ref()
            .and_then(|d| d.reason.as_deref());
        let (mut finish, raw) = finish_of(status, reason, !self.calls.is_empty());
        if self.refused && finish == FinishReason::Stop {
            finish = FinishReason::Refusal;
        }
        out.push_back(ModelEvent::Finish {
            reason: finish,
            raw: Some(raw),
        });
        self.finished = true;
    }

    /// Adds a delta's text to its channel (what it completes of a character split with the last
    /// one, without the half it leaves for the next).
    fn delta(&mut self, channel: Channel, delta: WireText<'_>, out: &mut VecDeque<ModelEvent>) {
        self.any_output = true;
        let text = self.pairs.join(channel, delta);
        if !text.is_empty() {
            out.push_back(channel.event(text));
        }
    }

    fn arguments(
        &mut self,
        index: u32,
        args: WireText<'_>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        self.any_output = true;
        let text = self.pairs.join(Channel::Arguments(index), args);
        self.pass_arguments(index, text, out)
    }

    /// Passes on text of a call's arguments, counted in what its deltas carried.
    fn pass_arguments(
        &mut self,
        index: u32,
        text: String,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        let call = self.call_mut(index).ok_or_else(|| unknown_call(index))?;
        call.got_arguments = true;
        call.streamed.add(text.as_bytes());
        if !text.is_empty() {
            out.push_back(Channel::Arguments(index).event(text));
        }
        Ok(())
    }

    /// A call's whole arguments, as its `done` events restate them: the arguments when no delta
    /// carried any; the rest of them when the deltas carried only their head (a gateway that
    /// lost the last delta: read as it came, the call would be broken JSON, and rejected); a
    /// warning when they differ from what streamed, which has reached the caller and stays.
    fn whole_arguments(
        &mut self,
        index: u32,
        whole: &str,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        // A half character the deltas ended on never gets its partner now.
        if let Some(half) = self.pairs.flush(Channel::Arguments(index)) {
            self.pass_arguments(index, half, out)?;
        }
        let call = self.call_mut(index).ok_or_else(|| unknown_call(index))?;
        let streamed = call.streamed;
        if !call.got_arguments || streamed.len == 0 {
            return self.pass_arguments(index, whole.to_owned(), out);
        }
        if streamed == Digest::of(whole.as_bytes()) {
            return Ok(());
        }
        let id = format!("{} ({})", call.id, call.name);
        match whole.get(..streamed.len).zip(whole.get(streamed.len..)) {
            Some((head, rest)) if Digest::of(head.as_bytes()) == streamed => {
                out.push_back(ModelEvent::Warning(format!(
                    "the argument deltas of tool call {id} stopped short of the whole arguments \
                     its done event sent: the rest is read from it"
                )));
                self.pass_arguments(index, rest.to_owned(), out)
            }
            _ if call.contradicted => Ok(()),
            _ => {
                call.contradicted = true;
                out.push_back(ModelEvent::Warning(format!(
                    "the whole arguments of tool call {id} in its done event differ from what \
                     its deltas streamed: the streamed arguments are kept"
                )));
                Ok(())
            }
        }
    }

    fn item_done(
        &mut self,
        index: u32,
        item: &InItem<'_>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        self.any_output = true;
        // A character the item's deltas left half of ends with the item: in its text, in the
        // reasoning its block is about to take, in its call's arguments.
        for channel in [Channel::Text, Channel::Reasoning] {
            if let Some(half) = self.pairs.flush(channel) {
                out.push_back(channel.event(half));
            }
        }
        if let Some(half) = self.pairs.flush(Channel::Arguments(index)) {
            match self.call_mut(index) {
                Some(_) => self.pass_arguments(index, half, out)?,
                None => out.push_back(Channel::Arguments(index).event(half)),
            }
        }
        match &*item.kind {
            "function_call" => {
                if self.call_mut(index).is_none() {
                    self.start_call(index, item, out);
                }
                if let Some(args) = item.arguments_text().filter(|a| !a.is_empty()) {
                    self.whole_arguments(index, args, out)?;
                }
            }
            "reasoning" => {
                // Streamed summary text is taken by the accumulator when the block's text is empty.
                let text = if self.reasoning_streamed {
                    String::new()
                } else {
                    item.summary_text()
                };
                self.reasoning_streamed = false;
                out.push_back(ModelEvent::Reasoning(item.reasoning(text)));
            }
            "message" if !self.streamed_text.contains(&index) => {
                let (text, refused) = item.message_text();
                self.refused |= refused;
                if !text.is_empty() {
                    out.push_back(ModelEvent::TextDelta(text));
                }
            }
            "message" => {}
            // The hosted tool search: kept whole to go back on later turns, never shown.
            "tool_search_call" | "tool_search_output" => {
                out.push_back(ModelEvent::Reasoning(Reasoning {
                    text: String::new(),
                    signature: None,
                    provider_data: Some(item.search_item()),
                }));
            }
            other => out.push_back(ModelEvent::Warning(format!(
                "ignored an output item of unsupported type {other:?}"
            ))),
        }
        Ok(())
    }

    /// The stream ended: fine after `response.completed`/`.incomplete` or an error, otherwise the
    /// response is incomplete and must not be used.
    pub fn end(&mut self, _out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        if self.finished || self.failed {
            return Ok(());
        }
        self.failed = true;
        Err(stream_cut(
            PROVIDER,
            "the stream ended before response.completed",
        ))
    }
}

fn unknown_call(index: u32) -> ModelError {
    stream_error(
        PROVIDER,
        format!("function call arguments for output item {index}, which never started"),
    )
}

impl StreamDecoder for ResponsesStreamParser {
    fn event(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        self.push(data, out)
    }

    fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        ResponsesStreamParser::end(self, out)
    }

    fn over(&self) -> bool {
        self.finished
    }

    /// A whole response is read as the stream of it: its head, each output item done, then its
    /// final status.
    fn whole(&mut self, body: &[u8], out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        // A lone half of a character anywhere in the body (text, arguments, a summary, an id)
        // is U+FFFD: one damaged character does not cost the answer.
        let mut repaired = None;
        let mut head: WholeResponse<'_> = surrogates::from_slice(body, &mut repaired)
            .map_err(|e| decode_error(PROVIDER, "response body", &e))?;
        let output = std::mem::take(&mut head.output);
        let status = head.status.as_deref().unwrap_or("completed");
        // A failed response, or a gateway's error envelope answered with HTTP 200 (no status,
        // no output: read as a response it would be an empty success).
        let envelope = head.status.is_none() && output.is_empty();
        if envelope && head.error.is_some() {
            return Err(failure(head.error.as_ref()));
        }
        if let Some(error) = unfinished(status, head.error.as_ref(), ModelErrorKind::Decode) {
            return Err(error);
        }
        // Neither a status nor an output (`{}`, a proxy's `{"detail": ...}`): no response at all,
        // which read as one would be an empty success.
        if envelope {
            return Err(ModelError::new(
                ModelErrorKind::Decode,
                "the response body is no response: it has neither a status nor an output",
            )
            .with_provider(PROVIDER));
        }
        self.started = true;
        out.push_back(ModelEvent::Start {
            id: head.id.as_deref().map(str::to_owned),
            model: head.model.as_deref().map(str::to_owned),
        });
        for (index, item) in (0u32..).zip(&output) {
            self.item_done(index, item, out)?;
        }
        self.finish(status, &head, out);
        Ok(())
    }
}

/// A whole response: the head that lifecycle events carry, with its output. (Not a flattened
/// head beside the output: flattening buffers the body's values first, where a usage count past
/// f64's range, `1e400`, fails the whole body, and where its lenient reading cannot reach.)
type WholeResponse<'a> = ResponseHead<'a, Vec<InItem<'a>>>;

/// Parses a whole (non-streamed) Responses body, through the stream parser and the accumulator:
/// a response cut off inside a function call's arguments drops that call and is marked truncated.
pub fn parse_response(body: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_whole(body, ResponsesStreamParser::new())
}

/// Parses a whole streamed body held in memory (server-sent events) into a response, the way a
/// streamed call does: for fuzzing, benchmarks and replaying recorded streams.
pub fn parse_stream_bytes(bytes: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_sse(bytes, PROVIDER, ResponsesStreamParser::new())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn events(lines: &[&str]) -> Result<Vec<ModelEvent>, ModelError> {
        crate::decode::decode_all(ResponsesStreamParser::new(), lines)
    }

    #[test]
    fn a_stream_of_lifecycle_events_only_is_read_from_its_final_response() {
        // No item or delta event: the answer is in the final response's output, and is read
        // there (a call and its text), rather than ending as an empty answer.
        let sse = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\",\"output\":[",
            "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Looking.\"}]},",
            "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}]}}\n\n",
        );
        let r = parse_stream_bytes(sse.as_bytes()).unwrap();
        assert_eq!(r.message.text, "Looking.");
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        let call = &r.message.tool_calls[0];
        assert_eq!((&*call.call_id, call.tool.as_str()), ("c1", "f"));
        assert_eq!(call.arguments, r#"{"a":1}"#);
        // Once the stream carried the output, the final response's copy is not read again.
        let streamed = concat!(
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hi.\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[",
            "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi.\"}]}]}}\n\n",
        );
        assert_eq!(
            parse_stream_bytes(streamed.as_bytes())
                .unwrap()
                .message
                .text,
            "Hi."
        );
        // An output of null is none, not a malformed event.
        let null = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":null}}\n\n";
        assert_eq!(
            parse_stream_bytes(null.as_bytes()).unwrap().message.text,
            ""
        );
    }

    #[test]
    fn arguments_done_without_deltas_supplies_the_arguments() {
        let ev = events(&[
            r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"c1","name":"f","arguments":""}}"#,
            r#"{"type":"response.function_call_arguments.done","output_index":0,"arguments":"{\"a\":1}"}"#,
            r#"{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":5,"output_tokens":2,"input_tokens_details":{"cached_tokens":3},"output_tokens_details":{"reasoning_tokens":1}}}}"#,
        ])
        .unwrap();
        assert!(ev.contains(&ModelEvent::ToolCallDelta {
            index: 0,
            arguments: r#"{"a":1}"#.into()
        }));
        let usage = Usage {
            input_tokens: 5,
            output_tokens: 2,
            cached_input_tokens: 3,
            reasoning_tokens: 1,
            ..Default::default()
        };
        assert!(ev.contains(&ModelEvent::Usage(usage)));
        assert_eq!(
            ev.last(),
            Some(&ModelEvent::Finish {
                reason: FinishReason::ToolCalls,
                raw: Some("completed".into())
            })
        );
    }

    #[test]
    fn incomplete_response_is_a_length_stop_with_its_reason() {
        let ev = events(&[
            r#"{"type":"response.output_text.delta","output_index":0,"delta":"Hi"}"#,
            r#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#,
        ])
        .unwrap();
        assert_eq!(
            ev.last(),
            Some(&ModelEvent::Finish {
                reason: FinishReason::Length,
                raw: Some("incomplete:max_output_tokens".into())
            })
        );
    }

    #[test]
    fn failed_response_carries_the_provider_code() {
        let err = events(&[
            r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"boom"}}}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Server);
        assert_eq!(err.provider_code.as_deref(), Some("server_error"));
        assert_eq!(err.message, "boom");
    }

    #[test]
    fn unknown_events_of_any_shape_are_skipped() {
        let ev = events(&[
            r#"{"type":"response.audio.delta","delta":{"odd":true}}"#,
            r#"{"type":"response.completed","response":{"status":"completed"}}"#,
        ])
        .unwrap();
        assert_eq!(ev.len(), 1);
    }

    #[test]
    fn arguments_for_unknown_call_fail_the_stream() {
        let err = events(&[
            r#"{"type":"response.function_call_arguments.delta","output_index":3,"delta":"{"}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
    }

    #[test]
    fn stream_without_completion_fails() {
        let err = events(&[r#"{"type":"response.created","response":{"id":"r"}}"#]).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
    }

    #[test]
    fn truncated_whole_response_drops_the_cut_call() {
        let body = br#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},
            "output":[{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":"}]}"#;
        let r = parse_response(body).unwrap();
        assert!(r.truncated);
        assert!(r.message.tool_calls.is_empty());
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(r.warnings, ["tool call c1 (f) was cut off and dropped"]);
        assert_eq!(
            r.raw_finish_reason.as_deref(),
            Some("incomplete:max_output_tokens")
        );
        let failed = br#"{"status":"failed","error":{"code":"server_error","message":"boom"}}"#;
        assert_eq!(
            parse_response(failed).unwrap_err().kind,
            ModelErrorKind::Server
        );
    }

    #[test]
    fn a_whole_body_with_neither_status_nor_output_is_no_response() {
        for body in [
            &b"{}"[..],
            br#"{"detail":"Not Found"}"#,
            br#"{"id":"r","output":[]}"#,
        ] {
            let err = parse_response(body).unwrap_err();
            assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
        }
        // A status alone is a response, even an empty one.
        let r = parse_response(br#"{"status":"completed","output":[]}"#).unwrap();
        assert_eq!(r.finish_reason, FinishReason::Stop);
    }
}
