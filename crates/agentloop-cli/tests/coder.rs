#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The coding example (`examples/coder`), run from a copy: its plan kept with `todo` and shown in
//! `--json`, a program written, run, fixed with `edit_file` and run again through the shell,
//! everything inside its workspace, with no key.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

mod support;

use support::copy_dir;

#[test]
fn the_coder_example_plans_writes_runs_and_fixes_a_program_in_its_workspace() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/coder");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&example, dir.path());
    let _ = std::fs::remove_file(dir.path().join("workspace/calc.py"));
    let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("run")
        .arg(dir.path().join("agent.toml"))
        .args([
            "--input",
            "Write calc.py, run it, and fix it if it is wrong.",
            "--json",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{body:#}");
    assert_eq!(body["stop_reason"], "finished");
    let runs: Vec<&Value> = body["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["tool"] == "shell")
        .collect();
    assert_eq!(runs.len(), 2);
    assert!(
        runs[0]["output"].as_str().unwrap().contains("2 + 3 = -1"),
        "{:#}",
        runs[0]
    );
    assert!(
        runs[1]["output"].as_str().unwrap().contains("2 + 3 = 5"),
        "{:#}",
        runs[1]
    );
    let program = std::fs::read_to_string(dir.path().join("workspace/calc.py")).unwrap();
    assert!(program.contains("return a + b"), "{program}");
    let todos = body["todos"].as_array().unwrap();
    assert_eq!(todos.len(), 4);
    assert!(todos.iter().all(|t| t["status"] == "done"), "{todos:#?}");
    assert_eq!(todos[2]["title"], "Fix what is wrong");
}
