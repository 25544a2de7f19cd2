//! A `ToolCall` read back (a stored session, a journal's step, a non-streamed body) makes its id's
//! `Arc<str>` straight from the text read: one allocation, where serde's own `Arc<str>` reads a
//! `String` first and then copies it. Its serde form is a plain string, as it was when the id was
//! a `String`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::System;

use agentloop::message::ToolCall;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The call read from `json`, and the allocations reading it took: the least of five counts, as
/// stats_alloc counts every thread's allocations, and another thread (libtest's main thread,
/// recording the test it has spawned) makes four at once milliseconds into the test, which a
/// busy machine can put inside a counted read. Another thread only ever adds, and a read's own
/// count is the same every time, so the least is the read's.
fn read(json: &str) -> (ToolCall, usize) {
    let mut least = usize::MAX;
    let mut call = None;
    for _ in 0..5 {
        let region = Region::new(ALLOCATOR);
        let read: ToolCall = serde_json::from_str(json).unwrap();
        let change = region.change();
        least = least.min(change.allocations + change.reallocations);
        call = Some(read);
    }
    (call.unwrap(), least)
}

#[test]
fn a_tool_call_reads_its_id_with_one_allocation_and_writes_it_as_before() {
    let call = ToolCall {
        call_id: "call_1".into(),
        tool: "t".into(),
        arguments: "{}".into(),
    };
    let written = serde_json::to_string(&call).unwrap();
    assert_eq!(
        written,
        r#"{"call_id":"call_1","tool":"t","arguments":"{}"}"#
    );
    // One allocation for the id and one for the arguments (a short tool name is held inline in
    // the call): the id borrowed from the text, copied out of serde_json's buffer for an escape
    // (the buffer is the third), and under the wire's own key (`id`).
    for (json, want) in [
        (written.as_str(), 2),
        (
            r#"{"call_id":"call_\u0031","tool":"t","arguments":"{}"}"#,
            3,
        ),
        (r#"{"id":"call_1","name":"t","arguments":"{}"}"#, 2),
    ] {
        let (read, allocations) = read(json);
        assert_eq!(read, call, "{json}");
        assert_eq!(allocations, want, "{json}");
    }
    // A value's owned string (a step decoded through a `Value`) reads too.
    let value = serde_json::to_value(&call).unwrap();
    assert_eq!(serde_json::from_value::<ToolCall>(value).unwrap(), call);
    assert!(
        serde_json::from_str::<ToolCall>(r#"{"call_id":7,"tool":"t","arguments":""}"#).is_err()
    );
}
