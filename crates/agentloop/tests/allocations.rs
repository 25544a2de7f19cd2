//! What a tool turn allocates, counted: each allocation of a turn is paid again at every turn of
//! every run, and at ten thousand runs at once with cold caches (`agentloop-bench allocs` and
//! `scale`, BENCHMARKS.md under #30). The bound is today's count, so that an allocation a turn
//! that comes back fails here, not only in the bench.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::System;

use agentloop::{Agent, ModelResponse, StopReason, Tool, ToolError, testing::ScriptedModel};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Count {
    n: u32,
}

/// How many runs of each length are counted: the least count is the run's.
const SAMPLES: usize = 5;

/// The allocations of a run of `turns` tool turns: the least of [`SAMPLES`] counts. stats_alloc
/// counts every thread's allocations, and even in a file of one test another thread (libtest's
/// main thread, recording the test it has spawned) makes four at once, milliseconds into the
/// test, which a busy machine can put inside a counted run (the same flake was seen in
/// `agentloop-providers`' `tests/allocations.rs`). Another thread only ever adds, and a run's own
/// count is the same every time, so the least is the run's: an allocation that comes back raises
/// every sample.
fn least_allocations_of_a_run(turns: usize) -> usize {
    (0..SAMPLES)
        .map(|_| allocations_of_a_run(turns))
        .min()
        .unwrap_or(usize::MAX)
}

/// A run of `turns` tool turns of three calls each, then a text answer; its allocations, on a
/// runtime of the calling thread.
fn allocations_of_a_run(turns: usize) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let responses = (0..turns)
        .map(|t| {
            ModelResponse::tool_calls((0..3).map(|k| {
                (
                    format!("t{t}_{k}"),
                    "count",
                    format!(r#"{{"n":{}}}"#, t * 3 + k),
                )
            }))
        })
        .chain([ModelResponse::text("done")]);
    let agent = Agent::builder()
        .name("allocations")
        .model(ScriptedModel::new(responses))
        .tool(
            Tool::builder("count")
                .description("Counts.")
                .handler(|args: Count, _ctx| async move { Ok::<_, ToolError>(args.n) }),
        )
        .build()
        .unwrap();
    let region = Region::new(ALLOCATOR);
    let out = rt.block_on(agent.run("go"));
    let change = region.change();
    assert_eq!(out.stop_reason, StopReason::Finished, "{out:?}");
    assert_eq!(out.tool_calls.len(), 3 * turns);
    change.allocations + change.reallocations
}

/// A tool turn's own allocations: a run of three tool turns against one of two. Its batch's
/// slots are inline in the batch's box (one allocation for both up to four calls), and a call's
/// id is the response's `Arc<str>`, which the run's set of ids, the call's record, its result and
/// every copy of the response share; its tool's short name is inline in the call.
#[test]
fn a_tool_turn_of_three_calls_allocates_no_more_than_it_did() {
    // Warm what is made once a process (the thread's argument view, the runtime's statics).
    let _ = allocations_of_a_run(1);
    let two = least_allocations_of_a_run(2);
    let three = least_allocations_of_a_run(3);
    let turn = three.saturating_sub(two);
    eprintln!("a tool turn of three calls: {turn} allocations; a run of three: {three}");
    // 30 in a debug build of the test: the batch's calls inline in its box, and one text for all
    // their arguments (32 while the run's set of call ids grew at its eighth id, in this third
    // turn, before the set took room for 14 at its first call). 38 with a text each and the calls in a vector of their own; 50 with each
    // call's tool name a `String` (copied by each copy of the response) where a short name is
    // inline now; 65 with each call id a `String`, copied by each copy of the response (the
    // scripted model's, and the two the replay check of `verify-replay` keeps) and into the
    // run's set of ids; 67 with the slots in a vector of their own as well.
    assert!(
        turn <= 30,
        "a tool turn of three calls made {turn} allocations"
    );
    // What a run pays once, beside its turns: 146 in a debug build for a run of three tool turns
    // and its answer. 155 with the run's set of call ids grown from empty (five allocations for
    // 30 calls where it takes three now), the stuck-loop rule's recent turns grown the same way,
    // the tools' end-of-retries token a child of the calls' token (two allocations where one
    // is), the input's text gathered through a vector, and a prose answer parsed as JSON (to see
    // whether it is a call written as text) for an error to be made and dropped.
    assert!(
        three <= 146,
        "a run of three tool turns made {three} allocations"
    );
}
