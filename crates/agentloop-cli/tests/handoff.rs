#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Hand-offs through the command, on scripted models: a triage agent passes the conversation to
//! one of two specialists (billing, refunds), which answers for the run under the run's one
//! budget; a hand-off beside another call waits for a turn of its own; agents that hand off to
//! each other load and plan; and a journaled run killed inside the second agent resumes there.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::crash::{
    TOOL, call, check_against, exited, journal_runs, json_of, killed_at_fault, resume_json,
    side_log, top_and_running_children,
};
use support::*;

const TRIAGE: &str = r#"name = "triage"
description = "Sorts what the customer needs."
instructions = "Hand the customer to the right desk."
[model]
provider = "scripted"
script = "triage.json"
[limits]
max_turns = 8
[[handoffs]]
agent = "billing.toml"
[[handoffs]]
agent = "refunds.toml"
name = "to_refunds"
history = "last_user"
description = "Refunds of an order."
[[tools]]
name = "write"
command = ["sh", "tool.sh", "write"]
input_schema = { type = "object", properties = { key = { type = "string" } }, required = ["key"] }
"#;

/// A specialist with its own tools (`read`, idempotent, and `write`), its own limits, and a
/// hand-off back to triage (a cycle of files).
fn specialist(name: &str, description: &str) -> String {
    format!(
        r#"name = "{name}"
description = "{description}"
instructions = "You are the {name} desk."
[model]
provider = "scripted"
script = "{name}.json"
[limits]
max_turns = 30
[[handoffs]]
agent = "agent.toml"
[[tools]]
name = "read"
command = ["sh", "tool.sh", "read"]
input_schema = {{ type = "object", properties = {{ key = {{ type = "string" }} }}, required = ["key"] }}
idempotent = true
[[tools]]
name = "write"
command = ["sh", "tool.sh", "write"]
input_schema = {{ type = "object", properties = {{ key = {{ type = "string" }} }}, required = ["key"] }}
"#
    )
}

fn handoff(id: &str, tool: &str) -> Value {
    json!({"id": id, "name": tool, "arguments": {"reason": "their desk"}})
}

fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output})
}

/// Triage hands off with `triage` (its script); billing reads, writes, then answers; refunds
/// writes, then answers.
fn desk(triage: &Value) -> AgentDir {
    let dir = AgentDir::new(TRIAGE);
    dir.write("tool.sh", TOOL);
    dir.write(
        "billing.toml",
        &specialist("billing", "Invoices and charges."),
    );
    dir.write("refunds.toml", &specialist("refunds", "Money back."));
    dir.write("triage.json", &triage.to_string());
    dir.write(
        "billing.json",
        &json!([
            {"tool_calls": [call("b1", "read", "invoice-7")], "usage": usage(100, 10)},
            {"tool_calls": [call("b2", "write", "credit-7")], "usage": usage(120, 10)},
            {"text": "Billing: invoice 7 was charged twice; the second charge is credited.",
             "usage": usage(140, 20)}
        ])
        .to_string(),
    );
    dir.write(
        "refunds.json",
        &json!([
            {"tool_calls": [call("r1", "write", "refund-9")], "usage": usage(80, 10)},
            {"text": "Refunds: order 9 is refunded.", "usage": usage(90, 15)}
        ])
        .to_string(),
    );
    dir
}

fn to_billing() -> Value {
    json!([{"text": "Billing will help.", "tool_calls": [handoff("t1", "transfer_to_billing")],
            "usage": usage(50, 5)}])
}

async fn run(dir: &AgentDir, input: &str) -> std::process::Output {
    let agent = dir.agent();
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args(["run", agent.to_str().unwrap(), "--input", input, "--json"])
        .current_dir(dir.path("."))
        .stdin(Stdio::null());
    cmd.output().await.unwrap()
}

#[tokio::test]
async fn triage_hands_off_to_billing_which_answers_for_the_run_on_one_budget() {
    let dir = desk(&to_billing());
    let out = run(&dir, "I was charged twice for invoice 7.").await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished");
    assert_eq!(v["answered_by"], "billing");
    assert_eq!(
        v["output"],
        "Billing: invoice 7 was charged twice; the second charge is credited."
    );
    // One budget: triage's call and billing's three, in the run's totals.
    assert_eq!(v["model_calls"], 4);
    assert_eq!(v["usage"]["input_tokens"], 50 + 100 + 120 + 140);
    assert_eq!(v["usage"]["output_tokens"], 5 + 10 + 10 + 20);
    let subs = v["subagents"].as_array().unwrap();
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0]["agent"], "billing");
    assert_eq!(subs[0]["answered_by"], "billing");
    assert_eq!(subs[0]["tool"], "transfer_to_billing");
    assert_eq!(subs[0]["turns"], 3);
    // Billing ran its own tools: the side log has its read and its write.
    assert_eq!(
        side_log(&dir),
        [r#"read {"key":"invoice-7"}"#, r#"write {"key":"credit-7"}"#]
    );
    // Triage's transcript: the question, the hand-off, and billing's answer as its result.
    let t = v["transcript"].as_array().unwrap();
    assert_eq!(t.len(), 3, "{t:#?}");
    assert_eq!(t[1]["tool_calls"][0]["tool"], "transfer_to_billing");
    assert_eq!(t[2]["tool"], "transfer_to_billing");
}

#[tokio::test]
async fn triage_hands_off_to_refunds_which_sees_only_the_last_user_message() {
    let dir = desk(&json!([
        {"text": "Refunds will help.", "tool_calls": [handoff("t1", "to_refunds")]}
    ]));
    // A trace with payloads shows what refunds was sent.
    let trace = dir.path("trace.ndjson");
    let agent = dir.agent();
    let out = agentloop(args(&[
        "run",
        agent.to_str().unwrap(),
        "--input",
        "Please refund order 9.",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
        "--trace-payloads",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished");
    assert_eq!(v["answered_by"], "refunds");
    assert_eq!(v["output"], "Refunds: order 9 is refunded.");
    assert_eq!(side_log(&dir), [r#"write {"key":"refund-9"}"#]);
    // The trace holds both agents' runs: the child run of the hand-off under the top run.
    let text = std::fs::read_to_string(&trace).unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Each run's record as it ended (its record as it started comes first).
    let runs: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "run" && e["status"] != "running")
        .collect();
    let top = runs.iter().find(|r| r["agent"] == "triage").expect(&text);
    let refunds = runs.iter().find(|r| r["agent"] == "refunds").expect(&text);
    assert_eq!(refunds["parent_id"], top["id"], "{text}");
    // The top run's span says where the conversation went and who answered.
    assert_eq!(top["handoff"]["to"], "refunds", "{text}");
    assert_eq!(top["handoff"]["answered_by"], "refunds", "{text}");
    assert_eq!(top["handoff"]["call_id"], "t1", "{text}");
    assert_eq!(top["handoff"]["run_id"], refunds["id"], "{text}");
    assert_eq!(top["stop_reason"], "finished", "{text}");
    // The run's output is the answer of the agent handed to, as in --json.
    assert_eq!(top["output"], "Refunds: order 9 is refunded.", "{text}");
    assert_eq!(refunds["input"], "Please refund order 9.", "{text}");
    assert!(text.contains("to_refunds"), "{text}");
}

#[tokio::test]
async fn the_agent_handed_to_spends_what_the_run_has_left_not_its_own_limits() {
    // Triage may take 3 turns; it spends one handing off, so billing (30 turns of its own)
    // gets 2, and stops there: the run stops on its limit.
    let dir = desk(&to_billing());
    let text = std::fs::read_to_string(dir.agent()).unwrap();
    dir.write(
        "agent.toml",
        &text.replace("max_turns = 8", "max_turns = 3"),
    );
    let out = run(&dir, "I was charged twice.").await;
    let v = stdout_json(&out);
    assert_eq!(out.status.code(), Some(5), "{v:#}");
    assert_eq!(v["stop_reason"], "max_turns");
    assert_eq!(v["answered_by"], "billing");
    let subs = v["subagents"].as_array().unwrap();
    assert_eq!(subs[0]["stop_reason"], "max_turns");
    assert_eq!(
        subs[0]["turns"], 2,
        "what triage had left, not billing's 30"
    );
    assert_eq!(v["model_calls"], 3);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("billing took over the conversation and stopped"),
        "{v:#}"
    );
}

#[tokio::test]
async fn a_handoff_beside_another_call_waits_for_a_turn_of_its_own() {
    let dir = desk(&json!([
        {"tool_calls": [call("t1", "write", "note"), handoff("t2", "transfer_to_billing")]},
        {"tool_calls": [handoff("t3", "transfer_to_billing")]}
    ]));
    let out = run(&dir, "I was charged twice.").await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["answered_by"], "billing");
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["status"], "ok", "the other call ran: {calls:#?}");
    assert_eq!(calls[1]["status"], "rejected");
    assert_eq!(calls[1]["error"]["code"], "handoff.not_alone");
    assert_eq!(calls[2]["status"], "ok");
    assert_eq!(v["subagents"].as_array().unwrap().len(), 1);
    assert_eq!(side_log(&dir)[0], r#"write {"key":"note"}"#);
}

#[tokio::test]
async fn an_agent_that_answers_itself_names_itself() {
    let dir = desk(&json!([{"text": "You are welcome."}]));
    let out = run(&dir, "Thanks!").await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["answered_by"], "triage");
    assert!(v["subagents"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn plan_shows_the_handoffs_and_files_that_hand_off_to_each_other_load_once() {
    // billing and refunds hand back to triage: a cycle, loaded without recursing.
    let dir = desk(&to_billing());
    let agent = dir.agent();
    let out = agentloop(args(&["plan", agent.to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    let h = v["handoffs"].as_array().unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h[0]["tool"], "transfer_to_billing");
    assert_eq!(h[0]["agent"], "billing");
    assert_eq!(h[0]["history"], "all");
    assert!(
        h[0]["description"]
            .as_str()
            .unwrap()
            .contains("Invoices and charges."),
        "{h:#?}"
    );
    assert_eq!(h[1]["tool"], "to_refunds");
    assert_eq!(h[1]["history"], "last_user");
    assert_eq!(h[1]["description"], "Refunds of an order.");
    let text = stdout(&agentloop(args(&["plan", agent.to_str().unwrap()])).await);
    assert!(
        text.contains("handoffs\n        transfer_to_billing -> billing"),
        "{text}"
    );

    // A hand-off to a file that is not there is refused at load, at its line.
    dir.write(
        "agent.toml",
        &TRIAGE.replace("refunds.toml", "nowhere.toml"),
    );
    let out = agentloop(args(&["plan", agent.to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("handoffs[1].agent") && err.contains("nowhere.toml"),
        "{err}"
    );
}

fn run_journaled(dir: &AgentDir, journal: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args([
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "I was charged twice for invoice 7.",
        "--json",
        "--journal",
        journal.to_str().unwrap(),
    ])
    .current_dir(dir.path("."))
    .stdin(Stdio::null());
    cmd
}

#[test]
fn a_run_killed_inside_the_agent_handed_to_resumes_there() {
    let base_dir = desk(&to_billing());
    let base_journal = base_dir.path("runs.db");
    let out = run_journaled(&base_dir, &base_journal).output().unwrap();
    exited(&out, 0, "the uninterrupted run");
    let base = json_of(&out);
    assert_eq!(base["answered_by"], "billing");
    let base_transcript = base["transcript"].as_array().unwrap().clone();
    let base_runs = journal_runs(&base_dir, &base_journal);
    assert_eq!(
        base_runs.len(),
        2,
        "triage's run and billing's: {base_runs:#?}"
    );
    let total: u64 = base_runs.iter().map(|r| r["steps"].as_u64().unwrap()).sum();

    let mut inside = 0;
    for n in 0..total {
        let fault = format!("after-write:{n}");
        let dir = desk(&to_billing());
        let journal = dir.path("runs.db");
        let mut cmd = run_journaled(&dir, &journal);
        cmd.env("AGENTLOOP_TEST_JOURNAL_FAULT", &fault);
        assert!(killed_at_fault(cmd), "{fault}: reached");
        let (top, running) = top_and_running_children(&journal_runs(&dir, &journal));
        inside += running;
        let out = resume_json(&dir, &journal, &top);
        exited(&out, 0, &fault);
        let resumed = json_of(&out);
        assert_eq!(resumed["stop_reason"], "finished", "{fault}");
        assert_eq!(resumed["answered_by"], "billing", "{fault}");
        assert_eq!(resumed["output"], base["output"], "{fault}");
        assert_eq!(
            resumed["usage"], base["usage"],
            "{fault}: nothing spent twice"
        );
        assert_eq!(resumed["model_calls"], base["model_calls"], "{fault}");
        // No finished call of either agent ran twice.
        check_against(
            &base_transcript,
            resumed["transcript"].as_array().unwrap(),
            &side_log(&dir),
            &fault,
        );
        let after = journal_runs(&dir, &journal);
        assert_eq!(
            after.len(),
            2,
            "{fault}: billing's run was not started twice"
        );
        assert!(after.iter().all(|r| r["status"] == "finished"), "{fault}");
    }
    assert!(inside > 0, "some kill landed inside billing's run");
}

#[tokio::test]
async fn the_example_desk_hands_a_double_charge_to_billing_which_reads_the_invoice() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/handoff/agent.toml"
    );
    let out = agentloop(args(&[
        "run",
        example,
        "--input",
        "I was charged twice for invoice 7.",
        "--json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["answered_by"], "billing");
    assert!(
        v["output"]
            .as_str()
            .unwrap()
            .starts_with("Invoice 7 was charged twice"),
        "{v}"
    );
    let billing = &v["subagents"][0];
    assert_eq!(billing["agent"], "billing", "{v}");
    assert_eq!(billing["tool_calls"], 1, "{v}");
    assert_eq!(billing["stop_reason"], "finished", "{v}");
    // One budget: triage's turn and billing's two are the run's tokens.
    assert_eq!(v["usage"]["input_tokens"], 180 + 210 + 290, "{v}");
    let plan = agentloop(args(&["plan", example, "--json"])).await;
    assert_eq!(plan.status.code(), Some(0), "{}", stderr(&plan));
    assert_eq!(stdout_json(&plan)["handoffs"].as_array().unwrap().len(), 2);
}
