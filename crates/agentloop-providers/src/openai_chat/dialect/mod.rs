//! Tool calls in plain text, for models served without a tool-call parser: the tools are
//! described in the system prompt in the format the model was trained on, its calls are read out
//! of the streamed text (a marker or a call may be split across any chunks), and earlier calls and
//! their results go back in the same format. Text around the calls stays text.
//!
//! - `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5/3).
//! - `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral instruct models).
//! - `llama3-json`: the whole answer is `{"name": ..., "parameters": {...}}`, maybe after
//!   `<|python_tag|>` (Llama 3.1 and later, JSON tool calling).
//! - `auto`: every shape small models write (the three above, fenced blocks, bare JSON objects
//!   and lists, a bare call after text on its line, `name` with `arguments` or `parameters`, the
//!   pythonic `[name(arg=value)]`, a Python dict, a tool's name alone in `<tool_call>` tags, a
//!   call as a tag's attributes `<tool_call name="f" arguments={...} />`),
//!   read only where it names a tool the agent has; the tools are described as for `hermes`.
//!
//! Every dialect reads every shape when it names one of the agent's tools (a Hermes model that
//! writes its call in a fence still gets it run); in its own shape (its marker, or a bare call as
//! the whole answer for `hermes` and `llama3-json`) a named dialect reads any name, so that the
//! machine can answer a wrong one with the real names.

mod reader;
mod shapes;

use agentloop::message::{ToolCall, ToolResult};
use agentloop::tool::ToolSpec;
use serde_json::{Value, json};

pub(crate) use reader::DialectReader;

/// A plain-text tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolDialect {
    /// `<tool_call>…</tool_call>` blocks.
    Hermes,
    /// A `[TOOL_CALLS]` marker and a JSON list of calls.
    Mistral,
    /// One JSON object with `name` and `parameters` as the whole answer.
    Llama3Json,
    /// Every common shape, where it names one of the agent's tools.
    Auto,
}

impl ToolDialect {
    /// The dialect of this name: `hermes`, `mistral`, `llama3-json` or `auto`.
    pub fn from_name(name: &str) -> Option<ToolDialect> {
        match name {
            "auto" => Some(ToolDialect::Auto),
            "hermes" => Some(ToolDialect::Hermes),
            "mistral" => Some(ToolDialect::Mistral),
            "llama3-json" => Some(ToolDialect::Llama3Json),
            _ => None,
        }
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolDialect::Hermes => "hermes",
            ToolDialect::Mistral => "mistral",
            ToolDialect::Llama3Json => "llama3-json",
            ToolDialect::Auto => "auto",
        }
    }

    /// The names [`ToolDialect::from_name`] knows.
    pub const NAMES: [&'static str; 4] = ["auto", "hermes", "mistral", "llama3-json"];

    /// What the system prompt says of the tools, in this dialect.
    pub(crate) fn describe_tools(self, tools: &[ToolSpec]) -> String {
        let specs: Vec<String> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema
                }})
                .to_string()
            })
            .collect();
        match self {
            // The wording Hermes-format models (Qwen 2.5 and 3 among them) were trained on.
            ToolDialect::Hermes | ToolDialect::Auto => format!(
                "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
                 You are provided with function signatures within <tools></tools> XML tags:\n\
                 <tools>\n{}\n</tools>\n\nFor each function call, return a json object with \
                 function name and arguments within <tool_call></tool_call> XML tags:\n\
                 <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n\
                 </tool_call>",
                specs.join("\n")
            ),
            ToolDialect::Mistral => format!(
                "[AVAILABLE_TOOLS][{}][/AVAILABLE_TOOLS]\nTo call functions, answer with \
                 [TOOL_CALLS] followed by a JSON list of calls: \
                 [TOOL_CALLS][{{\"name\": \"<function name>\", \"arguments\": {{...}}}}]. The \
                 results come back between [TOOL_RESULTS] and [/TOOL_RESULTS].",
                specs.join(", ")
            ),
            ToolDialect::Llama3Json => format!(
                "You have access to the following functions:\n{}\n\nTo call a function, answer \
                 with only a JSON object of the form {{\"name\": \"<function name>\", \
                 \"parameters\": {{<arguments as JSON>}}}} and nothing else. Answer in plain \
                 text when no function is needed.",
                specs.join("\n")
            ),
        }
    }

    /// An assistant message's text and calls, as the model would have written them.
    pub(crate) fn render_calls(self, text: &str, calls: &[ToolCall]) -> String {
        // Written by hand so the name comes first, as the models were trained to write it.
        let call = |c: &ToolCall, arguments_key: &str| -> String {
            let arguments: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
            format!(
                "{{\"name\": {}, \"{arguments_key}\": {arguments}}}",
                Value::from(c.tool.as_str())
            )
        };
        let mut out = text.to_owned();
        match self {
            ToolDialect::Hermes | ToolDialect::Auto => {
                for c in calls {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(&format!(
                        "<tool_call>\n{}\n</tool_call>",
                        call(c, "arguments")
                    ));
                }
            }
            ToolDialect::Mistral => {
                if !calls.is_empty() {
                    let list: Vec<String> = calls.iter().map(|c| call(c, "arguments")).collect();
                    out.push_str(&format!("[TOOL_CALLS][{}]", list.join(", ")));
                }
            }
            ToolDialect::Llama3Json => {
                for c in calls {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(&call(c, "parameters"));
                }
            }
        }
        out
    }

    /// A tool's result, as the model expects to read it (in a user message).
    pub(crate) fn render_result(self, result: &ToolResult) -> String {
        let content = result.content.as_text();
        match self {
            ToolDialect::Hermes | ToolDialect::Auto => {
                format!("<tool_response>\n{content}\n</tool_response>")
            }
            ToolDialect::Mistral => format!(
                "[TOOL_RESULTS]{}[/TOOL_RESULTS]",
                json!({"name": &*result.tool, "content": content})
            ),
            ToolDialect::Llama3Json => {
                format!("The function {} returned:\n{content}", result.tool)
            }
        }
    }
}

#[cfg(test)]
mod tests;
