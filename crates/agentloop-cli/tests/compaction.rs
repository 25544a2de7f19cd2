#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Compaction through the command: an agent file with a small `context_tokens` compacts its
//! conversation by summary, `--json` reports it, the trace records it with what was replaced, and
//! the session store keeps the full history beside the compacted transcript; a journaled run
//! killed at any step, a summary's among them, resumes to the same summaries.

mod support;

use std::process::{Command, Stdio};

use serde_json::Value;
use support::crash;
use support::*;

const AGENT: &str = r#"name = "reader"
instructions = "Read pages."

[model]
provider = "scripted"
script = "s.json"
context_tokens = 1000
max_tokens = 100
compaction_keep_turns = 1

[[tools]]
name = "page"
description = "A page of text."
command = ["python3", "-c", "print('x' * 1500)"]
input_schema = { type = "object", properties = { n = { type = "integer" } } }
"#;

/// Two pages, a summary, a third page, a summary, an answer: each summary comes where the request
/// (about 530 tokens a page) would pass the budget of 900.
const SCRIPT: &str = r#"[
  {"tool_calls": [{"id": "c1", "name": "page", "arguments": {"n": 1}}]},
  {"tool_calls": [{"id": "c2", "name": "page", "arguments": {"n": 2}}]},
  {"text": "Read page one: all x."},
  {"tool_calls": [{"id": "c3", "name": "page", "arguments": {"n": 3}}]},
  {"text": "Read pages one and two: all x."},
  {"text": "Three pages of x."}
]"#;

fn command(dir: &AgentDir, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(args)
        .current_dir(dir.path("."))
        .env_remove("AGENTLOOP_SESSIONS")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_small_context_budget_compacts_by_summary_and_keeps_the_full_history() {
    let dir = AgentDir::new(AGENT);
    dir.write("s.json", SCRIPT);
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();

    let plan = command(&dir, &["plan", agent, "--json"]);
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan["model"]["compaction"]["context_tokens"], 1000);
    assert_eq!(plan["model"]["compaction"]["budget"], 900);
    assert_eq!(plan["model"]["compaction"]["policy"], "summarize");

    let out = command(
        &dir,
        &[
            "run",
            agent,
            "--input",
            "read three pages",
            "--json",
            "--session",
            "s",
            "--trace",
            "t.db",
            "--trace-payloads",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["output"], "Three pages of x.");
    let compactions = body["compactions"].as_array().unwrap();
    assert_eq!(compactions.len(), 2, "{body:#}");
    assert_eq!(compactions[0]["policy"], "summarize");
    assert_eq!(compactions[0]["summary"], "Read page one: all x.");
    assert_eq!(compactions[0]["messages_replaced"], 3);
    assert!(compactions[0]["tokens_after"].as_u64() < compactions[0]["tokens_before"].as_u64());
    // The summary of the second compaction replaced the first summary and page two.
    assert_eq!(compactions[1]["messages_replaced"], 3);
    let transcript = body["transcript"].as_array().unwrap();
    assert_eq!(transcript.len(), 4, "{transcript:#?}");
    assert!(
        transcript[0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Read pages one and two")
    );
    assert_eq!(transcript[1]["tool_calls"][0]["call_id"], "c3");

    // The store keeps the compacted transcript for the next turn, and the whole history.
    let show = command(&dir, &["sessions", "show", "s", "--json"]);
    let session: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(session["messages"].as_array().unwrap().len(), 4);
    let history = session["history"].as_array().unwrap();
    assert_eq!(history.len(), 8, "{history:#?}");
    assert_eq!(history[0]["content"][0]["text"], "read three pages");
    let calls: Vec<&str> = history
        .iter()
        .filter_map(|m| m["tool_calls"][0]["call_id"].as_str())
        .collect();
    assert_eq!(calls, ["c1", "c2", "c3"]);
    let text = stdout(&command(&dir, &["sessions", "show", "s"]));
    assert!(text.contains("read three pages"), "{text}");
    assert!(
        text.contains("(compacted: the next turn sends 4 messages"),
        "{text}"
    );

    // The trace has each compaction under its turn, with what it replaced.
    let trace = command(&dir, &["trace", "show", "t.db", "--json"]);
    assert_eq!(trace.status.code(), Some(0), "{}", stderr(&trace));
    let trace: Value = serde_json::from_slice(&trace.stdout).unwrap();
    let found: Vec<&Value> = trace["turns"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["compactions"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(found.len(), 2, "{trace:#}");
    assert_eq!(found[0]["summary"], "Read page one: all x.");
    assert_eq!(
        found[0]["replaced"][0]["content"][0]["text"],
        "read three pages"
    );
    let shown = stdout(&command(&dir, &["trace", "show", "t.db"]));
    assert!(
        shown.contains("compaction summarize: 3 messages"),
        "{shown}"
    );
}

#[test]
fn compaction_off_and_bad_budgets_are_read_from_the_file() {
    let dir = AgentDir::new(&AGENT.replace(
        "compaction_keep_turns = 1",
        "compaction_keep_turns = 1\ncompaction = \"off\"",
    ));
    dir.write("s.json", SCRIPT);
    let agent = dir.agent();
    let plan = command(&dir, &["plan", agent.to_str().unwrap(), "--json"]);
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert!(plan["model"]["compaction"].is_null(), "{plan:#}");

    let bad = AgentDir::new(&AGENT.replace("context_tokens = 1000", "context_tokens = 90"));
    bad.write("s.json", SCRIPT);
    let out = command(&bad, &["plan", bad.agent().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("context_tokens"), "{}", stderr(&out));
}

/// A journaled run that compacts by summary, killed after any step or inside any write (a
/// summary's answer among them) and resumed: it ends as the uninterrupted run did, the same
/// summaries in the same places, the same answer and counts. The page tool is idempotent here,
/// so a page read at the kill is read again and the conversation is the same size.
#[test]
fn a_compacting_run_killed_at_any_step_resumes_to_the_same_summaries_and_answer() {
    let agent = AGENT.replace(
        "input_schema = { type = \"object\", properties = { n = { type = \"integer\" } } }\n",
        "input_schema = { type = \"object\", properties = { n = { type = \"integer\" } } }\n\
         idempotent = true\n",
    );
    assert_ne!(agent, AGENT);
    let fresh = || {
        let dir = AgentDir::new(&agent);
        dir.write("s.json", SCRIPT);
        dir
    };
    let run = |dir: &AgentDir| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
        cmd.args(["run", "agent.toml", "--input", "read three pages", "--json"])
            .args(["--journal", "runs.db"])
            .current_dir(dir.path("."))
            .env_remove("AGENTLOOP_SESSIONS")
            .stdin(Stdio::null());
        cmd
    };
    let base_dir = fresh();
    let base: Value = serde_json::from_slice(&run(&base_dir).output().unwrap().stdout).unwrap();
    assert_eq!(base["compactions"].as_array().unwrap().len(), 2, "{base:#}");
    let steps = crash::journal_runs(&base_dir, &base_dir.path("runs.db"))[0]["steps"]
        .as_u64()
        .unwrap();
    let mut summaries_cut = 0;
    for n in 0..steps {
        for fault in [format!("after-step:{n}"), format!("in-step:{n}")] {
            let dir = fresh();
            let mut cmd = run(&dir);
            cmd.env("AGENTLOOP_TEST_JOURNAL_FAULT", &fault);
            assert!(crash::killed_at_fault(cmd), "{fault}");
            let journal = dir.path("runs.db");
            let listed = &crash::journal_runs(&dir, &journal)[0];
            if listed["status"] == "finished" {
                continue;
            }
            let id = listed["run_id"].as_str().unwrap();
            let shown = command(
                &dir,
                &["journal", "show", id, "--journal", "runs.db", "--json"],
            );
            let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
            // A kill whose journal ends with a summary's answer, or inside the write of one.
            let answers = shown["steps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["input"] == "model_responded")
                .count();
            summaries_cut += usize::from(answers == 3 || answers == 5);
            let out = crash::resume_json(&dir, &journal, id);
            crash::exited(&out, 0, &fault);
            let resumed = crash::json_of(&out);
            for key in [
                "stop_reason",
                "output",
                "usage",
                "turns",
                "model_calls",
                "transcript",
                "compactions",
            ] {
                assert_eq!(resumed[key], base[key], "{fault}: {key}");
            }
        }
    }
    assert!(summaries_cut > 0, "some kill landed on a summary's step");
}
