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
