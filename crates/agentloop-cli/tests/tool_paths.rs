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
        "name = \"tool-paths\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\n\
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
fn a_nul_byte_in_a_path_is_a_path_error_every_file_tool_names() {
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

#[test]
fn a_very_long_path_is_echoed_cut_short_in_every_file_tool_s_error() {
    // A path the model made 5,000 characters long came back whole in each error (the file
    // system's "File name too long", `..` refused), to the model, the trace and the terminal.
    let long = "a".repeat(5000);
    let mut calls = every_tool_at(&long);
    calls.push((
        "read_file",
        json!({"path": format!("{long}/../src/main.rs")}),
    ));
    calls.push((
        "write_file",
        json!({"path": format!("/{long}"), "content": "x"}),
    ));
    let dir = file_agent(&calls);
    let (v, stderr, trace) = run(&dir);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 8, "{v}");
    let head = &long[..190];
    let mut failed = 0;
    for call in calls {
        let read = call["error"]["message"]
            .as_str()
            .or(call["output"].as_str())
            .unwrap();
        assert!(read.len() < 400, "{}: {read}", call["tool"]);
        if call["ok"] == false {
            assert!(
                read.contains(head) && read.contains('…') && read.contains(" characters)"),
                "{}: {read}",
                call["tool"]
            );
            failed += 1;
        }
    }
    // Every call fails, grep's too: a file named alone that it cannot open is an error, not
    // a search with no match.
    assert_eq!(failed, 8, "{v}");
    assert!(!stderr.contains(&long), "{stderr}");
    // The trace records each call's arguments (the path whole, as the model gave it) and its
    // error cut short as the model read it: no line holds the path twice.
    let mut errors = 0;
    for line in trace.lines() {
        assert!(line.matches(&long).count() <= 1, "{line}");
        let event: Value = serde_json::from_str(line).unwrap();
        if let Some(message) = event["error"]["message"].as_str() {
            assert!(message.len() < 400, "{message}");
            errors += 1;
        }
    }
    assert!(errors >= 7, "{trace}");
}
