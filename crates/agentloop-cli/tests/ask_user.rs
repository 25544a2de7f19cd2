#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The `ask_user` built-in through the command, with a scripted model: a question answered at a
//! terminal (a real pseudo-terminal, driven by python's `pty`), the same question suspending a
//! journaled run and answered from another process, and a parallel batch of two questions and
//! an approval, surfaced together and answered in any order.

mod support;

use serde_json::{Value, json};
use support::crash::{cli, exited, json_of, side_log};
use support::questions::*;
use support::*;

/// `agentloop run` of the agent on "go", with these flags, stdin not a terminal.
fn run(dir: &AgentDir, flags: &[&str]) -> std::process::Output {
    let agent = dir.agent();
    let mut args = vec!["run", agent.to_str().unwrap(), "--input", "go"];
    args.extend_from_slice(flags);
    cli(dir, &args)
}

/// The trace's events of one call.
fn traced(dir: &AgentDir, trace: &str, call_id: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.path(trace))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e.to_string().contains(&format!("\"{call_id}\"")))
        .collect()
}

#[test]
fn a_question_is_asked_at_the_terminal_and_a_wrong_answer_asks_again() {
    let dir = one_question_dir();
    let agent = dir.agent();
    let out = in_terminal(
        &dir,
        &["one of: red", "blue", "not an answer", "green"],
        &[
            "run",
            agent.to_str().unwrap(),
            "--input",
            "paint the fence",
            "--trace",
            "t.ndjson",
            "--trace-payloads",
        ],
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}\n{}", stderr(&out));
    assert!(
        shown.contains("the agent asks [q1]: Which colour?"),
        "{shown}"
    );
    assert_eq!(shown.matches("not an answer").count(), 1, "{shown}");
    assert!(shown.contains("Painting it."), "{shown}");
    // The question and the answer are in the trace (payloads were asked for).
    let events = traced(&dir, "t.ndjson", "q1");
    let text = serde_json::to_string(&events).unwrap();
    assert!(text.contains("Which colour?"), "{text}");
    assert!(text.contains("green"), "{text}");
    assert!(!text.contains("blue"), "only the accepted answer: {text}");
}

#[test]
fn a_form_is_asked_at_the_terminal_field_by_field() {
    let form = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "coats": {"type": "integer", "minimum": 1},
            "colour": {"enum": ["red", "green"]}
        },
        "required": ["name", "coats"]
    });
    let dir = AgentDir::new(ONE_QUESTION);
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [question("q1", "The job?", form)]},
            {"text": "Booked."}
        ])
        .to_string(),
    );
    let agent = dir.agent();
    let out = in_terminal(
        &dir,
        &[
            "name: text >",
            "Ada",
            "coats: a whole number >",
            "0",
            "coats: a whole number >",
            "2",
            "colour: one of: red · green, empty to skip >",
            "",
        ],
        &[
            "run",
            agent.to_str().unwrap(),
            "--input",
            "book a painter",
            "--trace",
            "t.ndjson",
            "--trace-payloads",
        ],
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}\n{}", stderr(&out));
    assert!(shown.contains("the agent asks [q1]: The job?"), "{shown}");
    assert_eq!(shown.matches("not an answer").count(), 1, "{shown}");
    assert!(shown.contains("Booked."), "{shown}");
    let ended: Vec<Value> = traced(&dir, "t.ndjson", "q1")
        .into_iter()
        .filter(|e| e["status"] == "ok")
        .map(|e| e["output"].clone())
        .collect();
    assert_eq!(
        ended,
        [json!({"name": "Ada", "coats": 2})],
        "the form's answer"
    );
}

#[test]
fn a_suspended_question_is_answered_from_another_process_checked_against_its_schema() {
    let dir = one_question_dir();
    let out = run(
        &dir,
        &["--json", "--journal", "runs.db", "--trace", "t.ndjson"],
    );
    exited(&out, 8, "the run suspends on the question");
    let suspended = json_of(&out);
    assert_eq!(suspended["stop_reason"], "suspended");
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    let pending = suspended["pending_approvals"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["call_id"], "q1");
    assert_eq!(pending[0]["question"]["text"], "Which colour?");

    let listed = json_of(&cli(&dir, &["questions", "list", "--json"]));
    assert_eq!(listed[0]["run_id"], id.as_str());
    assert_eq!(listed[0]["call_id"], "q1");
    assert_eq!(
        listed[0]["question"]["schema"],
        json!({"enum": ["red", "green"]})
    );
    assert_eq!(listed[0]["answer"], Value::Null);

    // A wrong answer is a clear error and records nothing; so is a text that is not JSON.
    let wrong = cli(&dir, &["answer", &id, "--call", "q1", "--json", "\"blue\""]);
    exited(&wrong, 2, "a wrong answer");
    assert!(
        stderr(&wrong).contains("answer.invalid"),
        "{}",
        stderr(&wrong)
    );
    let bare = cli(&dir, &["answer", &id, "--call", "q1", "--json", "green"]);
    exited(&bare, 2, "an answer that is not JSON");
    assert!(stderr(&bare).contains("not JSON"), "{}", stderr(&bare));
    let listed = json_of(&cli(&dir, &["questions", "list", "--json"]));
    assert_eq!(listed[0]["answer"], Value::Null, "nothing was recorded");
    // `approve` is for approvals: it sends a question to `answer`.
    let approve = cli(&dir, &["approve", &id, "--call", "q1", "--allow"]);
    exited(&approve, 2, "approve on a question");
    assert!(
        stderr(&approve).contains("agentloop answer"),
        "{}",
        stderr(&approve)
    );

    let ok = cli(
        &dir,
        &["answer", &id, "--call", "q1", "--json", "\"green\""],
    );
    exited(&ok, 0, "the answer");
    let text = String::from_utf8_lossy(&cli(&dir, &["approvals", "list"]).stdout).to_string();
    assert!(text.contains("answered \"green\""), "{text}");

    let out = cli(&dir, &["resume", &id, "--json", "--trace", "t.ndjson"]);
    exited(&out, 0, "the resumed run");
    let resumed = json_of(&out);
    assert_eq!(resumed["stop_reason"], "finished");
    assert_eq!(resumed["output"], "Painting it.");
    let q1 = call(&resumed, "q1");
    assert_eq!(q1["status"], "ok", "{q1}");
    assert_eq!(q1["output"], "green", "{q1}");
    // Without --trace-payloads the trace shows the question's call, not what was said.
    let text = serde_json::to_string(&traced(&dir, "t.ndjson", "q1")).unwrap();
    assert!(text.contains("ask_user"), "{text}");
    assert!(
        !text.contains("Which colour?") && !text.contains("green"),
        "{text}"
    );
}

#[test]
fn a_batch_of_two_questions_and_an_approval_suspends_once_and_is_answered_in_any_order() {
    let dir = batch_dir();
    // Without --json, and with no terminal to ask at: the run suspends and says how to go on.
    let out = run(&dir, &["--journal", "runs.db"]);
    exited(&out, 8, "the run suspends");
    let how = stderr(&out);
    assert!(how.contains("agentloop answer"), "{how}");
    assert!(how.contains("agentloop approve"), "{how}");
    assert!(how.contains("question \"Which colour?\""), "{how}");
    let pending = json_of(&cli(&dir, &["approvals", "list", "--json"]));
    let id = pending[0]["run_id"].as_str().unwrap().to_owned();
    let mut waiting: Vec<&str> = pending
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["call_id"].as_str().unwrap())
        .collect();
    waiting.sort_unstable();
    assert_eq!(waiting, ["q1", "q2", "w1"], "all three, together");
    assert!(side_log(&dir).is_empty(), "no tool of the batch ran");

    // `approvals list` shows the questions beside the approval; `questions list` only them.
    let listed = String::from_utf8_lossy(&cli(&dir, &["approvals", "list"]).stdout).to_string();
    assert!(listed.contains("question \"How many coats?\""), "{listed}");
    assert!(listed.contains("w1  waiting  write"), "{listed}");
    let questions = json_of(&cli(&dir, &["questions", "list", "--json"]));
    assert_eq!(questions.as_array().unwrap().len(), 2, "{questions}");

    // Answered in another order than asked; the run waits until all are.
    let zero = cli(&dir, &["answer", &id, "--call", "q2", "--json", "0"]);
    exited(&zero, 2, "0 coats is below the schema's minimum");
    exited(
        &cli(&dir, &["answer", &id, "--call", "q2", "--json", "2"]),
        0,
        "q2",
    );
    exited(
        &cli(&dir, &["approve", &id, "--call", "w1", "--allow"]),
        0,
        "w1",
    );
    let early = cli(&dir, &["resume", &id]);
    exited(&early, 9, "a resume while q1 waits");
    assert!(stderr(&early).contains("q1"), "{}", stderr(&early));
    exited(
        &cli(&dir, &["answer", &id, "--call", "q1", "--json", "\"red\""]),
        0,
        "q1",
    );

    let out = cli(&dir, &["resume", &id, "--json"]);
    exited(&out, 0, "the resumed run");
    let resumed = json_of(&out);
    assert_eq!(resumed["stop_reason"], "finished");
    assert_eq!(call(&resumed, "q1")["output"], "red");
    assert_eq!(call(&resumed, "q2")["output"], 2);
    assert_eq!(call(&resumed, "w1")["status"], "ok");
    assert_eq!(
        side_log(&dir),
        [r#"write {"key":"x"}"#],
        "the approved write ran once"
    );
    // The model read both answers.
    let transcript = serde_json::to_string(&resumed["transcript"]).unwrap();
    assert!(transcript.contains("red"), "{transcript}");
}

#[test]
fn without_a_terminal_or_a_journal_the_model_reads_that_nobody_answered() {
    let dir = one_question_dir();
    let out = run(&dir, &["--json"]);
    exited(&out, 0, "the run goes on");
    let outcome = json_of(&out);
    let q1 = call(&outcome, "q1");
    assert_eq!(q1["status"], "denied", "{q1}");
    assert!(q1.to_string().contains("nobody can answer"), "{q1}");
}

#[test]
fn a_subagents_question_suspends_the_tree_is_listed_with_its_place_and_answered_there() {
    let dir = tree_dir();
    let out = run(&dir, &["--json", "--journal", "runs.db"]);
    exited(&out, 8, "the tree suspends on the helper's question");
    let suspended = json_of(&out);
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    let pending = suspended["pending_approvals"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["call_id"], "p1/a1");
    assert_eq!(pending[0]["question"]["text"], "Which colour?");

    // Listed once, on the top run, with its place in the tree.
    let listed = json_of(&cli(&dir, &["questions", "list", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["run_id"], id.as_str());
    assert_eq!(listed[0]["call_id"], "p1/a1");
    let text = String::from_utf8_lossy(&cli(&dir, &["questions", "list"]).stdout).into_owned();
    assert!(text.contains("question \"Which colour?\""), "{text}");
    assert!(
        text.contains("(lead/helper)"),
        "its place in the tree: {text}"
    );

    let wrong = cli(
        &dir,
        &["answer", &id, "--call", "p1/a1", "--json", "\"blue\""],
    );
    exited(&wrong, 2, "a wrong answer");
    assert!(
        stderr(&wrong).contains("answer.invalid"),
        "{}",
        stderr(&wrong)
    );
    exited(
        &cli(
            &dir,
            &["answer", &id, "--call", "p1/a1", "--json", "\"red\""],
        ),
        0,
        "the answer",
    );
    let out = cli(
        &dir,
        &[
            "resume",
            &id,
            "--json",
            "--trace",
            "t.ndjson",
            "--trace-payloads",
        ],
    );
    exited(&out, 0, "the tree goes on to its end");
    let done = json_of(&out);
    assert_eq!(done["stop_reason"], "finished", "{done}");
    assert_eq!(done["output"], "The helper painted.");
    let helper = &done["subagents"][0];
    assert_eq!(helper["stop_reason"], "finished", "{helper}");
    assert_eq!(call(&done, "p1")["output"], "Painted it.");
    // The helper's question was answered with the answer given.
    let ended: Vec<Value> = traced(&dir, "t.ndjson", "a1")
        .into_iter()
        .filter(|e| e["call_id"] == "a1" && e["status"] == "ok")
        .map(|e| e["output"].clone())
        .collect();
    assert_eq!(ended, [json!("red")], "the helper's a1");
}
