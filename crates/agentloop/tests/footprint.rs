//! What a running run and a running subagent call hold in memory. Each running run holds its
//! future, so its size is what ten thousand concurrent runs multiply (`agentloop-bench scale`,
//! BENCHMARKS.md under #30); a parent's run holds each running subagent call's. The bounds
//! leave room for the compiler's layout to move a little, not for a state to come back that
//! keeps a wait's arguments twice (3,656 and 19,200 bytes before they were cut), or that keeps
//! inline what most runs leave empty (2,312 bytes before that was boxed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use agentloop::message::Message;
use agentloop::{
    Agent, ModelResponse, RunOptions, Tool, ToolContext, ToolError, testing::ScriptedModel,
};
use serde_json::json;

fn agent(name: &str) -> Agent {
    Agent::builder()
        .name(name)
        .model(ScriptedModel::new(Vec::new()))
        .build()
        .unwrap()
}

#[test]
fn a_running_runs_future_stays_under_2_1_kb() {
    let agent = agent("footprint");
    let run = agent.run("hello");
    let bytes = std::mem::size_of_val(&run);
    assert!(bytes <= 2_100, "a run's future is {bytes} bytes");
}

/// A resumed run (`Agent::resume`, the Restate worker's every run) holds the same driven run,
/// not its journal, its arguments and its replayed machine beside it (6,392 bytes before
/// they were handed over boxed).
#[tokio::test]
async fn a_resumed_runs_future_stays_under_2_2_kb() {
    let journal = Arc::new(common::journal::Memory::default());
    let options = || RunOptions {
        journal: Some(journal.clone()),
        ..RunOptions::default()
    };
    let first = agent("footprint")
        .run_with(Vec::new(), Some(Message::user("hello")), options())
        .await;
    assert_eq!(
        first.stop_reason,
        agentloop::StopReason::Failed,
        "{first:?}"
    );
    let fresh = agent("footprint");
    let resumed = fresh.resume(journal.cut(1), options(), false);
    let bytes = std::mem::size_of_val(&resumed);
    assert!(bytes <= 2_200, "a resumed run's future is {bytes} bytes");
    let out = resumed.await.unwrap();
    assert_eq!(
        out.run_id, first.run_id,
        "the future measured is the run resumed"
    );
}

#[test]
fn a_running_subagent_calls_future_stays_under_4_kb() {
    let tool = agent("worker").as_tool("worker", "Does the work.");
    let call = tool.call(
        json!({"task": "work"}),
        ToolContext::detached("call_1", "worker"),
    );
    let bytes = std::mem::size_of_val(&*call);
    assert!(bytes <= 4_096, "a subagent call's future is {bytes} bytes");
}

/// Every call a run makes keeps its record until the run ends (a run of 15 calls holds 16
/// records' room): what most calls leave empty (`code`, `diagnostic`, `details`) is boxed, so a
/// record is 168 bytes, not the 200 it was with them inline. (160 before its arguments became a
/// span of their batch's one text: 8 bytes more a record, where a batch of K calls makes one
/// text of its arguments, not K, each with its own 16-byte count and the allocator's header.)
#[test]
fn a_calls_record_stays_under_169_bytes() {
    let bytes = std::mem::size_of::<agentloop::ToolCallRecord>();
    assert!(bytes <= 168, "a call's record is {bytes} bytes");
}

/// A run's calls of a tool share one copy of its name (its records and its results), and no run
/// shares it with another: a name every run's calls counted on would be one cache line that the
/// cores of a multi-threaded runtime take from each other at every call.
#[tokio::test]
async fn a_runs_calls_share_their_tools_name_with_each_other_not_with_other_runs() {
    let echo = || {
        Tool::builder("echo")
            .description("Says ok.")
            .handler(|_args: serde_json::Value, _ctx| async { Ok::<_, ToolError>("ok") })
    };
    // One agent, two runs of it, one after the other: the script answers both.
    let turns = || {
        [
            ModelResponse::tool_calls([("a", "echo", "{}"), ("b", "echo", "{}")]),
            ModelResponse::tool_calls([("c", "echo", "{}")]),
            ModelResponse::text("done"),
        ]
    };
    let agent = Agent::builder()
        .name("names")
        .model(ScriptedModel::new(turns().into_iter().chain(turns())))
        .tool(echo())
        .build()
        .unwrap();
    let one = agent.run("go").await;
    let two = agent.run("go").await;
    let name = |out: &agentloop::RunOutcome| Arc::clone(&out.tool_calls[0].tool);
    for out in [&one, &two] {
        assert_eq!(out.tool_calls.len(), 3, "{:?}", out.stop_reason);
        let first = name(out);
        assert!(out.tool_calls.iter().all(|r| Arc::ptr_eq(&r.tool, &first)));
        let results: Vec<_> = out
            .transcript
            .iter()
            .filter_map(|m| match m {
                Message::Tool(r) => Some(&r.tool),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 3);
        assert!(results.iter().all(|t| Arc::ptr_eq(t, &first)));
    }
    assert!(!Arc::ptr_eq(&name(&one), &name(&two)));
}
