//! Property tests of the OpenAI Responses stream parser over the in-memory path (SSE reader, event
//! parser, accumulator): arbitrary bytes, and streams assembled from real event pieces, give a
//! response or an error, never a panic. The cargo fuzz target `openai_responses_stream` drives the
//! same function for longer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentloop::FinishReason;
use agentloop_providers::openai_responses::parse_stream_bytes;
use proptest::prelude::*;

fn event(data: &str) -> String {
    format!("data: {data}\n\n")
}

/// Pieces that real streams are made of, so random streams get past the framing.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(event(
            r#"{"type":"response.created","response":{"id":"r","model":"m","status":"in_progress"}}"#
        )),
        Just(event(
            r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"c1","name":"f","arguments":""}}"#
        )),
        Just(event(
            r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{\"a\":"}"#
        )),
        Just(event(
            r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"1}"}"#
        )),
        Just(event(
            r#"{"type":"response.function_call_arguments.done","output_index":0,"arguments":"{\"a\":1}"}"#
        )),
        Just(event(
            r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"}}"#
        )),
        Just(event(
            r#"{"type":"response.output_item.done","output_index":1,"item":{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"t"}],"encrypted_content":"e"}}"#
        )),
        Just(event(
            r#"{"type":"response.reasoning_summary_text.delta","output_index":1,"delta":"think"}"#
        )),
        Just(event(
            r#"{"type":"response.output_text.delta","output_index":2,"delta":"hi"}"#
        )),
        Just(event(
            r#"{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":1,"output_tokens":2}}}"#
        )),
        Just(event(
            r#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#
        )),
        Just(event(
            r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"}}}"#
        )),
        Just(event(
            r#"{"type":"error","code":"rate_limit_exceeded","message":"slow down"}"#
        )),
        Just(event(r#"{"type":"response.audio.delta","delta":{"x":1}}"#)),
        Just("data: ".to_owned()),
        Just("\n\n".to_owned()),
        Just("event: response.completed\n".to_owned()),
        "[ -~]{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = parse_stream_bytes(&bytes);
    }

    #[test]
    fn streams_built_from_real_pieces_never_panic(pieces in proptest::collection::vec(fragment(), 0..40)) {
        let stream = pieces.concat();
        if let Ok(response) = parse_stream_bytes(stream.as_bytes()) {
            prop_assert!(stream.contains("response.completed") || stream.contains("response.incomplete"));
            for call in &response.message.tool_calls {
                prop_assert!(!call.name.is_empty());
                prop_assert!(!call.id.is_empty());
                if response.finish_reason == FinishReason::Length && !call.arguments.is_empty() {
                    prop_assert!(serde_json::from_str::<serde_json::Value>(&call.arguments).is_ok());
                }
            }
            // Reasoning streamed without its item keeps the text only; an item is kept whole.
            for item in response.message.reasoning.iter().filter_map(|r| r.provider_data.as_ref()) {
                prop_assert_eq!(item["type"].as_str(), Some("reasoning"));
            }
        }
    }
}
