#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Durable runs through the command: the crash harness (a journaled run killed with SIGKILL
//! after each step, and inside each step's write, then resumed, against an uninterrupted run) at
//! both durability levels, approvals that suspend a run in one process and are answered and
//! resumed from others, a changed agent, damaged or foreign journals, the durability's
//! validation, and forks of a run.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::crash::*;
use support::*;

fn run_cmd(dir: &AgentDir, journal: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args([
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "go",
        "--json",
    ])
    .args(["--journal", journal.to_str().unwrap()])
    .args(extra)
    .current_dir(dir.path("."))
    .env_remove("OPENAI_API_KEY")
    .stdin(Stdio::null());
    cmd
}

/// Runs the agent with a journal fault, and kills the process with SIGKILL once it stops at the
/// fault. Returns false when the run ended before reaching it.
fn run_and_kill(dir: &AgentDir, journal: &Path, fault: &str) -> bool {
    run_and_kill_with(dir, journal, fault, &[])
}

/// [`run_and_kill`], with more arguments for `run`.
fn run_and_kill_with(dir: &AgentDir, journal: &Path, fault: &str, extra: &[&str]) -> bool {
    let mut cmd = run_cmd(dir, journal, extra);
    cmd.env("AGENTLOOP_TEST_JOURNAL_FAULT", fault);
    killed_at_fault(cmd)
}

fn run_ids(dir: &AgentDir, journal: &Path) -> Vec<Value> {
    journal_runs(dir, journal)
}

/// The crash agent, its `durability` key set to `level` when given.
fn crash_dir_at(level: Option<&str>) -> AgentDir {
    let dir = crash_dir("");
    if let Some(level) = level {
        dir.write(
            "agent.toml",
            &AGENT.replace(
                "version = \"1\"\n",
                &format!("version = \"1\"\ndurability = \"{level}\"\n"),
            ),
        );
    }
    dir
}

#[test]
fn a_run_killed_after_any_step_or_inside_any_write_resumes_to_the_same_transcript() {
    kill_at_every_step(None);
}

#[test]
fn at_process_durability_a_run_killed_after_any_step_or_inside_any_write_resumes_the_same() {
    kill_at_every_step(Some("process"));
}

/// The crash harness, with the agent file's `durability` at `level`.
fn kill_at_every_step(level: Option<&str>) {
    // The uninterrupted run.
    let base_dir = crash_dir_at(level);
    let base_journal = base_dir.path("runs.db");
    let out = run_cmd(&base_dir, &base_journal, &[]).output().unwrap();
    exited(&out, 0, "the command");
    let base = json_of(&out);
    assert_eq!(base["stop_reason"], "finished");
    assert_eq!(base["journal"], base_journal.to_str().unwrap());
    let base_transcript = base["transcript"].as_array().unwrap().clone();
    let runs = run_ids(&base_dir, &base_journal);
    assert_eq!(
        runs[0]["run_id"], base["run_id"],
        "the run id is the journal's"
    );
    let steps = runs[0]["steps"].as_u64().unwrap();
    assert!(steps >= 20, "a long enough run: {steps} steps");
    check_against(
        &base_transcript,
        &base_transcript,
        &side_log(&base_dir),
        "uninterrupted",
    );

    let mut interrupted_seen = 0;
    for n in 0..steps {
        for fault in [format!("after-step:{n}"), format!("in-step:{n}")] {
            let dir = crash_dir_at(level);
            let journal = dir.path("runs.db");
            assert!(
                run_and_kill(&dir, &journal, &fault),
                "{fault}: the fault was reached"
            );
            let runs = run_ids(&dir, &journal);
            assert_eq!(runs.len(), 1);
            let written = runs[0]["steps"].as_u64().unwrap();
            if fault == format!("after-step:{}", steps - 1) {
                // The last answer is committed with the run's end: the run is over, whole.
                assert_eq!(runs[0]["status"], "finished", "{fault}");
                assert_eq!(written, steps, "{fault}");
                let id = runs[0]["run_id"].as_str().unwrap();
                let again = cli(
                    &dir,
                    &["resume", id, "--journal", journal.to_str().unwrap()],
                );
                assert_eq!(again.status.code(), Some(9), "{fault}");
                continue;
            }
            assert_eq!(runs[0]["status"], "running", "{fault}");
            // Calls of a batch that finish together share one commit, so the commit that holds
            // step n may hold its neighbours too: it is kept or rolled back whole with them.
            if fault.starts_with("after") {
                assert!(
                    written > n,
                    "{fault}: the commit holding step {n} is kept ({written} steps)"
                );
            } else {
                assert!(
                    written <= n,
                    "{fault}: a write cut short is rolled back whole ({written} steps)"
                );
            }
            let id = runs[0]["run_id"].as_str().unwrap().to_owned();
            let out = cli(
                &dir,
                &[
                    "resume",
                    &id,
                    "--journal",
                    journal.to_str().unwrap(),
                    "--json",
                ],
            );
            exited(&out, 0, &fault);
            let resumed = json_of(&out);
            assert_eq!(resumed["run_id"], id.as_str());
            assert_eq!(resumed["stop_reason"], "finished", "{fault}");
            let transcript = resumed["transcript"].as_array().unwrap();
            interrupted_seen += transcript.iter().filter(|m| is_interrupted(m)).count();
            check_against(&base_transcript, transcript, &side_log(&dir), &fault);
            // Usage and counts go on from the journal: the resumed run reports the whole run's.
            assert_eq!(resumed["usage"], base["usage"], "{fault}");
            assert_eq!(resumed["model_calls"], base["model_calls"], "{fault}");
            assert_eq!(resumed["turns"], base["turns"], "{fault}");
            // And it is over: resuming it again is refused.
            let again = cli(
                &dir,
                &["resume", &id, "--journal", journal.to_str().unwrap()],
            );
            assert_eq!(again.status.code(), Some(9), "{fault}");
        }
    }
    assert!(
        interrupted_seen > 0,
        "some kill landed while a non-idempotent call ran"
    );
}

#[test]
fn an_approval_suspends_the_run_and_other_processes_answer_and_resume_it() {
    let dir = crash_dir(
        r#"[permissions]
ask = ["write"]
store = "permissions.json"
"#,
    );
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let out = run_cmd(&dir, &journal, &[]).output().unwrap();
    exited(&out, 8, "the command");
    let suspended = json_of(&out);
    assert_eq!(suspended["stop_reason"], "suspended");
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    let pending = suspended["pending_approvals"].as_array().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["call_id"], "c3");
    assert_eq!(pending[0]["tool"], "write");
    assert_eq!(pending[0]["arguments"], json!({"key": "x"}));
    assert!(
        side_log(&dir).is_empty(),
        "no tool of the batch ran while it waits"
    );

    let listed = cli(&dir, &["approvals", "list", "--journal", j, "--json"]);
    let listed = json_of(&listed);
    assert_eq!(listed[0]["run_id"], id.as_str());
    assert_eq!(listed[0]["call_id"], "c3");
    assert_eq!(listed[0]["answer"], Value::Null);

    // Resuming before the answer is refused, and says why.
    let early = cli(&dir, &["resume", &id, "--journal", j]);
    assert_eq!(early.status.code(), Some(9));
    assert!(String::from_utf8_lossy(&early.stderr).contains("c3"));

    // The journal defaults to runs.db in the current folder.
    let ok = cli(
        &dir,
        &["approve", &id, "--call", "c3", "--allow", "--always"],
    );
    exited(&ok, 0, "the command");
    let unknown = cli(
        &dir,
        &["approve", &id, "--call", "nope", "--deny", "--journal", j],
    );
    assert_eq!(unknown.status.code(), Some(9));

    let out = cli(&dir, &["resume", &id, "--journal", j, "--json"]);
    exited(&out, 0, "the command");
    let resumed = json_of(&out);
    assert_eq!(resumed["stop_reason"], "finished");
    let calls = resumed["tool_calls"].as_array().unwrap();
    let c7 = calls.iter().find(|c| c["id"] == "c7").unwrap();
    assert_eq!(
        c7["status"], "ok",
        "the `always` answer was saved and settles the later write"
    );
    let side = side_log(&dir);
    assert!(
        side.contains(&r#"write {"key":"x"}"#.to_owned()),
        "{side:?}"
    );
    let saved = std::fs::read_to_string(dir.path("permissions.json")).unwrap();
    assert!(saved.contains("write"), "{saved}");
}

#[test]
fn an_always_answer_holds_for_the_rest_of_the_run_across_its_later_resumes_without_a_store() {
    // No permission store: the "always" lives in the journal only. The run suspends on the
    // write (c3), answered always; it goes on and suspends on the commit (c4), answered once;
    // the process that resumes it then finds the later write (c7) allowed, as the first resume
    // did, rather than asking again.
    let dir = crash_dir("[permissions]\nask = [\"write\", \"commit\"]\n");
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let out = run_cmd(&dir, &journal, &[]).output().unwrap();
    exited(&out, 8, "the run suspends on the write");
    let id = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    let answered = cli(
        &dir,
        &[
            "approve",
            &id,
            "--call",
            "c3",
            "--allow",
            "--always",
            "--journal",
            j,
        ],
    );
    exited(&answered, 0, "the command");
    let out = cli(&dir, &["resume", &id, "--journal", j, "--json"]);
    exited(&out, 8, "the run suspends on the commit");
    let pending = json_of(&out)["pending_approvals"].clone();
    assert_eq!(pending[0]["call_id"], "c4", "{pending}");
    let answered = cli(
        &dir,
        &["approve", &id, "--call", "c4", "--allow", "--journal", j],
    );
    exited(&answered, 0, "the command");

    let out = cli(&dir, &["resume", &id, "--journal", j, "--json"]);
    exited(&out, 0, "the later write is not asked about");
    let resumed = json_of(&out);
    let calls = resumed["tool_calls"].as_array().unwrap();
    let c7 = calls.iter().find(|c| c["id"] == "c7").unwrap();
    assert_eq!(c7["status"], "ok", "{resumed}");
    assert!(side_log(&dir).contains(&r#"write {"key":"y"}"#.to_owned()));
    assert!(!dir.path("permissions.json").exists());
}

#[test]
fn a_changed_agent_is_refused_unless_forced_and_damage_is_reported_with_its_step() {
    let dir = crash_dir("");
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    assert!(run_and_kill(&dir, &journal, "after-step:6"));
    let id = run_ids(&dir, &journal)[0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The plan shows the fingerprint the journal holds.
    let plan = cli(&dir, &["plan", dir.agent().to_str().unwrap(), "--json"]);
    let fingerprint = json_of(&plan)["fingerprint"].as_str().unwrap().to_owned();
    let show = json_of(&cli(
        &dir,
        &["journal", "show", &id, "--journal", j, "--json"],
    ));
    assert_eq!(show["fingerprint"], fingerprint.as_str());

    dir.write(
        "agent.toml",
        &AGENT.replace("version = \"1\"", "version = \"2\""),
    );
    let refused = cli(&dir, &["resume", &id, "--journal", j]);
    assert_eq!(refused.status.code(), Some(9));
    let text = String::from_utf8_lossy(&refused.stderr);
    assert!(text.contains("/version"), "what changed is named: {text}");

    // A damaged row: reported with the run and the step, the steps before it still shown.
    let conn = rusqlite::Connection::open(&journal).unwrap();
    conn.execute(
        "UPDATE steps SET step = step || ' ' WHERE run_id = ?1 AND seq = 3",
        [&id],
    )
    .unwrap();
    drop(conn);
    let damaged = cli(&dir, &["resume", &id, "--journal", j, "--force"]);
    assert_eq!(damaged.status.code(), Some(9));
    let text = String::from_utf8_lossy(&damaged.stderr);
    assert!(text.contains(&id) && text.contains("step 3"), "{text}");
    let show = cli(&dir, &["journal", "show", &id, "--journal", j, "--json"]);
    assert_eq!(show.status.code(), Some(9));
    let shown = json_of(&show);
    assert_eq!(
        shown["steps"].as_array().unwrap().len(),
        3,
        "the intact steps stay readable"
    );
    assert_eq!(shown["damage"]["code"], "journal.damaged");

    // A file that is not a journal is refused, and left as it was.
    let foreign = dir.path("notes.db");
    std::fs::write(&foreign, b"these are my notes, not a database").unwrap();
    let out = cli(
        &dir,
        &["journal", "list", "--journal", foreign.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(9));
    let out = run_cmd(&dir, &foreign, &[]).output().unwrap();
    exited(&out, 9, "the command");
    assert_eq!(json_of(&out)["error"]["code"], "journal.foreign");
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        b"these are my notes, not a database"
    );
    // A truncated journal is reported, not crashed on.
    let bytes = std::fs::read(&journal).unwrap();
    let cut = dir.path("cut.db");
    std::fs::write(&cut, &bytes[..bytes.len().min(100)]).unwrap();
    let out = cli(
        &dir,
        &["journal", "list", "--journal", cut.to_str().unwrap()],
    );
    exited(&out, 9, "the command");
}

#[test]
fn a_forced_resume_whose_journal_the_changed_agent_cannot_replay_is_refused_and_changes_nothing() {
    let tighter = AGENT.replace("max_concurrency = 2", "max_concurrency = 2\nmax_turns = 1");
    let renamed = AGENT.replace("name = \"write\"", "name = \"write_v2\"");
    // A run of one write, killed once the write started: its start is the journal's last step.
    let one_write = json!([
        {"tool_calls": [call("w1", "write", "solo")]},
        {"text": "Written."}
    ])
    .to_string();
    // Killed inside the first batch, its write done: a limit the first answer already passes,
    // or a tool gone that a journaled call ran, stops the replay inside the journal; in the run
    // of one write, at its last step.
    for (fault, changed, script) in [
        ("after-step:6", &tighter, None),
        ("after-step:6", &renamed, None),
        ("after-step:1", &renamed, Some(&one_write)),
    ] {
        let what = format!("{fault}, {changed}");
        let dir = crash_dir("");
        if let Some(script) = script {
            dir.write("script.json", script);
        }
        let journal = dir.path("runs.db");
        let j = journal.to_str().unwrap();
        assert!(run_and_kill(&dir, &journal, fault), "{what}");
        let before = run_ids(&dir, &journal);
        let id = before[0]["run_id"].as_str().unwrap().to_owned();
        let ran = side_log(&dir);
        dir.write("agent.toml", changed);
        let out = cli(&dir, &["resume", &id, "--journal", j, "--json", "--force"]);
        exited(&out, 9, &what);
        let error = &json_of(&out)["error"];
        assert_eq!(error["code"], "journal.not_resumable", "{what}: {error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("does not replay with the agent as it is now"),
            "{what}: {error}"
        );
        // Nothing written, nothing run: the run is still there to go on with the agent it
        // started with.
        assert_eq!(run_ids(&dir, &journal), before, "{what}");
        assert_eq!(side_log(&dir), ran, "{what}");
        dir.write("agent.toml", AGENT);
        if script.is_none() {
            resumes_as_if_never_stopped(&dir, &journal, &id, &what);
            continue;
        }
        let out = resume_json(&dir, &journal, &id);
        exited(&out, 0, &what);
        let resumed = json_of(&out);
        assert_eq!(resumed["output"], "Written.", "{what}");
        assert!(
            side_log(&dir).len() <= 1,
            "{what}: the write ran at most once"
        );
    }
}

/// A forced resume (the agent file changed, its limits not) of a run whose limit trips on the
/// journal's last step, killed at every step: it stops as the uninterrupted run stopped, with
/// its stop reason, exit code, usage, cost and counts, and no call run twice or left out.
#[test]
fn a_forced_resume_whose_limit_trips_on_the_last_journaled_step_ends_as_the_run_would_have() {
    let priced = AGENT.replace(
        "script = \"script.json\"\n",
        "script = \"script.json\"\nprice = { input = 1.0, output = 2.0 }\n",
    );
    let usage = json!({"input_tokens": 100_000, "output_tokens": 50_000});
    let mut script: Vec<Value> = serde_json::from_str(&script()).unwrap();
    for answer in &mut script {
        answer["usage"] = usage.clone();
    }
    let script = Value::from(script).to_string();
    // The turn limit trips when the second batch ends; the cost budget ($0.20 a call) when the
    // third answer comes: each on the last step its run journals.
    for (limit, stop) in [
        ("max_turns = 2", "max_turns"),
        ("max_cost_usd = 0.5", "budget"),
    ] {
        let agent = priced.replace(
            "max_concurrency = 2\n",
            &format!("max_concurrency = 2\n{limit}\n"),
        );
        let changed = agent.replace("version = \"1\"", "version = \"2\"");
        let dir_with = |text: &str| {
            let dir = crash_dir("");
            dir.write("agent.toml", text);
            dir.write("script.json", &script);
            dir
        };
        let base_dir = dir_with(&agent);
        let out = run_cmd(&base_dir, &base_dir.path("runs.db"), &[])
            .output()
            .unwrap();
        exited(&out, 5, limit);
        let base = json_of(&out);
        assert_eq!(base["stop_reason"], stop, "{limit}");
        let steps = run_ids(&base_dir, &base_dir.path("runs.db"))[0]["steps"]
            .as_u64()
            .unwrap();
        for n in 0..steps {
            for fault in [format!("after-step:{n}"), format!("in-step:{n}")] {
                let what = format!("{limit}, {fault}");
                let dir = dir_with(&agent);
                let journal = dir.path("runs.db");
                assert!(run_and_kill(&dir, &journal, &fault), "{what}");
                let run = &run_ids(&dir, &journal)[0];
                if run["status"] == "finished" {
                    continue;
                }
                let id = run["run_id"].as_str().unwrap().to_owned();
                dir.write("agent.toml", &changed);
                let j = journal.to_str().unwrap();
                let out = cli(&dir, &["resume", &id, "--journal", j, "--json", "--force"]);
                exited(&out, 5, &what);
                let resumed = json_of(&out);
                for key in ["stop_reason", "usage", "cost_usd", "turns", "model_calls"] {
                    assert_eq!(resumed[key], base[key], "{what}: {key}");
                }
                assert_eq!(
                    resumed["tool_calls"].as_array().unwrap().len(),
                    base["tool_calls"].as_array().unwrap().len(),
                    "{what}"
                );
                check_against(
                    base["transcript"].as_array().unwrap(),
                    resumed["transcript"].as_array().unwrap(),
                    &side_log(&dir),
                    &what,
                );
            }
        }
    }
}

/// Resumes run `id` of the crash agent, and checks it ends as an uninterrupted run does.
fn resumes_as_if_never_stopped(dir: &AgentDir, journal: &Path, id: &str, what: &str) {
    let out = resume_json(dir, journal, id);
    exited(&out, 0, what);
    let base = json_of(
        &run_cmd(&crash_dir(""), &dir.path("base.db"), &[])
            .output()
            .unwrap(),
    );
    check_against(
        base["transcript"].as_array().unwrap(),
        json_of(&out)["transcript"].as_array().unwrap(),
        &side_log(dir),
        what,
    );
}

/// The one step log in a journal's owners' folder.
fn the_step_log(journal: &Path) -> std::path::PathBuf {
    let mut owners = journal.as_os_str().to_owned();
    owners.push(".owners");
    let logs: Vec<_> = std::fs::read_dir(std::path::PathBuf::from(owners))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::metadata(p).unwrap().len() > 0)
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs[0].clone()
}

#[test]
fn a_step_log_changed_after_it_was_written_is_refused_as_damaged_and_left_as_it_was() {
    // Killed at `process` with its steps in its step log, several frames of them.
    let dir = crash_dir_at(Some("process"));
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    assert!(run_and_kill(&dir, &journal, "after-step:9"));
    let id = run_ids(&dir, &journal)[0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ran = side_log(&dir);
    assert!(ran.iter().any(|l| l.starts_with("write ")), "{ran:?}");
    let log = the_step_log(&journal);
    let whole = std::fs::read(&log).unwrap();
    // One byte changed in the first frame (the header is the magic line, the id's length and
    // the id; a frame's head is its length and check): frames follow it, so this is no write
    // cut short.
    let first_payload = "agentloop-steps 1\n".len() + 4 + id.len() + 20;
    // "agentloop-steps 1\n": its version is the 17th byte.
    let mut newer = whole.clone();
    newer[16] = b'2';
    let damages: [(&str, Vec<u8>); 3] = [
        ("a changed frame", damages_first(&whole, first_payload)),
        (
            "bytes that are no step log",
            b"my notes, saved over the lock".to_vec(),
        ),
        ("a newer format", newer),
    ];
    for (what, bytes) in damages {
        std::fs::write(&log, &bytes).unwrap();
        let out = resume_json(&dir, &journal, &id);
        exited(&out, 9, what);
        let error = &json_of(&out)["error"];
        assert_eq!(error["code"], "journal.damaged", "{what}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(&id) && message.contains("step log"),
            "{what}: {message}"
        );
        assert_eq!(side_log(&dir), ran, "{what}: no tool call ran again");
        assert_eq!(
            std::fs::read(&log).unwrap(),
            bytes,
            "{what}: the log is kept"
        );
    }
    // A reader reports the damage where the intact frames end.
    std::fs::write(&log, damages_first(&whole, first_payload)).unwrap();
    let show = cli(&dir, &["journal", "show", &id, "--journal", j, "--json"]);
    exited(&show, 9, "journal show");
    let shown = json_of(&show);
    assert_eq!(shown["damage"]["code"], "journal.damaged", "{shown}");
    assert!(
        shown["damage"]["message"]
            .as_str()
            .unwrap()
            .contains("step log"),
        "{shown}"
    );
    // The log as it was written: the run goes on, and no call runs twice.
    std::fs::write(&log, &whole).unwrap();
    resumes_as_if_never_stopped(&dir, &journal, &id, "the whole log");
}

/// `log` with one byte of its first frame's payload (at `payload`) changed.
fn damages_first(log: &[u8], payload: usize) -> Vec<u8> {
    let mut changed = log.to_vec();
    changed[payload + 2] ^= 1;
    changed
}

#[test]
fn a_journal_or_session_store_whose_creation_ran_out_of_room_is_made_anew_once_there_is_room() {
    let dir = crash_dir("");
    let agent = dir.agent().to_str().unwrap().to_owned();
    // A limit on the size of files the command writes stands for a full disk: a write past it
    // fails (EFBIG; its signal ignored, so that it does not kill the process), after the first
    // few KiB of a new file.
    let out_of_room = |args: &[&str]| {
        Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_agentloop"))
            .args(args)
            .current_dir(dir.path("."))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let journal = [
        "run",
        &agent,
        "--input",
        "go",
        "--json",
        "--journal",
        "runs.db",
    ];
    let sessions = [
        "run",
        &agent,
        "--input",
        "go",
        "--json",
        "--session",
        "s1",
        "--sessions",
        "sess.db",
    ];
    for (args, code, what) in [(&journal[..], 9, "journal"), (&sessions[..], 10, "session")] {
        let out = out_of_room(args);
        exited(&out, code, what);
        let error = json_of(&out)["error"].clone();
        assert_eq!(error["code"], format!("{what}.io"), "{error}");
        assert!(side_log(&dir).is_empty(), "{what}: nothing ran");
        // With room again, the file the cut-short creation left is made anew, not refused as
        // another program's database.
        let out = cli(&dir, args);
        exited(&out, 0, what);
        assert_eq!(json_of(&out)["stop_reason"], "finished", "{what}");
        std::fs::remove_file(dir.path("side.log")).unwrap();
    }
}

#[test]
fn runs_started_at_once_on_a_new_journal_or_session_store_all_use_the_one_made_first() {
    for round in 0..5 {
        let dir = crash_dir("");
        let agent = dir.agent().to_str().unwrap().to_owned();
        let started: Vec<(String, std::process::Child)> = (0..4)
            .flat_map(|i| {
                let session = format!("s{i}");
                [
                    vec!["--journal", "runs.db"],
                    vec!["--session", &session, "--sessions", "sess.db"],
                ]
                .map(|store| {
                    let what = format!("round {round}, run {i} with {}", store[0]);
                    let child = Command::new(env!("CARGO_BIN_EXE_agentloop"))
                        .args(["run", &agent, "--input", "go", "--json"])
                        .args(&store)
                        .current_dir(dir.path("."))
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap();
                    (what, child)
                })
            })
            .collect();
        for (what, child) in started {
            let out = child.wait_with_output().unwrap();
            exited(&out, 0, &what);
            assert_eq!(json_of(&out)["stop_reason"], "finished", "{what}");
        }
        assert_eq!(
            run_ids(&dir, &dir.path("runs.db")).len(),
            4,
            "round {round}"
        );
    }
}

/// Three `resume`s of one killed run started at once, at kills through the run: one drives it to
/// the end, each other is refused (`journal.busy` while it runs, or `journal.not_resumable` once
/// it is over), and no call runs twice.
#[test]
fn resumes_of_one_killed_run_started_at_once_drive_it_once() {
    for n in [1, 4, 6, 9, 13] {
        let fault = format!("after-step:{n}");
        let dir = crash_dir("");
        let journal = dir.path("runs.db");
        assert!(run_and_kill(&dir, &journal, &fault), "{fault}");
        let id = run_ids(&dir, &journal)[0]["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let started: Vec<std::process::Child> = (0..3)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_agentloop"))
                    .args(["resume", &id, "--journal", "runs.db", "--json"])
                    .current_dir(dir.path("."))
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut drove = 0;
        for child in started {
            let out = child.wait_with_output().unwrap();
            let body = json_of(&out);
            match out.status.code() {
                Some(0) => {
                    drove += 1;
                    assert_eq!(body["stop_reason"], "finished", "{fault}");
                }
                Some(10) => assert_eq!(body["error"]["code"], "journal.busy", "{fault}"),
                Some(9) => assert_eq!(body["error"]["code"], "journal.not_resumable", "{fault}"),
                other => panic!("{fault}: exit {other:?}: {body}"),
            }
        }
        assert_eq!(drove, 1, "{fault}");
        assert_eq!(run_ids(&dir, &journal)[0]["status"], "finished", "{fault}");
        let side = side_log(&dir);
        for line in side.iter().filter(|l| !l.starts_with("read ")) {
            let times = side.iter().filter(|l| *l == line).count();
            assert_eq!(times, 1, "{fault}: {line} ran {times} times");
        }
    }
}

/// Makes a file or folder read-only for this process until dropped: its mode where that holds
/// (not for root), else the immutable attribute (`chattr +i`, for root on file systems that
/// have it).
struct ReadOnly {
    path: std::path::PathBuf,
    folder: bool,
}

impl ReadOnly {
    fn make(path: &Path) -> Option<ReadOnly> {
        use std::os::unix::fs::PermissionsExt;
        let folder = path.is_dir();
        let probe = path.join(".probe");
        let writable = || {
            if !folder {
                return std::fs::OpenOptions::new().append(true).open(path).is_ok();
            }
            let made = std::fs::write(&probe, b"").is_ok();
            let _ = std::fs::remove_file(&probe);
            made
        };
        let mode = if folder { 0o555 } else { 0o400 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        let guard = ReadOnly {
            path: path.to_owned(),
            folder,
        };
        if !writable() {
            return Some(guard);
        }
        let _ = Command::new("chattr").arg("+i").arg(path).status();
        (!writable()).then_some(guard)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = Command::new("chattr")
            .arg("-i")
            .arg(&self.path)
            .stderr(Stdio::null())
            .status();
        let mode = if self.folder { 0o755 } else { 0o600 };
        let _ = std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(mode));
    }
}

/// A journal, session store or SQLite trace the run may not write is refused before the run,
/// naming the file, and nothing is left beside it; SQLite opened such a file read-only without a
/// word, so a journaled run failed at its first step (`journal.write`, exit 7) and each left a
/// `-wal` and `-shm` behind.
#[test]
fn a_read_only_journal_session_store_or_trace_is_refused_before_the_run_and_left_as_it_was() {
    let dir = crash_dir("");
    let agent = dir.agent().to_str().unwrap().to_owned();
    let run = |store: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["run", &agent, "--input", "go", "--json"])
            .args(store)
            .current_dir(dir.path("."))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let stores: [(&str, &[&str], i32, &str); 3] = [
        ("runs.db", &["--journal", "runs.db"], 9, "journal.io"),
        (
            "s.db",
            &["--session", "s", "--sessions", "s.db"],
            10,
            "session.io",
        ),
        ("t.db", &["--trace", "t.db"], 1, "cli.io"),
    ];
    for (file, args, _, _) in &stores {
        exited(&run(args), 0, file);
    }
    std::fs::remove_file(dir.path("side.log")).unwrap();
    let listing = || dir.file_names();
    let before = listing();
    for (file, args, code, error) in stores {
        let Some(_read_only) = ReadOnly::make(&dir.path(file)) else {
            eprintln!("skipped: {file} cannot be made read-only here");
            return;
        };
        let bytes = std::fs::read(dir.path(file)).unwrap();
        let out = run(args);
        exited(&out, code, file);
        let body = json_of(&out);
        assert_eq!(body["error"]["code"], error, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(file) && message.contains("read-only"),
            "{file}: {message}"
        );
        assert_eq!(body["model_calls"], 0, "{file}: the run never started");
        assert!(!dir.path("side.log").exists(), "{file}: nothing ran");
        assert_eq!(std::fs::read(dir.path(file)).unwrap(), bytes, "{file}");
        assert_eq!(listing(), before, "{file}: nothing left beside it");
    }
}

/// The commands that only read a store (`journal list` and `show`, `approvals list`,
/// `questions list`, `sessions list` and `show`, `trace list` and `show`) leave nothing beside
/// it, and read it where they may not write: a read-only file (a session store was opened for
/// writing and a trace read-write, and SQLite, opening either read-only without a word, left a
/// `-wal` and `-shm` beside it; so did a journal), and a read-only folder (where none of them
/// could read at all: "attempt to write a readonly database").
#[test]
fn read_only_commands_leave_nothing_beside_the_stores_and_read_them_where_they_may_not_write() {
    let dir = crash_dir("");
    let agent = dir.agent().to_str().unwrap().to_owned();
    let command = |args: &[&str]| cli(&dir, args);
    let mut ran = Vec::new();
    for store in [
        &["--journal", "runs.db"][..],
        &["--session", "s", "--sessions", "s.db"],
        &["--trace", "t.db"],
    ] {
        let mut args = vec!["run", agent.as_str(), "--input", "go", "--json"];
        args.extend_from_slice(store);
        let out = command(&args);
        exited(&out, 0, store[1]);
        ran.push(json_of(&out)["run_id"].as_str().unwrap().to_owned());
    }
    let (journaled, traced) = (ran[0].as_str(), ran[2].as_str());
    let reads: [(&[&str], &str); 8] = [
        (
            &["journal", "list", "--journal", "runs.db", "--json"],
            journaled,
        ),
        (
            &[
                "journal",
                "show",
                journaled,
                "--journal",
                "runs.db",
                "--json",
            ],
            journaled,
        ),
        (
            &["approvals", "list", "--journal", "runs.db", "--json"],
            "[]",
        ),
        (
            &["questions", "list", "--journal", "runs.db", "--json"],
            "[]",
        ),
        (
            &["sessions", "list", "--sessions", "s.db", "--json"],
            "\"s\"",
        ),
        (
            &["sessions", "show", "s", "--sessions", "s.db", "--json"],
            "\"go\"",
        ),
        (&["trace", "list", "t.db", "--json"], traced),
        (&["trace", "show", "t.db", "--json"], traced),
    ];
    let before = dir.file_names();
    let read_all = |case: &str| {
        for (args, shows) in reads {
            let out = command(args);
            let what = format!("{case}: {}", args[..2].join(" "));
            exited(&out, 0, &what);
            let printed = String::from_utf8_lossy(&out.stdout);
            assert!(printed.contains(shows), "{what}: {printed}");
            assert_eq!(
                dir.file_names(),
                before,
                "{what}: nothing left beside the store"
            );
        }
    };
    read_all("writable");
    {
        let mut guards = Vec::new();
        for file in ["runs.db", "s.db", "t.db"] {
            let Some(guard) = ReadOnly::make(&dir.path(file)) else {
                eprintln!("skipped: {file} cannot be made read-only here");
                return;
            };
            guards.push(guard);
        }
        read_all("read-only files");
    }
    let Some(_folder) = ReadOnly::make(&dir.path(".")) else {
        eprintln!("skipped: the folder cannot be made read-only here");
        return;
    };
    read_all("a read-only folder");
}

/// A journal a run still writes is read as it stands: `journal list` and `journal show` see the
/// steps the run has committed so far, through the run's own `-wal` and `-shm`, which they leave
/// as they found them (a reader that read the file alone, as an immutable one does, would miss
/// every step still in the log).
#[test]
fn reading_a_journal_a_run_still_writes_shows_its_committed_steps_and_leaves_its_files() {
    use std::io::{BufRead, BufReader};
    let dir = crash_dir("");
    let journal = dir.path("runs.db");
    let mut cmd = run_cmd(&dir, &journal, &[]);
    cmd.env("AGENTLOOP_TEST_JOURNAL_FAULT", "after-step:5");
    let mut writer = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(writer.stderr.take().unwrap()).lines();
    let paused = stderr
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.starts_with("agentloop: fault: paused"));
    assert!(paused, "the run reached its fault");
    let before = dir.file_names();
    assert!(before.contains(&"runs.db-wal".to_owned()), "{before:?}");
    let runs = run_ids(&dir, &journal);
    let (run_id, steps) = (
        runs[0]["run_id"].as_str().unwrap().to_owned(),
        runs[0]["steps"].as_u64().unwrap(),
    );
    assert!(steps >= 5, "the committed steps are seen: {runs:?}");
    let out = cli(&dir, &["journal", "show", &run_id, "--json"]);
    exited(&out, 0, "journal show");
    assert_eq!(
        dir.file_names(),
        before,
        "the writer's files are left as they were"
    );
    writer.kill().unwrap();
    writer.wait().unwrap();
}

#[test]
fn a_file_where_the_journals_lock_folder_goes_is_named_in_the_error_and_left_as_it_was() {
    let dir = crash_dir("");
    let journal = dir.path("runs.db");
    let owners = dir.path("runs.db.owners");
    std::fs::write(&owners, "my notes").unwrap();
    let out = run_cmd(&dir, &journal, &[]).output().unwrap();
    exited(&out, 9, "the run");
    let error = &json_of(&out)["error"];
    assert_eq!(error["code"], "journal.io", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("runs.db.owners"),
        "{error}"
    );
    assert!(side_log(&dir).is_empty(), "nothing ran");
    assert_eq!(std::fs::read_to_string(&owners).unwrap(), "my notes");
}

#[test]
fn a_run_another_live_process_drives_is_refused_and_a_dead_owner_blocks_nothing() {
    let dir = crash_dir("");
    let journal = dir.path("runs.db");
    // The first process stops after its fourth step and stays alive, driving the run.
    let mut driver = run_cmd(&dir, &journal, &[])
        .env("AGENTLOOP_TEST_JOURNAL_FAULT", "after-step:3")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(driver.stderr.take().unwrap()).lines();
    assert!(
        lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.starts_with("agentloop: fault: paused")),
        "the run paused"
    );
    let run_id = run_ids(&dir, &journal)[0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resume = || {
        cli(
            &dir,
            &[
                "resume",
                &run_id,
                "--journal",
                journal.to_str().unwrap(),
                "--json",
            ],
        )
    };
    // The pause comes after the fourth step's commit, which can hold the step after it too (the
    // calls of a batch that finish together are committed together).
    let steps = run_ids(&dir, &journal)[0]["steps"].as_u64();
    assert!(steps.is_some_and(|n| n >= 4), "{steps:?}");
    let refused = resume();
    exited(&refused, 10, "a resume while the run's process lives");
    assert_eq!(json_of(&refused)["error"]["code"], "journal.busy");
    assert_eq!(
        run_ids(&dir, &journal)[0]["steps"].as_u64(),
        steps,
        "the refused resume wrote nothing"
    );
    driver.kill().unwrap(); // SIGKILL: the owner dies holding the run
    driver.wait().unwrap();
    let owners = dir.path("runs.db.owners");
    assert!(owners.is_dir(), "the dead owner's lock file stays");
    let resumed = resume();
    exited(&resumed, 0, "a resume after the owner died");
    assert_eq!(json_of(&resumed)["stop_reason"], "finished");
    assert_eq!(
        std::fs::read_dir(&owners).map(|d| d.count()).ok(),
        Some(0),
        "a finished run leaves no lock file"
    );
}

#[test]
fn the_durability_key_and_flag_are_checked_and_process_resumes_after_a_kill() {
    let dir = crash_dir_at(Some("disk"));
    let journal = dir.path("runs.db");
    let out = run_cmd(&dir, &journal, &[]).output().unwrap();
    exited(&out, 3, "an unknown durability in the agent file");
    let text = json_of(&out)["error"].to_string();
    assert!(
        text.contains("durability") && text.contains("process") && text.contains("power"),
        "{text}"
    );

    let dir = crash_dir("");
    let journal = dir.path("runs.db");
    let out = run_cmd(&dir, &journal, &["--durability", "disk"])
        .output()
        .unwrap();
    exited(&out, 2, "an unknown --durability");
    assert!(String::from_utf8_lossy(&out.stderr).contains("durability"));
    let out = cli(
        &dir,
        &[
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "go",
            "--durability",
            "process",
        ],
    );
    exited(&out, 2, "--durability without --journal");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--journal"));
    assert!(!journal.exists(), "nothing was journaled");

    // The flag: killed after a step, resumed at the same level, the run ends as it would have.
    let base = json_of(
        &run_cmd(&crash_dir(""), &dir.path("base.db"), &[])
            .output()
            .unwrap(),
    );
    assert!(run_and_kill_with(
        &dir,
        &journal,
        "after-step:9",
        &["--durability", "process"]
    ));
    let id = run_ids(&dir, &journal)[0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let j = journal.to_str().unwrap();
    let out = cli(
        &dir,
        &[
            "resume",
            &id,
            "--journal",
            j,
            "--durability",
            "process",
            "--json",
        ],
    );
    exited(&out, 0, "the resume");
    let resumed = json_of(&out);
    check_against(
        base["transcript"].as_array().unwrap(),
        resumed["transcript"].as_array().unwrap(),
        &side_log(&dir),
        "process",
    );
    let out = cli(
        &dir,
        &["resume", &id, "--journal", j, "--durability", "disk"],
    );
    exited(&out, 2, "an unknown --durability on resume");
}

/// Every row a run has in the journal file, as text.
fn rows_of(journal: &Path, id: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open(journal).unwrap();
    let mut out: Vec<String> = conn
        .prepare(
            "SELECT run_id || agent || fingerprint || header || header_sum || status || \
             COALESCE(stop_reason, '') || created_ms || updated_ms FROM runs WHERE run_id = ?1",
        )
        .unwrap()
        .query_map([id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let steps: Vec<String> = conn
        .prepare("SELECT seq || step || sum FROM steps WHERE run_id = ?1 ORDER BY seq")
        .unwrap()
        .query_map([id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    out.extend(steps);
    out
}

#[test]
fn a_fork_goes_on_differently_from_its_step_and_leaves_the_first_run_as_it_was() {
    let dir = crash_dir("");
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let out = run_cmd(&dir, &journal, &[]).output().unwrap();
    exited(&out, 0, "the first run");
    let first = json_of(&out);
    let id = first["run_id"].as_str().unwrap().to_owned();
    let base = first["transcript"].as_array().unwrap().clone();
    let before = rows_of(&journal, &id);
    let side_before = side_log(&dir);

    // The step before the model's second answer: the first batch is over.
    let show = json_of(&cli(
        &dir,
        &["journal", "show", &id, "--journal", j, "--json"],
    ));
    let answers: Vec<usize> = show["steps"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.to_string().contains(r#""input":"model_responded""#))
        .map(|(i, _)| i)
        .collect();
    let at = answers[1] - 1;

    // From there the model answers differently.
    let first_answer = serde_json::from_str::<Value>(&script()).unwrap()[0].clone();
    dir.write(
        "script.json",
        &json!([first_answer, {"text": "A different ending."}]).to_string(),
    );
    let out = cli(
        &dir,
        &[
            "journal",
            "fork",
            &id[..12],
            "--at",
            &at.to_string(),
            "--journal",
            j,
            "--json",
        ],
    );
    exited(&out, 0, "the fork");
    let forked = json_of(&out);
    let fork_id = forked["run_id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, id);
    assert_eq!(forked["stop_reason"], "finished");
    let transcript = forked["transcript"].as_array().unwrap();
    // The user's input, the first answer and its three results: the old run's, then its own.
    assert_eq!(transcript.len(), 6, "{transcript:#?}");
    assert_eq!(
        transcript[..5],
        base[..5],
        "the transcript up to the step is the old one's"
    );
    assert_ne!(transcript[5], base[5]);
    assert!(transcript[5].to_string().contains("A different ending."));
    assert_eq!(
        side_log(&dir),
        side_before,
        "no call the fork holds finished runs again"
    );

    let runs = run_ids(&dir, &journal);
    assert_eq!(runs.len(), 2);
    let listed = runs
        .iter()
        .find(|r| r["run_id"] == fork_id.as_str())
        .unwrap();
    assert_eq!(listed["forked_from"], json!({"run_id": id, "step": at}));
    assert_eq!(listed["status"], "finished");
    assert!(runs.iter().find(|r| r["run_id"] == id.as_str()).unwrap()["forked_from"].is_null());
    let show = json_of(&cli(
        &dir,
        &["journal", "show", &fork_id, "--journal", j, "--json"],
    ));
    assert_eq!(show["forked_from"]["run_id"], id.as_str());
    assert_eq!(
        rows_of(&journal, &id),
        before,
        "the first run's rows are untouched"
    );

    // A step the run does not have: refused, nothing new.
    let out = cli(
        &dir,
        &["journal", "fork", &id, "--at", "999", "--journal", j],
    );
    exited(&out, 9, "a fork past the run's end");
    assert_eq!(run_ids(&dir, &journal).len(), 2);
}

#[test]
fn an_approval_unanswered_at_the_deadline_ends_the_run_there_as_on_restate() {
    let dir = crash_dir("[permissions]\nask = [\"write\"]\n");
    dir.write(
        "agent.toml",
        &format!("{AGENT}[permissions]\nask = [\"write\"]\n").replace(
            "max_concurrency = 2",
            "max_concurrency = 2\ntimeout_secs = 1",
        ),
    );
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let out = run_cmd(&dir, &journal, &[]).output().unwrap();
    exited(&out, 8, "the run suspends");
    let id = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    // Before the deadline an unanswered run is not resumed.
    let early = cli(&dir, &["resume", &id, "--journal", j]);
    assert_eq!(
        early.status.code(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&early.stderr)
    );
    // The wait counts toward the run's deadline; past it, the run goes on only to stop there.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let out = cli(&dir, &["resume", &id, "--journal", j, "--json"]);
    exited(&out, 5, "the deadline's exit code");
    let outcome = json_of(&out);
    assert_eq!(outcome["stop_reason"], "deadline", "{outcome}");
    assert!(
        !side_log(&dir).iter().any(|l| l.starts_with("write ")),
        "the call it waited on did not run"
    );
    let listed = json_of(&cli(&dir, &["approvals", "list", "--journal", j, "--json"]));
    assert_eq!(listed, json!([]), "nothing waits any more");
}

/// Runs the agent on a script of one call of `tool` (which writes `start` to `side.log` first),
/// and kills the process with SIGKILL once the tool has started, while it works.
fn kill_while_the_tool_runs(dir: &AgentDir, journal: &Path, tool: &str, started_msg: &str) {
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "t1", "name": tool, "arguments": {}}]},
            {"text": "Over."}
        ])
        .to_string(),
    );
    let mut run = run_cmd(dir, journal, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        side_log(dir).iter().any(|l| l == "start")
    });
    assert!(started, "{started_msg}");
    run.kill().unwrap();
    run.wait().unwrap();
}

#[test]
fn a_tool_running_when_its_run_is_killed_dies_with_it_and_acts_no_more_after_the_resume() {
    // `slow` logs its start, works for two seconds, then logs its effect.
    let dir = AgentDir::new(
        r#"name = "slow"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "slow"
command = ["sh", "-c", "echo start >> side.log; sleep 2; echo effect >> side.log; echo done"]
input_schema = { type = "object", properties = {} }
"#,
    );
    let journal = dir.path("runs.db");
    kill_while_the_tool_runs(&dir, &journal, "slow", "the tool started");
    let id = run_ids(&dir, &journal)[0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = resume_json(&dir, &journal, &id);
    exited(&out, 0, "the resume");
    let resumed = json_of(&out);
    let transcript = resumed["transcript"].as_array().unwrap();
    assert!(
        transcript
            .iter()
            .any(|m| m["call_id"] == "t1" && is_interrupted(m)),
        "the model reads that the call was interrupted: {transcript:#?}"
    );
    // Past the time the tool would have taken: it never acted behind the resumed run's back.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(
        side_log(&dir),
        ["start"],
        "the killed run's tool died with it"
    );
}

/// The call's tree: a background subshell that writes `marker` after two seconds and, where the
/// sandbox lets it (`off`), a `setsid` child out of the group that writes `escaped` the same way.
/// The shell logs its group and the children's ids first, then waits for them.
const TREE: &str = r#"cut -d' ' -f5 /proc/$$/stat > group.id
(sleep 2; touch marker) &
echo $! > background.pid
setsid sh -c 'echo $$ > escaped.pid; sleep 2; touch escaped' 2>/dev/null &
sleep 0.3
echo start >> side.log
wait
"#;

#[test]
fn what_a_killed_run_s_tool_started_dies_with_it_in_and_out_of_the_sandbox() {
    for mode in sandbox_modes_here() {
        let dir = AgentDir::new(&format!(
            r#"name = "tree"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "tree"
command = ["sh", "tree.sh"]
input_schema = {{ type = "object", properties = {{}} }}
sandbox = "{mode}"
"#
        ));
        dir.write("tree.sh", TREE);
        let journal = dir.path("runs.db");
        kill_while_the_tool_runs(&dir, &journal, "tree", &format!("{mode}: the tool started"));
        let read = |name: &str| {
            std::fs::read_to_string(dir.path(name))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let group = read("group.id");
        let escaped = read("escaped.pid");
        assert!(!group.is_empty(), "{mode}: the tool logged its group");
        assert!(!read("background.pid").is_empty(), "{mode}");
        // Only unconfined may a child leave the group (the control of the second half).
        assert_eq!(escaped.is_empty(), mode != "off", "{mode}: {escaped:?}");
        // Past the time the children would have taken.
        std::thread::sleep(std::time::Duration::from_millis(2500));
        let mut groups = vec![group.as_str()];
        if !escaped.is_empty() {
            groups.push(escaped.as_str());
        }
        let live = live_in_groups(&groups);
        for pid in live.iter().filter_map(|p| p.split(' ').next()) {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        assert!(
            !dir.path("marker").exists(),
            "{mode}: the background child acted after agentloop died"
        );
        assert!(
            !dir.path("escaped").exists(),
            "{mode}: the child that left the group acted after agentloop died"
        );
        assert!(live.is_empty(), "{mode}: still alive: {live:?}");
    }
}

/// A program whose main thread ends while another thread runs on (`pthread_exit`): `/proc` shows
/// the process as a zombie, yet it lives. The thread writes `marker` two seconds after the run's
/// tool said it started.
const MAIN_THREAD_ENDS: &str = r#"import ctypes, os, threading, time
def late():
    while not os.path.exists("side.log"):
        time.sleep(0.05)
    time.sleep(2)
    open("marker", "w").write("acted")
threading.Thread(target=late).start()
open("lead.pid", "w").write(str(os.getpid()))
ctypes.CDLL(None).pthread_exit(None)
"#;

#[test]
fn a_killed_run_s_tool_child_whose_main_thread_ended_dies_with_it() {
    // Out of the group (`setsid`, which `off` allows), it is killed only as what came to the
    // supervisor; it must not be taken for a dead process there.
    let dir = AgentDir::new(
        r#"name = "lead"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "lead"
command = ["sh", "lead.sh"]
input_schema = { type = "object", properties = {} }
sandbox = "off"
"#,
    );
    dir.write("lead.py", MAIN_THREAD_ENDS);
    dir.write(
        "lead.sh",
        "setsid python3 lead.py &\n\
         while [ ! -s lead.pid ]; do sleep 0.05; done\n\
         sleep 0.3\n\
         cut -d' ' -f3 /proc/$(cat lead.pid)/stat > lead.state\n\
         echo start >> side.log\n\
         wait\n",
    );
    let journal = dir.path("runs.db");
    kill_while_the_tool_runs(&dir, &journal, "lead", "the tool started");
    let read = |name: &str| {
        std::fs::read_to_string(dir.path(name))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    // The control: its main thread had ended, so `/proc` called it a zombie.
    assert_eq!(read("lead.state"), "Z");
    let lead = read("lead.pid");
    // Past the time its thread would have taken.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    // Alive: listed, and not a zombie, or a zombie that still counts a thread beside its own.
    let stat = std::fs::read_to_string(format!("/proc/{lead}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rfind(')')
        .map(|at| stat[at + 1..].split_whitespace().collect())
        .unwrap_or_default();
    let alive = fields.len() > 17 && (fields[0] != "Z" || fields[17] != "1");
    if alive {
        let _ = Command::new("kill").args(["-9", &lead]).status();
    }
    assert!(
        !dir.path("marker").exists(),
        "the child whose main thread ended acted after agentloop died"
    );
    assert!(!alive, "still alive: {stat}");
}

/// A stdio MCP server for the kill below: it logs its start and each call (`side.log`), and a
/// call whose key starts with `slow` waits until the file `go` exists. `peek` says it is
/// read-only.
const SLOW_SERVER: &str = r#"import json, os, sys, time
with open("server.log", "a") as f: f.write(f"{os.getpid()}\n")
TOOLS = [
    {"name": "slow_write", "description": "w", "inputSchema": {"type": "object", "properties": {"key": {"type": "string"}}}},
    {"name": "peek", "description": "p", "inputSchema": {"type": "object", "properties": {"key": {"type": "string"}}},
     "annotations": {"readOnlyHint": True}},
]
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line); method = m.get("method"); rid = m.get("id")
    if rid is None: continue
    p = m.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name = p.get("name"); key = (p.get("arguments") or {}).get("key", "")
        with open("side.log", "a") as f: f.write(f"{name} {key}\n")
        while key.startswith("slow") and not os.path.exists("go"): time.sleep(0.05)
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": f"{name} done {key}"}]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
"#;

/// A journaled run killed while its MCP server runs a call: the server dies with it, and the
/// resume starts it anew; the call in flight is answered interrupted (the server's tool is not
/// idempotent) and not made again, a trusted read-only call waiting behind it is made, and the
/// run goes on to its answer.
#[test]
fn a_run_killed_with_an_mcp_call_in_flight_resumes_with_its_server_started_anew() {
    let dir = AgentDir::new(
        r#"name = "mcp-crash"
[model]
provider = "scripted"
script = "script.json"
[limits]
max_concurrency = 2
[[mcp]]
name = "s"
command = ["python3", "server.py"]
trust_hints = true
"#,
    );
    dir.write("server.py", SLOW_SERVER);
    let call = |id: &str, tool: &str, key: &str| json!({"id": id, "name": tool, "arguments": {"key": key}});
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [call("p1", "s__peek", "first")]},
            {"tool_calls": [call("w1", "s__slow_write", "slow-1"), call("p2", "s__peek", "behind")]},
            {"tool_calls": [call("w2", "s__slow_write", "after")]},
            {"text": "Over."}
        ])
        .to_string(),
    );
    let journal = dir.path("runs.db");
    let mut run = run_cmd(&dir, &journal, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let in_flight = (0..400).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        side_log(&dir).iter().any(|l| l == "slow_write slow-1")
    });
    assert!(in_flight, "the slow call started: {:?}", side_log(&dir));
    run.kill().unwrap();
    run.wait().unwrap();
    let first = std::fs::read_to_string(dir.path("server.log")).unwrap();
    let first = first.trim().to_owned();
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        !Path::new(&format!("/proc/{first}")).exists()
    });
    assert!(gone, "the server died with the run");

    dir.write("go", "");
    let id = run_ids(&dir, &journal)[0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = resume_json(&dir, &journal, &id);
    exited(&out, 0, "resume");
    let resumed = json_of(&out);
    assert_eq!(resumed["output"], "Over.");
    let results: Vec<(String, String)> = resumed["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["call_id"].as_str().unwrap().to_owned(),
                m["content"]["value"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let result = |id: &str| &results.iter().find(|(c, _)| c == id).unwrap().1;
    assert_eq!(result("p1"), "peek done first");
    assert!(result("w1").starts_with("interrupted:"), "{results:?}");
    assert_eq!(result("p2"), "peek done behind");
    assert_eq!(result("w2"), "slow_write done after");
    let servers = std::fs::read_to_string(dir.path("server.log")).unwrap();
    assert_eq!(
        servers.lines().count(),
        2,
        "a server started anew: {servers}"
    );
    let side = side_log(&dir);
    let count = |line: &str| side.iter().filter(|l| *l == line).count();
    assert_eq!(count("slow_write slow-1"), 1, "{side:?}");
    assert_eq!(count("slow_write after"), 1, "{side:?}");
    assert_eq!(count("peek first"), 1, "{side:?}");
}

/// Every status in a `trace show --json` tree, with where it is.
fn statuses(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "status"
                    && let Some(s) = v.as_str()
                {
                    out.push((at.to_owned(), s.to_owned()));
                }
                statuses(v, &format!("{at}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                statuses(v, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// A run killed while it writes a trace, resumed into the same trace: the trace reads as one
/// finished run with the whole run's counts, and what the killed process never ended is
/// `interrupted`; the counts were the resuming process's alone, and a model call the killed
/// process had made (its answer journaled) stayed `running` under the finished run for good.
#[test]
fn a_run_resumed_into_the_trace_it_was_killed_writing_reads_there_as_one_finished_run() {
    for trace in ["t.db", "t.ndjson"] {
        // After the first batch, inside the second, and in the last turn.
        for fault in [
            "after-step:4",
            "after-step:6",
            "after-step:9",
            "after-step:14",
        ] {
            let what = format!("{trace}, {fault}");
            let dir = crash_dir("");
            let journal = dir.path("runs.db");
            let j = journal.to_str().unwrap();
            assert!(
                run_and_kill_with(&dir, &journal, fault, &["--trace", trace]),
                "{what}"
            );
            let id = run_ids(&dir, &journal)[0]["run_id"]
                .as_str()
                .unwrap()
                .to_owned();
            let out = cli(
                &dir,
                &["resume", &id, "--journal", j, "--json", "--trace", trace],
            );
            exited(&out, 0, &what);
            let resumed = json_of(&out);
            let calls = resumed["tool_calls"].as_array().unwrap().len();

            let out = cli(&dir, &["trace", "show", trace, "--json"]);
            exited(&out, 0, &what);
            let shown = json_of(&out);
            let run = &shown["run"];
            assert_eq!(run["run_id"], id.as_str(), "{what}");
            assert_eq!(run["status"], "ok", "{what}");
            assert_eq!(run["stop_reason"], "finished", "{what}");
            assert_eq!(run["turns"], resumed["turns"], "{what}");
            assert_eq!(
                run["usage"]["input_tokens"],
                resumed["usage"]["input_tokens"]
            );
            assert_eq!(
                run["model_calls"], resumed["model_calls"],
                "{what}: {run:#}"
            );
            assert_eq!(run["tool_calls"], calls, "{what}: {run:#}");
            let mut all = Vec::new();
            statuses(&shown, "", &mut all);
            let running: Vec<_> = all.iter().filter(|(_, s)| s == "running").collect();
            assert!(running.is_empty(), "{what}: {running:?}");
            let out = cli(&dir, &["trace", "list", trace, "--json"]);
            let listed = json_of(&out);
            assert_eq!(listed.as_array().unwrap().len(), 1, "{what}: {listed:#}");
            assert_eq!(listed[0]["tool_calls"], calls, "{what}");
        }
    }
}

#[test]
fn a_finished_journaled_run_leaves_its_journal_whole_in_one_file() {
    // The journal's writer thread closes its connection (which moves the WAL back into the file
    // and removes it) before the process ends: the file alone holds every step, so a copy of it
    // is the whole journal. The race it lost before came out about one run in two.
    for level in [None, Some("process")] {
        let dir = crash_dir_at(level);
        for round in 0..5 {
            let journal = dir.path(&format!("runs-{round}.db"));
            let out = run_cmd(&dir, &journal, &[]).output().unwrap();
            exited(&out, 0, "the command");
            for leftover in ["-wal", "-shm"] {
                let mut side = journal.as_os_str().to_owned();
                side.push(leftover);
                assert!(
                    !Path::new(&side).exists(),
                    "{level:?}, run {round}: {} is left beside the journal",
                    Path::new(&side).display()
                );
            }
            assert_eq!(run_ids(&dir, &journal).len(), 1);
        }
    }
}

#[test]
fn read_only_journal_commands_leave_the_journals_folder_as_they_found_it() {
    // SQLite makes a `-wal` and a `-shm` beside a WAL file for a read-only connection too, and
    // only a connection that may write removes them: `journal list` left both behind.
    let dir = crash_dir("");
    let journal = dir.path("runs.db");
    exited(
        &run_cmd(&dir, &journal, &[]).output().unwrap(),
        0,
        "the run",
    );
    let alone = tempfile::tempdir().unwrap();
    let copy = alone.path().join("runs.db");
    std::fs::copy(&journal, &copy).unwrap();
    let copy = copy.to_str().unwrap();
    let id = run_ids(&dir, Path::new(copy))[0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let folder = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(alone.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(folder(), ["runs.db"], "journal list --json");
    for command in [
        vec!["journal", "list", "--journal", copy],
        vec!["journal", "show", &id, "--journal", copy],
        vec!["journal", "show", &id, "--json", "--journal", copy],
        vec!["approvals", "list", "--journal", copy],
    ] {
        exited(&cli(&dir, &command), 0, &format!("{command:?}"));
        assert_eq!(folder(), ["runs.db"], "{command:?}");
    }
}
