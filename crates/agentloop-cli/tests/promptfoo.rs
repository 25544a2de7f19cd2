#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! agentloop as a provider of promptfoo (npm, installed at a pinned version by
//! `scripts/promptfoo/install.sh`), through its exec provider and `scripts/promptfoo/
//! agentloop-exec.sh`: `promptfoo eval` runs the quickstart agent (scripted model, its command
//! tools really running) for each test, and its assertions pass or fail on the agent's answers.
//! Nothing leaves the machine: promptfoo's telemetry, update check and remote features are off.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

mod support;

use support::repo;

/// The folder promptfoo is installed in.
fn promptfoo() -> PathBuf {
    let out = Command::new(repo().join("scripts/promptfoo/install.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("cannot run scripts/promptfoo/install.sh (it needs bash and python3)");
    assert!(
        out.status.success(),
        "scripts/promptfoo/install.sh failed ({}): promptfoo could not be installed",
        out.status
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

#[test]
fn promptfoo_eval_runs_the_agent_through_its_exec_provider_and_scores_its_answers() {
    let install = promptfoo();
    let dir = tempfile::tempdir().unwrap();
    let agent = repo().join("examples/quickstart/agent.toml");
    let exec = repo().join("scripts/promptfoo/agentloop-exec.sh");
    let config = format!(
        r#"description: agentloop as a promptfoo provider
prompts:
  - "{{{{question}}}}"
providers:
  - id: "exec: {exec} {agent}"
    label: quickstart
tests:
  - description: the agent compares the two cities
    vars:
      question: Compare the weather in Paris and Lisbon, in Fahrenheit.
    assert:
      - type: contains
        value: Lisbon is warmer
      - type: icontains
        value: "73.4 °f"
  - description: an assertion the agent's answer does not meet
    vars:
      question: Which city is warmer?
    assert:
      - type: contains
        value: Paris is warmer
"#,
        exec = exec.display(),
        agent = agent.display()
    );
    std::fs::write(dir.path().join("promptfooconfig.yaml"), config).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = Command::new(install.join("venv/bin/node"))
        .arg(install.join("node_modules/promptfoo/dist/src/entrypoint.js"))
        .args([
            "eval",
            "-c",
            "promptfooconfig.yaml",
            "-o",
            "results.json",
            "--no-cache",
            "--no-progress-bar",
            "--no-table",
            "--max-concurrency",
            "1",
        ])
        .current_dir(dir.path())
        .env("AGENTLOOP", env!("CARGO_BIN_EXE_agentloop"))
        .env("HOME", &home)
        .env("PROMPTFOO_CONFIG_DIR", home.join(".promptfoo"))
        .env("PROMPTFOO_DISABLE_TELEMETRY", "1")
        .env("PROMPTFOO_DISABLE_UPDATE", "1")
        .env("PROMPTFOO_DISABLE_REMOTE_GENERATION", "true")
        .env("PROMPTFOO_SELF_HOSTED", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promptfoo's exit code when a test failed.
    assert_eq!(out.status.code(), Some(100), "{shown}");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    let rows = results["results"]["results"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{results:#}");
    let by = |question: &str| {
        rows.iter()
            .find(|r| r["vars"]["question"] == question)
            .unwrap_or_else(|| panic!("no result for {question:?}: {results:#}"))
    };
    let compared = by("Compare the weather in Paris and Lisbon, in Fahrenheit.");
    assert_eq!(compared["success"], true, "{compared:#}");
    assert_eq!(
        compared["response"]["output"],
        "Lisbon is warmer: 73.4 °F and sunny, against 64.4 °F and light rain in Paris.",
        "{compared:#}"
    );
    let failed = by("Which city is warmer?");
    assert_eq!(failed["success"], false, "{failed:#}");
    let reason = failed["gradingResult"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("Paris is warmer"), "{failed:#}");
    assert_eq!(results["results"]["stats"]["successes"], 1, "{results:#}");
    assert_eq!(results["results"]["stats"]["failures"], 1, "{results:#}");
}
