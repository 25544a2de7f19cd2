#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Runs past one machine, against a real Restate server (`scripts/restate/`, started here on
//! loopback with a fresh data dir): worker processes of `agentloop serve` killed after each
//! journaled step in turn while another takes the run over, an approval that waits across a
//! worker restart and is answered from the command line, and the runs of one session key
//! serialized.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::crash::*;
use support::restate::*;
use support::*;

/// The approvals run `id` waits on: `agentloop approvals list --restate URL --run ID --json`.
fn pending(dir: &AgentDir, server: &Server, id: &str) -> Vec<String> {
    listed(dir, server, "approvals", id)
        .iter()
        .map(|w| {
            assert_eq!(w["run_id"], id);
            w["call_id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Submits a run of `dir`'s agent on `session` to a worker that stops after step `n`, kills that
/// worker with SIGKILL when it does (another at the same address takes the run over) and waits
/// for the run's end through `attach`, which must succeed. The worker's line at the stop (none
/// when the run ended before step `n`), and `attach`'s output.
fn killed_after_step(
    dir: &AgentDir,
    server: &Server,
    n: u64,
    session: &str,
) -> (Option<String>, std::process::Output) {
    let what = format!("killed after step {n}");
    let addr = free_addr();
    let mut a = worker(dir, server, addr, true, Some(n));
    let id = submit_id(dir, server, session);
    let mut watch = watch(dir, server, &id);
    let deadline = Instant::now() + Duration::from_secs(60);
    let paused = loop {
        if let Some(line) =
            a.1.try_iter()
                .find(|l| l.starts_with("agentloop-restate: fault: paused"))
        {
            a.0.kill().unwrap(); // SIGKILL on Unix
            a.0.wait().unwrap();
            break Some(line);
        }
        if watch.try_wait().unwrap().is_some() {
            break None;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: neither crashed nor ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let b = paused
        .is_some()
        .then(|| worker(dir, server, addr, false, None));
    let out = watch.wait_with_output().unwrap();
    drop((a, b));
    assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
    (paused, out)
}

#[test]
fn a_worker_killed_after_any_step_leaves_the_run_to_another_with_the_same_transcript() {
    let server = Server::start();

    // The uninterrupted run.
    let base_dir = crash_dir("");
    let addr = free_addr();
    let w = worker(&base_dir, &server, addr, true, None);
    let id = submit_id(&base_dir, &server, "base");
    let base = attach(&base_dir, &server, &id);
    drop(w);
    assert_eq!(base["stop_reason"], "finished", "{base}");
    let base_transcript = base["transcript"].as_array().unwrap().clone();
    check_against(
        &base_transcript,
        &base_transcript,
        &side_log(&base_dir),
        "uninterrupted",
    );

    let mut crashes = 0;
    for n in 0.. {
        let what = format!("killed after step {n}");
        let dir = crash_dir("");
        let (crashed, out) = killed_after_step(&dir, &server, n, &format!("crash-{n}"));
        if crashed.is_none() {
            break;
        }
        crashes += 1;
        let outcome = stdout_json(&out);
        assert_eq!(outcome["stop_reason"], "finished", "{what}: {outcome}");
        let transcript = outcome["transcript"].as_array().unwrap();
        check_against(&base_transcript, transcript, &side_log(&dir), &what);
        assert_eq!(outcome["usage"], base["usage"], "{what}");
        assert_eq!(outcome["model_calls"], base["model_calls"], "{what}");
        assert_eq!(outcome["turns"], base["turns"], "{what}");
    }
    assert!(crashes >= 20, "a long enough run: {crashes} steps");
}

#[test]
fn an_approval_waits_across_a_worker_restart_and_is_answered_from_the_command_line() {
    let server = Server::start();
    let dir = crash_dir(
        r#"[permissions]
ask = ["write"]
store = "permissions.json"
"#,
    );
    let addr = free_addr();
    let a = worker(&dir, &server, addr, true, None);
    let id = submit_id(&dir, &server, "asks");
    let watch = watch(&dir, &server, &id);
    // Until the run waits on `call`, and on it alone.
    let wait_for_pending = |call: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while pending(&dir, &server, &id) != [call] {
            assert!(Instant::now() < deadline, "the run does not wait on {call}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for_pending("c3");
    // The worker that ran the run dies while it waits; another starts at its address.
    drop(a);
    let _b = worker(&dir, &server, addr, false, None);
    assert!(!side_log(&dir).iter().any(|l| l.starts_with("write ")));
    let answer = |call: &str, how: &str| {
        let out = cli(
            &dir,
            &[
                "approve",
                &id,
                "--call",
                call,
                how,
                "--restate",
                &server.ingress,
            ],
        );
        assert_eq!(out.status.code(), Some(0), "approve: {}", stderr(&out));
    };
    answer("c3", "--allow");
    // The second batch asks again (c7); it is denied.
    wait_for_pending("c7");
    answer("c7", "--deny");
    let out = watch.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "attach: {}", stderr(&out));
    let outcome = stdout_json(&out);
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    let side = side_log(&dir);
    assert!(side.iter().any(|l| l == r#"write {"key":"x"}"#), "{side:?}");
    assert!(
        !side.iter().any(|l| l == r#"write {"key":"y"}"#),
        "{side:?}"
    );
    let denied = outcome["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "c7")
        .unwrap();
    assert_eq!(denied["status"], "denied", "{denied}");
}

/// A tool that records when it starts and ends, a second apart.
const SLOW: &str = r#"import sys, time
with open("times.log", "a") as f:
    f.write(f"start {time.time()}\n")
time.sleep(1)
with open("times.log", "a") as f:
    f.write(f"end {time.time()}\n")
print("slept")
"#;

/// An agent of one tool, `slow`, which runs `command`, and a script that calls it once per
/// turn (`calls` turns), then answers.
fn slow_dir(command: &str, calls: usize) -> AgentDir {
    let dir = AgentDir::new(&format!(
        "name = \"slow\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\
         [[tools]]\nname = \"slow\"\ncommand = {command}\ninput_schema = {{ type = \"object\" }}\n"
    ));
    let mut script: Vec<Value> = (1..=calls)
        .map(|i| json!({"tool_calls": [{"id": format!("s{i}"), "name": "slow", "arguments": {}}]}))
        .collect();
    script.push(json!({"text": "Done."}));
    dir.write("script.json", &Value::Array(script).to_string());
    dir
}

#[test]
fn runs_of_one_session_key_are_serialized_and_a_repeated_submit_starts_none() {
    let server = Server::start();
    let dir = slow_dir(r#"["python3", "slow.py"]"#, 1);
    dir.write("slow.py", SLOW);
    let _w = worker(&dir, &server, free_addr(), true, None);
    let (first, second) = std::thread::scope(|s| {
        let one = s.spawn(|| submit(&dir, &server, "shared", &["--idempotency-key", "k1"]));
        let two = s.spawn(|| submit(&dir, &server, "shared", &["--idempotency-key", "k2"]));
        (one.join().unwrap(), two.join().unwrap())
    });
    assert_ne!(first["id"], second["id"]);
    // Submitting again with a key already used starts no run: the first one's id comes back.
    let again = submit(&dir, &server, "shared", &["--idempotency-key", "k1"]);
    assert_eq!(again["id"], first["id"]);
    let outcomes: Vec<Value> = [&first, &second]
        .iter()
        .map(|s| attach(&dir, &server, s["id"].as_str().unwrap()))
        .collect();
    for o in &outcomes {
        assert_eq!(o["stop_reason"], "finished", "{o}");
    }
    // One after the other: the tool's runs never overlap, and the later run saw the earlier's
    // conversation.
    let times = std::fs::read_to_string(dir.path("times.log")).unwrap();
    let marks: Vec<&str> = times
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(marks, ["start", "end", "start", "end"], "{times}");
    let mut lengths: Vec<usize> = outcomes
        .iter()
        .map(|o| o["transcript"].as_array().unwrap().len())
        .collect();
    lengths.sort_unstable();
    assert_eq!(lengths[1], 2 * lengths[0], "{lengths:?}");
}

#[test]
fn restates_cancel_reaches_the_run_in_a_long_call_which_is_cancelled_and_drained() {
    let server = Server::start();
    let dir = slow_dir(
        r#"["sh", "-c", "echo started >> side.log; sleep 30; echo slept"]"#,
        2,
    );
    let _w = worker_with(
        &dir,
        &server,
        free_addr(),
        true,
        None,
        &["--heartbeat-secs", "0.2"],
        &[],
    );
    let id = submit_id(&dir, &server, "cancelled");
    let deadline = Instant::now() + Duration::from_secs(30);
    while side_log(&dir).is_empty() {
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Restate's own cancel, through its admin API, while the call sleeps.
    let cancelled_at = Instant::now();
    let code = format!(
        "import urllib.request\n\
         urllib.request.urlopen(urllib.request.Request('{}/invocations/{id}/cancel', method='PATCH'))",
        server.admin.trim_end_matches('/')
    );
    let out = Command::new("python3")
        .args(["-c", &code])
        .output()
        .unwrap();
    assert!(out.status.success(), "cancel: {}", stderr(&out));
    let out = attach_cmd(&dir, &server, &id).output().unwrap();
    assert_eq!(out.status.code(), Some(130), "attach: {}", stderr(&out));
    // The cancel reached the run at its next heartbeat, not when the call would have ended.
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(20),
        "the run ended {:?} after the cancel",
        cancelled_at.elapsed()
    );
    let outcome = stdout_json(&out);
    assert_eq!(outcome["stop_reason"], "cancelled", "{outcome}");
    assert_eq!(outcome["error"]["code"], "run.cancelled", "{outcome}");
    // The call in flight was cancelled and drained, and no later one started.
    assert_eq!(side_log(&dir), ["started"]);
    let calls = outcome["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{outcome}");
    assert_eq!(calls[0]["error"]["code"], "cancelled", "{outcome}");
}

/// The crash agent with a 3 s deadline, whose `write` asks for approval.
fn asking_dir_with_a_deadline() -> AgentDir {
    let agent = AGENT.replace(
        "max_concurrency = 2",
        "max_concurrency = 2\ntimeout_secs = 3",
    );
    let dir = AgentDir::new(&format!(
        "{agent}[permissions]\nask = [\"write\"]\nstore = \"permissions.json\"\n"
    ));
    dir.write("tool.sh", TOOL);
    dir.write("script.json", &script());
    dir
}

#[test]
fn an_unanswered_approval_waits_on_a_durable_timer_until_the_runs_deadline() {
    let server = Server::start();
    let dir = asking_dir_with_a_deadline();
    let _w = worker(&dir, &server, free_addr(), true, None);
    let id = submit_id(&dir, &server, "late");
    let started = Instant::now();
    let out = attach_cmd(&dir, &server, &id).output().unwrap();
    assert_eq!(out.status.code(), Some(5), "attach: {}", stderr(&out));
    let outcome = stdout_json(&out);
    assert_eq!(outcome["stop_reason"], "deadline", "{outcome}");
    assert!(started.elapsed() >= Duration::from_secs(2), "it waited");
    assert!(!side_log(&dir).iter().any(|l| l.starts_with("write ")));
}

#[test]
fn a_timer_that_ends_the_wait_on_a_worker_whose_clock_is_behind_still_stops_at_the_deadline() {
    // The run begins on a worker with the system's clock and waits for an answer that never
    // comes; that worker dies, and the timer ends the wait on another whose clock reads a minute
    // behind. The run has reached its deadline all the same (the timer says so): it stops there,
    // rather than failing as a run with unanswered calls that cannot go on.
    let server = Server::start();
    let dir = asking_dir_with_a_deadline();
    let addr = free_addr();
    let a = worker(&dir, &server, addr, true, None);
    let id = submit_id(&dir, &server, "skewed");
    let deadline = Instant::now() + Duration::from_secs(60);
    while pending(&dir, &server, &id).is_empty() {
        assert!(Instant::now() < deadline, "the run never waited");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(a);
    let behind = [("AGENTLOOP_TEST_RESTATE_CLOCK_BEHIND_MS", "60000")];
    let _b = worker_with(&dir, &server, addr, false, None, &[], &behind);
    let out = attach_cmd(&dir, &server, &id).output().unwrap();
    let outcome = stdout_json(&out);
    assert_eq!(outcome["stop_reason"], "deadline", "{outcome}");
    assert_eq!(out.status.code(), Some(5), "attach: {}", stderr(&out));
    assert!(!side_log(&dir).iter().any(|l| l.starts_with("write ")));
}

/// Two calls at once, one short and one long, on a server that cuts an attempt silent for a
/// second (inactivity and abort timeouts of 1 s).
fn long_step(heartbeat_secs: &str) -> Value {
    let server = Server::start_with(&[("AGENTLOOP_RESTATE_INACTIVITY", "1s")]);
    let dir = AgentDir::new(
        r#"name = "long"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "wait"
command = ["python3", "-c", "import json, sys, time; time.sleep(json.load(sys.stdin)['secs']); print('waited')"]
input_schema = { type = "object", properties = { secs = { type = "number" } }, required = ["secs"] }
"#,
    );
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                {"id": "short", "name": "wait", "arguments": {"secs": 0.2}},
                {"id": "long", "name": "wait", "arguments": {"secs": 4}}
            ]},
            {"text": "Done."}
        ])
        .to_string(),
    );
    let _w = worker_with(
        &dir,
        &server,
        free_addr(),
        true,
        None,
        &["--heartbeat-secs", heartbeat_secs],
        &[],
    );
    let id = submit_id(&dir, &server, "long");
    attach(&dir, &server, &id)
}

fn call_status(outcome: &Value, id: &str) -> String {
    let call = outcome["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no call {id}: {outcome}"));
    call["status"].as_str().unwrap().to_owned()
}

#[test]
fn heartbeats_keep_a_long_step_alive_where_restate_cuts_a_silent_attempt() {
    // With a heartbeat well inside the server's timeouts, the long call finishes.
    let alive = long_step("0.2");
    assert_eq!(alive["stop_reason"], "finished", "{alive}");
    assert_eq!(call_status(&alive, "short"), "ok", "{alive}");
    assert_eq!(call_status(&alive, "long"), "ok", "{alive}");
    // Without (one far past them), Restate cuts the attempt while the long call runs: the next
    // attempt finds it in flight, and the model reads that it was interrupted.
    let cut = long_step("600");
    assert_eq!(cut["stop_reason"], "finished", "{cut}");
    assert_eq!(call_status(&cut, "short"), "ok", "{cut}");
    assert_eq!(call_status(&cut, "long"), "error", "{cut}");
}

#[test]
fn a_runs_news_is_kept_for_attach_and_forgotten_after_its_retention() {
    let server = Server::start();
    let dir = slow_dir(r#"["sh", "-c", "echo slept"]"#, 1);
    let _w = worker_with(
        &dir,
        &server,
        free_addr(),
        true,
        None,
        &["--news-retention-secs", "2"],
        &[],
    );
    let id = submit_id(&dir, &server, "news");
    let outcome = attach(&dir, &server, &id);
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    let kinds = |n: &Value| -> Vec<String> {
        n["events"]
            .as_array()
            .map(|e| {
                e.iter()
                    .map(|e| e["event"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let kept = kinds(&news(&server, &id));
    assert_eq!(
        kept.first().map(String::as_str),
        Some("run_started"),
        "{kept:?}"
    );
    assert_eq!(
        kept.last().map(String::as_str),
        Some("run_finished"),
        "{kept:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kinds(&news(&server, &id)).is_empty() {
        assert!(Instant::now() < deadline, "the news was never forgotten");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The outcome itself stays with the invocation.
    assert_eq!(attach(&dir, &server, &id)["stop_reason"], "finished");
}

#[test]
fn an_awakeable_rejected_through_restate_denies_its_call_and_the_run_goes_on() {
    let server = Server::start();
    let dir = crash_dir(
        r#"[permissions]
ask = ["write"]
store = "permissions.json"
"#,
    );
    let _w = worker(&dir, &server, free_addr(), true, None);
    let id = submit_id(&dir, &server, "rejected");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rejected = Vec::new();
    let out = loop {
        // Each asked call's awakeable is rejected through Restate's own API, as it comes.
        for p in news(&server, &id)["approvals"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let awakeable = p["awakeable"].as_str().unwrap().to_owned();
            if rejected.contains(&awakeable) {
                continue;
            }
            reject(&server, &awakeable);
            rejected.push(awakeable);
        }
        if rejected.len() == 2 {
            break attach(&dir, &server, &id);
        }
        assert!(Instant::now() < deadline, "the run never asked twice");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(out["stop_reason"], "finished", "{out}");
    for call in ["c3", "c7"] {
        let c = out["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == call)
            .unwrap();
        assert_eq!(c["status"], "denied", "{c}");
    }
    assert!(!side_log(&dir).iter().any(|l| l.starts_with("write ")));
}

#[test]
fn a_worker_that_cannot_register_exits_with_the_restate_code_and_shows_no_credentials() {
    let dir = crash_dir("");
    let addr = free_addr().to_string();
    // Nothing listens on port 1: the admin API cannot be reached.
    let out = cli(
        &dir,
        &[
            "serve",
            dir.agent().to_str().unwrap(),
            "--restate-endpoint",
            &addr,
            "--register",
            "http://admin:s3cret-pass@127.0.0.1:1",
        ],
    );
    assert_eq!(out.status.code(), Some(11), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the Restate admin API at http://[redacted]@127.0.0.1:1/"),
        "{err}"
    );
    assert!(
        !err.contains("s3cret-pass") && !err.contains("admin:"),
        "{err}"
    );
}

#[test]
fn two_submits_with_one_idempotency_key_and_no_session_start_one_run() {
    let server = Server::start();
    let dir = slow_dir(r#"["python3", "slow.py"]"#, 1);
    dir.write("slow.py", SLOW);
    let _w = worker(&dir, &server, free_addr(), true, None);
    let submit_keyed = |key: &str| {
        let agent = dir.agent();
        let out = cli(
            &dir,
            &[
                "submit",
                agent.to_str().unwrap(),
                "--input",
                "go",
                "--idempotency-key",
                key,
                "--restate",
                &server.ingress,
                "--json",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "submit: {}", stderr(&out));
        stdout_json(&out)
    };
    let first = submit_keyed("order-17");
    let second = submit_keyed("order-17");
    assert_eq!(first["status"], "Accepted", "{first}");
    assert_eq!(second["status"], "PreviouslyAccepted", "{second}");
    assert_eq!(
        second["id"], first["id"],
        "the second submit is the first run"
    );
    assert_eq!(second["session"], first["session"]);
    assert!(
        !first["session"].as_str().unwrap().contains("order-17"),
        "the session does not show the key"
    );
    let outcome = attach(&dir, &server, first["id"].as_str().unwrap());
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    // Another key is another run, on a session of its own.
    let other = submit_keyed("order-18");
    assert_ne!(other["id"], first["id"]);
    assert_ne!(other["session"], first["session"]);
    let outcome = attach(&dir, &server, other["id"].as_str().unwrap());
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    // The tool ran once per run: twice, not three times.
    let times = std::fs::read_to_string(dir.path("times.log")).unwrap();
    assert_eq!(
        times.lines().filter(|l| l.starts_with("start")).count(),
        2,
        "{times}"
    );
}

#[test]
fn a_run_whose_agent_changed_between_workers_ends_visibly_and_its_session_stays_whole() {
    let server = Server::start();
    let dir = crash_dir("");
    let addr = free_addr();
    let mut a = worker(&dir, &server, addr, true, Some(4));
    let id = submit_id(&dir, &server, "changed");
    let watch = watch(&dir, &server, &id);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !a
        .1
        .try_iter()
        .any(|l| l.starts_with("agentloop-restate: fault: paused"))
    {
        assert!(Instant::now() < deadline, "the worker never paused");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    // The next worker serves a changed agent: resuming the run is refused.
    dir.write(
        "agent.toml",
        &AGENT.replace("version = \"1\"", "version = \"2\""),
    );
    let b = worker(&dir, &server, addr, false, None);
    let out = watch.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(9),
        "the journal's exit code: {}",
        stderr(&out)
    );
    let outcome = stdout_json(&out);
    assert_eq!(outcome["stop_reason"], "failed", "{outcome}");
    assert_eq!(outcome["error"]["code"], "journal.changed", "{outcome}");
    // The session's transcript is as the last run that ended left it (none): the next run on
    // it starts from its own input, and ends whole.
    let next = submit_id(&dir, &server, "changed");
    let done = attach(&dir, &server, &next);
    drop(b);
    assert_eq!(done["stop_reason"], "finished", "{done}");
    let transcript = done["transcript"].as_array().unwrap();
    assert_eq!(transcript[0]["role"], "user", "{done}");
    assert_eq!(
        transcript.iter().filter(|m| m["role"] == "user").count(),
        1,
        "nothing of the refused run: {done}"
    );
}

#[test]
fn a_tree_whose_worker_is_killed_inside_a_child_goes_on_the_same_on_another() {
    let server = Server::start();
    let base_dir = tree_dir("");
    let w = worker(&base_dir, &server, free_addr(), true, None);
    let base = attach(&base_dir, &server, &submit_id(&base_dir, &server, "tree"));
    drop(w);
    assert_eq!(base["stop_reason"], "finished", "{base}");
    assert_eq!(base["output"], "Both workers are done.");
    let base_transcript = base["transcript"].as_array().unwrap().clone();

    let (mut crashes, mut in_child) = (0, 0);
    for n in 0.. {
        let what = format!("killed after step {n}");
        let dir = tree_dir("");
        let (paused, out) = killed_after_step(&dir, &server, n, &format!("tree-{n}"));
        let Some(line) = paused else {
            break;
        };
        crashes += 1;
        // A subagent's step names its run: the kill landed inside a child.
        if line.contains(" of run ") {
            in_child += 1;
        }
        let outcome = stdout_json(&out);
        assert_eq!(outcome["stop_reason"], "finished", "{what}: {outcome}");
        assert_eq!(outcome["output"], base["output"], "{what}");
        let transcript = outcome["transcript"].as_array().unwrap();
        check_against(&base_transcript, transcript, &side_log(&dir), &what);
        assert_eq!(outcome["usage"], base["usage"], "{what}");
        assert_eq!(outcome["model_calls"], base["model_calls"], "{what}");
    }
    assert!(crashes >= 5, "{crashes} kills");
    assert!(in_child > 0, "a kill landed inside a child");
}
