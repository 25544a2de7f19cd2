//! Arbitrary bytes through the OpenAI Responses stream parser (SSE reader, event parser, accumulator): a
//! response or an error, never a panic, a hang or unbounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = agentloop_providers::openai_responses::parse_stream_bytes(data);
});
