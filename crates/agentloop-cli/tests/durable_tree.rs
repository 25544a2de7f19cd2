#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! A tree of agents as one durable unit, through the command: a parent with two subagents (the
//! first running in parallel with a plain tool call) killed with SIGKILL after every step any
//! agent of the tree journals, and inside every such write, then resumed: the same answer, the
//! same usage, no call of any agent twice. And a subagent's question, which suspends the tree:
//! listed on the top run with its place in the tree, answered there, and gone on from.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::crash::{
    check_against, cli, exited, is_interrupted, journal_runs as runs, json_of, killed_at_fault,
    resume_json, side_log, top_and_running_children, tree_dir,
};
use support::*;

fn run_cmd(dir: &AgentDir, journal: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args([
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "go",
        "--json",
    ])
    .args(["--journal", journal.to_str().unwrap()])
    .current_dir(dir.path("."))
    .stdin(Stdio::null());
    cmd
}

/// Runs the tree with a journal fault and kills the process with SIGKILL once it stops there.
fn run_and_kill(dir: &AgentDir, journal: &Path, fault: &str) -> bool {
    let mut cmd = run_cmd(dir, journal);
    cmd.env("AGENTLOOP_TEST_JOURNAL_FAULT", fault);
    killed_at_fault(cmd)
}

fn subagent_usage(outcome: &Value) -> Vec<(String, Value, Value)> {
    let mut subs: Vec<(String, Value, Value)> = outcome["subagents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["agent"].as_str().unwrap().to_owned(),
                s["usage"].clone(),
                s["tool_calls"].clone(),
            )
        })
        .collect();
    subs.sort_by(|a, b| a.0.cmp(&b.0));
    subs
}

#[test]
fn a_tree_killed_after_any_step_or_inside_any_write_of_any_agent_resumes_the_same() {
    kill_tree_at_every_write(None);
}

#[test]
fn at_process_durability_a_tree_killed_at_any_write_resumes_the_same() {
    kill_tree_at_every_write(Some("process"));
}

/// The tree, its top agent file's `durability` at `level` when given.
fn tree_dir_at(level: Option<&str>) -> AgentDir {
    let dir = tree_dir("");
    if let Some(level) = level {
        dir.write(
            "agent.toml",
            &support::crash::TREE.replace(
                "version = \"1\"\n",
                &format!("version = \"1\"\ndurability = \"{level}\"\n"),
            ),
        );
    }
    dir
}

/// The tree's crash harness: a kill after and inside every write of every agent, then a resume.
fn kill_tree_at_every_write(level: Option<&str>) {
    let base_dir = tree_dir_at(level);
    let base_journal = base_dir.path("runs.db");
    let out = run_cmd(&base_dir, &base_journal).output().unwrap();
    exited(&out, 0, "the uninterrupted tree");
    let base = json_of(&out);
    assert_eq!(base["stop_reason"], "finished");
    assert_eq!(base["output"], "Both workers are done.");
    let base_transcript = base["transcript"].as_array().unwrap().clone();
    let base_runs = runs(&base_dir, &base_journal);
    assert_eq!(
        base_runs.len(),
        3,
        "the parent and a child journal per subagent call"
    );
    let (id, _) = top_and_running_children(&base_runs);
    for r in base_runs.iter().filter(|r| r["run_id"] != id.as_str()) {
        assert_eq!(r["parent"], id.as_str(), "a child journal names its parent");
        assert_eq!(r["status"], "finished");
    }
    let total: u64 = base_runs.iter().map(|r| r["steps"].as_u64().unwrap()).sum();
    assert!(total >= 20, "a long enough tree: {total} steps");
    let base_side = side_log(&base_dir);
    assert_eq!(base_side.len(), 5, "{base_side:?}");
    check_against(
        &base_transcript,
        &base_transcript,
        &base_side,
        "uninterrupted",
    );

    let mut children_resumed = 0;
    let mut interrupted = 0;
    for n in 0..total {
        for fault in [format!("after-write:{n}"), format!("in-write:{n}")] {
            let dir = tree_dir_at(level);
            let journal = dir.path("runs.db");
            assert!(run_and_kill(&dir, &journal, &fault), "{fault}: reached");
            let written = runs(&dir, &journal);
            let (id, running) = top_and_running_children(&written);
            children_resumed += running;
            let out = resume_json(&dir, &journal, &id);
            if written.iter().all(|r| r["status"] == "finished") {
                // The top run's last answer is committed with its end: the tree is over,
                // whole, and resuming it is refused.
                assert_eq!(fault, format!("after-write:{}", total - 1));
                assert_eq!(out.status.code(), Some(9), "{fault}");
                continue;
            }
            exited(&out, 0, &fault);
            let resumed = json_of(&out);
            assert_eq!(resumed["stop_reason"], "finished", "{fault}");
            assert_eq!(resumed["output"], base["output"], "{fault}");
            let transcript = resumed["transcript"].as_array().unwrap();
            interrupted += transcript.iter().filter(|m| is_interrupted(m)).count();
            // No call of any agent ran twice; every call read as done ran.
            check_against(&base_transcript, transcript, &side_log(&dir), &fault);
            // The tree's usage and counts are the uninterrupted tree's: nothing spent before
            // the kill is lost or spent again.
            assert_eq!(resumed["usage"], base["usage"], "{fault}");
            assert_eq!(resumed["model_calls"], base["model_calls"], "{fault}");
            assert_eq!(resumed["turns"], base["turns"], "{fault}");
            let (subs, base_subs) = (subagent_usage(&resumed), subagent_usage(&base));
            assert_eq!(
                subs.iter().map(|s| &s.1).collect::<Vec<_>>(),
                base_subs.iter().map(|s| &s.1).collect::<Vec<_>>(),
                "{fault}: each subagent's usage"
            );
            let after = runs(&dir, &journal);
            assert_eq!(after.len(), 3, "{fault}: no child started twice");
            assert!(
                after.iter().all(|r| r["status"] == "finished"),
                "{fault}: {after:#?}"
            );
            // A child is its parent's to resume.
            if let Some(child) = after.iter().find(|r| r.get("parent").is_some()) {
                let direct = cli(
                    &dir,
                    &[
                        "resume",
                        child["run_id"].as_str().unwrap(),
                        "--journal",
                        journal.to_str().unwrap(),
                    ],
                );
                assert_eq!(direct.status.code(), Some(9), "{fault}");
            }
        }
    }
    assert!(children_resumed > 0, "some kill landed inside a child");
    assert!(interrupted > 0, "some kill landed while a write ran");
}

/// The statuses anywhere in a `trace show --json` tree.
fn statuses_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                if let (true, Some(s)) = (k == "status", v.as_str()) {
                    out.push(s.to_owned());
                }
                statuses_in(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| statuses_in(v, out)),
        _ => {}
    }
}

/// A tree killed after any write while it writes a trace, resumed into the same trace: every
/// run there has ended and nothing in it reads `running`; a child the killed process finished
/// (its answer then read from its journal, nothing of it run again) stayed `running` in the
/// trace for good, under a finished parent.
#[test]
fn a_tree_resumed_into_the_trace_it_was_killed_writing_leaves_no_run_open_there() {
    let base_dir = tree_dir("");
    let out = run_cmd(&base_dir, &base_dir.path("runs.db"))
        .output()
        .unwrap();
    exited(&out, 0, "the uninterrupted tree");
    let total: u64 = runs(&base_dir, &base_dir.path("runs.db"))
        .iter()
        .map(|r| r["steps"].as_u64().unwrap())
        .sum();
    let mut open_children = 0;
    for n in 0..total {
        let fault = format!("after-write:{n}");
        let dir = tree_dir("");
        let journal = dir.path("runs.db");
        let mut cmd = run_cmd(&dir, &journal);
        cmd.args(["--trace", "t.db"])
            .env("AGENTLOOP_TEST_JOURNAL_FAULT", &fault);
        assert!(killed_at_fault(cmd), "{fault}: reached");
        let (id, _) = top_and_running_children(&runs(&dir, &journal));
        let listed = json_of(&cli(&dir, &["trace", "list", "t.db", "--json"]));
        open_children += listed
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["parent_id"].is_string() && r["status"] == "running")
            .count();
        let j = journal.to_str().unwrap();
        let out = cli(
            &dir,
            &["resume", &id, "--journal", j, "--json", "--trace", "t.db"],
        );
        if out.status.code() == Some(9) {
            // The tree was over at the kill.
            continue;
        }
        exited(&out, 0, &fault);
        let listed = json_of(&cli(&dir, &["trace", "list", "t.db", "--json"]));
        let listed = listed.as_array().unwrap();
        assert_eq!(listed.len(), 3, "{fault}: {listed:#?}");
        for run in listed {
            let run_id = run["id"].as_str().unwrap();
            assert_ne!(run["status"], "running", "{fault}: {run:#}");
            let shown = cli(&dir, &["trace", "show", "t.db", "--run", run_id, "--json"]);
            exited(&shown, 0, &fault);
            let mut all = Vec::new();
            statuses_in(&json_of(&shown), &mut all);
            assert!(
                !all.iter().any(|s| s == "running"),
                "{fault}: run {run_id}: {all:?}"
            );
        }
    }
    assert!(
        open_children > 0,
        "some kill left a child's run open in the trace"
    );
}

/// Answers worker A's first question (`p1/a1`) allow, resumes the top run `id` to its second
/// (`p1/a3`), answers it deny, and resumes it to its end: the finished tree's outcome.
fn allow_then_deny(dir: &AgentDir, journal: &Path, id: &str, what: &str) -> Value {
    let j = journal.to_str().unwrap();
    exited(
        &cli(
            dir,
            &["approve", id, "--call", "p1/a1", "--allow", "--journal", j],
        ),
        0,
        &format!("{what}: approve"),
    );
    let out = resume_json(dir, journal, id);
    // Worker A asks again about its second write.
    exited(&out, 8, &format!("{what}: the second question"));
    assert_eq!(json_of(&out)["pending_approvals"][0]["call_id"], "p1/a3");
    exited(
        &cli(
            dir,
            &["approve", id, "--call", "p1/a3", "--deny", "--journal", j],
        ),
        0,
        &format!("{what}: deny"),
    );
    let out = resume_json(dir, journal, id);
    exited(&out, 0, &format!("{what}: the tree goes on to its end"));
    let done = json_of(&out);
    assert_eq!(done["stop_reason"], "finished", "{what}");
    assert_eq!(done["output"], "Both workers are done.", "{what}");
    done
}

/// The harness's tool, but the lead's own write takes 3 s: longer than the 2 s grace period a
/// stopped batch gives its calls.
fn slow_lead_write(dir: &AgentDir) {
    dir.write(
        "tool.sh",
        &support::crash::TOOL.replace(
            "args=\"$(cat)\"\n",
            "args=\"$(cat)\"\ncase \"$args\" in *lead-1*) sleep 3;; esac\n",
        ),
    );
}

#[test]
fn a_subagents_question_suspends_the_tree_and_is_answered_on_the_top_run() {
    let dir = tree_dir("[permissions]\nask = [\"write\"]\n");
    // The lead's write is still running when worker A asks: the suspension lets it finish.
    slow_lead_write(&dir);
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let out = run_cmd(&dir, &journal).output().unwrap();
    exited(
        &out,
        8,
        "the tree suspends as a parent's own question would",
    );
    let suspended = json_of(&out);
    assert_eq!(suspended["stop_reason"], "suspended");
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    let pending = suspended["pending_approvals"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{pending:#?}");
    assert_eq!(pending[0]["call_id"], "p1/a1");
    assert_eq!(pending[0]["tool"], "write");
    let lead_write = |outcome: &Value| {
        outcome["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "p2")
            .cloned()
    };
    assert_eq!(
        lead_write(&suspended).map(|c| c["status"].clone()),
        Some(json!("ok")),
        "the lead's write beside the question ran to its end: {suspended:#}"
    );

    let listed = json_of(&cli(&dir, &["approvals", "list", "--journal", j, "--json"]));
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "listed once, on the top run: {listed:#?}");
    assert_eq!(listed[0]["run_id"], id.as_str());
    assert_eq!(listed[0]["call_id"], "p1/a1");
    let text = String::from_utf8_lossy(&cli(&dir, &["approvals", "list", "--journal", j]).stdout)
        .into_owned();
    assert!(
        text.contains("(lead/worker-a)"),
        "its place in the tree: {text}"
    );
    assert!(
        !side_log(&dir).iter().any(|l| l.contains("a-1")),
        "the asked call did not run"
    );

    let done = allow_then_deny(&dir, &journal, &id, "");
    let side = side_log(&dir);
    let count = |line: &str| side.iter().filter(|l| l.as_str() == line).count();
    assert_eq!(count(r#"write {"key":"a-1"}"#), 1, "{side:?}");
    assert_eq!(count(r#"write {"key":"a-3"}"#), 0, "denied: {side:?}");
    // The lead's own write ran beside the question: once, to its end, and its result was kept
    // through the suspension (a finished call is never run again and never lost).
    assert_eq!(count(r#"write {"key":"lead-1"}"#), 1, "{side:?}");
    assert_eq!(count(r#"write {"key":"b-1"}"#), 1, "{side:?}");
    let transcript = done["transcript"].as_array().unwrap();
    let result = transcript
        .iter()
        .find(|m| m["role"] == "tool" && m["call_id"] == "p2")
        .unwrap();
    assert_eq!(
        result["content"]["value"].as_str().unwrap().trim_end(),
        r#"write done: {"key":"lead-1"}"#,
        "{transcript:#?}"
    );
}

/// A kill after a subagent's suspension was committed and before its parent's (the parent
/// still running, with nothing to answer listed): resuming the parent asks the subagent's
/// question again, on the top run, and the tree goes on from its answers. At both durability
/// levels.
#[test]
fn a_kill_between_a_childs_suspension_and_its_parents_asks_again_on_resume() {
    for level in [None, Some("process")] {
        let dir = tree_dir_at(level);
        dir.write(
            "worker-a.toml",
            &support::crash::tree_worker("worker-a", "[permissions]\nask = [\"write\"]\n"),
        );
        let journal = dir.path("runs.db");
        // The journal's first suspension is worker A's: the lead's comes after it.
        assert!(
            run_and_kill(&dir, &journal, "after-suspend:0"),
            "{level:?}: reached"
        );
        let written = runs(&dir, &journal);
        let (id, _) = top_and_running_children(&written);
        let top = written.iter().find(|r| r["run_id"] == id.as_str()).unwrap();
        assert_eq!(top["status"], "running", "{level:?}: {written:#?}");
        assert!(
            written
                .iter()
                .any(|r| r.get("parent").is_some() && r["status"] == "suspended"),
            "{level:?}: {written:#?}"
        );

        let out = resume_json(&dir, &journal, &id);
        exited(&out, 8, &format!("{level:?}: the question, asked again"));
        let again = json_of(&out);
        assert_eq!(again["stop_reason"], "suspended", "{level:?}");
        let pending = again["pending_approvals"].as_array().unwrap();
        assert_eq!(pending.len(), 1, "{level:?}: {pending:#?}");
        assert_eq!(pending[0]["call_id"], "p1/a1", "{level:?}");
        allow_then_deny(&dir, &journal, &id, &format!("{level:?}"));
        let side = side_log(&dir);
        let count = |line: &str| side.iter().filter(|l| l.as_str() == line).count();
        assert_eq!(count(r#"write {"key":"a-1"}"#), 1, "{level:?}: {side:?}");
        assert_eq!(count(r#"write {"key":"a-3"}"#), 0, "{level:?}: {side:?}");
        assert!(
            count(r#"write {"key":"lead-1"}"#) <= 1,
            "{level:?}: {side:?}"
        );
        assert_eq!(count(r#"write {"key":"b-1"}"#), 1, "{level:?}: {side:?}");
    }
}

#[test]
fn after_a_kill_inside_a_child_the_tree_spends_what_was_left_never_more() {
    // The lead may make 5 model calls in all; its one subagent call is granted 3 of the 4 left
    // after its own first (the lead keeps one to read the worker's result), and its worker would
    // go on for longer.
    let tight = |dir: &AgentDir| {
        dir.write(
            "agent.toml",
            &support::crash::TREE.replace("max_turns = 20", "max_model_calls = 5"),
        );
        dir.write(
            "lead.json",
            &json!([
                {"tool_calls": [support::crash::task("p1", "ask_a", "alpha")]},
                {"text": "Done."}
            ])
            .to_string(),
        );
        let turns: Vec<Value> = (1..=8)
            .map(|i| json!({"tool_calls": [support::crash::call(&format!("a{i}"), "write", &format!("a-{i}"))]}))
            .collect();
        dir.write("worker-a.json", &Value::Array(turns).to_string());
    };
    let base_dir = tree_dir("");
    tight(&base_dir);
    let journal = base_dir.path("runs.db");
    let out = run_cmd(&base_dir, &journal).output().unwrap();
    let base = json_of(&out);
    let code = out.status.code();
    assert_eq!(base["model_calls"], 5, "the tree spent its budget: {base}");
    let worker = &base["subagents"][0];
    assert_eq!(
        worker["model_calls"], 3,
        "the worker spent its grant: {base}"
    );
    assert_eq!(base["output"], "Done.", "the lead read it: {base}");
    let total: u64 = runs(&base_dir, &journal)
        .iter()
        .map(|r| r["steps"].as_u64().unwrap())
        .sum();
    let mut inside = 0;
    for n in 0..total {
        for fault in [format!("after-write:{n}"), format!("in-write:{n}")] {
            let dir = tree_dir("");
            tight(&dir);
            let journal = dir.path("runs.db");
            assert!(run_and_kill(&dir, &journal, &fault), "{fault}: reached");
            let written = runs(&dir, &journal);
            let (id, running) = top_and_running_children(&written);
            inside += running;
            let out = resume_json(&dir, &journal, &id);
            if written.iter().all(|r| r["status"] == "finished") {
                // The lead's answer is committed with its end: the tree is over, and resuming
                // it is refused.
                assert_eq!(fault, format!("after-write:{}", total - 1));
                assert_eq!(out.status.code(), Some(9), "{fault}");
                continue;
            }
            assert_eq!(out.status.code(), code, "{fault}");
            let resumed = json_of(&out);
            assert_eq!(resumed["stop_reason"], base["stop_reason"], "{fault}");
            assert_eq!(
                resumed["model_calls"], 5,
                "{fault}: never more than the budget"
            );
            assert_eq!(resumed["usage"], base["usage"], "{fault}");
            assert_eq!(
                resumed["subagents"][0]["model_calls"], 3,
                "{fault}: the worker went on within its grant"
            );
            let side = side_log(&dir);
            let mut seen = std::collections::HashSet::new();
            assert!(
                side.iter().all(|l| seen.insert(l)),
                "{fault}: a write ran twice: {side:?}"
            );
        }
    }
    assert!(inside > 0, "some kill landed inside the worker");
}

/// Subagent calls whose ids differ only in characters a file name cannot hold, and one whose id
/// is long: each child run is journaled (and its lock file held) on its own, at every level. A
/// child's run id is its parent's and the model's call id, any text up to 256 bytes.
#[test]
fn subagent_calls_whose_ids_differ_only_in_odd_characters_or_run_long_each_keep_a_journal() {
    let long = "c".repeat(250);
    for level in [None, Some("process")] {
        let dir = tree_dir_at(level);
        dir.write(
            "lead.json",
            &json!([
                {"text": "Both at once.", "tool_calls": [
                    support::crash::task("w:1", "ask_a", "alpha"),
                    support::crash::task("w.1", "ask_b", "beta")]},
                {"tool_calls": [support::crash::task(&long, "ask_b", "gamma")]},
                {"text": "All three are done."}
            ])
            .to_string(),
        );
        // Worker B is called twice; a scripted model's script is the agent file's, not a run's.
        dir.write(
            "worker-b.json",
            &json!([
                {"tool_calls": [support::crash::call("b1", "write", "b-1")]},
                {"text": "B is done."},
                {"tool_calls": [support::crash::call("b2", "write", "b-2")]},
                {"text": "B is done again."}
            ])
            .to_string(),
        );
        let journal = dir.path("runs.db");
        let out = run_cmd(&dir, &journal).output().unwrap();
        exited(&out, 0, &format!("{level:?}"));
        let outcome = json_of(&out);
        assert_eq!(outcome["stop_reason"], "finished", "{level:?}");
        assert_eq!(outcome["output"], "All three are done.", "{level:?}");
        let calls = outcome["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 3, "{level:?}: {calls:?}");
        for c in calls {
            assert_eq!(c["status"], "ok", "{level:?}: {c}");
        }
        let written = runs(&dir, &journal);
        assert_eq!(written.len(), 4, "{level:?}: {written:?}");
        let (id, _) = top_and_running_children(&written);
        let mut children: Vec<String> = written
            .iter()
            .filter(|r| r["run_id"] != id.as_str())
            .map(|r| {
                assert_eq!(r["status"], "finished", "{level:?}: {r}");
                assert!(r["steps"].as_u64().unwrap() > 0, "{level:?}: {r}");
                r["run_id"].as_str().unwrap().to_owned()
            })
            .collect();
        children.sort();
        let mut wanted: Vec<String> = ["w:1", "w.1", long.as_str()]
            .iter()
            .map(|c| agentloop::journal::child_run_id(&id, c))
            .collect();
        wanted.sort();
        assert_eq!(children, wanted, "{level:?}");
    }
}

/// A dotted call id at one level and a call a level deeper whose ids joined the same way (the
/// lead's `x.y`, and worker A's `y` under the lead's `x`): each call's child is a run of its
/// own, and the second is not answered with the first's outcome.
#[test]
fn a_dotted_call_id_never_names_the_child_of_a_deeper_call() {
    let dir = tree_dir("");
    dir.write(
        "lead.json",
        &json!([
            {"tool_calls": [support::crash::task("x", "ask_a", "alpha")]},
            {"tool_calls": [support::crash::task("x.y", "ask_b", "beta")]},
            {"text": "Both workers are done."}
        ])
        .to_string(),
    );
    dir.write(
        "worker-a.toml",
        &format!(
            "{}[[tools]]\nname = \"ask_c\"\nagent = \"worker-c.toml\"\ndescription = \"Worker C.\"\n",
            support::crash::tree_worker("worker-a", "")
        ),
    );
    dir.write(
        "worker-a.json",
        &json!([
            {"tool_calls": [support::crash::task("y", "ask_c", "gamma")]},
            {"text": "A is done."}
        ])
        .to_string(),
    );
    dir.write(
        "worker-c.toml",
        &support::crash::tree_worker("worker-c", ""),
    );
    dir.write(
        "worker-c.json",
        &json!([
            {"tool_calls": [support::crash::call("c1", "write", "c-1")]},
            {"text": "C is done."}
        ])
        .to_string(),
    );
    let journal = dir.path("runs.db");
    let out = run_cmd(&dir, &journal).output().unwrap();
    exited(&out, 0, "the tree");
    let outcome = json_of(&out);
    assert_eq!(outcome["output"], "Both workers are done.");
    let calls = outcome["tool_calls"].as_array().unwrap();
    let dotted = calls.iter().find(|c| c["id"] == "x.y").unwrap();
    assert_eq!(dotted["status"], "ok", "{dotted}");
    assert_eq!(
        dotted["output"], "B is done.",
        "worker B answered: {dotted}"
    );
    let side = side_log(&dir);
    assert_eq!(
        side,
        [r#"write {"key":"c-1"}"#, r#"write {"key":"b-1"}"#],
        "each worker ran"
    );
    let written = runs(&dir, &journal);
    assert_eq!(written.len(), 4, "a run for each call: {written:#?}");
    assert!(
        written.iter().all(|r| r["status"] == "finished"),
        "{written:#?}"
    );
}
