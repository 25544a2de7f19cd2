//! The replay driver: a run's step log, fed to a fresh machine, reproduces the run exactly
//! (transcript, records, usage, cost, stop reason), because the tokio driver decides nothing of
//! its own. Every run of this crate's test suite checks this too (the `verify-replay` feature of
//! its dev-dependency on itself); these tests use the log as a caller would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentloop::driver::{RunLog, StepLog, replay};
use agentloop::machine::Input;
use agentloop::{
    Agent, CallOutcome, Limits, Message, ModelResponse, RunOptions, RunOutcome, StopReason,
    ToolOutput, ids::UuidIds, steering::Steering, testing::ScriptedModel,
};
use common::{CallLog, calls, sleeper};

async fn logged(agent: &Agent, options: RunOptions) -> (RunOutcome, RunLog) {
    let log = StepLog::new();
    let options = RunOptions {
        log: Some(log.clone()),
        ..options
    };
    let out = agent
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    (out, log.take().expect("the run left its log"))
}

fn same_run(a: &RunOutcome, b: &RunOutcome) {
    assert_eq!(a.transcript, b.transcript);
    assert_eq!(a.tool_calls, b.tool_calls);
    assert_eq!(a.usage, b.usage);
    assert_eq!(a.cost_usd, b.cost_usd);
    assert_eq!(a.stop_reason, b.stop_reason);
    assert_eq!(a.error, b.error);
    assert_eq!(a.turns, b.turns);
}

fn agent(log: &CallLog, script: Vec<ModelResponse>, limits: Limits) -> Agent {
    Agent::builder()
        .model(ScriptedModel::new(script))
        .tool(sleeper("alpha", log))
        .ids(UuidIds)
        .limits(limits)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_logged_run_replays_exactly_after_a_round_trip_through_json() {
    let log = CallLog::default();
    let a = agent(
        &log,
        vec![
            // Blank ids: the run draws them from its (random) id source; the log keeps them.
            calls(&[("", "alpha", r#"{"ms": 5}"#), ("", "alpha", "{}")]),
            calls(&[("x", "nope", "{}")]),
            ModelResponse::text("done"),
        ],
        Limits::default(),
    );
    let (out, run_log) = logged(&a, RunOptions::default()).await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let text = serde_json::to_string(&run_log).unwrap();
    let back: RunLog = serde_json::from_str(&text).unwrap();
    let replayed = replay(Arc::clone(a.config()), &back);
    same_run(&out, &replayed);
    assert_eq!(log.len(), 2, "the replay ran no tool");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_replays_to_the_same_stop_with_every_call_answered() {
    let log = CallLog::default();
    let a = agent(
        &log,
        vec![
            calls(&[
                ("a", "alpha", r#"{"ms": 50}"#),
                ("b", "alpha", r#"{"ms": 5000}"#),
            ]),
            ModelResponse::text("never"),
        ],
        Limits {
            grace_period: Duration::from_millis(10),
            ..Limits::default()
        },
    );
    let cancel = agentloop::CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.cancel();
    });
    let (out, run_log) = logged(
        &a,
        RunOptions {
            cancel: Some(cancel),
            ..RunOptions::default()
        },
    )
    .await;
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert!(
        run_log
            .steps
            .iter()
            .any(|s| matches!(s.input, Input::Interrupted { .. }))
    );
    same_run(&out, &replay(Arc::clone(a.config()), &run_log));
}

#[tokio::test(start_paused = true)]
async fn steering_is_replayed_from_the_log_not_from_the_queue() {
    let log = CallLog::default();
    let a = agent(
        &log,
        vec![ModelResponse::text("18 C"), ModelResponse::text("64 F")],
        Limits::default(),
    );
    let steering = Steering::new();
    steering.follow_up("and in Fahrenheit?");
    let (out, run_log) = logged(
        &a,
        RunOptions {
            steering: Some(steering),
            ..RunOptions::default()
        },
    )
    .await;
    assert_eq!(out.output.as_deref(), Some("64 F"));
    same_run(&out, &replay(Arc::clone(a.config()), &run_log));
}

#[tokio::test(start_paused = true)]
async fn a_different_step_result_gives_a_different_run() {
    // The replay is driven by the log alone: change one recorded outcome, and the replayed
    // transcript says what the changed log says.
    let log = CallLog::default();
    let a = agent(
        &log,
        vec![calls(&[("a", "alpha", "{}")]), ModelResponse::text("done")],
        Limits::default(),
    );
    let (out, mut run_log) = logged(&a, RunOptions::default()).await;
    let changed = run_log
        .steps
        .iter_mut()
        .find_map(|s| match &mut s.input {
            Input::CallFinished { outcome, .. } => Some(outcome),
            _ => None,
        })
        .unwrap();
    *changed = CallOutcome::ok(ToolOutput::text("something else"));
    let replayed = replay(Arc::clone(a.config()), &run_log);
    assert_ne!(out.transcript, replayed.transcript);
    assert_eq!(
        replayed.tool_calls[0].outcome.output(),
        Some(&agentloop::message::ToolContent::Text(
            "something else".into()
        ))
    );
}
