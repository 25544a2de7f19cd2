#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! What a hostile model's tool calls reach on the host beyond the command gate, through the
//! `agentloop` binary with a scripted model: descriptors the agentloop process inherited from
//! whoever started it.

mod support;

use serde_json::{Value, json};
use support::*;

/// An agent whose shell is rooted in `work/` under `sandbox`, running `commands` one per call.
fn shell_agent(sandbox: &str, commands: &[&str]) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "host8"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "shell"
root = "work"
timeout_secs = 20
sandbox = "{sandbox}"

[permissions]
allow = ["shell"]
"#
    ));
    std::fs::create_dir(dir.path("work")).unwrap();
    let mut steps: Vec<Value> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "shell", "arguments": {"command": c}}]})
        })
        .collect();
    steps.push(json!({"text": "done"}));
    dir.write("script.json", &Value::Array(steps).to_string());
    dir
}

/// The output of each call of a finished `--json` run, in order.
fn outputs(out: &std::process::Output) -> Vec<String> {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(out));
    let v = stdout_json(out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["output"]
                .as_str()
                .map_or_else(|| c.to_string(), str::to_owned)
        })
        .collect()
}

#[test]
fn host8_a_descriptor_agentloop_inherited_open_on_an_outside_file_does_not_reach_the_shell() {
    // A script that holds a file open without close-on-exec (`exec 9>lock` for `flock`, a log)
    // and then runs agentloop: the descriptor is open in agentloop, and was passed on to every
    // tool process, where neither Landlock nor the read-only view refuses a write through a
    // descriptor already open. The model wrote outside the root through it, in every mode.
    let mut modes = sandbox_modes_here();
    if modes.contains(&"workspace-write") {
        modes.push("read-only");
    }
    for mode in modes {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim.log");
        std::fs::write(&victim, "before\n").unwrap();
        let dir = shell_agent(
            mode,
            &["if [ -e /proc/self/fd/7 ]; then echo fd7-open; fi; echo written >&7; echo wrote=$?"],
        );
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                r#"exec 7>>"$1"; exec "$2" run "$3" --input go --json"#,
                "sh",
            ])
            .arg(&victim)
            .arg(bin())
            .arg(dir.agent())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let calls = outputs(&out);
        assert!(!calls[0].contains("fd7-open"), "{mode}: {}", calls[0]);
        assert!(!calls[0].contains("wrote=0"), "{mode}: {}", calls[0]);
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "before\n",
            "{mode}"
        );
    }
}

#[test]
fn host8_the_file_tools_never_read_the_agentloop_process_s_own_proc_files() {
    // The file tools run inside the agentloop process, where being non-dumpable does not help:
    // its own `/proc/self/environ` holds the provider's key. Links the model's shell made in the
    // root lead there by every road; the key reaches no result, output or trace.
    let key = "sk-host8-never-shown-0042";
    let dir = AgentDir::new(
        r#"name = "host8"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "shell"
root = "work"
[[tools]]
builtin = "read_file"
root = "work"
[[tools]]
builtin = "grep"
root = "work"
[[tools]]
builtin = "list_dir"
root = "work"

[permissions]
allow = ["shell", "read_file", "grep", "list_dir"]
"#,
    );
    std::fs::create_dir(dir.path("work")).unwrap();
    let links = "ln -s /proc/self/environ env; ln -s /proc proc; ln -s /proc/self self; \
                 ln -s /proc/self/fd fds; ln -s /proc/self/root root; ln -s /proc/self/cwd cwd; \
                 ln -s env again; echo made";
    let read = |id: &str, path: &str| json!({"tool_calls": [{"id": id, "name": "read_file", "arguments": {"path": path}}]});
    let mut steps = vec![
        json!({"tool_calls": [{"id": "ln", "name": "shell", "arguments": {"command": links}}]}),
    ];
    for (i, path) in [
        "env",
        "again",
        "proc/self/environ",
        "self/environ",
        "root/proc/self/environ",
        "cwd/env",
        "fds/0",
        "/proc/self/environ",
        "../../../../../../../proc/self/environ",
    ]
    .iter()
    .enumerate()
    {
        steps.push(read(&format!("r{i}"), path));
    }
    steps.push(json!({"tool_calls": [
        {"id": "g", "name": "grep", "arguments": {"pattern": "OPENAI_API_K[E]Y|nev[e]r-shown"}},
        {"id": "l", "name": "list_dir", "arguments": {"path": "self"}}
    ]}));
    steps.push(json!({"text": "done"}));
    dir.write("script.json", &Value::Array(steps).to_string());
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
        // The tools' root as the working folder: `/proc/self/cwd` leads into the root.
        .current_dir(dir.path("work"))
        .env("OPENAI_API_KEY", key)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    let calls = v["tool_calls"].as_array().unwrap();
    assert!(calls[0]["output"].as_str().unwrap().contains("made"), "{v}");
    for call in &calls[1..] {
        if call["tool"] == "read_file" {
            assert_eq!(call["ok"], false, "{call}");
        }
    }
    let trace = std::fs::read_to_string(&trace).unwrap();
    assert!(trace.contains("read_file"), "{trace}");
    for (what, text) in [
        ("stdout", stdout(&out)),
        ("stderr", stderr(&out)),
        ("trace", trace),
    ] {
        assert!(!text.contains(key), "the key is in {what}: {text}");
        assert!(
            !text.contains("host8-never"),
            "the key is in {what}: {text}"
        );
    }
}
