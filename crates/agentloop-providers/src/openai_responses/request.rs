//! The Responses request body, encoded from the provider-neutral transcript: messages, function
//! calls and their outputs by `call_id`, and earlier reasoning items sent back whole.

use std::borrow::Cow;

use agentloop::{
    Message, ModelError,
    message::{ContentPart, ToolContent},
    model::{ModelRequest, ToolChoice},
};
use serde::Serialize;
use serde_json::Value;

use super::{OpenAiResponses, Options, PROVIDER};
use crate::http::json_body;

impl OpenAiResponses {
    /// True when requests ask for reasoning items' encrypted content (needed to carry reasoning
    /// across turns without server-side storage).
    fn wants_encrypted_reasoning(&self) -> bool {
        if self.options.store {
            return false;
        }
        self.options.encrypted_reasoning.unwrap_or_else(|| {
            // Models without reasoning reject the include; ask only where reasoning is in play.
            // The chat snapshots of a reasoning family (`gpt-5-chat-latest`) have none, and
            // refuse the include with a 400.
            let m = self.model.as_str();
            self.options.reasoning_effort.is_some()
                || (["o1", "o3", "o4", "gpt-5", "codex"]
                    .iter()
                    .any(|p| m.starts_with(p))
                    && !m.contains("-chat"))
        })
    }

    /// Encodes the request body this model sends for `request` (exposed for inspection and tests).
    pub fn encode_request(&self, request: &ModelRequest<'_>) -> Result<Vec<u8>, ModelError> {
        let body = build_request(
            &self.model,
            request,
            &self.options,
            self.wants_encrypted_reasoning(),
        );
        json_body(PROVIDER, &body)
    }
}

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    input: Vec<InputItem<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireToolEntry<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    store: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    include: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<WireReasoning<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<WireText<'a>>,
}

#[derive(Serialize)]
struct WireReasoning<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<&'a str>,
}

#[derive(Serialize)]
struct WireText<'a> {
    format: WireFormat<'a>,
}

#[derive(Serialize)]
struct WireFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'static str,
    schema: &'a Value,
    strict: bool,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    parameters: &'a Value,
    strict: bool,
    /// Out of the model's context until the hosted tool search loads it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    defer_loading: bool,
}

/// A function, or the hosted tool search (`{"type": "tool_search"}`), sent when a tool is
/// deferred.
#[derive(Serialize)]
#[serde(untagged)]
enum WireToolEntry<'a> {
    Function(WireTool<'a>),
    Search {
        #[serde(rename = "type")]
        kind: &'static str,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum WireToolChoice<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        name: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputItem<'a> {
    Message {
        role: &'static str,
        content: Vec<InputContent<'a>>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: Cow<'a, str>,
    },
    /// A reasoning item sent back exactly as it came.
    #[serde(untagged)]
    Verbatim(&'a Value),
}

/// Whether a reasoning item kept from an earlier answer can go back. With `store: true` the
/// server holds it. With `store: false` it holds nothing, so an item without `encrypted_content`
/// cannot be sent back at all: the API answers "Item with id 'rs_…' not found" (vercel/ai#7543,
/// openai-agents-python#1756). Such an item is left out; the answer it led to still goes back.
fn replayable_reasoning(item: &Value, store: bool) -> Option<InputItem<'_>> {
    let encrypted = item
        .get("encrypted_content")
        .and_then(Value::as_str)
        .is_some_and(|e| !e.is_empty());
    (store || encrypted).then_some(InputItem::Verbatim(item))
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputContent<'a> {
    InputText { text: &'a str },
    InputImage { image_url: &'a str },
    OutputText { text: &'a str, annotations: [(); 0] },
}

fn user_content(part: &ContentPart) -> InputContent<'_> {
    match part {
        ContentPart::Text { text } => InputContent::InputText { text },
        ContentPart::Image { url, .. } => InputContent::InputImage { image_url: url },
    }
}

/// The conversation as the Responses API's input items.
fn input_items<'a>(messages: &'a [Message], store: bool) -> Vec<InputItem<'a>> {
    let mut input = Vec::with_capacity(messages.len() + 4);
    for message in messages {
        match message {
            Message::User { content } => {
                input.push(InputItem::Message {
                    role: "user",
                    content: content.iter().map(user_content).collect(),
                });
            }
            Message::Assistant(a) => {
                // Reasoning items precede the items they led to; only whole items (with their id
                // and encrypted content) can be sent back.
                for r in &a.reasoning {
                    let Some(item) = r.provider_data.as_ref() else {
                        continue;
                    };
                    match item.get("type").and_then(Value::as_str) {
                        Some("reasoning") => {
                            input.extend(replayable_reasoning(item, store));
                        }
                        // The hosted tool search's call and output: the tools it loaded load
                        // from them again.
                        Some("tool_search_call" | "tool_search_output") => {
                            input.push(InputItem::Verbatim(item));
                        }
                        _ => {}
                    }
                }
                if !a.text.is_empty() {
                    input.push(InputItem::Message {
                        role: "assistant",
                        content: vec![InputContent::OutputText {
                            text: &a.text,
                            annotations: [],
                        }],
                    });
                }
                for call in &a.tool_calls {
                    input.push(InputItem::FunctionCall {
                        call_id: &call.call_id,
                        name: &call.tool,
                        arguments: crate::decode::sent_arguments(&call.arguments),
                    });
                }
            }
            Message::Tool(result) => {
                input.push(InputItem::FunctionCallOutput {
                    call_id: &result.call_id,
                    output: ToolContent::as_text(&result.content),
                });
            }
        }
    }
    input
}

/// The agent's tools, and the hosted tool search when any of them is deferred.
fn wire_tools<'a>(specs: &'a [agentloop::tool::ToolSpec]) -> Vec<WireToolEntry<'a>> {
    let mut tools: Vec<WireToolEntry<'a>> = specs
        .iter()
        .map(|t| {
            WireToolEntry::Function(WireTool {
                kind: "function",
                name: &t.name,
                description: &t.description,
                parameters: &t.input_schema,
                // Strict mode would reject ordinary schemas (optional properties); validation is
                // ours.
                strict: false,
                defer_loading: t.deferred,
            })
        })
        .collect();
    // The same list every turn: the tools the search loads join the context at its end, so
    // the cached prefix holds.
    if specs.iter().any(|t| t.deferred) {
        tools.push(WireToolEntry::Search {
            kind: "tool_search",
        });
    }
    tools
}

fn build_request<'a>(
    model: &'a str,
    request: &ModelRequest<'a>,
    options: &'a Options,
    encrypted_reasoning: bool,
) -> WireRequest<'a> {
    let input = input_items(request.messages, options.store);
    let settings = request.settings;
    let tools = wire_tools(request.tools);
    let tool_choice = settings.tool_choice.as_ref().map(|c| match c {
        ToolChoice::Auto => WireToolChoice::Mode("auto"),
        ToolChoice::Required => WireToolChoice::Mode("required"),
        ToolChoice::None => WireToolChoice::Mode("none"),
        ToolChoice::Tool(name) => WireToolChoice::Function {
            kind: "function",
            name,
        },
    });
    let reasoning = (options.reasoning_effort.is_some() || options.reasoning_summary.is_some())
        .then_some(WireReasoning {
            effort: options.reasoning_effort.as_deref(),
            summary: options.reasoning_summary.as_deref(),
        });
    WireRequest {
        model,
        instructions: request.instructions.filter(|i| !i.is_empty()),
        input,
        tool_choice: if tools.is_empty() { None } else { tool_choice },
        parallel_tool_calls: if tools.is_empty() {
            None
        } else {
            settings.parallel_tool_calls
        },
        tools,
        temperature: settings.temperature,
        top_p: settings.top_p,
        max_output_tokens: settings.max_tokens,
        store: options.store,
        stream: options.stream,
        include: if encrypted_reasoning {
            vec!["reasoning.encrypted_content"]
        } else {
            Vec::new()
        },
        reasoning,
        text: request.output_schema.map(|schema| WireText {
            format: WireFormat {
                kind: "json_schema",
                name: "final_answer",
                schema,
                strict: false,
            },
        }),
    }
}
