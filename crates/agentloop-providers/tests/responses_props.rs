//! Property tests of the OpenAI Responses stream parser over the in-memory path (SSE reader, event
//! parser, accumulator), through the shared harness: arbitrary bytes, and streams assembled from
//! real event pieces, give a response or an error, never a panic. The cargo fuzz target
//! `openai_responses_stream` drives the same function for longer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use support::props::StreamProps;

/// Pieces that real streams are made of.
const PIECES: &[&str] = &[
    concat!(
        "data: ",
        r#"{"type":"response.created","response":{"id":"r","model":"m","status":"in_progress"}}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"c1","name":"f","arguments":""}}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{\"a\":"}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"1}"}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.function_call_arguments.done","output_index":0,"arguments":"{\"a\":1}"}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"}}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.output_item.done","output_index":1,"item":{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"t"}],"encrypted_content":"e"}}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.reasoning_summary_text.delta","output_index":1,"delta":"think"}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.output_text.delta","output_index":2,"delta":"hi"}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":1,"output_tokens":2}}}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"}}}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"error","code":"rate_limit_exceeded","message":"slow down"}"#,
        "\n\n"
    ),
    concat!(
        "data: ",
        r#"{"type":"response.audio.delta","delta":{"x":1}}"#,
        "\n\n"
    ),
    "data: ",
    "\n\n",
    "event: response.completed\n",
];

/// Reasoning streamed without its item keeps the text only; an item is kept whole.
fn reasoning_items_are_whole(response: &agentloop::ModelResponse) -> Result<(), TestCaseError> {
    for item in response
        .message
        .reasoning
        .iter()
        .filter_map(|r| r.provider_data.as_ref())
    {
        prop_assert_eq!(item["type"].as_str(), Some("reasoning"));
    }
    Ok(())
}

#[test]
fn streams_give_a_response_or_an_error_never_a_panic() {
    StreamProps {
        parse: agentloop_providers::openai_responses::parse_stream_bytes,
        pieces: PIECES,
        complete: &["response.completed", "response.incomplete"],
        // Summary text streamed without its reasoning item, then completion (once shrunk to).
        known: &[concat!(
            "data: {\"type\":\"response.reasoning_summary_text.delta\",\"output_index\":1,\"delta\":\"think\"}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n",
        )],
        extra: reasoning_items_are_whole,
    }
    .check();
}
