//! Property tests of the Chat Completions stream parser over the in-memory path, through the
//! shared harness: arbitrary bytes, and well-framed events with arbitrary payloads, give a
//! response or an error, never a panic. CI runs these; the cargo fuzz target (`fuzz/`) drives the
//! same function for longer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::props::{StreamProps, nothing_more};

/// Pieces that real streams are made of, so random streams often get past the framing.
const PIECES: &[&str] = &[
    "data: ",
    "\n\n",
    "\r\n",
    "data: [DONE]\n\n",
    r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"","function":{"name":"f","arguments":"{\"a\""}}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":":1}"}}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
    r#"{"error":{"message":"boom","code":500}}"#,
    "event: x\nid: 1\nretry: 5\n: comment\n",
];

#[test]
fn streams_give_a_response_or_an_error_never_a_panic() {
    StreamProps {
        parse: agentloop_providers::openai_chat::parse_stream_bytes,
        pieces: PIECES,
        complete: &["[DONE]", "finish_reason"],
        known: &[],
        extra: nothing_more,
    }
    .check();
}
