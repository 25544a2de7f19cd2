//! A final answer that is nothing but a tool call written as text: the model meant to call a tool,
//! and nothing read it as a call (no tool-call parser at the server, or a text dialect that did not
//! recognise the shape). Reporting it as a finished answer would be dishonest: the tool never ran.
//! The rule is kept narrow so that ordinary answers that contain JSON stay answers: the whole
//! answer (or the one fenced block or `<tool_call>` block it is) must be a JSON object, or an array
//! of them, each naming a tool the agent has, with its arguments and nothing else.

use serde_json::Value;

/// The tool the answer calls, when the whole answer is a call of one of `tools` written as text.
pub(super) fn unread_tool_call(text: &str, mut tools: impl FnMut(&str) -> bool) -> Option<String> {
    let body = unwrap(text.trim());
    // Most answers are prose: not parsed at all (a failed parse allocates its error).
    if !body.starts_with(['{', '[']) {
        return None;
    }
    let value: Value = serde_json::from_str(body).ok()?;
    let calls: Vec<&Value> = match &value {
        Value::Array(items) if !items.is_empty() => items.iter().collect(),
        Value::Object(_) => vec![&value],
        _ => return None,
    };
    let mut first = None;
    for call in calls {
        let name = call_name(call)?;
        if !tools(name) {
            return None;
        }
        first.get_or_insert_with(|| name.to_owned());
    }
    first
}

/// The text inside one fence (```json … ``` or ``` … ```) or one `<tool_call>` block that is the
/// whole answer, else the answer.
fn unwrap(text: &str) -> &str {
    if let Some(inner) = text
        .strip_prefix("<tool_call>")
        .and_then(|t| t.strip_suffix("</tool_call>"))
    {
        return inner.trim();
    }
    if let Some(rest) = text.strip_prefix("```")
        && let Some(inner) = rest.strip_suffix("```")
    {
        // The fence's info string (`json`) ends at the first line break.
        let inner = match inner.split_once('\n') {
            Some((info, body)) if !info.trim().contains(['{', '[']) => body,
            _ => inner,
        };
        return inner.trim();
    }
    text
}

/// `{"name": …, "arguments": {…}}` (or `parameters`, an object or a JSON string, or none), with
/// at most a `type` and an `id` beside: the name, else `None`.
fn call_name(call: &Value) -> Option<&str> {
    let map = call.as_object()?;
    // OpenAI's own shape nests the call: {"type": "function", "function": {…}}.
    if let Some(function) = map.get("function")
        && map
            .keys()
            .all(|k| matches!(k.as_str(), "function" | "type" | "id"))
    {
        return call_name(function);
    }
    let name = map.get("name")?.as_str()?;
    let arguments_ok = ["arguments", "parameters"]
        .iter()
        .filter_map(|k| map.get(*k))
        .all(|a| a.is_object() || a.is_string());
    let only_call_keys = map.keys().all(|k| {
        matches!(
            k.as_str(),
            "name" | "arguments" | "parameters" | "type" | "id"
        )
    });
    (arguments_ok && only_call_keys).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(name: &str) -> bool {
        matches!(name, "write_file" | "shell")
    }

    #[test]
    fn a_call_written_as_text_is_found_in_the_shapes_small_models_write() {
        for text in [
            r#"{"name": "write_file", "arguments": {"path": "calc.py", "content": "x"}}"#,
            "```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a\"}}\n```",
            "```\n{\"name\": \"shell\", \"parameters\": {\"command\": \"ls\"}}\n```",
            "<tool_call>\n{\"name\": \"shell\", \"arguments\": \"{\\\"command\\\": \\\"ls\\\"}\"}\n</tool_call>",
            r#"[{"name": "shell", "arguments": {}}, {"name": "write_file", "arguments": {}}]"#,
            r#"{"type": "function", "function": {"name": "shell", "arguments": "{}"}}"#,
        ] {
            assert!(unread_tool_call(text, known).is_some(), "{text}");
        }
    }

    #[test]
    fn answers_that_merely_contain_json_stay_answers() {
        for text in [
            "The file is written.",
            r#"{"name": "delete_all", "arguments": {}}"#,
            r#"{"name": "write_file", "arguments": {}, "note": "done"}"#,
            r#"Here is the call: {"name": "shell", "arguments": {}}"#,
            r#"{"name": "Ada", "age": 36}"#,
            r#"[{"name": "shell", "arguments": {}}, {"name": "Ada"}]"#,
            "[]",
            "```json\n{\"result\": 5}\n```",
        ] {
            assert_eq!(unread_tool_call(text, known), None, "{text}");
        }
    }
}
