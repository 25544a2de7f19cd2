//! Tool calls in plain text, for models served without a tool-call parser: the tools are
//! described in the system prompt in the format the model was trained on, its calls are read out
//! of the streamed text (a marker or a call may be split across any chunks), and earlier calls and
//! their results go back in the same format. Text around the calls stays text.
//!
//! - `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5/3).
//! - `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral instruct models).
//! - `llama3-json`: the whole answer is `{"name": ..., "parameters": {...}}`, maybe after
//!   `<|python_tag|>` (Llama 3.1 and later, JSON tool calling).

use std::collections::VecDeque;

use agentloop::message::{ToolCall, ToolResult};
use agentloop::model::ModelEvent;
use agentloop::tool::ToolSpec;
use serde_json::{Value, json};

/// A plain-text tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolDialect {
    /// `<tool_call>…</tool_call>` blocks.
    Hermes,
    /// A `[TOOL_CALLS]` marker and a JSON list of calls.
    Mistral,
    /// One JSON object with `name` and `parameters` as the whole answer.
    Llama3Json,
}

impl ToolDialect {
    /// The dialect of this name: `hermes`, `mistral` or `llama3-json`.
    pub fn from_name(name: &str) -> Option<ToolDialect> {
        match name {
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
        }
    }

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
            ToolDialect::Hermes => format!(
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
            ToolDialect::Hermes => {
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
        let content = result.content.to_text();
        match self {
            ToolDialect::Hermes => format!("<tool_response>\n{content}\n</tool_response>"),
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

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_MARKER: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Plain text, watching for the start of a call.
    Text,
    /// Inside a call (Hermes) or the list of calls (Mistral).
    Call,
    /// The whole answer is JSON calls, read at its end (Llama 3; Hermes when a server strips the
    /// `<tool_call>` tags, which are special tokens of Qwen's vocabulary that llama.cpp does not
    /// print).
    Bare,
    /// The answer's start does not yet tell whether it is text or bare calls.
    Undecided,
}

/// Reads the calls out of a model's streamed text. Text that could still turn out to be the start
/// of a marker is held back until the next piece tells.
#[derive(Debug)]
pub(crate) struct DialectReader {
    dialect: ToolDialect,
    state: State,
    buf: String,
    calls: usize,
}

impl DialectReader {
    pub(crate) fn new(dialect: ToolDialect) -> Self {
        DialectReader {
            dialect,
            state: if dialect == ToolDialect::Mistral {
                State::Text
            } else {
                State::Undecided
            },
            buf: String::new(),
            calls: 0,
        }
    }

    /// How many calls were read.
    pub(crate) fn calls(&self) -> usize {
        self.calls
    }

    /// Reads one piece of text.
    pub(crate) fn push(&mut self, text: &str, out: &mut VecDeque<ModelEvent>) {
        self.buf.push_str(text);
        loop {
            match (self.dialect, &self.state) {
                (ToolDialect::Hermes | ToolDialect::Mistral, State::Text) => {
                    let open = if self.dialect == ToolDialect::Hermes {
                        HERMES_OPEN
                    } else {
                        MISTRAL_MARKER
                    };
                    if let Some(at) = self.buf.find(open) {
                        self.emit_text(at, out);
                        self.buf.drain(..open.len());
                        self.state = State::Call;
                        continue;
                    }
                    let keep = partial_suffix(&self.buf, open);
                    self.emit_text(self.buf.len() - keep, out);
                }
                (ToolDialect::Hermes, State::Call) => {
                    if let Some(at) = self.buf.find(HERMES_CLOSE) {
                        let body: String = self.buf.drain(..at).collect();
                        self.buf.drain(..HERMES_CLOSE.len());
                        self.call_or_text(&body, out);
                        self.state = State::Text;
                        continue;
                    }
                }
                (_, State::Undecided) => {
                    let start = self.buf.trim_start();
                    if start.is_empty()
                        || (self.dialect == ToolDialect::Llama3Json
                            && PYTHON_TAG.starts_with(start))
                    {
                        return;
                    }
                    self.state = if start.starts_with('{') || start.starts_with(PYTHON_TAG) {
                        State::Bare
                    } else {
                        State::Text
                    };
                    continue;
                }
                (ToolDialect::Llama3Json, State::Text) => self.emit_text(self.buf.len(), out),
                // The list of calls (Mistral) and bare calls are read whole at the end.
                _ => {}
            }
            return;
        }
    }

    /// The text ended: what is still held is a call or text.
    pub(crate) fn finish(&mut self, out: &mut VecDeque<ModelEvent>) {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            // An unclosed block at the end of the answer (the stop token ate the tag).
            State::Call if self.dialect == ToolDialect::Hermes => self.call_or_text(&rest, out),
            State::Call => self.list_or_text(&rest, out),
            State::Bare => {
                let body = rest.trim_start().trim_start_matches(PYTHON_TAG);
                // Some models put several calls one after another, separated by `;` or lines.
                let parsed = json_values(body).unwrap_or_default();
                if !parsed.is_empty() && parsed.iter().all(|v| call_of(v).is_some()) {
                    for v in &parsed {
                        self.emit_call(v, out);
                    }
                } else {
                    out.push_back(ModelEvent::TextDelta(rest));
                }
            }
            _ => {
                if !rest.is_empty() {
                    out.push_back(ModelEvent::TextDelta(rest));
                }
            }
        }
        self.state = State::Text;
    }

    fn emit_text(&mut self, upto: usize, out: &mut VecDeque<ModelEvent>) {
        let upto = floor_char_boundary(&self.buf, upto);
        if upto == 0 {
            return;
        }
        let text: String = self.buf.drain(..upto).collect();
        out.push_back(ModelEvent::TextDelta(text));
    }

    /// One call's JSON; text (with the markers it came in) when it is not one.
    fn call_or_text(&mut self, body: &str, out: &mut VecDeque<ModelEvent>) {
        match serde_json::from_str::<Value>(body.trim()) {
            Ok(v) if call_of(&v).is_some() => self.emit_call(&v, out),
            _ => {
                out.push_back(ModelEvent::Warning(format!(
                    "a {} tool call that is not a JSON call was kept as text",
                    self.dialect.as_str()
                )));
                out.push_back(ModelEvent::TextDelta(format!(
                    "{HERMES_OPEN}{body}{HERMES_CLOSE}"
                )));
            }
        }
    }

    fn list_or_text(&mut self, body: &str, out: &mut VecDeque<ModelEvent>) {
        match serde_json::from_str::<Value>(body.trim()) {
            Ok(Value::Array(items)) if items.iter().all(|v| call_of(v).is_some()) => {
                for v in &items {
                    self.emit_call(v, out);
                }
            }
            Ok(v) if call_of(&v).is_some() => self.emit_call(&v, out),
            _ => {
                out.push_back(ModelEvent::Warning(
                    "a mistral [TOOL_CALLS] list that is not JSON was kept as text".to_owned(),
                ));
                out.push_back(ModelEvent::TextDelta(format!("{MISTRAL_MARKER}{body}")));
            }
        }
    }

    fn emit_call(&mut self, v: &Value, out: &mut VecDeque<ModelEvent>) {
        if let Some((name, arguments)) = call_of(v) {
            self.calls += 1;
            out.push_back(ModelEvent::ToolCall(ToolCall {
                // The machine gives calls without an id one of their own.
                call_id: v
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                tool: name,
                arguments,
            }));
        }
    }
}

/// The JSON values one after another in `text`, with `;` or blanks between them; `None` when
/// anything else is there.
fn json_values(mut text: &str) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    loop {
        text = text.trim_start().trim_start_matches(';').trim_start();
        if text.is_empty() {
            return Some(values);
        }
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        let value = stream.next()?.ok()?;
        let used = stream.byte_offset();
        values.push(value);
        text = text.get(used..)?;
    }
}

/// A call's name and raw arguments: `arguments` or `parameters`, an object or its JSON text.
fn call_of(v: &Value) -> Option<(String, String)> {
    let name = v.get("name")?.as_str()?.to_owned();
    if name.is_empty() {
        return None;
    }
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some((name, arguments))
}

/// The length of the longest end of `text` that is a beginning of `marker`: text that may yet
/// become the marker when the next piece comes.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && marker.starts_with(text.get(text.len() - n..).unwrap_or_default())
        })
        .unwrap_or(0)
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// Feeds `text` in pieces of every size from 1 to its length, and checks each split gives
    /// the same text and calls.
    fn read_every_split(dialect: ToolDialect, text: &str) -> (String, Vec<ToolCall>) {
        let mut seen: Option<(String, Vec<ToolCall>)> = None;
        let chars: Vec<char> = text.chars().collect();
        for size in 1..=chars.len() {
            let mut reader = DialectReader::new(dialect);
            let mut out = VecDeque::new();
            for piece in chars.chunks(size) {
                reader.push(&piece.iter().collect::<String>(), &mut out);
            }
            reader.finish(&mut out);
            let mut got = (String::new(), Vec::new());
            for e in out {
                match e {
                    ModelEvent::TextDelta(t) => got.0.push_str(&t),
                    ModelEvent::ToolCall(c) => got.1.push(c),
                    _ => {}
                }
            }
            if let Some(first) = &seen {
                assert_eq!(&got, first, "pieces of {size}");
            }
            seen = Some(got);
        }
        seen.unwrap()
    }

    #[test]
    fn hermes_calls_are_read_out_of_text_split_anywhere() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
        let (rest, calls) = read_every_split(ToolDialect::Hermes, text);
        assert_eq!(rest, "Let me check.\n\n");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].tool, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[1].tool, "get_time");
    }

    #[test]
    fn a_lone_angle_bracket_or_an_unclosed_block_is_handled() {
        let (rest, calls) = read_every_split(ToolDialect::Hermes, "a < b and é <tool");
        assert_eq!(rest, "a < b and é <tool");
        assert!(calls.is_empty());
        let (_, calls) = read_every_split(
            ToolDialect::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
        );
        assert_eq!(calls[0].arguments, r#"{"x":1}"#);
        let (rest, calls) =
            read_every_split(ToolDialect::Hermes, "<tool_call>not json</tool_call>");
        assert!(calls.is_empty());
        assert_eq!(rest, "<tool_call>not json</tool_call>");
    }

    #[test]
    fn hermes_calls_whose_tags_the_server_stripped_are_read_as_bare_json() {
        let (rest, calls) = read_every_split(
            ToolDialect::Hermes,
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"get_time\", \"arguments\": {}}",
        );
        assert_eq!(rest, "");
        assert_eq!(calls.len(), 2);
        let (rest, calls) = read_every_split(ToolDialect::Hermes, "{braces} are text too");
        assert_eq!(rest, "{braces} are text too");
        assert!(calls.is_empty());
    }

    #[test]
    fn mistral_and_llama3_calls_are_read() {
        let (rest, calls) = read_every_split(
            ToolDialect::Mistral,
            "Sure. [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {}}]",
        );
        assert_eq!(rest, "Sure. ");
        assert_eq!(calls.len(), 2);
        let (rest, calls) = read_every_split(
            ToolDialect::Llama3Json,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        );
        assert_eq!(rest, "");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        let (rest, calls) = read_every_split(ToolDialect::Llama3Json, "  It is sunny {really}.");
        assert_eq!(rest, "  It is sunny {really}.");
        assert!(calls.is_empty());
        let (rest, calls) = read_every_split(ToolDialect::Llama3Json, "{\"not\": \"a call\"}");
        assert_eq!(rest, "{\"not\": \"a call\"}");
        assert!(calls.is_empty());
    }

    #[test]
    fn calls_go_back_in_the_form_they_came() {
        let call = ToolCall {
            call_id: "c".into(),
            tool: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        };
        for dialect in [
            ToolDialect::Hermes,
            ToolDialect::Mistral,
            ToolDialect::Llama3Json,
        ] {
            let text = dialect.render_calls("", std::slice::from_ref(&call));
            let (_, calls) = read_every_split(dialect, &text);
            assert_eq!(calls.len(), 1, "{dialect:?}: {text}");
            assert_eq!(calls[0].arguments, call.arguments);
        }
    }
}
