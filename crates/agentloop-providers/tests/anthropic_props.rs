//! Property tests of the Anthropic Messages stream parser over the in-memory path (SSE reader,
//! event parser, accumulator): arbitrary bytes, and streams assembled from real event pieces, give
//! a response or an error, never a panic. The cargo fuzz target `anthropic_stream` drives the same
//! function for longer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentloop::FinishReason;
use agentloop_providers::anthropic::parse_stream_bytes;
use proptest::prelude::*;

fn event(data: &str) -> String {
    format!("event: x\ndata: {data}\n\n")
}

/// Pieces that real streams are made of, so random streams get past the framing.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(event(
            r#"{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":5,"output_tokens":1,"cache_read_input_tokens":2}}}"#
        )),
        Just(event(
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#
        )),
        Just(event(
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#
        )),
        Just(event(
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}"#
        )),
        Just(event(
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\": "}}"#
        )),
        Just(event(
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}"#
        )),
        Just(event(r#"{"type":"content_block_stop","index":1}"#)),
        Just(event(
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"thinking","thinking":""}}"#
        )),
        Just(event(
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"signature_delta","signature":"S"}}"#
        )),
        Just(event(r#"{"type":"content_block_stop","index":2}"#)),
        Just(event(
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":9}}"#
        )),
        Just(event(
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#
        )),
        Just(event(r#"{"type":"message_stop"}"#)),
        Just(event(r#"{"type":"ping"}"#)),
        Just(event(
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
        )),
        Just("data: ".to_owned()),
        Just("\n\n".to_owned()),
        Just(": comment\r\n".to_owned()),
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
            // A response only for a stream that said it was complete.
            prop_assert!(stream.contains("message_stop"));
            for call in &response.message.tool_calls {
                prop_assert!(!call.name.is_empty());
                prop_assert!(!call.id.is_empty());
                // With a length stop, no call with incomplete JSON is ever handed on.
                if response.finish_reason == FinishReason::Length && !call.arguments.is_empty() {
                    prop_assert!(serde_json::from_str::<serde_json::Value>(&call.arguments).is_ok());
                }
            }
            if response.truncated {
                prop_assert_eq!(response.finish_reason, FinishReason::Length);
            }
        }
    }
}
