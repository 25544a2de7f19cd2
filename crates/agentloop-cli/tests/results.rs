#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! What the model reads of a failing command is what it needs: its head and its end, not the
//! first few KiB of a long test run with the verdict and the stderr cut away.

mod support;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_commands_result_keeps_its_summary_line_and_its_stderr() {
    let dir = AgentDir::new(
        r#"name = "tester"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "run_tests"
command = ["python3", "tests.py"]
"#,
    );
    dir.write(
        "tests.py",
        r#"import sys
print("collected 600 items")
for i in range(600):
    print(f"tests/test_mod.py::test_case_{i:03} PASSED" + " " * 20)
print("===== 2 failed, 598 passed in 3.2s =====")
print("Traceback: AssertionError in test_case_417", file=sys.stderr)
sys.exit(1)
"#,
    );
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "t", "name": "run_tests", "arguments": {}}]},
            {"text": "Two tests fail."}
        ])
        .to_string(),
    );
    let (_, v) = run_finished(&dir.agent(), "Run the tests.").await;
    let call = &v["tool_calls"][0];
    assert_eq!(call["ok"], false, "{call}");
    let read = v["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .map(|m| m.to_string())
        .unwrap_or_else(|| call.to_string());
    for wanted in [
        "collected 600 items",
        "2 failed, 598 passed",
        "AssertionError in test_case_417",
        "cut from the middle",
    ] {
        assert!(
            read.contains(wanted),
            "{wanted} not in what the model read: {read}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_runs_usage_has_every_count_a_subagents_node_has() {
    // Tokens written to a provider's prompt cache are priced apart (`cache_write`): the run's
    // own usage shows them as each subagent's node does.
    let script = json!([
        {"text": "done", "usage": {"input_tokens": 900, "output_tokens": 5,
            "cached_input_tokens": 300, "cache_write_tokens": 500, "reasoning_tokens": 2}}
    ]);
    let dir = scripted_weather("usage", &script.to_string());
    let (_, v) = run_finished(&dir.agent(), "go").await;
    let usage = &v["usage"];
    for (key, count) in [
        ("input_tokens", 900),
        ("output_tokens", 5),
        ("cached_input_tokens", 300),
        ("cache_write_tokens", 500),
        ("reasoning_tokens", 2),
    ] {
        assert_eq!(usage[key], count, "{key} in {usage}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_trace_records_the_status_the_core_gives_a_call_that_never_started() {
    // Two calls of one response share an id: the whole decision is refused
    // (`decision.invalid`), and no call starts.
    let script = json!([
        {"tool_calls": [
            {"id": "same", "name": "get_weather", "arguments": {}},
            {"id": "same", "name": "get_weather", "arguments": {}}
        ]},
        {"text": "done"}
    ]);
    let dir = scripted_weather("ids", &script.to_string());
    let trace = dir.path("t.ndjson");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "go",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]))
    .await;
    let v = stdout_json(&out);
    let said: Vec<(String, String)> = v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["status"].as_str().unwrap().to_owned(),
                c["error"]["code"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(!said.is_empty(), "{v}");
    assert!(
        said.iter()
            .all(|(s, c)| s == "refused" && c == "decision.invalid"),
        "{said:?}"
    );
    let recorded: Vec<(String, String)> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "tool_call")
        .map(|r| {
            (
                r["status"].as_str().unwrap_or_default().to_owned(),
                r["error"]["code"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(recorded, said, "the trace and --json use one word");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_final_answer_that_is_only_a_tool_call_written_as_text_is_not_finished() {
    let dir = AgentDir::new(
        r#"name = "coder"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
builtin = "write_file"
root = "work"
"#,
    );
    std::fs::create_dir(dir.path("work")).unwrap();
    // What Qwen2.5-Coder-1.5B wrote without a dialect that reads it: the call as a fenced block.
    let call = "```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"calc.py\", \
                \"content\": \"print(2 + 3)\"}}\n```";
    dir.write("script.json", &json!([{"text": call}]).to_string());
    let out = run_agent_json(&dir.agent(), "Write calc.py").await;
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "failed", "{v}");
    assert_eq!(v["error"]["code"], "decision.invalid", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("write_file") && message.contains("tool_dialect"),
        "{message}"
    );
    assert!(!dir.path("work/calc.py").exists());
    // An answer that merely shows JSON is still an answer.
    dir.write(
        "script.json",
        &json!([{"text": "Done: {\"name\": \"write_file\"} ran."}]).to_string(),
    );
    let (_, v) = run_finished(&dir.agent(), "Write calc.py").await;
    assert_eq!(v["output"], "Done: {\"name\": \"write_file\"} ran.");
}
