//! The Anthropic Messages API (`POST /v1/messages`): request encoding from the provider-neutral
//! transcript, a pure stream parser that turns server-sent events into [`ModelEvent`]s, and the
//! [`Anthropic`] model that sends requests through the shared HTTP client.
//!
//! Thinking blocks come back with their signatures and are sent back unchanged on tool turns; all
//! tool results of a turn travel in one user message. A `tool_use` whose JSON was cut off is never
//! executed: the stream maps to [`FinishReason::Length`] and the accumulator drops the call.

use std::borrow::Cow;
use std::collections::VecDeque;

use agentloop::{
    AssistantMessage, ContentPart, FinishReason, Message, Model, ModelError, ModelErrorKind,
    ModelEvent, ModelRequest, ModelResponse, ModelStream, Reasoning, ToolChoice, ToolContent,
    ToolResult, Usage,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decode::{StreamDecoder, accumulate_sse, accumulate_whole, post_and_decode};
use crate::error::{decode_error, reported_error, stream_error};
use crate::http::{ANTHROPIC_API_KEY_ENV, AuthStyle, HttpClient, HttpConfig, KeySource};

const PROVIDER: &str = "anthropic";
/// The API version header value this adapter speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `max_tokens` sent when the settings give none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Extended thinking settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkingConfig {
    /// Tokens the model may spend thinking; must be below `max_tokens`.
    pub budget_tokens: u32,
}

/// A model served by the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct Anthropic {
    model: String,
    client: HttpClient,
    stream: bool,
    max_tokens: u32,
    thinking: Option<ThinkingConfig>,
}

/// Builds an [`Anthropic`] model. Setters never fail; [`AnthropicBuilder::build`] reports problems.
#[derive(Debug, Clone)]
#[must_use]
pub struct AnthropicBuilder {
    model: String,
    config: HttpConfig,
    stream: bool,
    max_tokens: u32,
    thinking: Option<ThinkingConfig>,
}

impl Anthropic {
    /// A builder for this model id (`claude-sonnet-4-5`), with the key read from `ANTHROPIC_API_KEY`.
    pub fn builder(model: impl Into<String>) -> AnthropicBuilder {
        let mut config = HttpConfig::new(DEFAULT_BASE_URL);
        config.key = KeySource::Env(ANTHROPIC_API_KEY_ENV.to_owned());
        config.auth = AuthStyle::Header("x-api-key".to_owned());
        AnthropicBuilder {
            model: model.into(),
            config,
            stream: true,
            max_tokens: DEFAULT_MAX_TOKENS,
            thinking: None,
        }
    }

    /// Encodes the request body this model sends for `request` (exposed for inspection and tests).
    pub fn encode_request(&self, request: &ModelRequest<'_>) -> Result<Vec<u8>, ModelError> {
        let body = build_request(
            &self.model,
            request,
            self.stream,
            self.max_tokens,
            self.thinking,
        );
        serde_json::to_vec(&body).map_err(|e| {
            ModelError::new(
                ModelErrorKind::Other,
                format!("cannot encode the request: {e}"),
            )
            .with_provider(PROVIDER)
        })
    }
}

impl AnthropicBuilder {
    crate::http::http_builder_methods!();

    /// Streams responses (the default) or asks for whole ones.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// The `max_tokens` sent when the request's settings give none (default 4096).
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Enables extended thinking with this token budget.
    pub fn thinking(mut self, budget_tokens: u32) -> Self {
        self.thinking = Some(ThinkingConfig { budget_tokens });
        self
    }

    /// Builds the model.
    pub fn build(mut self) -> Result<Anthropic, ModelError> {
        if !self
            .config
            .extra_headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("anthropic-version"))
        {
            self.config
                .extra_headers
                .push(("anthropic-version".to_owned(), ANTHROPIC_VERSION.to_owned()));
        }
        let client = HttpClient::new(self.config, PROVIDER)?;
        Ok(Anthropic {
            model: self.model,
            client,
            stream: self.stream,
            max_tokens: self.max_tokens,
            thinking: self.thinking,
        })
    }
}

impl Model for Anthropic {
    fn id(&self) -> &str {
        &self.model
    }

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let body = self.encode_request(&request);
        let decoder = AnthropicStreamParser::new();
        post_and_decode(&self.client, "/v1/messages", body, decoder, self.stream)
    }
}

// ---------------------------------------------------------------------------------------------
// Request encoding

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<Cow<'a, str>>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<WireThinking>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
struct WireThinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: &'a Value,
}

#[derive(Serialize)]
struct WireToolChoice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    disable_parallel_tool_use: bool,
}

#[derive(Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Role {
    User,
    Assistant,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: Role,
    content: Vec<OutBlock<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock<'a> {
    Text {
        text: &'a str,
    },
    Image {
        source: ImageSource<'a>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: ResultContent<'a>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ImageSource<'a> {
    Base64 { media_type: &'a str, data: &'a str },
    Url { url: &'a str },
}

#[derive(Serialize)]
#[serde(untagged)]
enum ResultContent<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<OutBlock<'a>>),
}

fn image_source<'a>(url: &'a str, media_type: Option<&'a str>) -> ImageSource<'a> {
    if let Some(rest) = url.strip_prefix("data:")
        && let Some((meta, data)) = rest.split_once(',')
        && let Some(mime) = meta.strip_suffix(";base64")
    {
        return ImageSource::Base64 {
            media_type: media_type.unwrap_or(mime),
            data,
        };
    }
    ImageSource::Url { url }
}

fn part_block(part: &ContentPart) -> OutBlock<'_> {
    match part {
        ContentPart::Text { text } => OutBlock::Text { text },
        ContentPart::Image { url, media_type } => OutBlock::Image {
            source: image_source(url, media_type.as_deref()),
        },
    }
}

fn result_block(result: &ToolResult) -> OutBlock<'_> {
    let content = match &result.content {
        ToolContent::Text(t) => ResultContent::Text(Cow::Borrowed(t)),
        ToolContent::Json(v) => ResultContent::Text(Cow::Owned(v.to_string())),
        ToolContent::Parts(parts) => ResultContent::Blocks(parts.iter().map(part_block).collect()),
    };
    OutBlock::ToolResult {
        tool_use_id: &result.call_id,
        content,
        is_error: result.is_error,
    }
}

/// The input object of a tool call: its raw arguments parsed, `{}` when empty. Anthropic accepts
/// only objects, so arguments that are not one (a call the run already rejected) become `{}`.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::Object(serde_json::Map::new()),
    }
}

fn assistant_blocks(message: &AssistantMessage) -> Vec<OutBlock<'_>> {
    let mut blocks = Vec::with_capacity(message.reasoning.len() + 1 + message.tool_calls.len());
    for r in &message.reasoning {
        let redacted = r
            .provider_data
            .as_ref()
            .filter(|d| d.get("type").and_then(Value::as_str) == Some("redacted_thinking"))
            .and_then(|d| d.get("data"))
            .and_then(Value::as_str);
        if let Some(data) = redacted {
            blocks.push(OutBlock::RedactedThinking { data });
        } else if let Some(signature) = r.signature.as_deref() {
            blocks.push(OutBlock::Thinking {
                thinking: &r.text,
                signature,
            });
        }
        // Reasoning without a signature (from another provider) cannot be sent back: Anthropic
        // rejects unsigned thinking blocks.
    }
    if !message.text.is_empty() {
        blocks.push(OutBlock::Text {
            text: &message.text,
        });
    }
    for call in &message.tool_calls {
        blocks.push(OutBlock::ToolUse {
            id: &call.id,
            name: &call.name,
            input: tool_input(&call.arguments),
        });
    }
    blocks
}

fn push_user_blocks<'a>(
    messages: &mut Vec<WireMessage<'a>>,
    blocks: impl IntoIterator<Item = OutBlock<'a>>,
) {
    match messages.last_mut() {
        Some(last) if last.role == Role::User => last.content.extend(blocks),
        _ => messages.push(WireMessage {
            role: Role::User,
            content: blocks.into_iter().collect(),
        }),
    }
}

fn build_request<'a>(
    model: &'a str,
    request: &ModelRequest<'a>,
    stream: bool,
    default_max_tokens: u32,
    thinking: Option<ThinkingConfig>,
) -> WireRequest<'a> {
    let mut messages: Vec<WireMessage<'a>> = Vec::with_capacity(request.messages.len());
    for message in request.messages {
        match message {
            Message::User { content } => {
                push_user_blocks(&mut messages, content.iter().map(part_block))
            }
            // Consecutive tool results join one user message of tool_result blocks.
            Message::Tool(result) => push_user_blocks(&mut messages, [result_block(result)]),
            Message::Assistant(a) => {
                let content = assistant_blocks(a);
                if !content.is_empty() {
                    messages.push(WireMessage {
                        role: Role::Assistant,
                        content,
                    });
                }
            }
        }
    }
    let system = match (request.instructions, request.output_schema) {
        (instructions, Some(schema)) => {
            let mut s = instructions.map(str::to_owned).unwrap_or_default();
            if !s.is_empty() {
                s.push_str("\n\n");
            }
            s.push_str("Give your final answer as a single JSON value (no prose, no code fence) matching this JSON Schema:\n");
            s.push_str(&schema.to_string());
            Some(Cow::Owned(s))
        }
        (Some(i), None) if !i.is_empty() => Some(Cow::Borrowed(i)),
        _ => None,
    };
    let settings = request.settings;
    let disable_parallel = settings.parallel_tool_calls == Some(false);
    let tool_choice = match (&settings.tool_choice, disable_parallel) {
        (Some(ToolChoice::Auto), d) | (None, d @ true) => Some(WireToolChoice {
            kind: "auto",
            name: None,
            disable_parallel_tool_use: d,
        }),
        (Some(ToolChoice::Required), d) => Some(WireToolChoice {
            kind: "any",
            name: None,
            disable_parallel_tool_use: d,
        }),
        (Some(ToolChoice::None), _) => Some(WireToolChoice {
            kind: "none",
            name: None,
            disable_parallel_tool_use: false,
        }),
        (Some(ToolChoice::Tool(name)), d) => Some(WireToolChoice {
            kind: "tool",
            name: Some(name),
            disable_parallel_tool_use: d,
        }),
        (None, false) => None,
    };
    let tools: Vec<WireTool<'a>> = request
        .tools
        .iter()
        .map(|t| WireTool {
            name: &t.name,
            description: &t.description,
            input_schema: &t.input_schema,
        })
        .collect();
    WireRequest {
        model,
        max_tokens: settings.max_tokens.unwrap_or(default_max_tokens),
        system,
        messages,
        tool_choice: if tools.is_empty() { None } else { tool_choice },
        tools,
        temperature: settings.temperature,
        top_p: settings.top_p,
        thinking: thinking.map(|t| WireThinking {
            kind: "enabled",
            budget_tokens: t.budget_tokens,
        }),
        stream,
    }
}

// ---------------------------------------------------------------------------------------------
// Response decoding

/// Anthropic's usage object. Its `input_tokens` leaves out cache reads and writes; later events
/// repeat or add counts, so the parser keeps the latest of each and converts at the wire.
#[derive(Debug, Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
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
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
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
}

#[derive(Deserialize)]
struct MessageHead<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// The `delta` of `content_block_delta` and of `message_delta`, in one shape.
#[derive(Deserialize)]
struct InDelta<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
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
    #[serde(default)]
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
        id: String,
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
    Ignored,
}

/// Turns Anthropic's stream events into [`ModelEvent`]s. Pure: no I/O, no clock. Feed it each
/// event's `data` in order, then call [`AnthropicStreamParser::end`] when the stream ends.
#[derive(Debug, Default)]
pub struct AnthropicStreamParser {
    blocks: Vec<(u32, BlockState)>,
    /// The latest count of each kind, as Anthropic reports them.
    usage: WireUsage,
    stop_reason: Option<String>,
    stopped: bool,
    failed: bool,
}

impl AnthropicStreamParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    fn block_mut(&mut self, index: u32) -> Result<&mut BlockState, ModelError> {
        self.blocks
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b)
            .ok_or_else(|| {
                stream_error(
                    PROVIDER,
                    format!("an event refers to content block {index}, which never started"),
                )
            })
    }

    fn start_block(
        &mut self,
        index: u32,
        block: InBlock<'_>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        if self.blocks.iter().any(|(i, _)| *i == index) {
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
                let id = block.id.map(Cow::into_owned).unwrap_or_default();
                let name = block.name.map(Cow::into_owned).unwrap_or_default();
                out.push_back(ModelEvent::ToolCallStart {
                    index,
                    id: id.clone(),
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
            other => {
                out.push_back(ModelEvent::Warning(format!(
                    "ignored a content block of unsupported type {other:?}"
                )));
                BlockState::Ignored
            }
        };
        self.blocks.push((index, state));
        Ok(())
    }

    fn delta(
        &mut self,
        index: u32,
        delta: InDelta<'_>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        let block = self.block_mut(index)?;
        match delta.kind.as_deref() {
            Some("text_delta") => {
                if let Some(t) = delta.text.filter(|t| !t.is_empty()) {
                    out.push_back(ModelEvent::TextDelta(t.into_owned()));
                }
            }
            Some("input_json_delta") => {
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
                    out.push_back(ModelEvent::ToolCallDelta {
                        index,
                        arguments: json.into_owned(),
                    });
                }
            }
            Some("thinking_delta") => {
                if let Some(t) = delta.thinking.filter(|t| !t.is_empty()) {
                    out.push_back(ModelEvent::ReasoningDelta(t.into_owned()));
                }
            }
            Some("signature_delta") => {
                if let (BlockState::Thinking { signature }, Some(s)) = (block, delta.signature) {
                    signature.get_or_insert_with(String::new).push_str(&s);
                }
            }
            _ => {} // citations and future delta kinds carry nothing we keep
        }
        Ok(())
    }

    fn stop_block(&mut self, index: u32, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        match self.block_mut(index)? {
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
            BlockState::Text | BlockState::Ignored => {}
        }
        Ok(())
    }

    fn usage(&mut self, newer: WireUsage, out: &mut VecDeque<ModelEvent>) {
        self.usage.update(newer);
        out.push_back(ModelEvent::Usage(self.usage.to_usage()));
    }

    fn message_start(&mut self, head: MessageHead<'_>, out: &mut VecDeque<ModelEvent>) {
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
        let event: InEvent<'_> = serde_json::from_str(data).map_err(|e| {
            self.failed = true;
            decode_error(PROVIDER, "stream event", &e)
        })?;
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
        Err(stream_error(
            PROVIDER,
            "the stream ended before message_stop",
        ))
    }
}

impl StreamDecoder for AnthropicStreamParser {
    fn event(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        self.push(data, out)
    }

    fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        AnthropicStreamParser::end(self, out)
    }

    /// A whole message is read as the stream of it: `message_start`, each block started and
    /// stopped, the stop reason, `message_stop`.
    fn whole(&mut self, body: &[u8], out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        let message: WholeMessage<'_> = serde_json::from_slice(body)
            .map_err(|e| decode_error(PROVIDER, "response body", &e))?;
        if message.kind.as_deref() == Some("error") {
            return Err(reported_error(PROVIDER, body));
        }
        self.message_start(message.head, out);
        let stop_reason = message.stop_reason.map(Cow::into_owned);
        let length = stop_reason.as_deref().map(map_stop_reason) == Some(FinishReason::Length);
        let last = message.content.len().saturating_sub(1);
        for (position, (index, mut block)) in (0u32..).zip(message.content).enumerate() {
            // The limit hit while the last block was being written: a final tool_use holds only
            // part of its input, so it is cut off.
            let cut = length && position == last && block.kind == "tool_use";
            let input = block.input.take();
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

/// A whole message: the head that `message_start` carries, with its content and stop reason.
#[derive(Deserialize)]
struct WholeMessage<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(flatten, borrow)]
    head: MessageHead<'a>,
    #[serde(default, borrow)]
    content: Vec<InBlock<'a>>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
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
    fn delta_for_unknown_block_is_a_stream_error() {
        let err = events(&[
            r#"{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
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
        assert_eq!(r.message.tool_calls[0].id, "t1");
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

    #[test]
    fn data_url_images_become_base64_sources() {
        let v = serde_json::to_value(image_source("data:image/png;base64,AAAA", None)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "base64", "media_type": "image/png", "data": "AAAA"})
        );
        let v = serde_json::to_value(image_source("https://x/y.png", None)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "url", "url": "https://x/y.png"})
        );
    }
}
