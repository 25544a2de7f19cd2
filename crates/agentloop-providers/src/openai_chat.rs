//! OpenAI Chat Completions, and every server that speaks it (DeepSeek, Groq, xAI, OpenRouter,
//! Gemini's and Anthropic's compatible endpoints, Ollama, vLLM, llama.cpp's server).
//!
//! The wire types are our own serde structs. Requests borrow from the run's transcript; stream
//! chunks are read into borrowing structs (no `Value` tree per chunk). The stream parser is a
//! pure [`ChatStreamParser`] that the live path, [`parse_stream_bytes`] (fuzzing, benchmarks) and
//! the tests all share.
//!
//! Rules that are ours to pick, documented here:
//! - `max_tokens` is sent as `max_completion_tokens` when the provider name is `openai` (the
//!   reasoning models require it) and as `max_tokens` for every other provider name, which is what
//!   compatible servers understand. [`OpenAiChatBuilder::max_tokens_field`] overrides it.
//! - A stream that ends without a `finish_reason` and without `[DONE]` is an error, never a half
//!   response. `[DONE]` without a `finish_reason` finishes the response with a warning.
//! - The `Finish` event is held until the stream ends, so the trailing usage chunk
//!   (`stream_options.include_usage`, whose `choices` is empty) is read before it.

use std::borrow::Cow;
use std::collections::VecDeque;

use agentloop::{
    ContentPart, FinishReason, Message, Model, ModelError, ModelErrorKind, ModelEvent,
    ModelRequest, ModelResponse, ModelStream, ToolChoice, Usage,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::decode::{StreamDecoder, accumulate_sse, accumulate_whole, post_and_decode};
use crate::error::{ProviderError, decode_error, stream_error};
use crate::http::{HttpClient, HttpConfig, KeySource};

/// The default base URL.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub use crate::http::OPENAI_API_KEY_ENV;

/// Which request field carries the output token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_completion_tokens` (OpenAI; required by its reasoning models).
    MaxCompletionTokens,
    /// `max_tokens` (compatible servers).
    MaxTokens,
}

/// An OpenAI Chat Completions model.
#[derive(Debug, Clone)]
pub struct OpenAiChat {
    model: String,
    provider: String,
    client: HttpClient,
    stream: bool,
    stream_usage: bool,
    strict: bool,
    max_tokens_field: MaxTokensField,
    reasoning_in_history: bool,
}

/// Builds an [`OpenAiChat`].
#[derive(Debug, Clone)]
#[must_use]
pub struct OpenAiChatBuilder {
    model: String,
    provider: String,
    config: HttpConfig,
    stream: bool,
    stream_usage: bool,
    strict: bool,
    max_tokens_field: Option<MaxTokensField>,
    reasoning_in_history: bool,
}

impl OpenAiChat {
    /// A builder for `model` on api.openai.com, with the key from `OPENAI_API_KEY`.
    pub fn builder(model: impl Into<String>) -> OpenAiChatBuilder {
        let mut config = HttpConfig::new(OPENAI_BASE_URL);
        config.key = KeySource::Env(OPENAI_API_KEY_ENV.to_owned());
        OpenAiChatBuilder {
            model: model.into(),
            provider: "openai".to_owned(),
            config,
            stream: true,
            stream_usage: true,
            strict: false,
            max_tokens_field: None,
            reasoning_in_history: false,
        }
    }

    /// A builder for a compatible server: its provider name (`deepseek`, `groq`, `local`), base URL
    /// and model. No key is sent until one is set.
    pub fn compatible(
        provider: impl Into<String>,
        base_url: impl Into<String>,
        model: impl Into<String>,
    ) -> OpenAiChatBuilder {
        OpenAiChat::builder(model)
            .provider_name(provider)
            .base_url(base_url)
            .no_api_key()
    }

    /// The JSON body this model would send for `request`.
    pub fn encode_request(&self, request: &ModelRequest<'_>) -> Result<Vec<u8>, ModelError> {
        let wire = self.wire_request(request);
        serde_json::to_vec(&wire).map_err(|e| {
            ModelError::new(
                ModelErrorKind::Other,
                format!("cannot encode the request: {e}"),
            )
            .with_provider(self.provider.clone())
        })
    }

    fn wire_request<'a>(&'a self, request: &ModelRequest<'a>) -> WireRequest<'a> {
        let settings = request.settings;
        let (max_completion_tokens, max_tokens) = match self.max_tokens_field {
            MaxTokensField::MaxCompletionTokens => (settings.max_tokens, None),
            MaxTokensField::MaxTokens => (None, settings.max_tokens),
        };
        WireRequest {
            model: &self.model,
            messages: wire_messages(request, self.reasoning_in_history),
            tools: request
                .tools
                .iter()
                .map(|t| wire_tool(t, self.strict))
                .collect(),
            // Both are rejected by OpenAI when no tool is offered.
            tool_choice: settings
                .tool_choice
                .as_ref()
                .filter(|_| !request.tools.is_empty())
                .map(wire_tool_choice),
            parallel_tool_calls: settings
                .parallel_tool_calls
                .filter(|_| !request.tools.is_empty()),
            temperature: settings.temperature,
            top_p: settings.top_p,
            seed: settings.seed,
            max_completion_tokens,
            max_tokens,
            response_format: request.output_schema.map(|schema| ResponseFormat {
                kind: "json_schema",
                json_schema: JsonSchemaFormat {
                    name: "output",
                    schema: if self.strict {
                        Cow::Owned(strict_schema(schema))
                    } else {
                        Cow::Borrowed(schema)
                    },
                    strict: self.strict.then_some(true),
                },
            }),
            stream: self.stream,
            stream_options: (self.stream && self.stream_usage).then_some(StreamOptions {
                include_usage: true,
            }),
        }
    }
}

impl OpenAiChatBuilder {
    crate::http::http_builder_methods!();

    /// Streams responses (the default) or asks for whole ones.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Asks for the trailing usage chunk when streaming (`stream_options.include_usage`, the
    /// default). Turn it off for a server that rejects `stream_options`.
    pub fn stream_usage(mut self, include: bool) -> Self {
        self.stream_usage = include;
        self
    }

    /// Strict mode: tool and output schemas are sent with `strict: true`, adapted to what strict
    /// mode accepts (every property required, optional ones nullable, `additionalProperties: false`).
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The provider name reported in events, errors and pricing (`openai` by default).
    pub fn provider_name(mut self, name: impl Into<String>) -> Self {
        self.provider = name.into();
        self
    }

    /// Which field carries `max_tokens` (by default: `max_completion_tokens` for `openai`,
    /// `max_tokens` for any other provider name).
    pub fn max_tokens_field(mut self, field: MaxTokensField) -> Self {
        self.max_tokens_field = Some(field);
        self
    }

    /// Sends earlier reasoning back as `reasoning_content` on assistant messages (DeepSeek's
    /// thinking mode with tools asks for it; OpenAI does not accept it). Off by default.
    pub fn reasoning_in_history(mut self, send: bool) -> Self {
        self.reasoning_in_history = send;
        self
    }

    /// Builds the model.
    pub fn build(self) -> Result<OpenAiChat, ModelError> {
        let client = HttpClient::new(self.config, self.provider.clone())?;
        let max_tokens_field = self
            .max_tokens_field
            .unwrap_or(if self.provider == "openai" {
                MaxTokensField::MaxCompletionTokens
            } else {
                MaxTokensField::MaxTokens
            });
        Ok(OpenAiChat {
            model: self.model,
            provider: self.provider,
            client,
            stream: self.stream,
            stream_usage: self.stream_usage,
            strict: self.strict,
            max_tokens_field,
            reasoning_in_history: self.reasoning_in_history,
        })
    }
}

impl Model for OpenAiChat {
    fn id(&self) -> &str {
        &self.model
    }

    fn provider(&self) -> &str {
        &self.provider
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let body = self.encode_request(&request);
        let decoder = ChatStreamParser::new(&self.provider);
        post_and_decode(
            &self.client,
            "/chat/completions",
            body,
            decoder,
            self.stream,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Request encoding

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    name: &'static str,
    schema: Cow<'a, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the message has no text (it only called tools).
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: String,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(&'a str),
    Parts(Vec<WirePart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WirePart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: ImageUrl<'a> },
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: &'a str,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    parameters: Cow<'a, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

fn wire_messages<'a>(
    request: &ModelRequest<'a>,
    reasoning_in_history: bool,
) -> Vec<WireMessage<'a>> {
    let mut out = Vec::with_capacity(request.messages.len() + 1);
    if let Some(instructions) = request.instructions {
        out.push(WireMessage::System {
            content: instructions,
        });
    }
    for message in request.messages {
        match message {
            Message::User { content } => out.push(WireMessage::User {
                content: user_content(content),
            }),
            Message::Assistant(a) => {
                let reasoning_content = if reasoning_in_history && !a.reasoning.is_empty() {
                    Some(
                        a.reasoning
                            .iter()
                            .map(|r| r.text.as_str())
                            .collect::<Vec<_>>()
                            .join("\n"),
                    )
                } else {
                    None
                };
                out.push(WireMessage::Assistant {
                    content: (!a.text.is_empty()).then_some(a.text.as_str()),
                    reasoning_content,
                    tool_calls: a
                        .tool_calls
                        .iter()
                        .map(|c| WireToolCall {
                            id: &c.id,
                            kind: "function",
                            function: WireFunctionCall {
                                name: &c.name,
                                arguments: if c.arguments.trim().is_empty() {
                                    "{}"
                                } else {
                                    &c.arguments
                                },
                            },
                        })
                        .collect(),
                });
            }
            Message::Tool(result) => {
                out.push(WireMessage::Tool {
                    tool_call_id: &result.call_id,
                    content: result.content.to_text(),
                });
            }
        }
    }
    out
}

fn user_content(parts: &[ContentPart]) -> UserContent<'_> {
    if let [ContentPart::Text { text }] = parts {
        return UserContent::Text(text);
    }
    UserContent::Parts(
        parts
            .iter()
            .map(|p| match p {
                ContentPart::Text { text } => WirePart::Text { text },
                ContentPart::Image { url, .. } => WirePart::ImageUrl {
                    image_url: ImageUrl { url },
                },
            })
            .collect(),
    )
}

fn wire_tool(spec: &agentloop::ToolSpec, strict: bool) -> WireTool<'_> {
    WireTool {
        kind: "function",
        function: WireFunction {
            name: &spec.name,
            description: &spec.description,
            parameters: if strict {
                Cow::Owned(strict_schema(&spec.input_schema))
            } else {
                Cow::Borrowed(&spec.input_schema)
            },
            strict: strict.then_some(true),
        },
    }
}

fn wire_tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => Value::from("auto"),
        ToolChoice::Required => Value::from("required"),
        ToolChoice::None => Value::from("none"),
        ToolChoice::Tool(name) => {
            serde_json::json!({"type": "function", "function": {"name": name}})
        }
    }
}

/// The `format` values strict mode accepts; others are dropped from strict schemas.
const STRICT_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// Adapts a JSON Schema to what OpenAI's strict mode accepts: every object lists all its
/// properties as required, the ones that were optional become nullable, `additionalProperties`
/// is `false`, and unsupported `format`s are dropped; recursively, through properties, items,
/// combinators and definitions.
pub fn strict_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    make_strict(&mut schema);
    schema
}

fn make_strict(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    if let Some(Value::String(format)) = map.get("format")
        && !STRICT_FORMATS.contains(&format.as_str())
    {
        map.remove("format");
    }
    let is_object = map.get("properties").is_some()
        || match map.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            _ => false,
        };
    if is_object {
        let required: Vec<String> = match map.get("required") {
            Some(Value::Array(r)) => r
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        let mut all = Vec::new();
        if let Some(Value::Object(props)) = map.get_mut("properties") {
            for (name, prop) in props.iter_mut() {
                make_strict(prop);
                if !required.contains(name) {
                    make_nullable(prop);
                }
                all.push(Value::String(name.clone()));
            }
        }
        map.insert("required".to_owned(), Value::Array(all));
        map.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    for key in ["items", "additionalItems", "not"] {
        if let Some(sub) = map.get_mut(key) {
            make_strict(sub);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(subs)) = map.get_mut(key) {
            subs.iter_mut().for_each(make_strict);
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = map.get_mut(key) {
            defs.values_mut().for_each(make_strict);
        }
    }
}

fn make_nullable(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    let null = Value::from("null");
    match map.get_mut("type") {
        Some(Value::String(t)) => {
            if t != "null" {
                let t = std::mem::take(t);
                map.insert(
                    "type".to_owned(),
                    Value::Array(vec![Value::String(t), null.clone()]),
                );
            }
        }
        Some(Value::Array(types)) => {
            if !types.contains(&null) {
                types.push(null.clone());
            }
        }
        _ => {
            let inner = std::mem::replace(map, Map::new());
            map.insert(
                "anyOf".to_owned(),
                Value::Array(vec![
                    Value::Object(inner),
                    serde_json::json!({"type": "null"}),
                ]),
            );
            return;
        }
    }
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
}

// ---------------------------------------------------------------------------------------------
// Response parsing

/// A whole response or one stream chunk: the same shape, with `message` or `delta` in each choice.
#[derive(Deserialize)]
struct WireCompletion<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Option<Vec<WireChoice<'a>>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    delta: Option<WireDelta<'a>>,
    #[serde(default, borrow)]
    message: Option<WireDelta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    /// OpenRouter and some servers name it `reasoning`.
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<WireToolCallIn<'a>>>,
}

#[derive(Deserialize)]
struct WireToolCallIn<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<WireFunctionIn<'a>>,
}

#[derive(Deserialize)]
struct WireFunctionIn<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Arguments<'a>>,
}

/// A tool call's arguments: a JSON string on OpenAI (borrowed when it has no escapes); some
/// servers send an object, which is kept as its JSON text.
struct Arguments<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Arguments<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Arguments<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON string or object")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Arguments(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Arguments(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Arguments(Cow::Owned(v)))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Arguments(Cow::Borrowed("")))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                let value = Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Arguments(Cow::Owned(value.to_string())))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
    /// DeepSeek's own count of cached prompt tokens.
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.completion_tokens.unwrap_or(0),
            cached_input_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .or(self.prompt_cache_hit_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

/// Maps a Chat Completions `finish_reason` to a [`FinishReason`].
pub fn map_finish_reason(raw: &str) -> FinishReason {
    match raw {
        "stop" | "end_turn" | "stop_sequence" | "eos" => FinishReason::Stop,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        "length" | "max_tokens" | "model_length" => FinishReason::Length,
        "content_filter" | "safety" => FinishReason::ContentFilter,
        "refusal" => FinishReason::Refusal,
        "error" => FinishReason::Error,
        _ => FinishReason::Other,
    }
}

/// An error object inside a successful response (`{"error": {...}}` in a 200 stream chunk).
/// A numeric code that looks like an HTTP status (OpenRouter) classifies it as that status would.
fn in_body_error(provider: &str, error: &Value) -> ModelError {
    let wrapped = serde_json::json!({ "error": error });
    let parsed = ProviderError::from_value(&wrapped).unwrap_or_default();
    let status = parsed
        .code
        .as_deref()
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|s| (400..600).contains(s));
    let kind = parsed.kind(status);
    let mut e = parsed.into_model_error(provider, None);
    e.kind = kind;
    e
}

/// The pure parser of a Chat Completions event stream: it turns each event's data into
/// [`ModelEvent`]s. The live adapter, [`parse_stream_bytes`] and the tests share it.
#[derive(Debug)]
pub struct ChatStreamParser {
    provider: String,
    started: bool,
    tool_started: Vec<u32>,
    saw_tool_call: bool,
    finish: Option<(FinishReason, String)>,
    done: bool,
}

impl ChatStreamParser {
    /// A parser for a stream from `provider` (named in errors).
    pub fn new(provider: &str) -> Self {
        ChatStreamParser {
            provider: provider.to_owned(),
            started: false,
            tool_started: Vec::new(),
            saw_tool_call: false,
            finish: None,
            done: false,
        }
    }

    /// Applies one event's data.
    pub fn push(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if self.done {
            return Err(stream_error(&self.provider, "data after [DONE]"));
        }
        if data == "[DONE]" {
            self.done = true;
            return self.emit_finish(out);
        }
        let chunk: WireCompletion<'_> = serde_json::from_str(data)
            .map_err(|e| stream_error(&self.provider, format!("malformed stream chunk: {e}")))?;
        self.apply(chunk, out)
    }

    /// Applies a parsed chunk (or a whole response, whose choices carry `message`).
    fn apply(
        &mut self,
        chunk: WireCompletion<'_>,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        if let Some(error) = &chunk.error {
            return Err(in_body_error(&self.provider, error));
        }
        if !self.started && (chunk.id.is_some() || chunk.model.is_some()) {
            self.started = true;
            out.push_back(ModelEvent::Start {
                id: chunk.id.map(Cow::into_owned),
                model: chunk.model.map(Cow::into_owned),
            });
        }
        for choice in chunk.choices.into_iter().flatten() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta.or(choice.message) {
                self.delta(delta, out);
            }
            if let Some(reason) = choice.finish_reason
                && !reason.is_empty()
            {
                self.finish = Some((map_finish_reason(&reason), reason.into_owned()));
            }
        }
        if let Some(usage) = chunk.usage {
            out.push_back(ModelEvent::Usage(usage.to_usage()));
        }
        Ok(())
    }

    fn delta(&mut self, delta: WireDelta<'_>, out: &mut VecDeque<ModelEvent>) {
        for reasoning in [delta.reasoning_content, delta.reasoning]
            .into_iter()
            .flatten()
        {
            if !reasoning.is_empty() {
                out.push_back(ModelEvent::ReasoningDelta(reasoning.into_owned()));
            }
        }
        for text in [delta.content, delta.refusal].into_iter().flatten() {
            if !text.is_empty() {
                out.push_back(ModelEvent::TextDelta(text.into_owned()));
            }
        }
        for (position, call) in delta.tool_calls.into_iter().flatten().enumerate() {
            self.saw_tool_call = true;
            let index = call.index.unwrap_or(position as u32);
            let (name, arguments) = match call.function {
                Some(f) => (f.name, f.arguments.map(|a| a.0)),
                None => (None, None),
            };
            let id = call.id.filter(|s| !s.is_empty());
            let name = name.filter(|s| !s.is_empty());
            let first = !self.tool_started.contains(&index);
            if first {
                self.tool_started.push(index);
            }
            if first || id.is_some() || name.is_some() {
                out.push_back(ModelEvent::ToolCallStart {
                    index,
                    id: id.map(Cow::into_owned).unwrap_or_default(),
                    name: name.map(Cow::into_owned).unwrap_or_default(),
                });
            }
            if let Some(arguments) = arguments
                && !arguments.is_empty()
            {
                out.push_back(ModelEvent::ToolCallDelta {
                    index,
                    arguments: arguments.into_owned(),
                });
            }
        }
    }

    fn emit_finish(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        match self.finish.take() {
            Some((reason, raw)) => out.push_back(ModelEvent::Finish {
                reason,
                raw: Some(raw),
            }),
            None => {
                out.push_back(ModelEvent::Warning(
                    "the stream ended with [DONE] but no finish_reason".to_owned(),
                ));
                let reason = if self.saw_tool_call {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Stop
                };
                out.push_back(ModelEvent::Finish { reason, raw: None });
            }
        }
        Ok(())
    }

    /// The byte stream ended: finishes the response if the stream said it was complete, else
    /// fails.
    pub fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        match self.finish.take() {
            Some((reason, raw)) => {
                out.push_back(ModelEvent::Finish {
                    reason,
                    raw: Some(raw),
                });
                Ok(())
            }
            None => Err(stream_error(
                &self.provider,
                "the stream ended before a finish_reason or [DONE]",
            )),
        }
    }
}

impl StreamDecoder for ChatStreamParser {
    fn event(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        self.push(data, out)
    }

    fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        ChatStreamParser::end(self, out)
    }

    /// A whole response is one chunk whose choices carry `message`; without a `finish_reason` it
    /// ends as the calls it made say.
    fn whole(&mut self, body: &[u8], out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        let completion: WireCompletion<'_> = serde_json::from_slice(body)
            .map_err(|e| decode_error(&self.provider, "response body", &e))?;
        let has_choice = completion
            .choices
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.index.unwrap_or(0) == 0));
        if completion.error.is_none() && !has_choice {
            return Err(
                ModelError::new(ModelErrorKind::Decode, "the response holds no choice")
                    .with_provider(self.provider.as_str()),
            );
        }
        self.apply(completion, out)?;
        self.done = true;
        let (reason, raw) = match self.finish.take() {
            Some((reason, raw)) => (reason, Some(raw)),
            None if self.saw_tool_call => (FinishReason::ToolCalls, None),
            None => (FinishReason::Stop, None),
        };
        out.push_back(ModelEvent::Finish { reason, raw });
        Ok(())
    }
}

/// Parses a whole Chat Completions event-stream body (the raw `text/event-stream` bytes) into a
/// response, through the same SSE reader, parser and accumulator as a live stream, without a
/// runtime. Arbitrary bytes give a response or an error, never a panic.
pub fn parse_stream_bytes(bytes: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_sse(bytes, "openai", ChatStreamParser::new("openai"))
}

/// Parses a whole (non-streamed) Chat Completions response body, through the stream parser and
/// the accumulator: the same rules (an empty id gets a generated one, a call cut off by the
/// length limit is dropped).
pub fn parse_completion(body: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_whole(body, ChatStreamParser::new("openai"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn strict_schema_requires_every_property_and_makes_optional_ones_nullable() {
        let schema = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "limit": {"type": "integer", "format": "uint32"},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "nested": {"type": "object", "properties": {"x": {"type": "number"}}},
                "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}},
                "any": {"$ref": "#/$defs/Thing"}
            },
            "required": ["path", "tags"],
            "$defs": {"Thing": {"type": "object", "properties": {"y": {"type": "boolean"}}}}
        });
        let strict = strict_schema(&schema);
        assert_eq!(
            strict["required"],
            json!(["any", "limit", "mode", "nested", "path", "tags"])
        );
        assert_eq!(strict["additionalProperties"], json!(false));
        assert_eq!(strict["properties"]["path"]["type"], json!("string"));
        assert_eq!(
            strict["properties"]["limit"],
            json!({"type": ["integer", "null"]})
        );
        assert_eq!(
            strict["properties"]["mode"]["enum"],
            json!(["a", "b", null])
        );
        assert_eq!(
            strict["properties"]["nested"]["type"],
            json!(["object", "null"])
        );
        assert_eq!(strict["properties"]["nested"]["required"], json!(["x"]));
        assert_eq!(
            strict["properties"]["nested"]["properties"]["x"]["type"],
            json!(["number", "null"])
        );
        assert_eq!(
            strict["properties"]["tags"]["items"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(
            strict["properties"]["tags"]["items"]["properties"]["k"]["type"],
            json!("string")
        );
        assert_eq!(
            strict["properties"]["any"],
            json!({"anyOf": [{"$ref": "#/$defs/Thing"}, {"type": "null"}]})
        );
        assert_eq!(
            strict["$defs"]["Thing"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(strict["$defs"]["Thing"]["required"], json!(["y"]));
    }

    #[test]
    fn finish_reasons_map_to_the_shared_enum() {
        assert_eq!(map_finish_reason("stop"), FinishReason::Stop);
        assert_eq!(map_finish_reason("tool_calls"), FinishReason::ToolCalls);
        assert_eq!(map_finish_reason("function_call"), FinishReason::ToolCalls);
        assert_eq!(map_finish_reason("length"), FinishReason::Length);
        assert_eq!(
            map_finish_reason("content_filter"),
            FinishReason::ContentFilter
        );
        assert_eq!(map_finish_reason("weird"), FinishReason::Other);
    }

    fn run(chunks: &[&str]) -> Result<Vec<ModelEvent>, ModelError> {
        let mut p = ChatStreamParser::new("openai");
        let mut out = VecDeque::new();
        for c in chunks {
            p.push(c, &mut out)?;
        }
        p.end(&mut out)?;
        Ok(out.into_iter().collect())
    }

    #[test]
    fn finish_is_held_until_the_trailing_usage_chunk_is_read() {
        let events = run(&[
            r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#,
            r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            "[DONE]",
        ])
        .unwrap();
        let kinds: Vec<_> = events.iter().map(std::mem::discriminant).collect();
        assert!(matches!(
            events.last(),
            Some(ModelEvent::Finish {
                reason: FinishReason::Stop,
                ..
            })
        ));
        let usage_at = events
            .iter()
            .position(|e| matches!(e, ModelEvent::Usage(_)))
            .unwrap();
        assert_eq!(usage_at, kinds.len() - 2);
    }

    #[test]
    fn a_stream_without_finish_or_done_is_an_error() {
        let err =
            run(&[r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"hi"}}]}"#]).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
    }

    #[test]
    fn an_error_object_in_a_chunk_becomes_a_classified_error() {
        let err = run(&[
            r#"{"error":{"message":"The server had an error","type":"server_error","code":null}}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Server);
        assert_eq!(err.message, "The server had an error");
        let err =
            run(&[r#"{"error":{"message":"Provider returned error","code":429}}"#]).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::RateLimited);
        assert_eq!(err.status, None);
    }

    #[test]
    fn data_after_done_is_an_error() {
        assert!(run(&["[DONE]", r#"{"choices":[]}"#]).is_err());
    }

    #[test]
    fn whole_response_with_object_arguments_keeps_their_json_text_and_gets_an_id() {
        let body = br#"{"id":"r","model":"llama3","choices":[{"index":0,"message":{"role":"assistant","content":null,
            "tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},"finish_reason":"tool_calls"}]}"#;
        let response = parse_completion(body).unwrap();
        let call = &response.message.tool_calls[0];
        assert_eq!(call.arguments, r#"{"a":1}"#);
        assert!(call.id.starts_with("call_"));
        assert_eq!(response.model.as_deref(), Some("llama3"));
    }

    #[test]
    fn whole_response_cut_off_inside_a_call_drops_it_and_says_truncated() {
        let body = br#"{"choices":[{"index":0,"message":{"content":"x","tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{\"a\": [1,"}}]},"finish_reason":"length"}],
            "usage":{"prompt_tokens":5,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":3}}}"#;
        let response = parse_completion(body).unwrap();
        assert!(response.truncated);
        assert!(response.message.tool_calls.is_empty());
        assert_eq!(response.finish_reason, FinishReason::Length);
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 5,
                output_tokens: 7,
                cached_input_tokens: 2,
                cache_write_tokens: 0,
                reasoning_tokens: 3
            }
        );
    }

    #[test]
    fn whole_response_without_choices_is_a_decode_error() {
        assert_eq!(
            parse_completion(br#"{"id":"x","choices":[]}"#)
                .unwrap_err()
                .kind,
            ModelErrorKind::Decode
        );
        assert_eq!(
            parse_completion(b"<html>").unwrap_err().kind,
            ModelErrorKind::Decode
        );
    }

    #[test]
    fn tool_choice_and_parallel_calls_are_left_out_when_no_tool_is_offered() {
        let model = OpenAiChat::builder("gpt-4.1").api_key("k").build().unwrap();
        let messages = [Message::user("hi")];
        let settings = agentloop::ModelSettings {
            parallel_tool_calls: Some(true),
            tool_choice: Some(ToolChoice::Required),
            ..Default::default()
        };
        let request = ModelRequest {
            instructions: None,
            messages: &messages,
            tools: &[],
            output_schema: None,
            settings: &settings,
        };
        let body: Value = serde_json::from_slice(&model.encode_request(&request).unwrap()).unwrap();
        assert!(body.get("tool_choice").is_none());
        assert!(body.get("parallel_tool_calls").is_none());
        assert!(body.get("tools").is_none());
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn reasoning_goes_back_as_reasoning_content_only_when_asked() {
        let transcript = [
            Message::user("hi"),
            Message::Assistant(agentloop::AssistantMessage {
                reasoning: vec![agentloop::Reasoning {
                    text: "think".into(),
                    ..Default::default()
                }],
                text: String::new(),
                tool_calls: vec![agentloop::ToolCall {
                    id: "c1".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                }],
            }),
        ];
        let settings = agentloop::ModelSettings::default();
        let request = ModelRequest {
            instructions: None,
            messages: &transcript,
            tools: &[],
            output_schema: None,
            settings: &settings,
        };
        let encode = |model: OpenAiChat| -> Value {
            serde_json::from_slice(&model.encode_request(&request).unwrap()).unwrap()
        };
        let plain = encode(
            OpenAiChat::compatible("deepseek", "http://x", "deepseek-reasoner")
                .build()
                .unwrap(),
        );
        assert!(plain["messages"][1].get("reasoning_content").is_none());
        let with = encode(
            OpenAiChat::compatible("deepseek", "http://x", "deepseek-reasoner")
                .reasoning_in_history(true)
                .build()
                .unwrap(),
        );
        assert_eq!(with["messages"][1]["reasoning_content"], "think");
        assert_eq!(with["messages"][1]["content"], Value::Null);
    }
}
