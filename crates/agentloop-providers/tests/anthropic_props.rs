//! Property tests of the Anthropic Messages stream parser over the in-memory path (SSE reader,
//! event parser, accumulator), through the shared harness: arbitrary bytes, and streams assembled
//! from real event pieces, give a response or an error, never a panic. The cargo fuzz target
//! `anthropic_stream` drives the same function for longer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::props::{StreamProps, nothing_more};

/// Pieces that real streams are made of.
const PIECES: &[&str] = &[
    concat!(
        "event: x\ndata: ",
        r#"{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":5,"output_tokens":1,"cache_read_input_tokens":2}}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\": "}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_stop","index":1}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"thinking","thinking":""}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"signature_delta","signature":"S"}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"content_block_stop","index":2}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":9}}"#,
        "\n\n"
    ),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
        "\n\n"
    ),
    concat!("event: x\ndata: ", r#"{"type":"message_stop"}"#, "\n\n"),
    concat!("event: x\ndata: ", r#"{"type":"ping"}"#, "\n\n"),
    concat!(
        "event: x\ndata: ",
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        "\n\n"
    ),
    "data: ",
    "\n\n",
    ": comment\r\n",
    ": comment\r\n",
];

#[test]
fn streams_give_a_response_or_an_error_never_a_panic() {
    StreamProps {
        parse: agentloop_providers::anthropic::parse_stream_bytes,
        pieces: PIECES,
        complete: &["message_stop"],
        known: &[],
        extra: nothing_more,
    }
    .check();
}
