#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The model's questions (`ask_user`) on Restate, against a real Restate server
//! (`scripts/restate/`) with scripted models: a question that waits on an awakeable across a
//! worker restart, listed by `questions list --restate` and answered from another process by
//! `agentloop answer --restate` (a wrong answer refused before anything is resolved); a batch
//! of two questions and an approval answered in any order; a subagent's question; a question
//! refused through Restate's own API.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::crash::{cli, exited, side_log};
use support::questions::*;
use support::restate::*;
use support::*;

/// Waits until run `id` waits on exactly these calls (sorted); what `approvals list` showed.
fn wait_for(dir: &AgentDir, server: &Server, id: &str, calls: &[&str]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting = listed(dir, server, "approvals", id);
        let mut ids: Vec<&str> = waiting
            .iter()
            .map(|w| w["call_id"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        if ids == calls {
            return waiting;
        }
        assert!(
            Instant::now() < deadline,
            "the run never waited on {calls:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `agentloop answer ID --call C --json JSON --restate URL`.
fn answer(
    dir: &AgentDir,
    server: &Server,
    id: &str,
    call: &str,
    json: &str,
) -> std::process::Output {
    cli(
        dir,
        &[
            "answer",
            id,
            "--call",
            call,
            "--json",
            json,
            "--restate",
            &server.ingress,
        ],
    )
}

#[test]
fn a_question_waits_across_a_worker_restart_and_is_answered_from_another_process() {
    let server = Server::start();
    let dir = one_question_dir();
    let addr = free_addr();
    let a = worker(&dir, &server, addr, true, None);
    let id = submit_id(&dir, &server, "asks");
    let watch = watch(&dir, &server, &id);
    wait_for(&dir, &server, &id, &["q1"]);
    let questions = listed(&dir, &server, "questions", &id);
    assert_eq!(questions.len(), 1, "{questions:?}");
    assert_eq!(questions[0]["run_id"], id.as_str());
    assert_eq!(questions[0]["question"]["text"], "Which colour?");
    assert_eq!(
        questions[0]["question"]["schema"],
        json!({"enum": ["red", "green"]})
    );
    let awakeable = news(&server, &id)["approvals"][0]["awakeable"].clone();
    assert!(awakeable.is_string(), "{awakeable}");

    // The worker that ran the run dies while it waits; another starts at its address.
    drop(a);
    let _b = worker(&dir, &server, addr, false, None);

    // A wrong answer is refused before anything is resolved: the run waits on the same
    // awakeable. So is `approve` on a question, and `answer` of a call the run does not wait on.
    let wrong = answer(&dir, &server, &id, "q1", "\"blue\"");
    exited(&wrong, 2, "a wrong answer");
    assert!(
        stderr(&wrong).contains("answer.invalid"),
        "{}",
        stderr(&wrong)
    );
    let approve = cli(
        &dir,
        &[
            "approve",
            &id,
            "--call",
            "q1",
            "--allow",
            "--restate",
            &server.ingress,
        ],
    );
    exited(&approve, 2, "approve on a question");
    assert!(
        stderr(&approve).contains("agentloop answer"),
        "{}",
        stderr(&approve)
    );
    let none = answer(&dir, &server, &id, "q9", "\"red\"");
    assert!(
        stderr(&none).contains("waits on no approval or question of call q9"),
        "{}",
        stderr(&none)
    );
    assert_ne!(none.status.code(), Some(0));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(news(&server, &id)["approvals"][0]["awakeable"], awakeable);

    exited(
        &answer(&dir, &server, &id, "q1", "\"green\""),
        0,
        "the answer",
    );
    let out = watch.wait_with_output().unwrap();
    exited(&out, 0, "attach");
    let outcome = stdout_json(&out);
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    assert_eq!(outcome["output"], "Painting it.");
    let q1 = call(&outcome, "q1");
    assert_eq!(q1["status"], "ok", "{q1}");
    assert_eq!(q1["output"], "green", "{q1}");
    assert!(listed(&dir, &server, "questions", &id).is_empty());
}

#[test]
fn a_batch_of_two_questions_and_an_approval_is_answered_in_any_order() {
    let server = Server::start();
    let dir = batch_dir();
    let _w = worker(&dir, &server, free_addr(), true, None);
    let id = submit_id(&dir, &server, "batch");
    let waiting = wait_for(&dir, &server, &id, &["q1", "q2", "w1"]);
    let asked = |call: &str| waiting.iter().find(|w| w["call_id"] == call).unwrap();
    assert_eq!(asked("q2")["question"]["text"], "How many coats?");
    assert!(asked("w1").get("question").is_none(), "{waiting:?}");
    assert_eq!(listed(&dir, &server, "questions", &id).len(), 2);
    assert!(side_log(&dir).is_empty(), "no tool of the batch ran");

    // Answered in another order than asked; the run waits until all are.
    exited(
        &answer(&dir, &server, &id, "q2", "0"),
        2,
        "0 coats is below the minimum",
    );
    exited(&answer(&dir, &server, &id, "q2", "2"), 0, "q2");
    let not_a_question = answer(&dir, &server, &id, "w1", "true");
    exited(&not_a_question, 2, "answer on an approval");
    assert!(
        stderr(&not_a_question).contains("agentloop approve"),
        "{}",
        stderr(&not_a_question)
    );
    exited(
        &cli(
            &dir,
            &[
                "approve",
                &id,
                "--call",
                "w1",
                "--allow",
                "--restate",
                &server.ingress,
            ],
        ),
        0,
        "w1",
    );
    exited(&answer(&dir, &server, &id, "q1", "\"red\""), 0, "q1");

    let outcome = attach(&dir, &server, &id);
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    assert_eq!(call(&outcome, "q1")["output"], "red");
    assert_eq!(call(&outcome, "q2")["output"], 2);
    assert_eq!(call(&outcome, "w1")["status"], "ok");
    assert_eq!(
        side_log(&dir),
        [r#"write {"key":"x"}"#],
        "the write ran once"
    );
}

#[test]
fn a_subagents_question_suspends_the_tree_on_restate_and_is_answered_there() {
    let server = Server::start();
    let dir = tree_dir();
    let _w = worker(&dir, &server, free_addr(), true, None);
    let id = submit_id(&dir, &server, "tree");
    let waiting = wait_for(&dir, &server, &id, &["p1/a1"]);
    assert_eq!(waiting[0]["question"]["text"], "Which colour?");
    assert_eq!(waiting[0]["agent"], "lead/helper");
    let text = cli(
        &dir,
        &[
            "questions",
            "list",
            "--restate",
            &server.ingress,
            "--run",
            &id,
        ],
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("(lead/helper)"),
        "its place in the tree: {text}"
    );
    // `attach` (not --json) shows the question and how to answer it.
    let mut shown = Command::new(bin())
        .args(["attach", &id, "--restate", &server.ingress])
        .current_dir(dir.path("."))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(shown.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok);
    let how = lines
        .by_ref()
        .find(|l| l.contains("agentloop answer"))
        .expect("attach shows the question");
    assert!(how.contains("\"Which colour?\""), "{how}");
    assert!(
        how.contains(&format!("answer {id} --call p1/a1 --json JSON")),
        "{how}"
    );
    exited(
        &answer(&dir, &server, &id, "p1/a1", "\"red\""),
        0,
        "the answer",
    );
    // Read to its end, so that `attach` never writes to a closed pipe.
    let rest: Vec<String> = lines.collect();
    assert_eq!(shown.wait().unwrap().code(), Some(0), "attach: {rest:?}");
    let outcome = attach(&dir, &server, &id);
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    assert_eq!(outcome["output"], "The helper painted.");
    assert_eq!(call(&outcome, "p1")["output"], "Painted it.");
}

#[test]
fn a_question_whose_awakeable_is_rejected_through_restate_is_refused_and_the_run_goes_on() {
    let server = Server::start();
    let dir = one_question_dir();
    let _w = worker(&dir, &server, free_addr(), true, None);
    let id = submit_id(&dir, &server, "refused");
    wait_for(&dir, &server, &id, &["q1"]);
    let awakeable = news(&server, &id)["approvals"][0]["awakeable"]
        .as_str()
        .unwrap()
        .to_owned();
    reject(&server, &awakeable);
    let outcome = attach(&dir, &server, &id);
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    let q1 = call(&outcome, "q1");
    assert_eq!(q1["status"], "denied", "{q1}");
    assert!(q1.to_string().contains("declined to answer"), "{q1}");
}
