//! Reading Messages answers: the borrowing wire types of stream events and whole messages, and
//! the pure [`AnthropicStreamParser`] that turns them into [`ModelEvent`]s for the live stream,
//! the in-memory path and whole bodies alike. Usage is converted here to the meaning
//! [`agentloop::model::Usage`] has on every provider.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

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
use crate::error::{
    decode_error, error_envelope, in_body_error, reported_error, stream_cut, stream_error,
};
use crate::surrogates;
use crate::wire_text::{Channel, Pairs, WireText};

/// Anthropic's usage object. Its `input_tokens` leaves out cache reads and writes; later events
/// repeat or add counts, so the parser keeps the latest of each and converts at the wire.
#[derive(Debug, Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    input_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    output_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    cache_read_input_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    cache_creation_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Takes the counts `newer` carries (absent ones are kept).
    fn update(&mut self, newer: WireUsage) {
        self.input_tokens = newer.input_tokens.or(self.input_tokens);
        self.output_tokens = newer.output_tokens.or(self.output_tokens);
        self.cache_read_input_tokens = newer
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
        self.cache_creation_input_tokens = newer
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
    }

    /// The counts as [`Usage`] means them on every provider: cache reads and writes are part of
    /// the input.
    fn to_usage(self) -> Usage {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        let write = self.cache_creation_input_tokens.unwrap_or(0);
        Usage {
            input_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(read)
                .saturating_add(write),
            output_tokens: self.output_tokens.unwrap_or(0),
            cached_input_tokens: read,
            cache_write_tokens: write,
            reasoning_tokens: 0,
        }
    }
}

/// A content block, as `content_block_start` and whole responses carry it.
#[derive(Deserialize)]
struct InBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "crate::decode::shared_id")]
    id: Option<Arc<str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    data: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(default)]
    content: Option<Value>,
    /// An MCP call's server (`mcp_tool_use`): it goes back with the block.
    #[serde(default, borrow)]
    server_name: Option<Cow<'a, str>>,
    /// Whether an MCP call failed (`mcp_tool_result`): it goes back with the block.
    #[serde(default)]
    is_error: Option<bool>,
}

/// A message as `message_start` carries it (its content skipped: `C` ignores it), or a whole
/// message with its content (`C` reads it). One struct rather than a head flattened into the
/// whole message: flattening buffers the body's values first, where a usage count past f64's
/// range (`1e400`) fails the whole body, and where its lenient reading cannot reach.
#[derive(Deserialize)]
#[serde(bound(deserialize = "C: Deserialize<'de> + Default"))]
struct MessageHead<'a, C = serde::de::IgnoredAny> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    usage: Option<WireUsage>,
    #[serde(default)]
    content: C,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    error: Option<Value>,
}

/// A whole message: its head with its content.
type WholeMessage<'a> = MessageHead<'a, Option<Vec<InBlock<'a>>>>;

/// The `delta` of `content_block_delta` and of `message_delta`, in one shape.
#[derive(Deserialize)]
struct InDelta<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<WireText<'a>>,
    #[serde(default, borrow)]
    partial_json: Option<WireText<'a>>,
    #[serde(default, borrow)]
    thinking: Option<WireText<'a>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
    /// A `citations_delta`'s citation, kept only in a paused turn's blocks.
    #[serde(default)]
    citation: Option<Value>,
}

/// One stream event, every kind in one borrowed shape (a single pass, no intermediate tree).
#[derive(Deserialize)]
struct InEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    message: Option<MessageHead<'a>>,
    #[serde(default, borrow)]
    content_block: Option<InBlock<'a>>,
    #[serde(default, borrow)]
    delta: Option<InDelta<'a>>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    usage: Option<WireUsage>,
}

/// Maps Anthropic's `stop_reason` to the common enum.
pub fn map_stop_reason(raw: &str) -> FinishReason {
    match raw {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "refusal" => FinishReason::Refusal,
        _ => FinishReason::Other,
    }
}

#[derive(Debug)]
enum BlockState {
    Text,
    ToolUse {
        /// The call's id, shared with its event: a warning may name it.
        id: Arc<str>,
        got_args: bool,
        initial_input: Option<String>,
        stopped: bool,
    },
    Thinking {
        signature: Option<String>,
    },
    RedactedThinking {
        data: String,
    },
    /// A tool the server runs itself was called (its tool search, web search or fetch, code
    /// execution: `server_tool_use`; an MCP connector's call: `mcp_tool_use`): its input
    /// streams as JSON like a `tool_use`'s.
    ServerUse {
        kind: String,
        id: String,
        name: String,
        server_name: Option<String>,
        initial_input: Option<Value>,
        json: String,
    },
    /// Such a tool answered (whole in its start: `web_search_tool_result`,
    /// `tool_search_tool_result`, `mcp_tool_result`, ...).
    ServerResult {
        kind: String,
        tool_use_id: String,
        content: Value,
        is_error: Option<bool>,
    },
    Ignored,
}

/// The raw stop reason of a turn the server paused: its blocks go back to continue it.
pub(crate) const PAUSE_TURN: &str = "pause_turn";

/// Where a parser that keeps its blocks puts the content of a paused turn (`stop_reason:
/// "pause_turn"`), as the server sent it, for the request that continues the turn. Shared: a
/// whole body's parser is consumed where the body is read.
pub(crate) type PausedContent = Arc<Mutex<Option<Vec<Value>>>>;

/// Takes what a parser left in `paused`.
pub(crate) fn take_paused(paused: &PausedContent) -> Option<Vec<Value>> {
    paused.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// The blocks of a stream rebuilt as the server sent them: each block's start, with the text,
/// thinking, signature, citations and input its deltas streamed.
#[derive(Debug, Default)]
struct KeptContent {
    /// In the order the blocks started (the order of the parser's own blocks), with the input
    /// JSON streamed to each.
    blocks: Vec<(Value, String)>,
    sink: PausedContent,
}

impl KeptContent {
    /// Appends `piece` to the string field `field` of the block at `at`.
    fn append(&mut self, at: Option<usize>, field: &str, piece: &str) {
        let Some(Value::Object(block)) =
            at.and_then(|at| self.blocks.get_mut(at)).map(|b| &mut b.0)
        else {
            return;
        };
        match block.get_mut(field) {
            Some(Value::String(s)) => s.push_str(piece),
            _ => {
                block.insert(field.to_owned(), Value::String(piece.to_owned()));
            }
        }
    }
}

/// Turns Anthropic's stream events into [`ModelEvent`]s. Pure: no I/O, no clock. Feed it each
/// event's `data` in order, then call [`AnthropicStreamParser::end`] when the stream ends.
#[derive(Debug, Default)]
pub struct AnthropicStreamParser {
    /// The blocks in the order they started.
    blocks: Vec<(u32, BlockState)>,
    /// Where each block index is in `blocks`: a stream of many blocks is not scanned for each of
    /// their events.
    block_at: HashMap<u32, usize>,
    /// The latest count of each kind, as Anthropic reports them.
    usage: WireUsage,
    stop_reason: Option<String>,
    stopped: bool,
    failed: bool,
    /// Characters split between two deltas' escapes, half received.
    pairs: Pairs,
    /// The blocks as sent, when a paused turn is to be continued (`None`: the usual parse, which
    /// keeps no second copy). Boxed: most parsers keep none.
    kept: Option<Box<KeptContent>>,
}

impl AnthropicStreamParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that also rebuilds the blocks as the server sent them and, if the answer is a
    /// paused turn, leaves them in `sink`.
    pub(crate) fn keeping_content(sink: PausedContent) -> Self {
        AnthropicStreamParser {
            kept: Some(Box::new(KeptContent {
                blocks: Vec::new(),
                sink,
            })),
            ..Self::default()
        }
    }

    fn start_block(
        &mut self,
        index: u32,
        block: InBlock<'_>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        if self.block_at.contains_key(&index) {
            return Err(stream_error(
                PROVIDER,
                format!("content block {index} started twice"),
            ));
        }
        let state = match &*block.kind {
            "text" => {
                if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                    out.push_back(ModelEvent::TextDelta(text.into_owned()));
                }
                BlockState::Text
            }
            "tool_use" => {
                // The id comes whole in this event, read into the `Arc` the call shares.
                let id = block.id.unwrap_or_default();
                let name = block.name.as_deref().map(SmolStr::new).unwrap_or_default();
                out.push_back(ModelEvent::ToolCallStart {
                    index,
                    id: Arc::clone(&id),
                    name,
                });
                let initial_input = block
                    .input
                    .filter(|v| !matches!(v, Value::Object(m) if m.is_empty()) && !v.is_null())
                    .map(|v| v.to_string());
                BlockState::ToolUse {
                    id,
                    got_args: false,
                    initial_input,
                    stopped: false,
                }
            }
            "thinking" => {
                if let Some(t) = block.thinking.filter(|t| !t.is_empty()) {
                    out.push_back(ModelEvent::ReasoningDelta(t.into_owned()));
                }
                BlockState::Thinking {
                    signature: block.signature.map(Cow::into_owned),
                }
            }
            "redacted_thinking" => BlockState::RedactedThinking {
                data: block.data.map(Cow::into_owned).unwrap_or_default(),
            },
            kind @ ("server_tool_use" | "mcp_tool_use") => BlockState::ServerUse {
                kind: kind.to_owned(),
                id: block.id.as_deref().map(str::to_owned).unwrap_or_default(),
                name: block.name.map(Cow::into_owned).unwrap_or_default(),
                server_name: block.server_name.map(Cow::into_owned),
                initial_input: block.input,
                json: String::new(),
            },
            kind if is_server_result(kind) => BlockState::ServerResult {
                kind: kind.to_owned(),
                tool_use_id: block.tool_use_id.map(Cow::into_owned).unwrap_or_default(),
                content: block.content.unwrap_or(Value::Null),
                is_error: block.is_error,
            },
            other => {
                out.push_back(ModelEvent::Warning(format!(
                    "ignored a content block of unsupported type {other:?}"
                )));
                BlockState::Ignored
            }
        };
        self.block_at.insert(index, self.blocks.len());
        self.blocks.push((index, state));
        Ok(())
    }

    fn delta(
        &mut self,
        index: u32,
        delta: InDelta<'_>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        let block = find_block(&mut self.blocks, &self.block_at, index)?;
        let pairs = &mut self.pairs;
        let at = self.block_at.get(&index).copied();
        let mut kept = self.kept.as_deref_mut();
        match delta.kind.as_deref() {
            Some("text_delta") => {
                if let Some(t) = delta.text.filter(|t| !t.is_empty()) {
                    let text = pairs.join(Channel::Text, t);
                    if let Some(kept) = kept {
                        kept.append(at, "text", &text);
                    }
                    if !text.is_empty() {
                        out.push_back(ModelEvent::TextDelta(text));
                    }
                }
            }
            Some("input_json_delta") => {
                if let BlockState::ServerUse { json, .. } = block {
                    if let Some(part) = delta.partial_json {
                        let part = pairs.join(Channel::Arguments(index), part);
                        if let Some(kept) = kept {
                            kept_json(kept, at, &part);
                        }
                        json.push_str(&part);
                    }
                    return Ok(());
                }
                // The input of a block ignored at its start (a server tool other than tool
                // search, an MCP call a gateway added) is ignored with it, but for a paused
                // turn's continuation, which sends the block back as it came.
                if matches!(block, BlockState::Ignored) {
                    if let (Some(kept), Some(part)) = (kept, delta.partial_json) {
                        let part = pairs.join(Channel::Arguments(index), part);
                        kept_json(kept, at, &part);
                    }
                    return Ok(());
                }
                let BlockState::ToolUse { got_args, .. } = block else {
                    return Err(stream_error(
                        PROVIDER,
                        format!(
                            "input_json_delta for content block {index}, which is not a tool_use"
                        ),
                    ));
                };
                if let Some(json) = delta.partial_json.filter(|j| !j.is_empty()) {
                    *got_args = true;
                    let arguments = pairs.join(Channel::Arguments(index), json);
                    if let Some(kept) = kept.as_deref_mut() {
                        kept_json(kept, at, &arguments);
                    }
                    if !arguments.is_empty() {
                        out.push_back(ModelEvent::ToolCallDelta { index, arguments });
                    }
                }
            }
            Some("thinking_delta") => {
                if let Some(t) = delta.thinking.filter(|t| !t.is_empty()) {
                    let text = pairs.join(Channel::Reasoning, t);
                    if let Some(kept) = kept {
                        kept.append(at, "thinking", &text);
                    }
                    if !text.is_empty() {
                        out.push_back(ModelEvent::ReasoningDelta(text));
                    }
                }
            }
            Some("signature_delta") => {
                if let Some(kept) = kept
                    && let Some(s) = &delta.signature
                {
                    kept.append(at, "signature", s);
                }
                if let (BlockState::Thinking { signature }, Some(s)) = (block, delta.signature) {
                    signature.get_or_insert_with(String::new).push_str(&s);
                }
            }
            Some("citations_delta") => {
                // Nothing of the answer's own: a paused turn's text block goes back with them.
                if let Some(kept) = kept
                    && let Some(citation) = delta.citation
                    && let Some(Value::Object(block)) =
                        at.and_then(|at| kept.blocks.get_mut(at)).map(|b| &mut b.0)
                {
                    match block.get_mut("citations") {
                        Some(Value::Array(list)) => list.push(citation),
                        _ => {
                            block.insert("citations".to_owned(), Value::Array(vec![citation]));
                        }
                    }
                }
            }
            _ => {} // future delta kinds carry nothing we keep
        }
        Ok(())
    }

    fn stop_block(&mut self, index: u32, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        let block = find_block(&mut self.blocks, &self.block_at, index)?;
        let at = self.block_at.get(&index).copied();
        // A character the block's deltas left half of ends with the block: in its text, in the
        // reasoning its block is about to take, in its call's arguments (or its search's input).
        for channel in [Channel::Text, Channel::Reasoning, Channel::Arguments(index)] {
            let Some(half) = self.pairs.flush(channel) else {
                continue;
            };
            if let Some(kept) = self.kept.as_deref_mut() {
                match channel {
                    Channel::Text => kept.append(at, "text", &half),
                    Channel::Reasoning => kept.append(at, "thinking", &half),
                    Channel::Arguments(_) => kept_json(kept, at, &half),
                }
            }
            match &mut *block {
                BlockState::ServerUse { json, .. } if channel == Channel::Arguments(index) => {
                    json.push_str(&half);
                }
                BlockState::Ignored if channel == Channel::Arguments(index) => {}
                _ => out.push_back(channel.event(half)),
            }
        }
        if let Some(kept) = self.kept.as_deref_mut()
            && let Some((Value::Object(raw), json)) = at.and_then(|at| kept.blocks.get_mut(at))
            && !json.trim().is_empty()
        {
            // Input that is no JSON stays as the block's start gave it: the server's own
            // check of the continuation then says what is wrong, not a guess of ours.
            if let Ok(input) = serde_json::from_str::<Value>(json) {
                raw.insert("input".to_owned(), input);
            }
        }
        match block {
            BlockState::ToolUse {
                got_args,
                initial_input,
                stopped,
                ..
            } => {
                *stopped = true;
                if !*got_args && let Some(input) = initial_input.take() {
                    out.push_back(ModelEvent::ToolCallDelta {
                        index,
                        arguments: input,
                    });
                }
            }
            BlockState::Thinking { signature } => {
                // Empty text: the accumulator takes the thinking streamed since the last block.
                out.push_back(ModelEvent::Reasoning(Reasoning {
                    text: String::new(),
                    signature: signature.take(),
                    provider_data: None,
                }));
            }
            BlockState::RedactedThinking { data } => {
                let data = std::mem::take(data);
                out.push_back(ModelEvent::Reasoning(redacted(data)));
            }
            BlockState::ServerUse {
                kind,
                id,
                name,
                server_name,
                initial_input,
                json,
            } => {
                let input = if json.trim().is_empty() {
                    initial_input
                        .take()
                        .unwrap_or_else(|| serde_json::json!({}))
                } else {
                    serde_json::from_str(json)
                        .map_err(|e| decode_error(PROVIDER, "a server tool's streamed input", &e))?
                };
                let mut block = serde_json::json!({
                    "type": std::mem::take(kind),
                    "id": std::mem::take(id),
                    "name": std::mem::take(name),
                    "input": input,
                });
                if let (Some(server), Value::Object(map)) = (server_name.take(), &mut block) {
                    map.insert("server_name".to_owned(), Value::String(server));
                }
                out.push_back(ModelEvent::Reasoning(server_block(block)));
            }
            BlockState::ServerResult {
                kind,
                tool_use_id,
                content,
                is_error,
            } => {
                let mut block = serde_json::json!({
                    "type": std::mem::take(kind),
                    "tool_use_id": std::mem::take(tool_use_id),
                    "content": std::mem::take(content),
                });
                if let (Some(failed), Value::Object(map)) = (is_error.take(), &mut block) {
                    map.insert("is_error".to_owned(), Value::Bool(failed));
                }
                out.push_back(ModelEvent::Reasoning(server_block(block)));
            }
            BlockState::Text | BlockState::Ignored => {}
        }
        Ok(())
    }

    fn usage(&mut self, newer: WireUsage, out: &mut VecDeque<ModelEvent>) {
        self.usage.update(newer);
        out.push_back(ModelEvent::Usage(self.usage.to_usage()));
    }

    fn message_start<C>(&mut self, head: MessageHead<'_, C>, out: &mut VecDeque<ModelEvent>) {
        out.push_back(ModelEvent::Start {
            id: head.id.map(Cow::into_owned),
            model: head.model.map(Cow::into_owned),
        });
        if let Some(u) = head.usage {
            self.usage(u, out);
        }
    }

    fn message_stop(&mut self, out: &mut VecDeque<ModelEvent>) {
        self.stopped = true;
        out.extend(self.pairs.flush_all());
        let mut cut_off = false;
        let mut has_tools = false;
        for (_, block) in &self.blocks {
            if let BlockState::ToolUse { id, stopped, .. } = block {
                has_tools = true;
                if !stopped {
                    cut_off = true;
                    out.push_back(ModelEvent::Warning(format!(
                        "tool_use {id} has no content_block_stop"
                    )));
                }
            }
        }
        let raw = self.stop_reason.take();
        if raw.as_deref() == Some(PAUSE_TURN)
            && let Some(kept) = self.kept.take()
        {
            let blocks = kept.blocks.into_iter().map(|(raw, _)| raw).collect();
            *kept.sink.lock().unwrap_or_else(PoisonError::into_inner) = Some(blocks);
        }
        let mut reason = match raw.as_deref() {
            Some(r) => map_stop_reason(r),
            None => {
                out.push_back(ModelEvent::Warning(
                    "the response carried no stop_reason".to_owned(),
                ));
                if has_tools {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Stop
                }
            }
        };
        // A tool_use never closed was cut off: report it as a length stop so that a call whose
        // JSON is incomplete is dropped, never executed.
        if cut_off {
            reason = FinishReason::Length;
        }
        out.push_back(ModelEvent::Finish { reason, raw });
    }

    /// Applies one event's `data`, pushing what it means onto `out`.
    pub fn push(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        if self.stopped || self.failed {
            return Ok(()); // nothing after message_stop or an error counts
        }
        // A lone half of a character in a field read whole (a block's text, a tool_use's
        // input, an id) costs that character, not the event, nor a delta's half of a split one.
        let mut repaired = None;
        let event: InEvent<'_> = match surrogates::event_from_str(data, &mut repaired, |t| {
            serde_json::from_str::<InEvent<'_>>(t).map(drop)
        }) {
            Ok(event) => event,
            Err(e) => {
                self.failed = true;
                // A gateway's error envelope in a 200 stream (`{"error": {...}}`, no `type`):
                // the error it reports, not a malformed event.
                return Err(match error_envelope(data.as_bytes()) {
                    Some(error) => in_body_error(PROVIDER, &error),
                    None => decode_error(PROVIDER, "stream event", &e),
                });
            }
        };
        let result = self.apply(event, data, out);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn apply(
        &mut self,
        event: InEvent<'_>,
        data: &str,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        let index = event.index.unwrap_or(0);
        match &*event.kind {
            "message_start" => {
                let head = event
                    .message
                    .ok_or_else(|| stream_error(PROVIDER, "message_start without a message"))?;
                self.message_start(head, out);
            }
            "content_block_start" => {
                let block = event
                    .content_block
                    .ok_or_else(|| stream_error(PROVIDER, "content_block_start without a block"))?;
                self.start_block(index, block, out)?;
                if let Some(kept) = self.kept.as_deref_mut() {
                    // The block as sent, every field of it (the borrowed one keeps only those
                    // the answer reads): one more parse of the event, only when keeping.
                    let raw = serde_json::from_str::<RawStart>(data)
                        .map(|e| e.content_block)
                        .unwrap_or(Value::Null);
                    kept.blocks.push((raw, String::new()));
                }
            }
            "content_block_delta" => {
                let delta = event
                    .delta
                    .ok_or_else(|| stream_error(PROVIDER, "content_block_delta without a delta"))?;
                self.delta(index, delta, out)?;
            }
            "content_block_stop" => self.stop_block(index, out)?,
            "message_delta" => {
                if let Some(reason) = event.delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason.into_owned());
                }
                if let Some(u) = event.usage {
                    self.usage(u, out);
                }
            }
            "message_stop" => self.message_stop(out),
            "error" => return Err(reported_error(PROVIDER, data.as_bytes())),
            _ => {} // ping and future event kinds
        }
        Ok(())
    }

    /// The stream ended: fine after `message_stop` or an error, otherwise the response is
    /// incomplete and must not be used.
    pub fn end(&mut self, _out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        if self.stopped || self.failed {
            return Ok(());
        }
        self.failed = true;
        Err(stream_cut(PROVIDER, "the stream ended before message_stop"))
    }
}

impl StreamDecoder for AnthropicStreamParser {
    fn event(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        self.push(data, out)
    }

    fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        AnthropicStreamParser::end(self, out)
    }

    fn over(&self) -> bool {
        self.stopped
    }

    /// A whole message is read as the stream of it: `message_start`, each block started and
    /// stopped, the stop reason, `message_stop`.
    fn whole(&mut self, body: &[u8], out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        // A lone half of a character anywhere in the body (text, thinking, a tool_use's input,
        // an id) is U+FFFD: one damaged character does not cost the answer.
        let mut repaired = None;
        let mut message: WholeMessage<'_> = surrogates::from_slice(body, &mut repaired)
            .map_err(|e| decode_error(PROVIDER, "response body", &e))?;
        let is_message = message.kind.as_deref() == Some("message");
        // An error body (`"type": "error"`), or a gateway's bare envelope answered with HTTP 200
        // (`{"error": {...}}`): read as a message either would be an empty success.
        if message.kind.as_deref() == Some("error")
            || (!is_message && message.error.as_ref().is_some_and(|e| !e.is_null()))
        {
            return Err(reported_error(PROVIDER, body));
        }
        // Any other JSON that is no message (`{}`, a proxy's `{"detail": ...}`) is no answer.
        let content = match message.content.take() {
            Some(content) => content,
            None if is_message => Vec::new(),
            None => {
                return Err(ModelError::new(
                    ModelErrorKind::Decode,
                    "the response body is no message: it has neither a type nor content",
                )
                .with_provider(PROVIDER));
            }
        };
        let paused = message.stop_reason.as_deref() == Some(PAUSE_TURN);
        // The body's own blocks go back, not ones rebuilt from what was read of them.
        let kept = self.kept.take();
        let stop_reason = message.stop_reason.take();
        self.whole_blocks(message, content, stop_reason, out)?;
        if paused && let Some(kept) = kept {
            let whole: WholeContent = serde_json::from_slice(body)
                .map_err(|e| decode_error(PROVIDER, "a paused turn's content", &e))?;
            *kept.sink.lock().unwrap_or_else(PoisonError::into_inner) = Some(whole.content);
        }
        Ok(())
    }
}

/// The block of a `content_block_start`, whole.
#[derive(Deserialize)]
struct RawStart {
    #[serde(default)]
    content_block: Value,
}

/// A whole message's blocks, whole.
#[derive(Deserialize)]
struct WholeContent {
    #[serde(default)]
    content: Vec<Value>,
}

/// Adds a piece of a kept block's streamed input.
fn kept_json(kept: &mut KeptContent, at: Option<usize>, piece: &str) {
    if let Some((_, json)) = at.and_then(|at| kept.blocks.get_mut(at)) {
        json.push_str(piece);
    }
}

impl AnthropicStreamParser {
    /// A whole message's head, blocks and stop reason, as the events of its stream.
    fn whole_blocks<C>(
        &mut self,
        head: MessageHead<'_, C>,
        content: Vec<InBlock<'_>>,
        stop_reason: Option<Cow<'_, str>>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        self.message_start(head, out);
        let stop_reason = stop_reason.map(Cow::into_owned);
        let length = stop_reason.as_deref().map(map_stop_reason) == Some(FinishReason::Length);
        let last = content.len().saturating_sub(1);
        for (position, (index, mut block)) in (0u32..).zip(content).enumerate() {
            // The limit hit while the last block was being written: a final tool_use holds only
            // part of its input, so it is cut off.
            let cut = length && position == last && block.kind == "tool_use";
            // Only a tool_use's input is its call's arguments; a server tool's stays in its
            // block.
            let input = if block.kind == "tool_use" {
                block.input.take()
            } else {
                None
            };
            self.start_block(index, block, out)?;
            if let Some(arguments) = whole_arguments(input, cut) {
                out.push_back(ModelEvent::ToolCallDelta { index, arguments });
            }
            self.stop_block(index, out)?;
        }
        self.stop_reason = stop_reason;
        self.message_stop(out);
        Ok(())
    }
}

/// The block started at `index`, found through its position.
fn find_block<'b>(
    blocks: &'b mut [(u32, BlockState)],
    block_at: &HashMap<u32, usize>,
    index: u32,
) -> Result<&'b mut BlockState, ModelError> {
    block_at
        .get(&index)
        .and_then(|&at| blocks.get_mut(at))
        .map(|(_, b)| b)
        .ok_or_else(|| {
            stream_error(
                PROVIDER,
                format!("an event refers to content block {index}, which never started"),
            )
        })
}

/// The arguments a whole response's `tool_use` input stands for. A cut-off input arrives parsed
/// into an object, so its JSON no longer shows the cut: its closing brace is withheld, which the
/// accumulator's one rule (incomplete JSON at a length stop is dropped, with a warning) then
/// applies to, exactly as to a stream cut inside the same call.
fn whole_arguments(input: Option<Value>, cut: bool) -> Option<String> {
    match input {
        Some(v @ Value::Object(_)) if cut => {
            let mut text = v.to_string();
            text.pop();
            Some(text)
        }
        _ if cut => Some("{".to_owned()),
        None | Some(Value::Null) => None,
        Some(v) => Some(v.to_string()),
    }
}

/// Whether a block of this type is the answer of a tool the server ran (`web_search_tool_result`,
/// `web_fetch_tool_result`, `code_execution_tool_result`, `tool_search_tool_result`,
/// `mcp_tool_result`, ...), not the client's own `tool_result`.
fn is_server_result(kind: &str) -> bool {
    kind != "tool_result" && kind.ends_with("_tool_result")
}

/// Whether a kept block is one of a tool the server ran, its call or its answer: the API wants
/// them back unchanged on every later turn, or it refuses the conversation (a
/// `server_tool_use` without its result) or the model loses what it found.
pub(super) fn is_server_block_kind(kind: &str) -> bool {
    matches!(kind, "server_tool_use" | "mcp_tool_use") || is_server_result(kind)
}

/// A block of a tool the server ran, kept whole to be sent back (never shown: no text).
fn server_block(block: Value) -> Reasoning {
    Reasoning {
        text: String::new(),
        signature: None,
        provider_data: Some(block),
    }
}

fn redacted(data: String) -> Reasoning {
    let mut map = serde_json::Map::with_capacity(2);
    map.insert(
        "type".to_owned(),
        Value::String("redacted_thinking".to_owned()),
    );
    map.insert("data".to_owned(), Value::String(data));
    Reasoning {
        text: String::new(),
        signature: None,
        provider_data: Some(Value::Object(map)),
    }
}

/// Parses a whole (non-streamed) Messages response body, through the stream parser and the
/// accumulator: a response cut off inside its last `tool_use` drops that call and is marked
/// truncated.
pub fn parse_message(body: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_whole(body, AnthropicStreamParser::new())
}

/// Parses a whole streamed body held in memory (server-sent events) into a response, the way a
/// streamed call does: for fuzzing, benchmarks and replaying recorded streams.
pub fn parse_stream_bytes(bytes: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_sse(bytes, PROVIDER, AnthropicStreamParser::new())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn events(lines: &[&str]) -> Result<Vec<ModelEvent>, ModelError> {
        crate::decode::decode_all(AnthropicStreamParser::new(), lines)
    }

    #[test]
    fn tool_use_without_deltas_takes_the_start_input() {
        let ev = events(&[
            r#"{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":3,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}"#,
            r#"{"type":"message_stop"}"#,
        ])
        .unwrap();
        assert!(ev.contains(&ModelEvent::ToolCallDelta {
            index: 0,
            arguments: r#"{"a":1}"#.into()
        }));
        assert!(ev.contains(&ModelEvent::Usage(Usage {
            input_tokens: 3,
            output_tokens: 9,
            ..Default::default()
        })));
        assert_eq!(
            ev.last(),
            Some(&ModelEvent::Finish {
                reason: FinishReason::ToolCalls,
                raw: Some("tool_use".into())
            })
        );
    }

    #[test]
    fn cache_reads_and_writes_are_counted_inside_the_input() {
        let ev = events(&[
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":10,"cache_read_input_tokens":100,"cache_creation_input_tokens":20,"output_tokens":1}}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#,
            r#"{"type":"message_stop"}"#,
        ])
        .unwrap();
        let usage = Usage {
            input_tokens: 130,
            output_tokens: 5,
            cached_input_tokens: 100,
            cache_write_tokens: 20,
            reasoning_tokens: 0,
        };
        assert_eq!(
            ev.last_chunk::<2>().map(|e| &e[0]),
            Some(&ModelEvent::Usage(usage))
        );
        assert_eq!(usage.total_tokens(), 135);
        // A hostile count saturates instead of wrapping.
        let body = br#"{"content":[],"stop_reason":"end_turn","usage":{"input_tokens":18446744073709551615,"cache_read_input_tokens":7,"output_tokens":1}}"#;
        let r = parse_message(body).unwrap();
        assert_eq!(r.usage.input_tokens, u64::MAX);
        assert_eq!(r.usage.total_tokens(), u64::MAX);
    }

    #[test]
    fn thinking_block_keeps_its_signature() {
        let ev = events(&[
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
            r#"{"type":"message_stop"}"#,
        ])
        .unwrap();
        assert!(ev.contains(&ModelEvent::ReasoningDelta("hmm".into())));
        assert!(ev.contains(&ModelEvent::Reasoning(Reasoning {
            signature: Some("SIG".into()),
            ..Default::default()
        })));
    }

    #[test]
    fn unclosed_tool_use_turns_the_finish_into_length() {
        let ev = events(&[
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\": "}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
            r#"{"type":"message_stop"}"#,
        ])
        .unwrap();
        assert!(ev.contains(&ModelEvent::Warning(
            "tool_use t1 has no content_block_stop".into()
        )));
        assert_eq!(
            ev.last(),
            Some(&ModelEvent::Finish {
                reason: FinishReason::Length,
                raw: Some("tool_use".into())
            })
        );
    }

    #[test]
    fn an_error_envelope_under_a_200_is_the_error_it_reports_whole_or_streamed() {
        // What gateways relaying the Messages API send when their upstream fails after the 200:
        // no `type`, so read as a message it was an empty success, and as an event a decode error.
        let envelope = r#"{"error":{"message":"upstream overloaded","type":"overloaded_error"}}"#;
        let err = parse_message(envelope.as_bytes()).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Overloaded);
        assert_eq!(err.message, "upstream overloaded");
        let err = parse_stream_bytes(format!("data: {envelope}\n\n").as_bytes()).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Overloaded);
        let err = events(&[
            r#"{"type":"message_start","message":{"id":"m"}}"#,
            r#"{"error":{"message":"rate limited","code":429}}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::RateLimited);
        // JSON that is no message at all is no answer either.
        for body in [&b"{}"[..], br#"{"detail":"Not Found"}"#] {
            assert_eq!(
                parse_message(body).unwrap_err().kind,
                ModelErrorKind::Decode
            );
        }
        // A message (by its type, or by its content) is read as before, even empty.
        let r = parse_message(br#"{"type":"message","stop_reason":"end_turn"}"#).unwrap();
        assert_eq!(r.finish_reason, FinishReason::Stop);
        parse_message(br#"{"content":[],"stop_reason":"end_turn"}"#).unwrap();
    }

    #[test]
    fn a_paused_stream_leaves_its_blocks_as_sent_and_an_unpaused_one_none() {
        let sink = PausedContent::default();
        let paused = [
            r#"{"type":"message_start","message":{"id":"m"}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Search "}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"first."}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Paris is sunny"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","url":"https://x","cited_text":"sunny"}}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"server_tool_use","id":"s1","name":"web_fetch","input":{}}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"url\": \"https://x\"}"}}"#,
            r#"{"type":"content_block_stop","index":2}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"pause_turn"}}"#,
            r#"{"type":"message_stop"}"#,
        ];
        let ev = crate::decode::decode_all(
            AnthropicStreamParser::keeping_content(Arc::clone(&sink)),
            &paused,
        )
        .unwrap();
        // The answer's own events are those of the usual parse.
        assert_eq!(ev, events(&paused).unwrap());
        assert_eq!(
            take_paused(&sink).unwrap(),
            vec![
                serde_json::json!({"type": "thinking", "thinking": "Search first.", "signature": "SIG"}),
                serde_json::json!({"type": "text", "text": "Paris is sunny", "citations": [
                    {"type": "web_search_result_location", "url": "https://x", "cited_text": "sunny"}]}),
                serde_json::json!({"type": "server_tool_use", "id": "s1", "name": "web_fetch", "input": {"url": "https://x"}}),
            ]
        );
        let finished = paused.map(|e| e.replace("pause_turn", "end_turn"));
        let finished: Vec<&str> = finished.iter().map(String::as_str).collect();
        crate::decode::decode_all(
            AnthropicStreamParser::keeping_content(Arc::clone(&sink)),
            &finished,
        )
        .unwrap();
        assert_eq!(take_paused(&sink), None);
    }

    #[test]
    fn delta_for_unknown_block_is_a_stream_error() {
        let err = events(&[
            r#"{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
    }

    #[test]
    fn the_input_of_an_ignored_server_tool_block_is_ignored_with_it() {
        let got = events(&[
            r#"{"type":"message_start","message":{"id":"m","model":"claude"}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"rust\"}"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Found it."}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
            r#"{"type":"message_stop"}"#,
        ])
        .unwrap();
        assert!(
            got.iter()
                .any(|e| matches!(e, ModelEvent::TextDelta(t) if t == "Found it."))
        );
        assert!(!got.iter().any(|e| matches!(
            e,
            ModelEvent::ToolCallStart { .. } | ModelEvent::ToolCallDelta { .. }
        )));
    }

    #[test]
    fn stream_without_message_stop_fails() {
        let err = events(&[r#"{"type":"message_start","message":{"id":"m"}}"#]).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
    }

    #[test]
    fn in_stream_error_event_is_classified() {
        let err = events(&[
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Overloaded);
        assert_eq!(err.error_type.as_deref(), Some("overloaded_error"));
        assert_eq!(err.message, "Overloaded");
    }

    #[test]
    fn whole_response_cut_inside_its_last_tool_use_drops_that_call() {
        let body = br#"{"type":"message","id":"m","content":[
            {"type":"tool_use","id":"t1","name":"f","input":{"a":1}},
            {"type":"tool_use","id":"t2","name":"g","input":{"lines":["x"]}}],
            "stop_reason":"max_tokens","usage":{"input_tokens":1,"output_tokens":2}}"#;
        let r = parse_message(body).unwrap();
        assert!(r.truncated);
        assert_eq!(r.message.tool_calls.len(), 1);
        assert_eq!(&*r.message.tool_calls[0].call_id, "t1");
        assert_eq!(r.message.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(r.warnings, ["tool call t2 (g) was cut off and dropped"]);
        assert_eq!(r.finish_reason, FinishReason::Length);
        let done = br#"{"content":[{"type":"tool_use","id":"t1","name":"f","input":{}}],"stop_reason":"tool_use"}"#;
        let r = parse_message(done).unwrap();
        assert!(!r.truncated);
        assert_eq!(r.message.tool_calls[0].arguments, "{}");
        assert!(r.warnings.is_empty());
        // Cut inside a call whose input is no object (or none): still dropped.
        let odd = br#"{"content":[{"type":"text","text":"x"},{"type":"tool_use","id":"t3","name":"h"}],"stop_reason":"max_tokens"}"#;
        let r = parse_message(odd).unwrap();
        assert!(r.truncated && r.message.tool_calls.is_empty());
        assert_eq!(r.message.text, "x");
    }
}
