//! Property tests of the Chat Completions stream parser: arbitrary bytes, and well-framed events
//! with arbitrary payloads, give a response or an error, never a panic. CI runs these; the cargo
//! fuzz target (`fuzz/`) drives the same function for longer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentloop_providers::openai_chat::parse_stream_bytes;
use proptest::prelude::*;

/// Pieces that real streams are made of, so random streams often get past the framing.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("data: ".to_owned()),
        Just("\n\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("data: [DONE]\n\n".to_owned()),
        Just(r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}"#.to_owned()),
        Just(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"","function":{"name":"f","arguments":"{\"a\""}}]}}]}"#.to_owned()),
        Just(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":":1}"}}]}}]}"#.to_owned()),
        Just(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#.to_owned()),
        Just(r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#.to_owned()),
        Just(r#"{"error":{"message":"boom","code":500}}"#.to_owned()),
        Just("event: x\nid: 1\nretry: 5\n: comment\n".to_owned()),
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
            // A response is only ever produced for a stream that said it was complete.
            prop_assert!(stream.contains("[DONE]") || stream.contains("finish_reason"));
            // A call cut off by the length limit is never handed on.
            for call in &response.message.tool_calls {
                prop_assert!(!call.name.is_empty());
                prop_assert!(!call.id.is_empty());
            }
        }
    }
}
