#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Subagents in agent files: the example coordinator and its two workers, run and planned; files
//! that name each other in a cycle; a tool that is both a command and an agent.

mod support;

use support::*;

fn example(name: &str) -> String {
    format!("{}/../../examples/team/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `run --json` of the example coordinator and its two workers.
async fn run_team_json() -> std::process::Output {
    agentloop(args(&[
        "run",
        &example("coordinator.toml"),
        "--input",
        "Is it warmer in Paris or Lisbon, in Fahrenheit?",
        "--json",
    ]))
    .await
}

#[tokio::test]
async fn the_example_team_runs_its_workers_in_parallel_under_one_budget() {
    let out = run_team_json().await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished");
    let subs = v["subagents"].as_array().unwrap();
    assert_eq!(subs.len(), 2);
    let mut agents: Vec<&str> = subs.iter().map(|s| s["agent"].as_str().unwrap()).collect();
    agents.sort_unstable();
    assert_eq!(agents, ["lisbon-worker", "paris-worker"]);
    for s in subs {
        assert_eq!(s["stop_reason"], "finished");
        assert_eq!(s["turns"], 3);
        assert_eq!(s["tool_calls"], 2);
        // Each worker's three model calls.
        assert_eq!(s["usage"]["input_tokens"], 470);
        assert_eq!(s["usage"]["output_tokens"], 41);
    }
    // The coordinator's own two model calls, plus its workers': one budget, one total.
    assert_eq!(v["usage"]["input_tokens"], 540 + 2 * 470);
    assert_eq!(v["usage"]["output_tokens"], 80 + 2 * 41);
    assert_eq!(v["model_calls"], 2 + 2 * 3);
    assert_eq!(
        v["output"],
        "Lisbon is warmer: 73.4 °F against 64.4 °F in Paris."
    );
    let calls = v["tool_calls"].as_array().unwrap();
    assert!(calls.iter().all(|c| c["status"] == "ok"), "{calls:?}");
}

#[tokio::test]
async fn plan_shows_the_tree_of_agents() {
    let out = agentloop(args(&["plan", &example("coordinator.toml"), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    let tree = v["subagents"].as_array().unwrap();
    assert_eq!(tree.len(), 2);
    assert_eq!(tree[0]["tool"], "ask_paris");
    assert_eq!(tree[0]["agent"], "paris-worker");
    assert_eq!(tree[0]["tools"][0], "get_weather");
    let tools = v["tools"].as_array().unwrap();
    assert_eq!(tools[0]["agent"], "paris.toml");
    assert_eq!(tools[0]["input_schema"]["required"][0], "task");
    let text = stdout(&agentloop(args(&["plan", &example("coordinator.toml")])).await);
    assert!(
        text.contains("subagents\n  ask_paris -> paris-worker"),
        "{text}"
    );
}

#[tokio::test]
async fn agent_files_that_name_each_other_in_a_cycle_are_refused() {
    let dir = AgentDir::new(
        r#"name = "a"
[model]
provider = "scripted"
script = "s.json"
[[tools]]
name = "to_b"
agent = "b.toml"
"#,
    );
    dir.write("s.json", "[]");
    dir.write(
        "b.toml",
        r#"name = "b"
[model]
provider = "scripted"
script = "s.json"
[[tools]]
name = "to_a"
agent = "agent.toml"
"#,
    );
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("cycle") && text.contains("tools[0].agent"),
        "{text}"
    );

    dir.write(
        "b.toml",
        r#"name = "b"
[model]
provider = "scripted"
script = "s.json"
[[tools]]
name = "both"
agent = "agent.toml"
command = ["true"]
max_turns = 2
"#,
    );
    let out = agentloop(args(&["plan", dir.path("b.toml").to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("not both"), "{}", stderr(&out));
}

#[tokio::test]
async fn a_tree_trace_round_trips_through_ndjson_and_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["t.ndjson", "t.sqlite"] {
        let trace = dir.path().join(name);
        let trace = trace.to_str().unwrap();
        let out = agentloop(args(&[
            "run",
            &example("coordinator.toml"),
            "--input",
            "go",
            "--quiet",
            "--trace",
            trace,
        ]))
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let shown = stdout(&agentloop(args(&["trace", "show", trace])).await);
        assert!(shown.contains("agent coordinator"), "{name}: {shown}");
        for call in ["call_paris", "call_lisbon"] {
            assert!(
                shown.contains(&format!("↳ subagent started by call {call}:")),
                "{name}: {shown}"
            );
        }
        assert!(shown.contains("    run ") && shown.contains("agent paris-worker"));
        let listed = stdout_json(&agentloop(args(&["trace", "list", trace, "--json"])).await);
        let runs = listed.as_array().unwrap();
        assert_eq!(runs.len(), 3, "{name}: {listed}");
        let children = runs
            .iter()
            .filter(|r| !r["parent_id"].is_null() || !r["parent_run_id"].is_null())
            .count();
        assert_eq!(children, 2, "{name}: {listed}");
    }
}

/// The README lists each node of `run --json`'s `subagents` tree with `error` and `subagents`:
/// a worker that finished and started no subagent of its own still has both (`null`, `[]`).
#[tokio::test]
async fn docs10_every_subagent_node_has_every_documented_field() {
    let out = run_team_json().await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    let subs = v["subagents"].as_array().unwrap();
    assert_eq!(subs.len(), 2);
    for node in subs {
        let node = node.as_object().unwrap();
        for key in [
            "run_id",
            "agent",
            "call_id",
            "tool",
            "stop_reason",
            "error",
            "usage",
            "cost_usd",
            "turns",
            "model_calls",
            "tool_calls",
            "subagents",
        ] {
            assert!(node.contains_key(key), "no `{key}` in {node:?}");
        }
        assert!(node["error"].is_null(), "{node:?}");
        assert_eq!(node["subagents"], serde_json::json!([]), "{node:?}");
    }
}
