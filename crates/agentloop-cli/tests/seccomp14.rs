#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Paths a hostile or confused model gives the file tools, through the `agentloop` binary with a
//! scripted model: what the model and the operator read back.

mod support;

use serde_json::{Value, json};
use support::*;

/// The built-in file tools.
const FILE_TOOLS: [&str; 6] = [
    "read_file",
    "write_file",
    "edit_file",
    "list_dir",
    "glob",
    "grep",
];

/// An agent whose file tools are rooted in `work/` (holding `src/main.rs`), calling each of
/// `calls` (a tool and its arguments) in a turn of its own, then answering.
fn file_agent(calls: &[(&str, Value)]) -> AgentDir {
    let tools: String = FILE_TOOLS
        .iter()
        .map(|tool| format!("[[tools]]\nbuiltin = \"{tool}\"\nroot = \"work\"\n"))
        .collect();
    let dir = AgentDir::new(&format!(
        "name = \"seccomp14\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\n\
         {tools}\n[permissions]\nallow = {FILE_TOOLS:?}\n"
    ));
    std::fs::create_dir_all(dir.path("work/src")).unwrap();
    std::fs::write(dir.path("work/src/main.rs"), "fn main() {}\n").unwrap();
    let mut steps: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (tool, args))| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": tool, "arguments": args}]})
        })
        .collect();
    steps.push(json!({"text": "done"}));
    dir.write("script.json", &Value::Array(steps).to_string());
    dir
}

/// Runs the agent to its end (`--json`, a trace with payloads): the run's JSON, its stderr and
/// its trace.
fn run(dir: &AgentDir) -> (Value, String, String) {
    let trace = dir.path("trace.ndjson");
    let out = std::process::Command::new(bin())
        .args([
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "go",
            "--json",
        ])
        .arg("--trace")
        .arg(&trace)
        .arg("--trace-payloads")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    (v, stderr(&out), std::fs::read_to_string(trace).unwrap())
}

/// Every file tool, each given `path` where it takes one.
fn every_tool_at(path: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("read_file", json!({"path": path})),
        ("write_file", json!({"path": path, "content": "x"})),
        (
            "edit_file",
            json!({"path": path, "old_string": "main", "new_string": "start"}),
        ),
        ("list_dir", json!({"path": path})),
        ("glob", json!({"pattern": "*.rs", "path": path})),
        ("grep", json!({"pattern": "main", "path": path})),
    ]
}

#[test]
fn seccomp14_a_nul_byte_in_a_path_is_a_path_error_every_file_tool_names() {
    // A NUL byte cannot be in a file name: the system refused the path only when the file was
    // opened, and every tool answered a generic `io_error` ("file name contained an unexpected
    // NUL byte"), which the model could not tell from a failing disk.
    let dir = file_agent(&every_tool_at("src\u{0}/main.rs"));
    let (v, _, _) = run(&dir);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 6, "{v}");
    for call in calls {
        assert_eq!(call["ok"], false, "{call}");
        assert_eq!(call["error"]["code"], "path_nul", "{call}");
        let message = call["error"]["message"].as_str().unwrap();
        assert!(message.contains("NUL byte"), "{call}");
    }
    // Nothing was written or edited.
    let mut names: Vec<String> = std::fs::read_dir(dir.path("work"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["src"]);
    assert_eq!(
        std::fs::read_to_string(dir.path("work/src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
}
