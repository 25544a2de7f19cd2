//! Arbitrary model text through the plain-text tool-call dialects, by the entry a live stream
//! uses: each piece is a Chat Completions chunk's `content`, pushed to a `ChatStreamParser` with
//! a dialect. The text goes in whole and cut into pieces whose sizes come from the input's own
//! bytes; the reader claims that however the text is split the same text and calls come out,
//! and that text from which no call is read comes back unchanged. Never a panic or a hang.
//!
//! Input: byte 0 picks the dialect (bits 0-1), whether the output limit ended the text (bit 2)
//! and a small bound on held blocks (bit 3, the bound from byte 1); byte 1 bounds the pieces'
//! sizes; the rest is the text (invalid UTF-8 replaced).
#![no_main]

use std::collections::VecDeque;

use agentloop::model::ModelEvent;
use agentloop_providers::openai_chat::{ChatStreamParser, ToolDialect};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

/// The tools the request offered (as the dialect's unit tests do).
const TOOLS: [&str; 4] = ["get_weather", "get_time", "write_file", "shell"];

/// The text read and the other events (calls, the finish, warnings), as `Debug` text.
type Read = (String, Vec<String>);

fuzz_target!(|data: &[u8]| {
    let [flags, sizes, rest @ ..] = data else {
        return;
    };
    let dialect = match flags & 3 {
        0 => ToolDialect::Auto,
        1 => ToolDialect::Hermes,
        2 => ToolDialect::Mistral,
        _ => ToolDialect::Llama3Json,
    };
    let cut = flags & 4 != 0;
    let max_block = (flags & 8 != 0).then_some(usize::from(*sizes) + 1);
    let text = String::from_utf8_lossy(rest);
    let whole = read(dialect, cut, max_block, &[&text]);
    let pieces = split(&text, rest, usize::from(*sizes % 32) + 1);
    let split = read(dialect, cut, max_block, &pieces);
    assert_eq!(
        split, whole,
        "{dialect:?}, cut by the limit: {cut}, pieces {pieces:?}"
    );
    if !whole.1.iter().any(|e| e.starts_with("ToolCall")) {
        assert_eq!(whole.0, text, "no call read, yet the text changed");
    }
});

/// The text cut into pieces of 1 to `most` bytes (whole characters), each size taken from the
/// input's bytes in turn.
fn split<'t>(text: &'t str, bytes: &[u8], most: usize) -> Vec<&'t str> {
    let mut pieces = Vec::new();
    let (mut at, mut turn) = (0, 0);
    while at < text.len() {
        let size = bytes
            .get(turn % bytes.len().max(1))
            .map_or(1, |b| usize::from(*b) % most + 1);
        turn += 1;
        let mut end = (at + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&text[at..end]);
        at = end;
    }
    pieces
}

/// Streams `pieces` as the content of Chat Completions chunks, then the finish.
fn read(dialect: ToolDialect, cut: bool, max_block: Option<usize>, pieces: &[&str]) -> Read {
    let mut parser =
        ChatStreamParser::new("fuzz").with_dialect_tools(Some(dialect), TOOLS.map(str::to_owned));
    if let Some(bytes) = max_block {
        parser = parser.with_dialect_max_block(bytes);
    }
    let mut out = VecDeque::new();
    for piece in pieces {
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": piece}}]});
        parser
            .push(&chunk.to_string(), &mut out)
            .expect("a content chunk is read");
    }
    let reason = if cut { "length" } else { "stop" };
    let last = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]});
    parser
        .push(&last.to_string(), &mut out)
        .expect("the finish is read");
    parser.push("[DONE]", &mut out).expect("[DONE] is read");
    parser.end(&mut out).expect("the stream ends");
    let mut read = Read::default();
    for event in out {
        match event {
            ModelEvent::TextDelta(t) => read.0.push_str(&t),
            other => read.1.push(format!("{other:?}")),
        }
    }
    read
}
