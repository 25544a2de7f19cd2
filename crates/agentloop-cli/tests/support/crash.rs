//! The crash harness's agent, shared by the durable-run and the Restate tests: tools that log
//! their side effects, a multi-turn script, and the check of a resumed run against an
//! uninterrupted one.
#![allow(dead_code, clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::HashMap;

use serde_json::{Value, json};

use std::process::{Command, Stdio};

use super::AgentDir;

/// Every tool appends `NAME ARGUMENTS` to `side.log`, then answers from its arguments; `broken`
/// fails. `read` is idempotent; `write` and `commit` change the world (`commit` is sequential).
pub(crate) const TOOL: &str = r#"name="$1"
args="$(cat)"
printf '%s %s\n' "$name" "$args" >> side.log
if [ "$name" = broken ]; then echo "broken: it always fails" >&2; exit 3; fi
printf '%s done: %s\n' "$name" "$args"
"#;

/// The idempotent `read` and the world-changing `write`, as every agent of the harness has them.
macro_rules! read_write_tools {
    () => {
        r#"[[tools]]
name = "read"
command = ["sh", "tool.sh", "read"]
input_schema = { type = "object", properties = { key = { type = "string" } }, required = ["key"] }
idempotent = true
[[tools]]
name = "write"
command = ["sh", "tool.sh", "write"]
input_schema = { type = "object", properties = { key = { type = "string" } }, required = ["key"] }
"#
    };
}

pub(crate) const AGENT: &str = concat!(
    r#"name = "crash"
version = "1"
[model]
provider = "scripted"
script = "script.json"
[limits]
max_concurrency = 2
"#,
    read_write_tools!(),
    r#"[[tools]]
name = "commit"
command = ["sh", "tool.sh", "commit"]
input_schema = { type = "object", properties = { key = { type = "string" } }, required = ["key"] }
mode = "sequential"
[[tools]]
name = "broken"
command = ["sh", "tool.sh", "broken"]
input_schema = { type = "object", properties = { key = { type = "string" } } }
"#
);

pub(crate) const TREE: &str = concat!(
    r#"name = "lead"
version = "1"
[model]
provider = "scripted"
script = "lead.json"
[limits]
max_concurrency = 2
max_turns = 20
"#,
    read_write_tools!(),
    r#"[[tools]]
name = "ask_a"
agent = "worker-a.toml"
description = "Worker A."
[[tools]]
name = "ask_b"
agent = "worker-b.toml"
description = "Worker B."
"#
);

pub(crate) fn tree_worker(name: &str, permissions: &str) -> String {
    format!(
        "name = \"{name}\"\nversion = \"1\"\n[model]\nprovider = \"scripted\"\n\
         script = \"{name}.json\"\n[limits]\nmax_concurrency = 2\n{}{permissions}",
        read_write_tools!()
    )
}

pub(crate) fn task(id: &str, tool: &str, task: &str) -> Value {
    json!({"id": id, "name": tool, "arguments": {"task": task}})
}

/// The tree: `lead` hands a task to worker A while it writes itself, then one to worker B, then
/// answers. Worker A writes and reads at once, then writes again; worker B writes once.
/// `permissions` goes into worker A's file.
pub(crate) fn tree_dir(permissions: &str) -> AgentDir {
    let dir = AgentDir::new(TREE);
    dir.write("tool.sh", TOOL);
    dir.write("worker-a.toml", &tree_worker("worker-a", permissions));
    dir.write("worker-b.toml", &tree_worker("worker-b", ""));
    dir.write(
        "lead.json",
        &json!([
            {"text": "A works while I write.", "tool_calls": [
                task("p1", "ask_a", "alpha"), call("p2", "write", "lead-1")]},
            {"tool_calls": [task("p3", "ask_b", "beta")]},
            {"text": "Both workers are done."}
        ])
        .to_string(),
    );
    dir.write(
        "worker-a.json",
        &json!([
            {"tool_calls": [call("a1", "write", "a-1"), call("a2", "read", "a-2")]},
            {"tool_calls": [call("a3", "write", "a-3")]},
            {"text": "A is done."}
        ])
        .to_string(),
    );
    dir.write(
        "worker-b.json",
        &json!([
            {"tool_calls": [call("b1", "write", "b-1")]},
            {"text": "B is done."}
        ])
        .to_string(),
    );
    dir
}

pub(crate) fn call(id: &str, tool: &str, key: &str) -> Value {
    json!({"id": id, "name": tool, "arguments": {"key": key}})
}

pub(crate) fn script() -> String {
    json!([
        {"text": "Reading and writing at once.", "tool_calls": [
            call("c1", "read", "a"), call("c2", "read", "b"), call("c3", "write", "x")]},
        {"tool_calls": [call("c4", "commit", "one"), call("c5", "read", "c")]},
        {"tool_calls": [call("c6", "broken", "z"), call("c7", "write", "y"), call("c8", "read", "d")]},
        {"text": "All done."}
    ])
    .to_string()
}

pub(crate) fn crash_dir(permissions: &str) -> AgentDir {
    let dir = AgentDir::new(&format!("{AGENT}{permissions}"));
    dir.write("tool.sh", TOOL);
    dir.write("script.json", &script());
    dir
}

pub(crate) fn side_log(dir: &AgentDir) -> Vec<String> {
    std::fs::read_to_string(dir.path("side.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The tool of each call id in a transcript.
pub(crate) fn tools_by_call(transcript: &[Value]) -> HashMap<String, String> {
    transcript
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .map(|c| {
            (
                c["call_id"].as_str().unwrap().to_owned(),
                c["tool"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

pub(crate) fn is_interrupted(message: &Value) -> bool {
    message["role"] == "tool"
        && message["content"]["value"]
            .as_str()
            .is_some_and(|t| t.starts_with("interrupted:"))
}

/// The resumed run's transcript is the uninterrupted one's, but for results of non-idempotent
/// calls that were running at the kill (their effect is unknown, and the model reads so); no
/// non-idempotent call ran twice, and each call the transcript reports as done ran.
pub(crate) fn check_against(base: &[Value], resumed: &[Value], side: &[String], what: &str) {
    assert_eq!(
        base.len(),
        resumed.len(),
        "{what}: transcript length\n{resumed:#?}"
    );
    let tools = tools_by_call(base);
    for (b, r) in base.iter().zip(resumed) {
        if is_interrupted(r) {
            let tool = &tools[r["call_id"].as_str().unwrap()];
            assert_ne!(
                tool, "read",
                "{what}: an idempotent call is run again, never interrupted"
            );
            assert_eq!(b["call_id"], r["call_id"], "{what}");
            continue;
        }
        assert_eq!(b, r, "{what}: messages differ");
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for line in side {
        *counts.entry(line.as_str()).or_default() += 1;
    }
    for (line, n) in &counts {
        if !line.starts_with("read ") {
            assert_eq!(
                *n, 1,
                "{what}: a non-idempotent call ran {n} times: {line}\n{side:#?}"
            );
        }
    }
    // Every call whose result the model read as done did run.
    for m in resumed
        .iter()
        .filter(|m| m["role"] == "tool" && !is_interrupted(m))
    {
        let tool = m["tool"].as_str().unwrap();
        let value = m["content"]["value"].as_str().unwrap_or_default();
        if let Some(args) = value.strip_prefix(&format!("{tool} done: ")) {
            let line = format!("{tool} {}", args.trim_end());
            assert!(
                counts.contains_key(line.as_str()),
                "{what}: {line} never ran\n{side:#?}"
            );
        }
    }
}

/// The `agentloop` command with these arguments, run in the agent's folder.
pub(crate) fn cli(dir: &AgentDir, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(args)
        .current_dir(dir.path("."))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Asserts the command exited with `code`, showing its stderr otherwise.
pub(crate) fn exited(out: &std::process::Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The command's stdout as JSON.
pub(crate) fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs `cmd` (its journal fault set), and kills the process with SIGKILL once it stops at the
/// fault. Returns false when the run ended before reaching it.
pub(crate) fn killed_at_fault(mut cmd: Command) -> bool {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let paused = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("agentloop: fault: paused"));
    if paused {
        child.kill().unwrap(); // SIGKILL on Unix
    }
    child.wait().unwrap();
    paused
}

/// The top run of a journal's runs (the one no other run started), and how many of the runs it
/// started were still running: a kill that landed inside a child.
pub(crate) fn top_and_running_children(runs: &[Value]) -> (String, usize) {
    let tops: Vec<&Value> = runs.iter().filter(|r| r.get("parent").is_none()).collect();
    assert_eq!(tops.len(), 1, "{runs:#?}");
    let running = runs
        .iter()
        .filter(|r| r.get("parent").is_some() && r["status"] == "running")
        .count();
    (tops[0]["run_id"].as_str().unwrap().to_owned(), running)
}

/// `resume RUN --journal JOURNAL --json`.
pub(crate) fn resume_json(
    dir: &AgentDir,
    journal: &std::path::Path,
    run_id: &str,
) -> std::process::Output {
    cli(
        dir,
        &[
            "resume",
            run_id,
            "--journal",
            journal.to_str().unwrap(),
            "--json",
        ],
    )
}

/// `journal list --json` of a journal.
pub(crate) fn journal_runs(dir: &AgentDir, journal: &std::path::Path) -> Vec<Value> {
    let out = cli(
        dir,
        &[
            "journal",
            "list",
            "--journal",
            journal.to_str().unwrap(),
            "--json",
        ],
    );
    exited(&out, 0, "journal list");
    json_of(&out).as_array().unwrap().clone()
}
