//! What a running run and a running subagent call hold in memory. Each running run holds its
//! future, so its size is what ten thousand concurrent runs multiply (`agentloop-bench scale`,
//! BENCHMARKS.md under #30); a parent's run holds each running subagent call's. The bounds
//! leave room for the compiler's layout to move a little, not for a state to come back that
//! keeps a wait's arguments twice (3,656 and 19,200 bytes before they were cut).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agentloop::{Agent, ToolContext, testing::ScriptedModel};
use serde_json::json;

fn agent(name: &str) -> Agent {
    Agent::builder()
        .name(name)
        .model(ScriptedModel::new(Vec::new()))
        .build()
        .unwrap()
}

#[test]
fn a_running_runs_future_stays_under_2_7_kb() {
    let agent = agent("footprint");
    let run = agent.run("hello");
    let bytes = std::mem::size_of_val(&run);
    assert!(bytes <= 2_700, "a run's future is {bytes} bytes");
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
