//! The dialects' readers over text split every way, and property tests: arbitrary text never
//! panics, and text that names no tool comes back unchanged.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::VecDeque;

use agentloop::message::ToolCall;
use agentloop::model::ModelEvent;
use proptest::prelude::*;

use super::*;

/// The tools of the requests in these tests.
const TOOLS: [&str; 4] = ["get_weather", "get_time", "write_file", "shell"];

/// Reads `pieces` one after another.
fn read_pieces<'a>(
    dialect: ToolDialect,
    pieces: impl IntoIterator<Item = &'a str>,
) -> (String, Vec<ToolCall>) {
    let mut reader = DialectReader::new(dialect, TOOLS.map(str::to_owned));
    let mut out = VecDeque::new();
    for piece in pieces {
        reader.push(piece, &mut out);
    }
    reader.finish(&mut out, false);
    let mut got = (String::new(), Vec::new());
    for e in out {
        match e {
            ModelEvent::TextDelta(t) => got.0.push_str(&t),
            ModelEvent::ToolCall(c) => got.1.push(c),
            _ => {}
        }
    }
    got
}

/// Feeds `text` in pieces of every size from 1 to its length, and checks each split gives
/// the same text and calls.
fn read_every_split(dialect: ToolDialect, text: &str) -> (String, Vec<ToolCall>) {
    let mut seen: Option<(String, Vec<ToolCall>)> = None;
    let chars: Vec<char> = text.chars().collect();
    for size in 1..=chars.len() {
        let pieces: Vec<String> = chars.chunks(size).map(|p| p.iter().collect()).collect();
        let got = read_pieces(dialect, pieces.iter().map(String::as_str));
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

/// Reads `text` whole as the text of a response the output limit ended: the calls that run,
/// and the calls it cut (their arguments as the model wrote them).
fn read_to_the_limit(dialect: ToolDialect, text: &str) -> (Vec<ToolCall>, Vec<ToolCall>) {
    let mut reader = DialectReader::new(dialect, TOOLS.map(str::to_owned));
    let mut out = VecDeque::new();
    reader.push(text, &mut out);
    reader.finish(&mut out, true);
    let (cut, whole): (Vec<ToolCall>, Vec<ToolCall>) = out
        .into_iter()
        .filter_map(|e| match e {
            ModelEvent::ToolCall(c) => Some(c),
            _ => None,
        })
        .partition(|c| serde_json::from_str::<serde_json::Value>(&c.arguments).is_err());
    assert_eq!(reader.calls(), whole.len(), "{text}");
    (whole, cut)
}

#[test]
fn a_block_the_output_limit_cut_is_a_cut_call_and_one_the_stop_token_cut_is_repaired() {
    let cut_hermes =
        "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"rm -rf build\"";
    let (whole, cut) = read_to_the_limit(ToolDialect::Hermes, cut_hermes);
    assert!(whole.is_empty());
    assert_eq!(cut[0].tool, "shell");
    assert_eq!(
        cut[0].arguments,
        r#"{"name": "shell", "arguments": {"command": "rm -rf build""#
    );
    // Ended by the stop token, the same block is closed for the model.
    let (_, calls) = read_every_split(ToolDialect::Hermes, cut_hermes);
    assert_eq!(calls[0].arguments, r#"{"command":"rm -rf build"}"#);

    // A list cut inside its second call: the first is whole and runs.
    let (whole, cut) = read_to_the_limit(
        ToolDialect::Auto,
        "```json\n[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"write_file\", \"arguments\": {\"paths\": [\"a\", \"b\"",
    );
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(cut.len(), 1);
    assert_eq!(cut[0].tool, "write_file");
    assert!(cut[0].arguments.starts_with(r#"{"name": "write_file""#));
    // Cut right after a whole call, only the list's own closer missing: nothing was cut.
    let (whole, cut) = read_to_the_limit(
        ToolDialect::Mistral,
        "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}",
    );
    assert_eq!((whole.len(), cut.len()), (1, 0));
    // Mistral's named form keeps the arguments as written.
    let (whole, cut) = read_to_the_limit(
        ToolDialect::Mistral,
        "[TOOL_CALLS]shell[ARGS]{\"command\": [\"ls\", \"-l\"",
    );
    assert!(whole.is_empty());
    assert_eq!(cut[0].arguments, r#"{"command": ["ls", "-l""#);
    // A call written whole runs, the limit or not; a missing `</tool_call>` alone cut nothing.
    for (dialect, text) in [
        (
            ToolDialect::Llama3Json,
            "{\"name\": \"shell\", \"parameters\": {\"command\": \"ls\"}}",
        ),
        (
            ToolDialect::Hermes,
            "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"ls\"}}\n",
        ),
    ] {
        let (whole, cut) = read_to_the_limit(dialect, text);
        assert_eq!((whole.len(), cut.len()), (1, 0), "{text}");
    }
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
    let (rest, calls) = read_every_split(ToolDialect::Hermes, "<tool_call>not json</tool_call>");
    assert!(calls.is_empty());
    assert_eq!(rest, "<tool_call>not json</tool_call>");
}

#[test]
fn hermes_calls_whose_tags_the_server_stripped_are_read_as_bare_json() {
    let (rest, calls) = read_every_split(
        ToolDialect::Hermes,
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"get_time\", \"arguments\": {}}",
    );
    assert_eq!(rest.trim(), "");
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
        ToolDialect::Auto,
    ] {
        let text = dialect.render_calls("", std::slice::from_ref(&call));
        let (_, calls) = read_every_split(dialect, &text);
        assert_eq!(calls.len(), 1, "{dialect:?}: {text}");
        assert_eq!(calls[0].arguments, call.arguments);
    }
}

#[test]
fn auto_reads_every_shape_small_models_write_and_keeps_the_text_around() {
    let paris = r#"{"city":"Paris"}"#;
    for (text, before, after) in [
        (
            "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "I'll check.\n",
            "",
        ),
        (
            "Sure:\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```\nDone.",
            "Sure:\n",
            "\nDone.",
        ),
        (
            "```\n[{\"name\": \"get_weather\", \"parameters\": \"{\\\"city\\\": \\\"Paris\\\"}\"}]\n```",
            "",
            "",
        ),
        (
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\",},}",
            "",
            "",
        ),
        (
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}",
            "",
            "",
        ),
        (
            "Ok [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
            "Ok ",
            "",
        ),
        ("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "", ""),
        (
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            "",
            "",
        ),
        ("[get_weather(city='Paris')]", "", ""),
        // A Python dict, in a fence or bare (small models write their calls so).
        (
            "Sure:\n```json\n{'name': 'get_weather', 'arguments': {'city': 'Paris'}}\n```",
            "Sure:\n",
            "",
        ),
        (
            "{'name': 'get_weather', 'arguments': {'city': 'Paris'}}",
            "",
            "",
        ),
        (
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}",
            "",
            "",
        ),
    ] {
        let (rest, calls) = read_every_split(ToolDialect::Auto, text);
        assert_eq!(calls.len(), 1, "{text}");
        assert_eq!(calls[0].tool, "get_weather", "{text}");
        assert_eq!(calls[0].arguments, paris, "{text}");
        assert_eq!(rest, format!("{before}{after}"), "{text}");
    }
}

#[test]
fn auto_reads_several_calls_and_code_fences_stay_text() {
    let (rest, calls) = read_every_split(
        ToolDialect::Auto,
        "{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.py\", \"content\": \"print(5)\\n\"}}\n{\"name\": \"shell\", \"arguments\": {\"command\": \"python3 a.py\"}}",
    );
    assert_eq!(rest, "\n");
    assert_eq!(
        calls.iter().map(|c| c.tool.as_str()).collect::<Vec<_>>(),
        ["write_file", "shell"]
    );
    let code = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n\n{'name': 'shell'}\n```\n```\n```\n";
    let (rest, calls) = read_every_split(ToolDialect::Auto, code);
    assert!(calls.is_empty());
    assert_eq!(rest, code);
}

/// Found by the `openai_chat_dialect` fuzz target: a fence indented after a line break closed a
/// fence of code when the blanks before it came in an earlier piece, and not when the text came
/// whole, so a call after it ran or not by how the text was cut.
#[test]
fn an_indented_fence_closes_a_fence_of_code_however_the_text_is_split() {
    for (dialect, text) in [
        (
            ToolDialect::Mistral,
            "```\nto\n ```[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]",
        ),
        (
            ToolDialect::Hermes,
            "1. List them:\n   ```sh\n   ls\n   ```\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
        ),
        (
            ToolDialect::Auto,
            "```\ncode\n\t```\n{\"name\": \"get_time\", \"arguments\": {}}",
        ),
    ] {
        let (_, calls) = read_every_split(dialect, text);
        assert_eq!(calls.len(), 1, "{text:?}");
        assert_eq!(calls[0].tool, "get_time");
    }
    // A fence after other text on its line still closes nothing.
    let code = "```\ncode\n x ```\n{\"name\": \"get_time\", \"arguments\": {}}\n";
    let (rest, calls) = read_every_split(ToolDialect::Auto, code);
    assert!(calls.is_empty());
    assert_eq!(rest, code);
}

#[test]
fn auto_leaves_json_that_names_no_tool_as_text() {
    for text in [
        "{\"name\": \"Ada\", \"age\": 36}",
        "```json\n{\"name\": \"delete_all\", \"arguments\": {}}\n```",
        "<tool_call>{\"name\": \"delete_all\", \"arguments\": {}}</tool_call>",
        "[1, 2]\n[see](http://example.com)\n{braces}",
        "Use [TOOL_CALLS] like this.",
        "[get_weather is a tool]",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"note\": 1}",
    ] {
        let (rest, calls) = read_every_split(ToolDialect::Auto, text);
        assert!(calls.is_empty(), "{text}");
        assert_eq!(rest, text);
    }
}

#[test]
fn a_made_up_tool_response_is_text_and_a_call_after_it_is_read() {
    // What is in a result the model wrote itself is never a call (it is the call it imagines
    // it made), in every dialect; a call after the result is read as any other.
    let made_up = "<tool_response>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_response>\nIt is 18 C.\n";
    let text =
        format!("{made_up}<tool_call>{{\"name\": \"get_time\", \"arguments\": {{}}}}</tool_call>");
    for dialect in [
        ToolDialect::Auto,
        ToolDialect::Hermes,
        ToolDialect::Llama3Json,
    ] {
        let (rest, calls) = read_every_split(dialect, &text);
        assert_eq!(rest, made_up, "{dialect:?}");
        assert_eq!(calls.len(), 1, "{dialect:?}");
        assert_eq!(calls[0].tool, "get_time", "{dialect:?}");
    }
    // Said once, as a warning.
    let mut reader = DialectReader::new(ToolDialect::Auto, TOOLS.map(str::to_owned));
    let mut out = VecDeque::new();
    reader.push(&format!("{made_up}{made_up}"), &mut out);
    reader.finish(&mut out, false);
    let warnings = out
        .iter()
        .filter(|e| matches!(e, ModelEvent::Warning(w) if w.contains("made-up result")))
        .count();
    assert_eq!(warnings, 1);
    // Never closed: the rest of the answer is text.
    let open = "<tool_response>\n{\"name\": \"get_weather\", \"arguments\": {}}";
    assert_eq!(
        read_every_split(ToolDialect::Auto, open),
        (open.to_owned(), Vec::new())
    );
}

#[test]
fn a_tool_call_tag_holding_only_a_tool_name_is_a_call_without_arguments() {
    let text = "<tool_call>get_time</tool_call>\nIt is late.";
    for dialect in [ToolDialect::Auto, ToolDialect::Hermes] {
        let (rest, calls) = read_every_split(dialect, text);
        assert_eq!(rest, "\nIt is late.", "{dialect:?}");
        assert_eq!(calls.len(), 1, "{dialect:?}");
        assert_eq!((&*calls[0].tool, &*calls[0].arguments), ("get_time", "{}"));
    }
    // A name that is no tool is no call, even in Hermes' own tag; nor is a tag left open (the
    // name may have been cut), nor a call written with positional arguments.
    for text in [
        "<tool_call>nope</tool_call>",
        "<tool_call>get_time",
        "<tool_call>get_time(1, 2)</tool_call>",
    ] {
        for dialect in [ToolDialect::Auto, ToolDialect::Hermes] {
            let (rest, calls) = read_every_split(dialect, text);
            assert!(calls.is_empty(), "{dialect:?} {text}");
            assert_eq!(rest, text, "{dialect:?}");
        }
    }
}

#[test]
fn a_call_written_as_a_tool_call_tags_attributes_is_read() {
    for (text, rest) in [
        (
            "<tool_call name=\"get_weather\" arguments={\"city\": \"a>b'c\"} />",
            "",
        ),
        (
            "Sure. <tool_call name='get_weather' arguments='{\"city\": \"a>b\"}'></tool_call>\nDone.",
            "Sure. \nDone.",
        ),
        // Closed as if it were an object.
        (
            "<tool_call name=\"get_weather\" arguments={\"city\": \"a>b'c\"}} and more",
            " and more",
        ),
        // The stop token ate the tag's end.
        (
            "<tool_call name=\"get_weather\" arguments={\"city\": \"a>b'c\"}",
            "",
        ),
    ] {
        for dialect in [ToolDialect::Auto, ToolDialect::Hermes] {
            let (got, calls) = read_every_split(dialect, text);
            assert_eq!(got, rest, "{dialect:?} {text}");
            assert_eq!(calls.len(), 1, "{dialect:?} {text}");
            assert_eq!(calls[0].tool, "get_weather");
            let arguments: serde_json::Value = serde_json::from_str(&calls[0].arguments).unwrap();
            let city = if text.starts_with("Sure") {
                "a>b"
            } else {
                "a>b'c"
            };
            assert_eq!(arguments, serde_json::json!({"city": city}), "{text}");
        }
    }
    for text in [
        "<tool_call name=\"nope\" arguments={} />",
        "Write <tool_call name tags> around it.",
        "<tool_call name=\"get_weather\" colour=\"red\" />",
    ] {
        for dialect in [ToolDialect::Auto, ToolDialect::Hermes] {
            let (got, calls) = read_every_split(dialect, text);
            assert!(calls.is_empty(), "{dialect:?} {text}");
            assert_eq!(got, text, "{dialect:?}");
        }
    }
    // Cut by the output limit inside its arguments: a cut call, never run.
    let (whole, cut) = read_to_the_limit(
        ToolDialect::Auto,
        "<tool_call name=\"get_weather\" arguments={\"city\": \"Pa\"",
    );
    assert!(whole.is_empty());
    assert_eq!(cut.len(), 1);
}

#[test]
fn named_dialects_also_read_a_fenced_call_of_a_known_tool() {
    let text = "```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"calc.py\", \"content\": \"x\"}}\n```";
    for dialect in [
        ToolDialect::Hermes,
        ToolDialect::Mistral,
        ToolDialect::Llama3Json,
    ] {
        let (rest, calls) = read_every_split(dialect, text);
        assert_eq!(calls.len(), 1, "{dialect:?}");
        assert_eq!(rest, "", "{dialect:?}");
    }
    // A name that is no tool stays text outside the dialect's own shape.
    let (rest, calls) = read_every_split(
        ToolDialect::Hermes,
        "```json\n{\"name\": \"nope\", \"arguments\": {}}\n```",
    );
    assert!(calls.is_empty());
    assert!(rest.starts_with("```json"));
}

#[test]
fn a_call_whose_strings_hold_raw_line_breaks_and_tabs_is_read() {
    // Small models write a multi-line `content` as it is; here it even holds a fence of its
    // own, which does not close the fence around the call.
    let content = "# Notes\n\tindented\n```sh\nls\n```\n";
    let call = format!(
        "{{\"name\": \"write_file\", \"arguments\": {{\"path\": \"a.md\", \"content\": \"{content}\"}}}}"
    );
    let want: serde_json::Value = serde_json::json!({"path": "a.md", "content": content});
    for (text, rest) in [
        (
            format!("Sure:\n```json\n{call}\n```\nDone."),
            "Sure:\n\nDone.",
        ),
        (format!("<tool_call>\n{call}\n</tool_call>"), ""),
        (call.clone(), ""),
    ] {
        let (got_rest, calls) = read_every_split(ToolDialect::Auto, &text);
        assert_eq!(calls.len(), 1, "{text}");
        let arguments: serde_json::Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(arguments, want, "{text}");
        assert_eq!(got_rest, rest, "{text}");
    }
}

#[test]
fn a_bare_call_after_text_on_its_line_is_read_when_it_names_a_tool() {
    let text = "I'll check: {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} now.";
    for dialect in [ToolDialect::Auto, ToolDialect::Hermes] {
        let (rest, calls) = read_every_split(dialect, text);
        assert_eq!(calls.len(), 1, "{dialect:?}");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(rest, "I'll check:  now.", "{dialect:?}");
    }
    let (rest, calls) = read_every_split(
        ToolDialect::Auto,
        "Ok: {'name': 'get_weather', 'arguments': {'city': 'Paris'}}",
    );
    assert_eq!((rest.as_str(), calls.len()), ("Ok: ", 1));
    // A name that is no tool, and JSON that is no call, stay text (in every dialect: after
    // other text, no dialect owns the shape).
    for text in [
        "Write it as {\"name\": \"delete_all\", \"arguments\": {}} please.",
        "The user is {\"name\": \"Ada\", \"age\": 36}.",
        "x {\"name\": {\"name\": {\"name\": ] and {\"name\"",
    ] {
        for dialect in [
            ToolDialect::Auto,
            ToolDialect::Hermes,
            ToolDialect::Llama3Json,
        ] {
            let (rest, calls) = read_every_split(dialect, text);
            assert!(calls.is_empty(), "{dialect:?} {text}");
            assert_eq!(rest, text, "{dialect:?}");
        }
    }
}

#[test]
fn a_fence_closed_right_after_the_call_on_its_line_ends_there() {
    let (rest, calls) = read_every_split(
        ToolDialect::Auto,
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}```\nDone.",
    );
    assert_eq!(calls.len(), 1);
    assert_eq!(rest, "\nDone.");
    let (rest, calls) = read_every_split(
        ToolDialect::Auto,
        "```\n[{\"name\": \"get_time\", \"arguments\": {}}] ``` and more",
    );
    assert_eq!(calls.len(), 1);
    assert_eq!(rest, " and more");
}

/// Reads `pieces` with blocks held for at most `max_block` bytes: the text, the calls and the
/// warnings.
fn read_held_at_most(
    max_block: usize,
    dialect: ToolDialect,
    pieces: &[&str],
) -> (String, usize, Vec<String>) {
    let mut reader =
        DialectReader::new(dialect, TOOLS.map(str::to_owned)).with_max_block(max_block);
    let mut out = VecDeque::new();
    for piece in pieces {
        reader.push(piece, &mut out);
    }
    reader.finish(&mut out, false);
    let mut got = (String::new(), 0, Vec::new());
    for e in out {
        match e {
            ModelEvent::TextDelta(t) => got.0.push_str(&t),
            ModelEvent::ToolCall(_) => got.1 += 1,
            ModelEvent::Warning(w) => got.2.push(w),
            _ => {}
        }
    }
    got
}

#[test]
fn a_block_that_does_not_end_within_the_bound_is_text_with_the_rest_of_the_answer() {
    let call = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
    let long = format!(
        "Hi\n<tool_call>{{\"name\": \"shell\", \"arguments\": {{\"command\": \"{}\"}}}}</tool_call>\n{call}",
        "a".repeat(200)
    );
    for dialect in [ToolDialect::Hermes, ToolDialect::Auto] {
        // Whole or in pieces, the same: the block and what follows are text.
        let whole = read_held_at_most(100, dialect, &[&long]);
        let pieces: Vec<String> = long.chars().map(String::from).collect();
        let split = read_held_at_most(
            100,
            dialect,
            &pieces.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert_eq!(whole, split, "{dialect:?}");
        assert_eq!(whole.0, long);
        assert_eq!(whole.1, 0);
        assert_eq!(whole.2.len(), 1, "{:?}", whole.2);
        assert!(whole.2[0].contains("within 100 bytes"), "{:?}", whole.2);
        // Within the bound, both calls are read.
        let within = read_held_at_most(1000, dialect, &[&long]);
        assert_eq!((within.0.as_str(), within.1), ("Hi\n\n", 2));
    }
    // A fenced call that fits, in text longer than the bound: the fence inside its content
    // still does not close it.
    let fenced =
        "```json\n{\"name\": \"write_file\", \"arguments\": {\"content\": \"a\n```\nb\"}}\n```";
    let text = format!("{fenced}\n{}", "x".repeat(100));
    let got = read_held_at_most(fenced.len() + 2, ToolDialect::Auto, &[&text]);
    assert_eq!((got.1, got.2.len()), (1, 0), "{got:?}");
    // A call that fits is read however close to the bound it ends.
    assert_eq!(
        read_held_at_most(call.len(), ToolDialect::Hermes, &[call]).1,
        1
    );
    assert_eq!(
        read_held_at_most(call.len() - 1, ToolDialect::Hermes, &[call]).1,
        0
    );
}

#[test]
fn text_up_to_where_a_bracketed_block_broke_is_text() {
    // A call inside JSON that breaks is no call; reading each bracket of broken JSON again
    // would read it once a bracket.
    let text = "[\n{\"name\": \"get_time\", \"arguments\": {}}\n}\n{\"name\": \"get_time\", \"arguments\": {}}";
    let (rest, calls) = read_every_split(ToolDialect::Auto, text);
    assert_eq!(calls.len(), 1);
    assert_eq!(rest, "[\n{\"name\": \"get_time\", \"arguments\": {}}\n}\n");
}

/// Text that may look like the start of a call, to make random texts interesting.
const PIECES: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "```",
    "```json\n",
    "\n",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "\"",
    "'",
    ",",
    "\"name\": ",
    "\"arguments\": ",
    "\"get_weather\"",
    "get_weather",
    "city=",
    "[ARGS]",
    "é",
    " text ",
];

fn random_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(PIECES).prop_map(str::to_owned),
            any::<String>(),
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

/// `text` cut at these places (byte offsets, moved to char boundaries).
fn cut(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| {
            let mut c = c % (text.len() + 1);
            while !text.is_char_boundary(c) {
                c -= 1;
            }
            c
        })
        .collect();
    at.push(0);
    at.push(text.len());
    at.sort_unstable();
    at.windows(2)
        .map(|w| text.get(w[0]..w[1]).unwrap().to_owned())
        .collect()
}

proptest! {
    #[test]
    fn any_text_split_anywhere_reads_as_it_reads_whole(
        text in random_text(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        for dialect in [ToolDialect::Auto, ToolDialect::Hermes, ToolDialect::Mistral, ToolDialect::Llama3Json] {
            let whole = read_pieces(dialect, [text.as_str()]);
            let pieces = cut(&text, &cuts);
            let split = read_pieces(dialect, pieces.iter().map(String::as_str));
            prop_assert_eq!(&split, &whole, "{:?}", dialect);
            if whole.1.is_empty() {
                // No call read: every byte came back as text.
                prop_assert_eq!(&whole.0, &text);
            }
        }
    }

    #[test]
    fn with_a_bound_on_blocks_any_text_split_anywhere_reads_as_it_reads_whole(
        text in random_text(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        max_block in 1usize..80,
    ) {
        for dialect in [ToolDialect::Auto, ToolDialect::Hermes, ToolDialect::Mistral, ToolDialect::Llama3Json] {
            let whole = read_held_at_most(max_block, dialect, &[text.as_str()]);
            let pieces = cut(&text, &cuts);
            let split = read_held_at_most(
                max_block,
                dialect,
                &pieces.iter().map(String::as_str).collect::<Vec<_>>(),
            );
            prop_assert_eq!(&split, &whole, "{:?}", dialect);
            if whole.1 == 0 {
                prop_assert_eq!(&whole.0, &text);
            }
        }
    }

    #[test]
    fn auto_gives_back_text_that_names_no_tool_unchanged(
        text in random_text(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        prop_assume!(!TOOLS.iter().any(|t| text.contains(t)));
        let pieces = cut(&text, &cuts);
        let (rest, calls) = read_pieces(ToolDialect::Auto, pieces.iter().map(String::as_str));
        prop_assert!(calls.is_empty());
        prop_assert_eq!(rest, text);
    }
}
