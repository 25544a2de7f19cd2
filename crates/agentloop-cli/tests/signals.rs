#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The environment's stop of a command that runs agents, through the real binary and real
//! signals: SIGTERM (`kill`, `docker stop`, systemd, a CI timeout) and SIGHUP (a closed terminal)
//! sent to `run`, `run --journal`, `resume`, `chat` and `eval` while a tool's process and a
//! background child it started run. Nothing of the tool outlives agentloop; a plain run is
//! cancelled (its outcome printed, the trace closed, the session kept) and a journaled one left
//! unfinished for `resume`, which repeats no finished call; the exit code is 128 + the signal's.

mod support;

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::crash::{cli, exited, is_interrupted, json_of};
use support::*;

/// The tool's program: logs its group and a background child's pid, says it started, then
/// works for 30 s while the child waits to leave a mark.
const TREE: &str = r#"cut -d' ' -f5 /proc/$$/stat > group.id
(sleep 30; touch marker) &
echo $! > background.pid
echo start >> side.log
sleep 30
echo done
"#;

/// An agent whose `tree` tool is a `[[tools]] command` running [`TREE`] in its folder, on
/// `script`.
fn command_agent(script: &Value) -> AgentDir {
    let dir = AgentDir::new(
        r#"name = "tree"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "tree"
command = ["sh", "tree.sh"]
input_schema = { type = "object", properties = {} }
[[tools]]
name = "quick"
command = ["sh", "-c", "echo quick >> side.log; echo ok"]
input_schema = { type = "object", properties = {} }
"#,
    );
    dir.write("tree.sh", TREE);
    dir.write("script.json", &script.to_string());
    dir
}

/// An agent whose built-in `shell` runs [`TREE`] in its root, `ws`.
fn shell_agent() -> AgentDir {
    let dir = AgentDir::new(
        r#"name = "shell"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
builtin = "shell"
root = "ws"
[permissions]
allow = ["shell"]
"#,
    );
    std::fs::create_dir_all(dir.path("ws")).unwrap();
    dir.write("ws/tree.sh", TREE);
    let script = json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "sh tree.sh"}}]},
        {"text": "Over."}
    ]);
    dir.write("script.json", &script.to_string());
    dir
}

fn one_tree_call() -> Value {
    json!([
        {"tool_calls": [{"id": "t1", "name": "tree", "arguments": {}}]},
        {"text": "Over."}
    ])
}

/// Starts `agentloop ARGS` in the agent's folder, its output captured.
fn start(dir: &AgentDir, args: &[&str], stdin: Stdio) -> Child {
    start_via(None, dir, args, stdin)
}

/// [`start`], through `via` (`nohup`), which runs the command in its own process.
fn start_via(via: Option<&str>, dir: &AgentDir, args: &[&str], stdin: Stdio) -> Child {
    let bin = env!("CARGO_BIN_EXE_agentloop");
    let mut command = Command::new(via.unwrap_or(bin));
    if via.is_some() {
        command.arg(bin);
    }
    command
        .args(args)
        .current_dir(dir.path("."))
        .env_remove("OPENAI_API_KEY")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the tool in `work` has started `n` times in all.
fn wait_started(dir: &AgentDir, work: &str, n: usize) {
    let log = dir.path(&format!("{work}/side.log"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().filter(|l| *l == "start").count() >= n {
            // Its background child's pid is written before.
            std::thread::sleep(Duration::from_millis(200));
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the tool did not start ({n})");
}

/// Sends `signal` (`TERM`, `HUP`) to the command and waits for its end.
fn stop(child: Child, signal: &str) -> Output {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the command ended after the signal")
        .unwrap()
}

/// True when `pid` is a process that has not ended (a zombie has).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let close = stat.rfind(')')?;
            stat[close + 1..]
                .split_whitespace()
                .next()
                .map(|s| s != "Z")
        })
        .unwrap_or(false)
}

/// Asserts that nothing of the tool in `work` runs any more: neither its process group nor the
/// background child; kills what is left, so that a failure leaves no process behind.
fn assert_no_tool_left(dir: &AgentDir, work: &str, what: &str) {
    let read = |name: &str| {
        std::fs::read_to_string(dir.path(&format!("{work}/{name}")))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let (group, background) = (read("group.id"), read("background.pid"));
    assert!(!group.is_empty() && !background.is_empty(), "{what}");
    // The group is killed as the command ends; give the kernel a moment to show it.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut live = live_in_groups(&[group.as_str()]);
    while (!live.is_empty() || alive(&background)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        live = live_in_groups(&[group.as_str()]);
    }
    let orphan = alive(&background);
    let kill = |pid: &str| {
        let _ = Command::new("kill")
            .args(["-9", pid])
            .stderr(Stdio::null())
            .status();
    };
    live.iter()
        .filter_map(|p| p.split(' ').next())
        .for_each(kill);
    kill(&background);
    assert!(
        live.is_empty(),
        "{what}: the tool's group lives on: {live:?}"
    );
    assert!(!orphan, "{what}: the tool's background child lives on");
}

/// The trace's records, each line of it whole JSON.
fn trace_records(dir: &AgentDir, name: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.path(name))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_run_stopped_by_sigterm_or_sighup_is_cancelled_its_tool_tree_killed_and_its_end_written() {
    for (signal, code) in [("TERM", 143), ("HUP", 129)] {
        for (dir, work) in [
            (command_agent(&one_tree_call()), "."),
            (shell_agent(), "ws"),
        ] {
            let what = format!("SIG{signal}, tool in {work}");
            let run = start(
                &dir,
                &[
                    "run",
                    "agent.toml",
                    "--input",
                    "go",
                    "--json",
                    "--trace",
                    "t.ndjson",
                ],
                Stdio::null(),
            );
            wait_started(&dir, work, 1);
            let out = stop(run, signal);
            exited(&out, code, &what);
            assert!(
                stderr_of(&out).contains(&format!("SIG{signal}: cancelling")),
                "{what}: {}",
                stderr_of(&out)
            );
            let outcome = json_of(&out);
            assert_eq!(outcome["stop_reason"], "cancelled", "{what}: {outcome}");
            assert_eq!(outcome["tool_calls"][0]["status"], "cancelled", "{what}");
            assert_no_tool_left(&dir, work, &what);
            assert!(!dir.path(&format!("{work}/marker")).exists(), "{what}");
            // The trace is whole and closes the run as it ended.
            let records = trace_records(&dir, "t.ndjson");
            let run = records.iter().rev().find(|r| r["kind"] == "run").unwrap();
            assert_eq!(run["stop_reason"], "cancelled", "{what}: {run}");
            let mut last = std::collections::HashMap::new();
            for r in &records {
                last.insert(r["id"].to_string(), r["status"].clone());
            }
            assert!(
                last.values().all(|s| s != "running"),
                "{what}: a span is left open: {records:#?}"
            );
        }
    }
}

#[test]
fn a_journaled_run_stopped_by_a_signal_is_left_for_resume_which_repeats_no_finished_call() {
    // A quick call that finishes, then the slow one, during which SIGTERM comes; the resume
    // makes another slow call, during which SIGHUP comes; the second resume ends the run.
    let dir = command_agent(&json!([
        {"tool_calls": [{"id": "t1", "name": "quick", "arguments": {}}]},
        {"tool_calls": [{"id": "t2", "name": "tree", "arguments": {}}]},
        {"tool_calls": [{"id": "t3", "name": "tree", "arguments": {}}]},
        {"text": "Over."}
    ]));
    let journal = ["--journal", "runs.db", "--json", "--trace", "t.ndjson"];
    let mut args = vec!["run", "agent.toml", "--input", "go"];
    args.extend(journal);
    let run = start(&dir, &args, Stdio::null());
    wait_started(&dir, ".", 1);
    let out = stop(run, "TERM");
    exited(&out, 143, "the run");
    let stopped = json_of(&out);
    assert_eq!(stopped["error"]["code"], "cli.stopped", "{stopped}");
    let id = stopped["run_id"].as_str().unwrap().to_owned();
    let message = stopped["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("agentloop resume {id} --journal runs.db")),
        "{message}"
    );
    assert_no_tool_left(&dir, ".", "the run");
    trace_records(&dir, "t.ndjson");

    let mut args = vec!["resume", id.as_str()];
    args.extend(journal);
    let resume = start(&dir, &args, Stdio::null());
    wait_started(&dir, ".", 2);
    let out = stop(resume, "HUP");
    exited(&out, 129, "the first resume");
    assert_eq!(json_of(&out)["run_id"], id.as_str());
    assert_eq!(json_of(&out)["error"]["code"], "cli.stopped");
    assert_no_tool_left(&dir, ".", "the first resume");

    let out = cli(&dir, &args);
    exited(&out, 0, "the second resume");
    let outcome = json_of(&out);
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    let log = std::fs::read_to_string(dir.path("side.log")).unwrap();
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        ["quick", "start", "start"],
        "no call ran twice"
    );
    let transcript = outcome["transcript"].as_array().unwrap();
    for call in ["t2", "t3"] {
        assert!(
            transcript
                .iter()
                .any(|m| m["call_id"] == call && is_interrupted(m)),
            "{call} was running at a stop: {transcript:#?}"
        );
    }
    assert!(
        transcript
            .iter()
            .any(|m| m["call_id"] == "t1" && m["role"] == "tool" && !is_interrupted(m)),
        "{transcript:#?}"
    );
    // One run in the trace, finished, nothing of it left open.
    let out = cli(&dir, &["trace", "list", "t.ndjson", "--json"]);
    exited(&out, 0, "trace list");
    let listed = json_of(&out);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
    assert_eq!(listed[0]["stop_reason"], "finished", "{listed:#}");
}

#[test]
fn a_chat_stopped_by_sigterm_cancels_its_turn_keeps_it_in_the_session_and_ends() {
    let dir = command_agent(&one_tree_call());
    let mut chat = start(
        &dir,
        &[
            "chat",
            "agent.toml",
            "--session",
            "s1",
            "--trace",
            "t.ndjson",
        ],
        Stdio::piped(),
    );
    // Its stdin stays open: the chat ends by the signal, not by the end of its input.
    let mut input = chat.stdin.take().unwrap();
    input.write_all(b"hello\n").unwrap();
    wait_started(&dir, ".", 1);
    let out = stop(chat, "TERM");
    drop(input);
    exited(&out, 143, "the chat");
    assert!(stderr_of(&out).contains("SIGTERM: ending the chat"));
    assert_no_tool_left(&dir, ".", "the chat");
    let out = cli(&dir, &["sessions", "show", "s1", "--json"]);
    exited(&out, 0, "sessions show");
    let session = json_of(&out);
    let messages = session["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .any(|m| m["role"] == "tool" && m["call_id"] == "t1"),
        "the cancelled turn is kept, its call answered: {session:#}"
    );
    let records = trace_records(&dir, "t.ndjson");
    let run = records.iter().rev().find(|r| r["kind"] == "run").unwrap();
    assert_eq!(run["stop_reason"], "cancelled", "{run}");
}

#[test]
fn an_eval_stopped_by_sigterm_cancels_its_runs_and_reports_them() {
    let dir = command_agent(&one_tree_call());
    dir.write(
        "cases.toml",
        r#"name = "s"
[[cases]]
name = "one"
input = "go"
checks = [{ stop_reason = "finished" }]
[[cases]]
name = "two"
input = "go"
checks = [{ stop_reason = "finished" }]
"#,
    );
    let eval = start(
        &dir,
        &["eval", "agent.toml", "--cases", "cases.toml", "--json"],
        Stdio::null(),
    );
    wait_started(&dir, ".", 1);
    let out = stop(eval, "TERM");
    exited(&out, 143, "the eval");
    assert_no_tool_left(&dir, ".", "the eval");
    let report = json_of(&out);
    let runs: Vec<&Value> = report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["runs"].as_array().unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "{report:#}");
    assert!(
        runs.iter().all(|r| r["stop_reason"] == "cancelled"),
        "{report:#}"
    );
}

#[test]
fn a_run_under_nohup_goes_on_through_a_hangup() {
    // `nohup` leaves SIGHUP ignored for the command it starts, so that a closed terminal does
    // not stop it: the run must go on as it did before agentloop heard SIGHUP at all.
    let dir = command_agent(&json!([
        {"tool_calls": [{"id": "t1", "name": "quick", "arguments": {}}]},
        {"tool_calls": [{"id": "t2", "name": "tree", "arguments": {}}]},
        {"text": "Over."}
    ]));
    dir.write("tree.sh", "echo start >> side.log\nsleep 1\necho done\n");
    let run = start_via(
        Some("nohup"),
        &dir,
        &["run", "agent.toml", "--input", "go", "--json"],
        Stdio::null(),
    );
    wait_started(&dir, ".", 1);
    let out = stop(run, "HUP");
    exited(&out, 0, "the run under nohup");
    assert_eq!(json_of(&out)["stop_reason"], "finished");
}
