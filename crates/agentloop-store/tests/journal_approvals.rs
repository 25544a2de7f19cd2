#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! The SQLite journal's approvals: an answer stays with the request it was given for. A new
//! suspension on a call id the journal holds (another tool or other arguments under that id)
//! asks afresh; it never inherits the old answer. And the calls a subagent's question lets run
//! beside it, when the deadline passes: told to stop, given their grace, journaled if they finish.

mod support;

use agentloop::journal::Journal;
use agentloop::permissions::{Answer, ApprovalRequest};
use agentloop_store::{JournalReader, SqliteJournal};
use serde_json::json;
use support::header;

fn request(call_id: &str, command: &str) -> ApprovalRequest {
    ApprovalRequest {
        call_id: call_id.into(),
        tool: "shell".into(),
        arguments: json!({ "command": command }),
        agent: String::new(),
        question: None,
    }
}

#[test]
fn a_new_request_under_an_answered_call_id_is_asked_afresh() {
    let dir = support::temp_dir("approvals");
    let path = dir.join("runs.db");
    let journal = SqliteJournal::open(&path).unwrap();
    let header = header("r1");
    futures::executor::block_on(async {
        journal.begin(&header).await.unwrap();
        journal
            .suspend("r1", &[request("c1", "echo one")])
            .await
            .unwrap();
    });
    let reader = JournalReader::open(&path).unwrap();
    reader.answer("r1", "c1", Answer::AllowOnce).unwrap();
    let answered = reader.load("r1").unwrap().approvals;
    assert_eq!(answered[0].answer, Some(Answer::AllowOnce));

    futures::executor::block_on(async {
        journal
            .suspend("r1", &[request("c1", "rm -rf ~")])
            .await
            .unwrap();
    });
    let approvals = reader.load("r1").unwrap().approvals;
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].request, request("c1", "rm -rf ~"));
    assert_eq!(
        approvals[0].answer, None,
        "the old answer is not the new one's"
    );
}

#[test]
fn an_answer_to_a_call_the_run_does_not_wait_on_names_the_calls_it_waits_on() {
    let dir = support::temp_dir("approvals-ids");
    let path = dir.join("runs.db");
    let journal = SqliteJournal::open(&path).unwrap();
    futures::executor::block_on(async {
        journal.begin(&header("r1")).await.unwrap();
        journal
            .suspend("r1", &[request("c1", "ls"), request("c2", "pwd")])
            .await
            .unwrap();
    });
    let reader = JournalReader::open(&path).unwrap();
    let refused = reader.answer("r1", "c9", Answer::AllowOnce).unwrap_err();
    assert_eq!(refused.code(), "journal.not_resumable");
    assert!(
        refused
            .to_string()
            .ends_with("it does not wait on a call c9; it waits on c1, c2"),
        "{refused}"
    );
    reader.answer("r1", "c1", Answer::AllowOnce).unwrap();
    let refused = reader.answer("r1", "c1x", Answer::AllowOnce).unwrap_err();
    assert!(refused.to_string().ends_with("it waits on c2"), "{refused}");
    let approvals = reader.load("r1").unwrap().approvals;
    assert_eq!(approvals[0].answer, Some(Answer::AllowOnce));
    assert_eq!(
        approvals[1].answer, None,
        "a refused answer changes nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lead whose subagent's question suspends it while two plain calls of its batch still run,
/// and whose deadline passes while the suspension waits for them: one call stops when told,
/// the other ignores it.
#[test]
fn calls_a_suspension_lets_run_are_told_at_the_deadline_and_given_the_grace_period() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use agentloop::event::{Event, EventKind};
    use agentloop::machine::Input;
    use agentloop::permissions::{Permission, PermissionGate, PermissionStore};
    use agentloop::testing::ScriptedModel;
    use agentloop::{
        Agent, CallStatus, Limits, Message, ModelResponse, RunOptions, StopReason, Tool, ToolOutput,
    };
    use serde_json::Value;

    let dir = support::temp_dir("suspension-drain-deadline");
    let path = dir.join("runs.db");
    let journal = Arc::new(SqliteJournal::open(&path).unwrap());
    let worker = Agent::builder()
        .name("worker")
        .model(ScriptedModel::new([
            ModelResponse::tool_calls([("a1", "write", "{}")]),
            ModelResponse::text("written"),
        ]))
        .tool(Tool::dynamic(
            "write",
            "Writes.",
            json!({"type": "object"}),
            |_a: Value, _c| async { Ok(ToolOutput::text("wrote")) },
        ))
        .gate(Arc::new(PermissionGate::new(PermissionStore::new(
            Permission::Ask,
        ))))
        .build()
        .unwrap();
    // When the polite call was told to stop, after the run started.
    let told = Arc::new(Mutex::new(None));
    let start = std::time::Instant::now();
    let polite = {
        let told = Arc::clone(&told);
        Tool::dynamic(
            "polite",
            "Works until told to stop, then wraps up.",
            json!({"type": "object"}),
            move |_a: Value, c: agentloop::ToolContext| {
                let told = Arc::clone(&told);
                async move {
                    c.cancel.cancelled().await;
                    *told.lock().unwrap() = Some(start.elapsed());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(ToolOutput::text("wrapped up"))
                }
            },
        )
    };
    let stubborn = Tool::dynamic(
        "stubborn",
        "Ignores being told to stop.",
        json!({"type": "object"}),
        |_a: Value, _c| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(ToolOutput::text("late"))
        },
    );
    let events = Arc::new(Mutex::new(Vec::<Event>::new()));
    let sink = {
        let events = Arc::clone(&events);
        move |e: &Event| events.lock().unwrap().push(e.clone())
    };
    // Far enough for the question to come first on a loaded machine (it takes milliseconds).
    let deadline = Duration::from_secs(2);
    let grace = Duration::from_secs(1);
    let lead = Agent::builder()
        .name("lead")
        .model(ScriptedModel::new([
            ModelResponse::tool_calls([
                ("p1", "ask", r#"{"task":"write"}"#),
                ("p2", "polite", "{}"),
                ("p3", "stubborn", "{}"),
            ]),
            ModelResponse::text("never"),
        ]))
        .tool(worker.as_tool("ask", "A worker."))
        .tool(polite)
        .tool(stubborn)
        .limits(Limits {
            timeout: Some(deadline),
            grace_period: grace,
            max_concurrency: 3,
            ..Limits::default()
        })
        .sink(sink)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let options = RunOptions {
        journal: Some(journal as Arc<dyn Journal>),
        ..RunOptions::default()
    };
    let out = rt.block_on(lead.run_with(Vec::new(), Some(Message::user("go")), options));
    let took = start.elapsed();

    assert_eq!(out.stop_reason, StopReason::Suspended, "{:?}", out.error);
    let told = told
        .lock()
        .unwrap()
        .expect("the polite call was told to stop");
    assert!(
        told >= deadline,
        "it ran on beside the question until the deadline: told at {told:?}"
    );
    assert!(
        took >= deadline + grace,
        "the stubborn call had the grace period: the run ended at {took:?}"
    );
    let call = |id: &str| {
        out.tool_calls
            .iter()
            .find(|c| c.call_id.as_ref() == id)
            .unwrap()
    };
    assert_eq!(call("p2").outcome.status, CallStatus::Ok, "{out:#?}");
    assert_eq!(call("p3").outcome.status, CallStatus::Cancelled, "{out:#?}");
    assert_eq!(call("p3").outcome.code.as_deref(), Some("cancelled"));
    // The call that wrapped up within its grace is journaled, so a resume reads it done; the
    // abandoned one is not, as after any drain.
    let run = JournalReader::open(&path)
        .unwrap()
        .load(&out.run_id)
        .unwrap();
    let finished: Vec<_> = run
        .steps
        .iter()
        .filter_map(|s| match &s.input {
            Input::CallFinished {
                position, outcome, ..
            } => Some((*position, outcome.status)),
            _ => None,
        })
        .collect();
    assert_eq!(finished, vec![(1, CallStatus::Ok)], "{:#?}", run.steps);
    // The abandoned call's start has its `cancelled` finish, as in every drain.
    let events = events.lock().unwrap();
    let finishes: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolFinished {
                call_id, outcome, ..
            } if call_id == "p3" => Some(outcome.status),
            _ => None,
        })
        .collect();
    assert_eq!(finishes, vec![CallStatus::Cancelled]);
}
