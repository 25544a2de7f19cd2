//! The Chat Completions request body, encoded from the provider-neutral transcript: wire types
//! that borrow from the run's messages, and the rules for the fields compatible servers differ
//! on (`max_tokens`, `tool_choice`, reasoning sent back).

use std::borrow::Cow;

use agentloop::{
    Message, ModelError,
    message::ContentPart,
    model::{ModelRequest, ToolChoice},
};
use serde::Serialize;
use serde_json::Value;

use super::dialect::ToolDialect;
use super::stream::{REASONING_DETAILS_KEY, TOOL_CALL_EXTRA_KEY};
use super::strict::strict_schema;
use super::{MaxTokensField, OpenAiChat, OpenAiCompat, PromptCacheKey};
use crate::http::json_body;

impl OpenAiChat {
    /// The JSON body this model would send for `request`.
    pub fn encode_request(&self, request: &ModelRequest<'_>) -> Result<Vec<u8>, ModelError> {
        let wire = self.wire_request(request);
        json_body(&self.provider, &wire)
    }

    fn wire_request<'a>(&'a self, request: &ModelRequest<'a>) -> WireRequest<'a> {
        let settings = request.settings;
        // Both are rejected by OpenAI when no tool is offered.
        let native_tools = !request.tools.is_empty() && self.compat.tool_dialect.is_none();
        let (max_completion_tokens, max_tokens) = match self.max_tokens_field {
            MaxTokensField::MaxCompletionTokens => (settings.max_tokens, None),
            MaxTokensField::MaxTokens => (None, settings.max_tokens),
        };
        WireRequest {
            model: &self.model,
            // A plain-text dialect describes the tools in the prompt: the server gets none.
            tools: if self.compat.tool_dialect.is_some() {
                Vec::new()
            } else {
                request
                    .tools
                    .iter()
                    .map(|t| wire_tool(t, self.strict))
                    .collect()
            },
            messages: wire_messages(request, &self.compat),
            prompt_cache_key: match &self.compat.prompt_cache_key {
                PromptCacheKey::Off => None,
                PromptCacheKey::Derived => {
                    Some(Cow::Owned(derived_cache_key(&self.model, request)))
                }
                PromptCacheKey::Fixed(key) => Some(Cow::Borrowed(key.as_str())),
            },
            tool_choice: settings
                .tool_choice
                .as_ref()
                .filter(|_| native_tools)
                .map(wire_tool_choice),
            parallel_tool_calls: settings.parallel_tool_calls.filter(|_| native_tools),
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

/// The request body. Its fields go out in this order, the unchanging ones (model, tools, then the
/// instructions as the first message) ahead of the conversation, so that servers which cache a
/// prompt by its prefix (llama.cpp, vLLM, OpenAI's automatic caching) find the same prefix
/// request after request.
#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<Cow<'a, str>>,
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
        content: Cow<'a, str>,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the message has no text (it only called tools).
        content: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<String>,
        /// OpenRouter's reasoning details, as the server sent them: only a server that sent them
        /// gets them back.
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_details: Option<&'a Value>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireToolCall<'a>>,
    },
    Tool {
        tool_call_id: Cow<'a, str>,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(Cow<'a, str>),
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
    id: Cow<'a, str>,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    extra_content: Option<&'a Value>,
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

fn wire_messages<'a>(request: &ModelRequest<'a>, compat: &OpenAiCompat) -> Vec<WireMessage<'a>> {
    if let Some(dialect) = compat.tool_dialect {
        return dialect_messages(request, dialect);
    }
    let mut out = Vec::with_capacity(request.messages.len() + 1);
    if let Some(instructions) = request.instructions {
        out.push(WireMessage::System {
            content: Cow::Borrowed(instructions),
        });
    }
    for message in request.messages {
        match message {
            Message::User { content } => out.push(WireMessage::User {
                content: user_content(content),
            }),
            Message::Assistant(a) => {
                // Only the text of reasoning goes back: the blocks that carry a call's extra
                // content are bookkeeping, not reasoning.
                let reasoning: Vec<&str> = a
                    .reasoning
                    .iter()
                    .map(|r| r.text.as_str())
                    .filter(|t| !t.is_empty())
                    .collect();
                // On every assistant message, empty when the turn had no reasoning: DeepSeek V4
                // answers 400 for a message of the history that lacks it, thought or not.
                let reasoning_content = compat.reasoning_content.then(|| reasoning.join("\n"));
                let extras: Vec<&Value> = if compat.tool_call_extra {
                    a.reasoning
                        .iter()
                        .filter_map(|r| r.provider_data.as_ref()?.get(TOOL_CALL_EXTRA_KEY))
                        .filter_map(Value::as_array)
                        .flatten()
                        .collect()
                } else {
                    Vec::new()
                };
                let reasoning_details = a
                    .reasoning
                    .iter()
                    .find_map(|r| r.provider_data.as_ref()?.get(REASONING_DETAILS_KEY));
                out.push(WireMessage::Assistant {
                    content: (!a.text.is_empty()).then_some(Cow::Borrowed(a.text.as_str())),
                    reasoning_content,
                    reasoning_details,
                    tool_calls: a
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(position, c)| WireToolCall {
                            id: wire_call_id(&c.call_id, compat.mistral_call_ids),
                            kind: "function",
                            function: WireFunctionCall {
                                name: &c.tool,
                                arguments: crate::decode::sent_arguments(&c.arguments),
                            },
                            extra_content: extra_for(&extras, &c.call_id, position),
                        })
                        .collect(),
                });
            }
            Message::Tool(result) => {
                out.push(WireMessage::Tool {
                    tool_call_id: wire_call_id(&result.call_id, compat.mistral_call_ids),
                    content: result.content.as_text(),
                });
            }
        }
    }
    out
}

/// The conversation for a model that calls tools in plain text: the tools described in the
/// system prompt, earlier calls written into the assistant's text, and each turn's results in one
/// user message (chat templates that want turns to alternate accept it).
fn dialect_messages<'a>(request: &ModelRequest<'a>, dialect: ToolDialect) -> Vec<WireMessage<'a>> {
    let mut out = Vec::with_capacity(request.messages.len() + 1);
    let mut system = request.instructions.unwrap_or_default().to_owned();
    if !request.tools.is_empty() {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&dialect.describe_tools(request.tools));
    }
    if !system.is_empty() {
        out.push(WireMessage::System {
            content: Cow::Owned(system),
        });
    }
    for message in request.messages {
        match message {
            Message::User { content } => out.push(WireMessage::User {
                content: user_content(content),
            }),
            Message::Assistant(a) => out.push(WireMessage::Assistant {
                content: Some(Cow::Owned(dialect.render_calls(&a.text, &a.tool_calls))),
                reasoning_content: None,
                reasoning_details: None,
                tool_calls: Vec::new(),
            }),
            Message::Tool(result) => {
                let text = dialect.render_result(result);
                match out.last_mut() {
                    Some(WireMessage::User {
                        content: UserContent::Text(previous),
                    }) if previous.ends_with(result_end(dialect)) => {
                        let joined = previous.to_mut();
                        joined.push('\n');
                        joined.push_str(&text);
                    }
                    _ => out.push(WireMessage::User {
                        content: UserContent::Text(Cow::Owned(text)),
                    }),
                }
            }
        }
    }
    // Small models tend to call again after their results; the latest results say what comes
    // next (as the chat templates of such models do).
    if let Some(WireMessage::User {
        content: UserContent::Text(last),
    }) = out.last_mut()
        && !result_end(dialect).is_empty()
        && last.ends_with(result_end(dialect))
    {
        last.to_mut().push_str(after_results(dialect));
    }
    out
}

/// What follows the latest results. The named dialects ask for a plain answer once the results
/// answer the question (the 0.5B model calls again without it). With that line the 1.5B model
/// answered a task of several steps after its first (it wrote calc.py and said so, without running
/// it); with none it wrote the same call again; asked to go on, it described the next call in
/// prose; asked for the next step's call or a plain reply "once the request is done", it called
/// the shell but then answered without the result. `auto` asks for the next step's call, or the
/// result in one sentence (docs/local-model.md).
fn after_results(dialect: ToolDialect) -> &'static str {
    match dialect {
        ToolDialect::Auto => AUTO_AFTER_RESULTS,
        _ => "\nIf these results answer the question, reply to the user in plain text now.",
    }
}

const AUTO_AFTER_RESULTS: &str = "\nIf the user's request needs another step, answer with only the \
    tool call for it now. If it is done, tell the user the result in one sentence.";

/// How a rendered result ends, to join the results of one turn.
fn result_end(dialect: ToolDialect) -> &'static str {
    match dialect {
        ToolDialect::Hermes | ToolDialect::Auto => "</tool_response>",
        ToolDialect::Mistral => "[/TOOL_RESULTS]",
        ToolDialect::Llama3Json => "",
    }
}

/// The extra content kept for the call with this id (or, when the server gave it no id, at this
/// position among the message's calls).
fn extra_for<'a>(extras: &[&'a Value], call_id: &str, position: usize) -> Option<&'a Value> {
    let by_id = extras.iter().find(|e| {
        e.get("id")
            .and_then(Value::as_str)
            .is_some_and(|id| !id.is_empty() && id == call_id)
    });
    let by_position = || {
        extras.iter().find(|e| {
            e.get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
                && e.get("position").and_then(Value::as_u64) == Some(position as u64)
        })
    };
    by_id
        .or_else(by_position)
        .and_then(|e| e.get("extra_content"))
}

/// A call id as it goes on the wire: as it is, or (for Mistral, see
/// [`OpenAiCompat::mistral_call_ids`]) nine letters or digits, a digest of an id of any other
/// shape. The digest is stable across requests and processes, so a call and its result carry the
/// same one on every request and a cached prompt prefix stays the same.
fn wire_call_id(id: &str, mistral: bool) -> Cow<'_, str> {
    const LEN: usize = 9;
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    if !mistral || (id.len() == LEN && id.bytes().all(|b| b.is_ascii_alphanumeric())) {
        return Cow::Borrowed(id);
    }
    let mut hash = fnv1a([id.as_bytes()]);
    let mut out = String::with_capacity(LEN);
    for _ in 0..LEN {
        let digit = usize::try_from(hash % 62).unwrap_or_default();
        out.push(char::from(DIGITS.get(digit).copied().unwrap_or(b'0')));
        hash /= 62;
    }
    Cow::Owned(out)
}

/// The FNV-1a hash of these byte strings, each closed by a byte no UTF-8 text holds: stable
/// across processes and releases (unlike the standard library's hasher).
fn fnv1a<'b>(parts: impl IntoIterator<Item = &'b [u8]>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for bytes in parts {
        for b in bytes.iter().chain([0xffu8].iter()) {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// A `prompt_cache_key` that requests with the same model, instructions and tools share: an
/// FNV-1a hash, stable across processes and releases (unlike the standard library's hasher).
fn derived_cache_key(model: &str, request: &ModelRequest<'_>) -> String {
    let schemas: Vec<String> = request
        .tools
        .iter()
        .map(|t| t.input_schema.to_string())
        .collect();
    let mut parts: Vec<&[u8]> = vec![
        model.as_bytes(),
        request.instructions.unwrap_or_default().as_bytes(),
    ];
    for (tool, schema) in request.tools.iter().zip(&schemas) {
        parts.extend([
            tool.name.as_bytes(),
            tool.description.as_bytes(),
            schema.as_bytes(),
        ]);
    }
    format!("agentloop-{:016x}", fnv1a(parts))
}

fn user_content(parts: &[ContentPart]) -> UserContent<'_> {
    if let [ContentPart::Text { text }] = parts {
        return UserContent::Text(Cow::Borrowed(text));
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

fn wire_tool(spec: &agentloop::tool::ToolSpec, strict: bool) -> WireTool<'_> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_choice_and_parallel_calls_are_left_out_when_no_tool_is_offered() {
        let model = OpenAiChat::builder("gpt-4.1").api_key("k").build().unwrap();
        let messages = [Message::user("hi")];
        let settings = agentloop::model::ModelSettings {
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
            Message::Assistant(agentloop::message::AssistantMessage {
                reasoning: vec![agentloop::message::Reasoning {
                    text: "think".into(),
                    ..Default::default()
                }],
                text: String::new(),
                tool_calls: vec![agentloop::message::ToolCall {
                    call_id: "c1".into(),
                    tool: "f".into(),
                    arguments: "{}".into(),
                }],
            }),
        ];
        let settings = agentloop::model::ModelSettings::default();
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
                .reasoning_in_history(false)
                .build()
                .unwrap(),
        );
        assert!(plain["messages"][1].get("reasoning_content").is_none());
        // DeepSeek gets it back by default; any other server does not.
        let picked = encode(
            OpenAiChat::compatible("deepseek", "http://x", "deepseek-reasoner")
                .build()
                .unwrap(),
        );
        assert_eq!(picked["messages"][1]["reasoning_content"], "think");
        let other = encode(
            OpenAiChat::compatible("local", "http://x", "qwen3")
                .build()
                .unwrap(),
        );
        assert!(other["messages"][1].get("reasoning_content").is_none());
        let with = encode(
            OpenAiChat::compatible("deepseek", "http://x", "deepseek-reasoner")
                .reasoning_in_history(true)
                .build()
                .unwrap(),
        );
        assert_eq!(with["messages"][1]["reasoning_content"], "think");
        assert_eq!(with["messages"][1]["content"], Value::Null);
        // A turn without reasoning still carries the field, empty.
        let mut thoughtless = transcript.clone();
        if let Message::Assistant(a) = &mut thoughtless[1] {
            a.reasoning.clear();
        }
        let request = ModelRequest {
            messages: &thoughtless,
            ..request
        };
        let deepseek = OpenAiChat::compatible("deepseek", "http://x", "deepseek-v4-flash")
            .build()
            .unwrap();
        let body: Value =
            serde_json::from_slice(&deepseek.encode_request(&request).unwrap()).unwrap();
        assert_eq!(body["messages"][1]["reasoning_content"], "");
    }
}
