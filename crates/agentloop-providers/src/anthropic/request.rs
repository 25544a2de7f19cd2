//! The Messages request body, encoded from the provider-neutral transcript: thinking blocks go
//! back with their signatures, tool inputs as parsed objects, and all tool results of a turn in
//! one user message.

use std::borrow::Cow;

use agentloop::{
    Message, ModelError,
    message::{AssistantMessage, ContentPart, ToolContent, ToolResult},
    model::{ModelRequest, ToolChoice},
};
use serde::Serialize;
use serde_json::Value;

use super::{Anthropic, CacheBreakpoints, PROVIDER, ThinkingConfig, ToolSearchVariant};
use crate::http::json_body;

impl Anthropic {
    /// Encodes the request body this model sends for `request` (exposed for inspection and tests).
    pub fn encode_request(&self, request: &ModelRequest<'_>) -> Result<Vec<u8>, ModelError> {
        self.encode_continuation(request, &[])
    }

    /// The request that continues a paused turn: `request`, then the turn's blocks so far as
    /// the server sent them (`server_tool_use` and results included) as the last assistant
    /// message, which the API continues.
    pub(super) fn encode_continuation(
        &self,
        request: &ModelRequest<'_>,
        paused: &[Value],
    ) -> Result<Vec<u8>, ModelError> {
        let mut body = build_request(
            &self.model,
            request,
            self.stream,
            self.max_tokens,
            self.thinking,
            self.cache,
            self.tool_search,
        );
        if !paused.is_empty() {
            // Sent back unchanged, with no breakpoint of ours among them.
            body.messages.push(WireMessage {
                role: Role::Assistant,
                content: paused.iter().map(OutBlock::Server).collect(),
                cache_last: false,
            });
        }
        json_body(PROVIDER, &body)
    }
}

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<System<'a>>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireToolEntry<'a>>,
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

/// The system prompt: a string, or one text block when it carries a cache breakpoint.
#[derive(Serialize)]
#[serde(untagged)]
enum System<'a> {
    Text(Cow<'a, str>),
    Blocks([SystemBlock<'a>; 1]),
}

#[derive(Serialize)]
struct SystemBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: Cow<'a, str>,
    cache_control: CacheControl,
}

/// `{"type": "ephemeral"}`: the prompt up to here is cached (5 minutes, refreshed on each hit).
#[derive(Serialize, Clone, Copy)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: CacheControl = CacheControl { kind: "ephemeral" };

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: &'a Value,
    /// Out of the model's context until the tool search finds it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    defer_loading: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// The server-side tool search tool (`tool_search_tool_bm25_20251119`), sent when a tool is
/// deferred.
#[derive(Serialize)]
struct SearchTool {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum WireToolEntry<'a> {
    Custom(WireTool<'a>),
    Search(SearchTool),
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

struct WireMessage<'a> {
    role: Role,
    content: Vec<OutBlock<'a>>,
    /// The last block that can carry one gets a cache breakpoint.
    cache_last: bool,
}

/// A block with a cache breakpoint.
#[derive(Serialize)]
struct Marked<'b, 'a> {
    #[serde(flatten)]
    block: &'b OutBlock<'a>,
    cache_control: CacheControl,
}

impl Serialize for WireMessage<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeSeq, SerializeStruct};
        struct Blocks<'m, 'a>(&'m WireMessage<'a>);
        impl Serialize for Blocks<'_, '_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let message = self.0;
                // Thinking blocks cannot carry a breakpoint: the last block that can, gets it.
                let marked = message
                    .cache_last
                    .then(|| {
                        message.content.iter().rposition(|b| {
                            !matches!(
                                b,
                                OutBlock::Thinking { .. }
                                    | OutBlock::RedactedThinking { .. }
                                    | OutBlock::Server(_)
                            )
                        })
                    })
                    .flatten();
                let mut seq = serializer.serialize_seq(Some(message.content.len()))?;
                for (i, block) in message.content.iter().enumerate() {
                    if Some(i) == marked {
                        seq.serialize_element(&Marked {
                            block,
                            cache_control: EPHEMERAL,
                        })?;
                    } else {
                        seq.serialize_element(block)?;
                    }
                }
                seq.end()
            }
        }
        let mut s = serializer.serialize_struct("WireMessage", 2)?;
        s.serialize_field("role", &self.role)?;
        s.serialize_field("content", &Blocks(self))?;
        s.end()
    }
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
    /// A block of a tool the server ran (`server_tool_use`, `web_search_tool_result`,
    /// `tool_search_tool_result`, ...), sent back as it came.
    #[serde(untagged)]
    Server(&'a Value),
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
        if let Some(block) = r.provider_data.as_ref().filter(|d| is_server_block(d)) {
            blocks.push(OutBlock::Server(block));
            continue;
        }
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
    // The API refuses a text block of whitespace only ("text content blocks must contain
    // non-whitespace text"), yet models answer `"\n\n"` before a tool call: it goes back as
    // nothing, or every later request of the conversation fails.
    if !message.text.trim().is_empty() {
        blocks.push(OutBlock::Text {
            text: &message.text,
        });
    }
    for call in &message.tool_calls {
        blocks.push(OutBlock::ToolUse {
            id: &call.call_id,
            name: &call.tool,
            input: tool_input(&call.arguments),
        });
    }
    blocks
}

/// The blocks of the tools the server ran (its tool search, web search and fetch, code
/// execution, MCP connector), kept in
/// [`Reasoning::provider_data`](agentloop::message::Reasoning::provider_data) to go back on
/// later turns: the found tools are expanded from them, and a web search's results are what the
/// model's answer rests on.
pub(super) fn is_server_block(data: &Value) -> bool {
    data.get("type")
        .and_then(Value::as_str)
        .is_some_and(super::stream::is_server_block_kind)
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
            cache_last: false,
        }),
    }
}

/// How many blocks before a breakpoint Anthropic looks back for an earlier cache entry (about
/// 20), less a margin for the blocks a breakpoint cannot go on (thinking, server blocks).
const CACHE_LOOKBACK_BLOCKS: usize = 18;

/// Marks the message the previous request ended with (the one before the latest assistant turn)
/// too, when the latest turn added more blocks than Anthropic looks back over: a turn of ten
/// parallel calls adds about 21 (the calls, their results, the text), and without this second
/// breakpoint the entry the previous request wrote is out of reach, so the whole conversation is
/// written to the cache again at every such turn instead of read from it. The breakpoints are
/// then four (tools, system, this, the latest turn), Anthropic's most.
fn bridge_to_the_previous_turn(messages: &mut [WireMessage<'_>]) {
    let Some(latest_answer) = messages.iter().rposition(|m| m.role == Role::Assistant) else {
        return;
    };
    let Some(previous_end) = latest_answer.checked_sub(1) else {
        return;
    };
    let added: usize = messages
        .iter()
        .skip(previous_end + 1)
        .map(|m| m.content.len())
        .sum();
    if added > CACHE_LOOKBACK_BLOCKS
        && let Some(previous) = messages.get_mut(previous_end)
    {
        previous.cache_last = true;
    }
}

fn build_request<'a>(
    model: &'a str,
    request: &ModelRequest<'a>,
    stream: bool,
    default_max_tokens: u32,
    thinking: Option<ThinkingConfig>,
    cache: CacheBreakpoints,
    search: ToolSearchVariant,
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
                        cache_last: false,
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
    let system = system.map(|text| {
        if cache.instructions {
            System::Blocks([SystemBlock {
                kind: "text",
                text,
                cache_control: EPHEMERAL,
            }])
        } else {
            System::Text(text)
        }
    });
    if cache.latest_turn
        && let Some(last) = messages.last_mut()
    {
        last.cache_last = true;
        bridge_to_the_previous_turn(&mut messages);
    }
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
    let tools = wire_tools(request, cache, search);
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

/// The request's tools. With a deferred one, the tools the model sees come first, then the
/// search tool, then the deferred tools marked `defer_loading`: the same list every turn, and
/// the cache breakpoint on the last tool in the model's context (deferred ones are not).
fn wire_tools<'a>(
    request: &ModelRequest<'a>,
    cache: CacheBreakpoints,
    search: ToolSearchVariant,
) -> Vec<WireToolEntry<'a>> {
    let wire = |t: &'a agentloop::tool::ToolSpec| WireTool {
        name: &t.name,
        description: &t.description,
        input_schema: &t.input_schema,
        defer_loading: t.deferred,
        cache_control: None,
    };
    let mut tools: Vec<WireToolEntry<'a>> = Vec::with_capacity(request.tools.len() + 1);
    tools.extend(
        request
            .tools
            .iter()
            .filter(|t| !t.deferred)
            .map(|t| WireToolEntry::Custom(wire(t))),
    );
    if uses_tool_search(request) {
        let (kind, name) = search.wire();
        tools.push(WireToolEntry::Search(SearchTool {
            kind,
            name,
            cache_control: None,
        }));
    }
    if cache.tools {
        match tools.last_mut() {
            Some(WireToolEntry::Custom(t)) => t.cache_control = Some(EPHEMERAL),
            Some(WireToolEntry::Search(t)) => t.cache_control = Some(EPHEMERAL),
            None => {}
        }
    }
    tools.extend(
        request
            .tools
            .iter()
            .filter(|t| t.deferred)
            .map(|t| WireToolEntry::Custom(wire(t))),
    );
    tools
}

/// True when a tool of the request is deferred: the request carries the server's tool search
/// and its beta header.
pub(super) fn uses_tool_search(request: &ModelRequest<'_>) -> bool {
    request.tools.iter().any(|t| t.deferred)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

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
