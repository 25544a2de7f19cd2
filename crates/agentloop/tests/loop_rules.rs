//! The loop's rules, pinned through the public API with scripted models.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop::{
    Agent, CallStatus, CancellationToken, EventKind, Limits, Message, ModelError, ModelResponse,
    Price, PriceTable, RetryPolicy, RunOptions, Session, StopReason, StreamItem, Tool, ToolError,
    ToolOutput,
    config::{DecisionPolicy, OnInvalidCall, OnToolPanic},
    limits::LimitKind,
    model::{ModelErrorKind, Usage},
    testing::{FunctionModel, ScriptStep, ScriptedModel},
};
use common::{CallLog, Events, agent, assert_tool_cycle, calls, counting_tool, sleeper};
use futures::StreamExt;
use serde_json::{Value, json};

#[tokio::test]
async fn a_lone_surrogate_in_a_calls_arguments_runs_the_tool_with_the_replacement_character() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[
            ("a", "echo", r#"{"tag": "x\ud800y"}"#),
            ("b", "echo", r#"{"tag": "\ud83d\ude00\udc00"}"#),
            ("c", "missing", r#"{"tag": "\ud800"}"#),
        ]),
        ModelResponse::text("done"),
    ]);
    let out = agent(model, vec![sleeper("echo", &log)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    // Both calls ran, each with U+FFFD where its lone half was and a pair read as its character.
    assert_eq!(log.len(), 2);
    for (record, tag) in out
        .tool_calls
        .iter()
        .zip(["x\u{fffd}y", "\u{1F600}\u{fffd}"])
    {
        assert!(record.ok(), "{record:?}");
        assert_eq!(record.arguments, json!({"tag": tag}));
        assert_eq!(
            record.outcome.content,
            agentloop::message::ToolContent::Json(json!({"tag": tag}))
        );
    }
    // A call refused before its arguments are checked records them read the same way.
    assert_eq!(out.tool_calls[2].outcome.status, CallStatus::Rejected);
    assert_eq!(out.tool_calls[2].arguments, json!({"tag": "\u{fffd}"}));
}

#[tokio::test]
async fn a_zero_cost_budget_or_deadline_is_no_bound_as_documented() {
    // `Some(0)` lifts a bound, as `None` does: a zero cost budget stopped the run before its
    // first model call, and a zero deadline at once.
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[("a", "echo", r#"{"tag": "x"}"#)]),
        ModelResponse::text("done"),
    ]);
    let limits = Limits {
        max_cost_usd: Some(0.0),
        timeout: Some(Duration::ZERO),
        ..Limits::default()
    };
    let out = agent(model, vec![sleeper("echo", &log)], limits)
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    assert_eq!(out.output.as_deref(), Some("done"));
    assert_eq!(log.len(), 1);
}

#[tokio::test]
async fn invalid_args_in_batch_start_no_handler() {
    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        calls(&[
            ("a", "count", r#"{"n": 1}"#),
            ("b", "count", r#"{"n": "one"}"#),
            ("c", "count", "{not json"),
        ]),
        ModelResponse::text("done"),
    ]);
    let out = agent(model, vec![counting_tool("count", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    // The valid call ran; the invalid ones never reached a handler.
    assert_eq!(n.load(Ordering::SeqCst), 1);
    let statuses: Vec<CallStatus> = out.tool_calls.iter().map(|r| r.outcome.status).collect();
    assert_eq!(
        statuses,
        vec![CallStatus::Ok, CallStatus::Rejected, CallStatus::Rejected]
    );
    let msg_b = out.tool_calls[1].outcome.error_text().unwrap();
    assert!(msg_b.contains("/n"), "names the failing path: {msg_b}");
    let msg_c = out.tool_calls[2].outcome.error_text().unwrap();
    assert!(msg_c.contains("not valid JSON"), "{msg_c}");
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn every_argument_is_validated_before_any_handler_starts() {
    // The invalid call comes last: if validation were per call as it runs, the first would start.
    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        calls(&[("a", "count", r#"{"n": 1}"#), ("b", "count", r#"{}"#)]),
        ModelResponse::text("ok"),
    ]);
    let policy = DecisionPolicy {
        invalid_arguments: OnInvalidCall::Fail,
        ..Default::default()
    };
    let a = Agent::builder()
        .model(model)
        .tool(counting_tool("count", &n))
        .policy(policy)
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.as_ref().unwrap().code(), "decision.invalid");
    assert_eq!(
        n.load(Ordering::SeqCst),
        0,
        "no handler of the batch started"
    );
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn invalid_arguments_message_lists_each_failing_path() {
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}}, "required": ["city", "days"]});
    let tool = Tool::dynamic("forecast", "Forecast.", schema, |_a: Value, _c| async {
        Ok(ToolOutput::text("x"))
    });
    let model = ScriptedModel::new([
        calls(&[("a", "forecast", r#"{"city": 3, "days": 9}"#)]),
        ModelResponse::text("k"),
    ]);
    let out = agent(model, vec![tool], Limits::default()).run("go").await;
    let err = out.tool_calls[0].outcome.error_text().unwrap();
    assert!(err.contains("/city") && err.contains("/days"), "{err}");
}

#[tokio::test]
async fn unknown_tool_is_fed_back_naming_the_valid_tools() {
    let log = CallLog::default();
    let model = ScriptedModel::new([calls(&[("a", "nope", "{}")]), ModelResponse::text("sorry")]);
    let out = agent(
        model,
        vec![sleeper("alpha", &log), sleeper("beta", &log)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let err = out.tool_calls[0].outcome.error_text().unwrap();
    assert!(
        err.contains("alpha") && err.contains("beta") && err.contains("nope"),
        "{err}"
    );
    let result = out
        .transcript
        .iter()
        .find_map(Message::as_tool_result)
        .unwrap();
    assert!(result.is_error);
}

#[tokio::test]
async fn policy_can_make_an_unknown_tool_fatal() {
    let model = ScriptedModel::new([calls(&[("a", "nope", "{}")]), ModelResponse::text("sorry")]);
    let policy = DecisionPolicy {
        unknown_tool: OnInvalidCall::Fail,
        ..Default::default()
    };
    let out = Agent::builder()
        .model(model)
        .policy(policy)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "decision.invalid");
}

#[tokio::test]
async fn empty_arguments_mean_an_empty_object() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", ""), ("b", "alpha", "  ")]),
        ModelResponse::text("ok"),
    ]);
    let out = agent(model, vec![sleeper("alpha", &log)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.tool_calls.iter().filter(|r| r.ok()).count(), 2);
    assert_eq!(out.tool_calls[0].arguments, json!({}));
}

#[tokio::test]
async fn typed_and_json_handlers_read_the_arguments_as_the_model_wrote_them() {
    // Read once, without a tree, for the schema and the typed handler: what each handler gets and
    // what the record keeps are what a `serde_json::Value` of the text gives (the last of a
    // repeated key, escapes decoded, keys sorted in the record's text).
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Note {
        text: String,
        n: u32,
    }
    let typed_seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = typed_seen.clone();
    let typed =
        Tool::builder("note")
            .description("Takes a note.")
            .handler(move |args: Note, _ctx| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push((args.text, args.n));
                    Ok::<_, ToolError>("noted")
                }
            });
    let n = Arc::new(AtomicUsize::new(0));
    let written = r#"{"text": "first", "n": 1, "text": "line\nbreak \u00e9", "extra": [1, {"z": 0, "a": null}]}"#;
    let model = ScriptedModel::new([
        calls(&[
            ("a", "note", written),
            ("b", "count", r#" { "n" : 7 , "n" : 8 } "#),
            ("c", "note", r#"{"text": "x", "n": -1}"#),
        ]),
        ModelResponse::text("done"),
    ]);
    let out = agent(
        model,
        vec![typed, counting_tool("count", &n)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(
        *typed_seen.lock().unwrap(),
        vec![("line\nbreak \u{e9}".to_owned(), 1)]
    );
    let value: Value = serde_json::from_str(written).unwrap();
    assert_eq!(out.tool_calls[0].arguments, value);
    assert_eq!(
        out.tool_calls[0].arguments.as_str(),
        r#"{"extra":[1,{"a":null,"z":0}],"n":1,"text":"line\nbreak é"}"#
    );
    // The JSON handler got the `Value` (the last `n`), and answered with it.
    assert_eq!(out.tool_calls[1].outcome.content.to_text(), r#"{"n":8}"#);
    assert_eq!(out.tool_calls[1].arguments.as_str(), r#"{"n":8}"#);
    // Its schema says `n` is a `u32` (minimum 0): refused before the handler, path named.
    assert_eq!(out.tool_calls[2].outcome.status, CallStatus::Rejected);
    let why = out.tool_calls[2].outcome.error_text().unwrap();
    assert!(why.contains("/n"), "{why}");
    assert_tool_cycle(&out.transcript);
}

#[tokio::test(start_paused = true)]
async fn outcomes_are_folded_in_decision_order_when_calls_finish_out_of_order() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[
            ("slow", "alpha", r#"{"ms": 30, "tag": "slow"}"#),
            ("fast", "alpha", r#"{"ms": 1, "tag": "fast"}"#),
        ]),
        ModelResponse::text("ok"),
    ]);
    let out = agent(model, vec![sleeper("alpha", &log)], Limits::default())
        .run("go")
        .await;
    let finished: Vec<String> = log.0.lock().unwrap().iter().map(|e| e.1.clone()).collect();
    assert_eq!(
        finished,
        vec!["fast", "slow"],
        "the fast call finished first"
    );
    let ids: Vec<&str> = out.tool_calls.iter().map(|r| &*r.call_id).collect();
    assert_eq!(ids, vec!["slow", "fast"]);
    assert_tool_cycle(&out.transcript);
}

#[tokio::test(start_paused = true)]
async fn parallel_calls_really_overlap() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[
            ("a", "alpha", r#"{"ms": 50}"#),
            ("b", "alpha", r#"{"ms": 50}"#),
            ("c", "alpha", r#"{"ms": 50}"#),
        ]),
        ModelResponse::text("ok"),
    ]);
    let out = agent(model, vec![sleeper("alpha", &log)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let entries = log.0.lock().unwrap().clone();
    assert_eq!(entries.len(), 3);
    let latest_start = entries.iter().map(|e| e.2).max().unwrap();
    let earliest_end = entries.iter().map(|e| e.3).min().unwrap();
    assert!(
        latest_start < earliest_end,
        "every call started before any ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sequential_tool_makes_the_batch_sequential() {
    let log = CallLog::default();
    let seq = {
        let log = log.clone();
        Tool::builder("seq")
            .description("Sequential.")
            .sequential()
            .dynamic(json!({"type": "object"}), move |_a: Value, ctx| {
                let log = log.clone();
                async move {
                    let start = tokio::time::Instant::now();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    log.0.lock().unwrap().push((
                        "seq".into(),
                        ctx.call_id.to_string(),
                        start,
                        tokio::time::Instant::now(),
                    ));
                    Ok(ToolOutput::text("s"))
                }
            })
    };
    let model = ScriptedModel::new([
        calls(&[
            ("a", "alpha", r#"{"ms": 20}"#),
            ("b", "seq", "{}"),
            ("c", "alpha", r#"{"ms": 20}"#),
        ]),
        ModelResponse::text("ok"),
    ]);
    let out = agent(model, vec![sleeper("alpha", &log), seq], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let mut entries = log.0.lock().unwrap().clone();
    entries.sort_by_key(|e| e.2);
    for w in entries.windows(2) {
        assert!(w[0].3 <= w[1].2, "{} overlapped {}", w[0].1, w[1].1);
    }
    let order: Vec<String> = entries.iter().map(|e| e.1.clone()).collect();
    assert_eq!(
        order,
        vec!["a", "b", "c"],
        "one at a time, in decision order"
    );
}

#[tokio::test(start_paused = true)]
async fn the_concurrency_cap_bounds_running_calls() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[
            ("a", "alpha", r#"{"ms": 10}"#),
            ("b", "alpha", r#"{"ms": 10}"#),
            ("c", "alpha", r#"{"ms": 10}"#),
            ("d", "alpha", r#"{"ms": 10}"#),
        ]),
        ModelResponse::text("ok"),
    ]);
    let limits = Limits {
        max_concurrency: 2,
        ..Limits::default()
    };
    agent(model, vec![sleeper("alpha", &log)], limits)
        .run("go")
        .await;
    let entries = log.0.lock().unwrap().clone();
    for e in &entries {
        let running = entries.iter().filter(|o| o.2 <= e.2 && o.3 > e.2).count();
        assert!(running <= 2, "{running} calls ran at once");
    }
}

#[tokio::test]
async fn a_batch_over_the_remaining_call_budget_is_refused_whole() {
    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        calls(&[("a", "count", r#"{"n": 1}"#), ("b", "count", r#"{"n": 2}"#)]),
        calls(&[("c", "count", r#"{"n": 3}"#), ("d", "count", r#"{"n": 4}"#)]),
        ModelResponse::text("never"),
    ]);
    let limits = Limits {
        max_tool_calls: Some(3),
        ..Limits::default()
    };
    let out = agent(model, vec![counting_tool("count", &n)], limits)
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::MaxToolCalls);
    assert_eq!(
        n.load(Ordering::SeqCst),
        2,
        "the second batch (2 > 1 remaining) started no handler"
    );
    let hit = out.limit.unwrap();
    assert_eq!(
        (hit.limit, hit.bound, hit.consumed, hit.requested),
        (LimitKind::ToolCalls, 3.0, 2.0, 2.0)
    );
    assert_eq!(
        out.tool_calls
            .iter()
            .filter(|r| r.outcome.status == CallStatus::Refused)
            .count(),
        2
    );
    assert_tool_cycle(&out.transcript);
    assert_eq!(
        out.clone().into_result().unwrap_err().code(),
        "limit.reached"
    );
}

#[tokio::test]
async fn finishing_on_the_last_allowed_turn_succeeds() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", "{}")]),
        calls(&[("b", "alpha", r#"{"tag": "2"}"#)]),
        ModelResponse::text("final"),
    ]);
    let limits = Limits {
        max_turns: Some(3),
        ..Limits::default()
    };
    let out = agent(model, vec![sleeper("alpha", &log)], limits)
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.turns, 3);
    assert_eq!(out.output.as_deref(), Some("final"));
}

#[tokio::test]
async fn the_last_allowed_turn_starts_no_tool_whose_result_nobody_would_read() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", "{}")]),
        calls(&[("b", "alpha", r#"{"tag": "2"}"#)]),
        ModelResponse::text("final"),
    ]);
    let limits = Limits {
        max_turns: Some(2),
        ..Limits::default()
    };
    let out = agent(model.clone(), vec![sleeper("alpha", &log)], limits)
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::MaxTurns);
    assert_eq!(model.calls(), 2);
    assert_eq!(log.len(), 1, "the last turn's call never started");
    assert_eq!(out.tool_calls.len(), 2);
    let last = &out.tool_calls[1].outcome;
    assert_eq!(last.status, CallStatus::Refused);
    assert_eq!(last.code.as_deref(), Some("limit.max_turns"));
    assert!(last.content.to_text().starts_with("not run:"), "{last:?}");
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn max_model_calls_stops_the_run() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", "{}")]),
        calls(&[("b", "alpha", "{}")]),
        ModelResponse::text("x"),
    ]);
    let limits = Limits {
        max_model_calls: Some(1),
        ..Limits::default()
    };
    let out = agent(model, vec![sleeper("alpha", &log)], limits)
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::MaxModelCalls);
    assert_eq!(out.model_calls, 1);
}

/// A tool whose result never changes.
fn constant_tool(name: &str, counter: &Arc<AtomicUsize>) -> Tool {
    let counter = counter.clone();
    Tool::dynamic(
        name,
        "Always says the same.",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        move |_args: Value, _ctx| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::text("pending"))
            }
        },
    )
}

#[tokio::test]
async fn a_stuck_loop_stops_once_the_same_call_came_back_the_same_threshold_times() {
    let n = Arc::new(AtomicUsize::new(0));
    // Key order differs: still the same arguments.
    let model = ScriptedModel::new([
        calls(&[("x", "same", r#"{"n": 7}"#)]),
        calls(&[("y", "same", r#"{"n":7}"#)]),
        calls(&[("z", "same", r#"{ "n" : 7 }"#)]),
        ModelResponse::text("never"),
    ]);
    let out = agent(
        model.clone(),
        vec![constant_tool("same", &n)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::StuckLoop);
    assert_eq!(
        n.load(Ordering::SeqCst),
        3,
        "each call ran and came back the same"
    );
    assert_eq!(model.calls(), 3, "no model call after the loop was seen");
    let hit = out.limit.unwrap();
    assert_eq!(hit.limit, LimitKind::StuckLoop);
    assert_eq!(hit.bound, 3.0);
    assert!(
        out.tool_calls
            .iter()
            .all(|r| r.outcome.status == CallStatus::Ok)
    );
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn the_same_call_with_new_results_is_progress_not_a_loop() {
    // The counting tool echoes its arguments, and the arguments are the same: but a tool whose
    // result changes (a job's progress) is not stuck.
    let n = Arc::new(AtomicUsize::new(0));
    let progress = {
        let n = n.clone();
        Tool::dynamic(
            "status",
            "A job's progress.",
            json!({"type": "object"}),
            move |_a: Value, _c| {
                let k = n.fetch_add(1, Ordering::SeqCst);
                async move { Ok(ToolOutput::text(format!("{}% done", k * 20))) }
            },
        )
    };
    let model = ScriptedModel::new(
        std::iter::repeat_n(calls(&[("a", "status", "{}")]), 5).chain([ModelResponse::text("ok")]),
    );
    let out = agent(model, vec![progress], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(n.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_turn_with_progress_elsewhere_is_not_a_loop_and_identical_calls_in_a_batch_count_once() {
    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        // `same` repeats with the same result, but the batch's other call makes progress.
        calls(&[("a1", "same", "{}"), ("a2", "count", r#"{"n": 1}"#)]),
        calls(&[("b1", "same", "{}"), ("b2", "count", r#"{"n": 2}"#)]),
        calls(&[("c1", "same", "{}"), ("c2", "count", r#"{"n": 3}"#)]),
        ModelResponse::text("done"),
    ]);
    let tools = vec![constant_tool("same", &n), counting_tool("count", &n)];
    let out = agent(model, tools, Limits::default()).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);

    // The same call twice in one batch, in another key order, is the same turn each time.
    let n = Arc::new(AtomicUsize::new(0));
    let twice = |i: &str| {
        calls(&[
            (&*format!("{i}1"), "count", r#"{"n": 1, "m": 2}"#),
            (&*format!("{i}2"), "count", r#"{"m": 2, "n": 1}"#),
        ])
    };
    let model = ScriptedModel::new([
        twice("a"),
        twice("b"),
        twice("c"),
        ModelResponse::text("never"),
    ]);
    let out = agent(model, vec![counting_tool("count", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::StuckLoop);
    assert_eq!(n.load(Ordering::SeqCst), 6);
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn a_cycle_of_two_calls_whose_results_never_change_is_a_loop() {
    let n = Arc::new(AtomicUsize::new(0));
    let a = calls(&[("a", "count", r#"{"n": 1}"#)]);
    let b = calls(&[("b", "count", r#"{"n": 2}"#)]);
    let model = ScriptedModel::new(
        [a.clone(), b.clone(), a.clone(), b.clone(), a, b]
            .into_iter()
            .chain(std::iter::repeat_n(ModelResponse::text("never"), 3)),
    );
    let out = agent(
        model.clone(),
        vec![counting_tool("count", &n)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::StuckLoop);
    assert_eq!(
        n.load(Ordering::SeqCst),
        6,
        "three rounds of the two-call cycle"
    );
    assert_eq!(model.calls(), 6);

    // A cycle of three.
    let n = Arc::new(AtomicUsize::new(0));
    let turn = |k: i64| calls(&[("c", "count", &*format!(r#"{{"n": {k}}}"#))]);
    let model = ScriptedModel::new(
        (0..9)
            .map(|i| turn(i % 3))
            .chain([ModelResponse::text("never")]),
    );
    let out = agent(model, vec![counting_tool("count", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::StuckLoop);
    assert_eq!(n.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn a_final_answer_or_a_new_message_starts_the_count_again_and_a_poller_is_judged_by_results()
{
    // A poller's arguments change (a cursor), its result does not: a loop by its results.
    let n = Arc::new(AtomicUsize::new(0));
    let poll = Tool::builder("poll")
        .description("Polls a job.")
        .poller(true)
        .dynamic(json!({"type": "object"}), |_a: Value, _c| async {
            Ok(ToolOutput::text("running"))
        });
    let model = ScriptedModel::new(
        (0..3)
            .map(|i| calls(&[("p", "poll", &*format!(r#"{{"cursor": {i}}}"#))]))
            .chain([ModelResponse::text("never")]),
    );
    let out = agent(model, vec![poll.clone()], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::StuckLoop);

    // The same (non-poller) call with changing arguments is not a loop.
    let model = ScriptedModel::new(
        (0..3)
            .map(|i| calls(&[("s", "same", &*format!(r#"{{"n": {i}}}"#))]))
            .chain([ModelResponse::text("done")]),
    );
    let out = agent(model, vec![constant_tool("same", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);

    // A session: each run's answer ends the turn streak, so three runs of two repeats never trip.
    let model = ScriptedModel::new((0..3).flat_map(|_| {
        [
            calls(&[("a", "same", "{}")]),
            calls(&[("b", "same", "{}")]),
            ModelResponse::text("again?"),
        ]
    }));
    let a = agent(model, vec![constant_tool("same", &n)], Limits::default());
    let mut session = Session::new();
    for _ in 0..3 {
        let out = a.run_in(&mut session, "check again").await;
        assert_eq!(out.stop_reason, StopReason::Finished);
    }
}

#[test]
fn a_stuck_loop_threshold_of_one_is_refused() {
    let limits = Limits {
        stuck_loop_threshold: 1,
        ..Limits::default()
    };
    let err = Agent::builder()
        .model(ScriptedModel::new([ModelResponse::text("x")]))
        .limits(limits)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("stuck_loop_threshold"), "{err}");
}

#[tokio::test]
async fn different_arguments_break_the_streak_and_zero_disables_the_rule() {
    let n = Arc::new(AtomicUsize::new(0));
    let script = || {
        ScriptedModel::new([
            calls(&[("a", "count", r#"{"n": 1}"#)]),
            calls(&[("b", "count", r#"{"n": 1}"#)]),
            calls(&[("c", "count", r#"{"n": 2}"#)]),
            calls(&[("d", "count", r#"{"n": 2}"#)]),
            ModelResponse::text("done"),
        ])
    };
    let out = agent(
        script(),
        vec![counting_tool("count", &n)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let repeat = ScriptedModel::new(
        std::iter::repeat_n(calls(&[("a", "count", r#"{"n": 1}"#)]), 5)
            .chain([ModelResponse::text("ok")]),
    );
    let limits = Limits {
        stuck_loop_threshold: 0,
        ..Limits::default()
    };
    let out = agent(repeat, vec![counting_tool("count", &n)], limits)
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
}

#[tokio::test(start_paused = true)]
async fn cancelling_mid_batch_leaves_a_valid_transcript() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[
            ("a", "alpha", r#"{"ms": 10}"#),
            ("b", "alpha", r#"{"ms": 100000}"#),
        ]),
        ModelResponse::text("never"),
    ]);
    let cancel = CancellationToken::new();
    let a = agent(model, vec![sleeper("alpha", &log)], Limits::default());
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c2.cancel();
    });
    let options = RunOptions {
        cancel: Some(cancel),
        ..Default::default()
    };
    let out = a
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(
        out.tool_calls[0].outcome.status,
        CallStatus::Ok,
        "the finished call keeps its result"
    );
    assert_ne!(out.tool_calls[1].outcome.status, CallStatus::Ok);
    assert_tool_cycle(&out.transcript);
    assert_eq!(out.error.unwrap().code(), "run.cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_ignores_cancellation_is_abandoned_after_the_grace_period() {
    let stubborn = Tool::dynamic(
        "stubborn",
        "Ignores cancellation.",
        json!({"type": "object"}),
        |_a: Value, _c| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(ToolOutput::text("late"))
        },
    );
    let model = ScriptedModel::new([
        calls(&[("a", "stubborn", "{}")]),
        ModelResponse::text("never"),
    ]);
    let limits = Limits {
        timeout: Some(Duration::from_secs(1)),
        grace_period: Duration::from_millis(200),
        ..Limits::default()
    };
    let events = Events::default();
    let a = Agent::builder()
        .model(model)
        .tool(stubborn)
        .limits(limits)
        .sink(events.sink())
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert!(
        start.elapsed() <= Duration::from_millis(1250),
        "outlived the deadline by {:?}",
        start.elapsed()
    );
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Cancelled);
    assert_tool_cycle(&out.transcript);
    // The abandoned call's start has its finish, in the outcome's words, before the run's end:
    // a sink pairing the two (a live view, a trace) closes it as `cancelled`, not left open.
    let all = events.all();
    let finished: Vec<_> = all
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match &e.kind {
            EventKind::ToolFinished {
                call_id, outcome, ..
            } if call_id == "a" => Some((i, outcome.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 1, "one finish for the one start: {all:#?}");
    let (at, outcome) = &finished[0];
    assert_eq!(outcome, &out.tool_calls[0].outcome);
    assert_eq!(outcome.code.as_deref(), Some("cancelled"));
    let ended = all
        .iter()
        .position(|e| matches!(e.kind, EventKind::RunFinished { .. }))
        .unwrap();
    assert!(*at < ended, "the finish comes before the run's end");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cuts_a_slow_model_call_short() {
    let model = ScriptedModel::from_json(r#"[{"text": "late", "delay_ms": 60000}]"#).unwrap();
    let limits = Limits {
        timeout: Some(Duration::from_secs(2)),
        ..Limits::default()
    };
    let out = agent(model, vec![], limits).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(out.error.unwrap().code(), "run.deadline");
}

/// A run's interrupts are made when a step first waits and raced by every later wait: a
/// deadline or a cancel that comes while the run waits for the sixth time (its third tool
/// call, after three waits for the model and two for tools) ends that wait.
#[tokio::test(start_paused = true)]
async fn an_interrupt_ends_a_later_wait_than_the_first() {
    for cancelled in [false, true] {
        let model = ScriptedModel::from_json(
            r#"[{"tool_calls": [{"id": "a", "name": "alpha", "arguments": {"ms": 100}}], "delay_ms": 500},
                {"tool_calls": [{"id": "b", "name": "alpha", "arguments": {"ms": 100}}], "delay_ms": 500},
                {"tool_calls": [{"id": "c", "name": "alpha", "arguments": {"ms": 100000}}], "delay_ms": 500},
                {"text": "never"}]"#,
        )
        .unwrap();
        let log = CallLog::default();
        let limits = Limits {
            timeout: (!cancelled).then_some(Duration::from_secs(3)),
            ..Limits::default()
        };
        let cancel = CancellationToken::new();
        if cancelled {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2500)).await;
                cancel.cancel();
            });
        }
        let options = RunOptions {
            cancel: Some(cancel),
            ..Default::default()
        };
        let start = tokio::time::Instant::now();
        let out = agent(model, vec![sleeper("alpha", &log)], limits)
            .run_with(Vec::new(), Some(Message::user("go")), options)
            .await;
        let (stop, at) = if cancelled {
            (StopReason::Cancelled, Duration::from_millis(2500))
        } else {
            (StopReason::Deadline, Duration::from_secs(3))
        };
        assert_eq!(out.stop_reason, stop);
        assert_eq!(
            start.elapsed(),
            at,
            "the wait ended when the interrupt came"
        );
        let statuses: Vec<CallStatus> = out.tool_calls.iter().map(|r| r.outcome.status).collect();
        assert_eq!(statuses[..2], [CallStatus::Ok, CallStatus::Ok]);
        assert_ne!(statuses[2], CallStatus::Ok);
        assert_tool_cycle(&out.transcript);
    }
}

#[tokio::test]
async fn a_panicking_tool_gives_the_model_an_error_and_a_policy_makes_it_fatal() {
    let boom = || {
        Tool::dynamic(
            "boom",
            "Panics.",
            json!({"type": "object"}),
            |_a: Value, _c| async {
                if true {
                    panic!("kaboom");
                }
                Ok(ToolOutput::text("unreachable"))
            },
        )
    };
    let script = || {
        ScriptedModel::new([
            calls(&[("a", "boom", "{}")]),
            ModelResponse::text("routed around"),
        ])
    };
    let out = agent(script(), vec![boom()], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.output.as_deref(), Some("routed around"));
    let o = &out.tool_calls[0].outcome;
    assert_eq!(o.status, CallStatus::Error);
    assert_eq!(o.code.as_deref(), Some("tool.panicked"));
    assert!(o.diagnostic.as_deref().unwrap().contains("kaboom"));
    assert!(
        !o.content.to_text().contains("kaboom"),
        "the panic is for the operator only"
    );

    let fatal = Agent::builder()
        .model(script())
        .tool(boom())
        .policy(DecisionPolicy {
            tool_panic: OnToolPanic::Fail,
            ..Default::default()
        })
        .build()
        .unwrap();
    let out = fatal.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    let err = out.error.unwrap();
    assert_eq!(err.code(), "tool.panicked");
    assert!(err.to_string().contains("kaboom"));
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn a_handler_that_panics_before_returning_its_future_fails_the_call_not_the_process() {
    let early = Tool::dynamic(
        "early",
        "Panics while it builds its future.",
        json!({"type": "object"}),
        |_a: Value, _c| -> std::future::Ready<Result<ToolOutput, ToolError>> {
            panic!("early kaboom")
        },
    );
    let model = ScriptedModel::new([calls(&[("a", "early", "{}")]), ModelResponse::text("after")]);
    let out = agent(model, vec![early], Limits::default()).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let o = &out.tool_calls[0].outcome;
    assert_eq!(o.status, CallStatus::Error);
    assert_eq!(o.code.as_deref(), Some("tool.panicked"));
    assert!(
        o.diagnostic.as_deref().unwrap().contains("early kaboom"),
        "{o:?}"
    );
    assert_tool_cycle(&out.transcript);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_tool_error_drains_running_siblings_without_cancelling_them() {
    let log = CallLog::default();
    let fatal = Tool::dynamic(
        "fatal",
        "Fails fatally.",
        json!({"type": "object"}),
        |_a: Value, _c| async { Err::<ToolOutput, _>(ToolError::fatal("disk on fire")) },
    );
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", r#"{"ms": 40}"#), ("b", "fatal", "{}")]),
        ModelResponse::text("never"),
    ]);
    let out = agent(
        model.clone(),
        vec![sleeper("alpha", &log), fatal],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "tool.fatal");
    assert_eq!(
        out.tool_calls[0].outcome.status,
        CallStatus::Ok,
        "the sibling finished, not cancelled"
    );
    assert_eq!(model.calls(), 1, "nothing more was dispatched");
    assert_tool_cycle(&out.transcript);
}

#[tokio::test(start_paused = true)]
async fn a_per_tool_timeout_becomes_an_error_the_model_reads() {
    let slow = Tool::builder("slow")
        .description("Slow.")
        .timeout(Duration::from_millis(100))
        .dynamic(json!({"type": "object"}), |_a: Value, _c| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(ToolOutput::text("late"))
        });
    let model = ScriptedModel::new([
        calls(&[("a", "slow", "{}")]),
        ModelResponse::text("recovered"),
    ]);
    let out = agent(model, vec![slow], Limits::default()).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Error);
    assert_eq!(out.tool_calls[0].outcome.code.as_deref(), Some("timeout"));
}

#[tokio::test]
async fn a_recoverable_tool_error_reaches_the_model() {
    let flaky = Tool::dynamic(
        "flaky",
        "Fails.",
        json!({"type": "object"}),
        |_a: Value, _c| async { Err::<ToolOutput, _>(ToolError::new("not_found", "no such city")) },
    );
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let seen2 = seen.clone();
    let model = FunctionModel::new(move |req| {
        if let Some(r) = req.messages.iter().rev().find_map(Message::as_tool_result) {
            *seen2.lock().unwrap() = r.content.to_text();
            return Ok(ModelResponse::text("handled"));
        }
        Ok(calls(&[("a", "flaky", "{}")]))
    });
    let out = Agent::builder()
        .model(model)
        .tool(flaky)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(*seen.lock().unwrap(), "no such city");
}

#[tokio::test]
async fn duplicate_call_ids_make_the_decision_invalid_and_run_nothing() {
    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        calls(&[
            ("same", "count", r#"{"n": 1}"#),
            ("same", "count", r#"{"n": 2}"#),
        ]),
        ModelResponse::text("never"),
    ]);
    let out = agent(model, vec![counting_tool("count", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "decision.invalid");
    assert_eq!(n.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn overlong_call_ids_are_refused() {
    let n = Arc::new(AtomicUsize::new(0));
    let long = "x".repeat(257);
    let model = ScriptedModel::new([
        calls(&[(&long, "count", r#"{"n": 1}"#)]),
        ModelResponse::text("never"),
    ]);
    let out = agent(model, vec![counting_tool("count", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.error.unwrap().code(), "decision.invalid");
    assert_eq!(n.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn blank_call_ids_get_generated_unique_ids() {
    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        calls(&[("", "count", r#"{"n": 1}"#), ("  ", "count", r#"{"n": 2}"#)]),
        ModelResponse::text("ok"),
    ]);
    let out = agent(model, vec![counting_tool("count", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let ids: Vec<&str> = out.tool_calls.iter().map(|r| &*r.call_id).collect();
    assert!(ids.iter().all(|i| !i.trim().is_empty()));
    assert_ne!(ids[0], ids[1]);
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn blank_ids_of_calls_cut_by_the_output_limit_are_unique_and_replay_alike() {
    // Two calls cut off by the output limit, both with blank ids: each gets an id of its own
    // before the step is logged, so the replay this crate's tests run on every run
    // (`verify-replay`) finds the same ids and the same outcome, and the cut calls do not
    // collide in the transcript.
    let n = Arc::new(AtomicUsize::new(0));
    let mut cut = calls(&[
        ("", "count", r#"{"n": 1}"#),
        ("", "count", r#"{"n": 2"#),
        ("", "count", r#"{"n"#),
    ]);
    cut.finish_reason = agentloop::model::FinishReason::Length;
    let model = ScriptedModel::new([cut, ModelResponse::text("ok")]);
    let log = agentloop::driver::StepLog::default();
    let options = RunOptions {
        log: Some(log.clone()),
        ..RunOptions::default()
    };
    let a = agent(model, vec![counting_tool("count", &n)], Limits::default());
    let out = a
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    assert_eq!(n.load(Ordering::SeqCst), 1, "only the complete call ran");
    let mut ids: Vec<&str> = out.tool_calls.iter().map(|r| &*r.call_id).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.iter().all(|i| !i.trim().is_empty()), "{ids:?}");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "the cut calls' ids do not collide: {ids:?}");
    assert_tool_cycle(&out.transcript);
    let log = log.take().expect("the run left its step log");
    let replayed = agentloop::driver::replay(Arc::clone(a.config()), &log);
    assert_eq!(replayed.transcript, out.transcript);
    assert_eq!(replayed.tool_calls, out.tool_calls);
}

#[tokio::test]
async fn a_batch_whose_calls_all_ask_to_terminate_ends_the_run() {
    let stop = Tool::dynamic(
        "stop",
        "Stops.",
        json!({"type": "object"}),
        |_a: Value, _c| async { Ok(ToolOutput::text("stopped here").terminate()) },
    );
    let model = ScriptedModel::new([
        calls(&[("a", "stop", "{}"), ("b", "stop", "{}")]),
        ModelResponse::text("never"),
    ]);
    let out = agent(model.clone(), vec![stop], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Terminated);
    assert_eq!(out.output.as_deref(), Some("stopped here"));
    assert_eq!(model.calls(), 1);
    assert!(out.is_success());
}

#[tokio::test]
async fn one_call_asking_to_terminate_is_not_enough() {
    let log = CallLog::default();
    let stop = Tool::dynamic(
        "stop",
        "Stops.",
        json!({"type": "object"}),
        |_a: Value, _c| async { Ok(ToolOutput::text("stop").terminate()) },
    );
    let model = ScriptedModel::new([
        calls(&[("a", "stop", "{}"), ("b", "alpha", "{}")]),
        ModelResponse::text("done"),
    ]);
    let out = agent(model, vec![stop, sleeper("alpha", &log)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
}

#[tokio::test]
async fn details_reach_the_caller_but_never_the_model() {
    let t = Tool::dynamic(
        "d",
        "Details.",
        json!({"type": "object"}),
        |_a: Value, _c| async {
            Ok(ToolOutput::text("visible").with_details(json!({"secret_internal": 42})))
        },
    );
    let model = ScriptedModel::new([calls(&[("a", "d", "{}")]), ModelResponse::text("ok")]);
    let out = agent(model, vec![t], Limits::default()).run("go").await;
    assert_eq!(
        out.tool_calls[0].outcome.details.as_deref(),
        Some(&json!({"secret_internal": 42}))
    );
    let transcript = serde_json::to_string(&out.transcript).unwrap();
    assert!(!transcript.contains("secret_internal"));
}

#[tokio::test]
async fn the_output_schema_sends_an_invalid_answer_back_then_accepts_a_valid_one() {
    let model = ScriptedModel::new([
        ModelResponse::text(r#"{"answer": "x"}"#),
        ModelResponse::text("```json\n{\"answer\": 42}\n```"),
    ]);
    let a = Agent::builder()
        .model(model)
        .output_schema(json!({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}))
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.structured_output, Some(json!({"answer": 42})));
    assert_eq!(out.model_calls, 2);
    assert_eq!(out.turns, 1, "a re-ask is a model call, not a new turn");
}

#[tokio::test]
async fn the_output_schema_fails_the_run_after_the_retries() {
    let model = ScriptedModel::new(std::iter::repeat_n(ModelResponse::text("not json"), 5));
    let a = Agent::builder()
        .model(model.clone())
        .output_schema(json!({"type": "object"}))
        .limits(Limits {
            output_retries: 1,
            ..Limits::default()
        })
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "output.invalid");
    assert_eq!(model.calls(), 2);
}

#[tokio::test]
async fn the_token_budget_stops_before_the_next_model_call() {
    let log = CallLog::default();
    let u = Usage {
        input_tokens: 60,
        output_tokens: 50,
        ..Usage::default()
    };
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", "{}")]).with_usage(u),
        calls(&[("b", "alpha", r#"{"tag":"b"}"#)]).with_usage(u),
        ModelResponse::text("x"),
    ]);
    let limits = Limits {
        max_tokens: Some(100),
        ..Limits::default()
    };
    let out = agent(model, vec![sleeper("alpha", &log)], limits)
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Budget);
    assert_eq!(out.usage.total_tokens(), 110);
    assert_eq!(out.limit.unwrap().limit, LimitKind::Tokens);
}

#[tokio::test]
async fn the_cost_budget_uses_the_price_table() {
    let log = CallLog::default();
    let u = Usage {
        input_tokens: 1_000_000,
        output_tokens: 0,
        ..Usage::default()
    };
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", "{}")]).with_usage(u),
        ModelResponse::text("x").with_usage(u),
    ]);
    let prices = PriceTable::new().with("scripted", Price::new(0.5, 2.0));
    let a = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .pricing(prices)
        .limits(Limits {
            max_cost_usd: Some(0.4),
            ..Limits::default()
        })
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Budget);
    assert!((out.cost_usd - 0.5).abs() < 1e-9, "{}", out.cost_usd);
}

#[tokio::test]
async fn a_model_error_fails_the_run_and_keeps_the_transcript() {
    let log = CallLog::default();
    let model = ScriptedModel::from_steps([
        ScriptStep::Respond(calls(&[("a", "alpha", "{}")])),
        ScriptStep::Fail(ModelError::new(ModelErrorKind::Server, "boom").with_status(500)),
    ]);
    let out = agent(model, vec![sleeper("alpha", &log)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.as_ref().unwrap().code(), "model.server_error");
    assert_eq!(out.tool_calls.len(), 1);
    assert_eq!(out.transcript.len(), 3);
}

#[tokio::test]
async fn a_cut_tool_call_never_runs_its_siblings_do_and_the_model_reads_it_was_cut() {
    let n = Arc::new(AtomicUsize::new(0));
    let cut = ScriptedModel::from_json(
        r#"[{"tool_calls": [{"id": "a", "name": "count", "arguments": "{\"n\": 1}"},
                            {"id": "b", "name": "count", "arguments": "{\"n\": 2, \"pad"}],
             "finish_reason": "length"},
            {"tool_calls": [{"id": "c", "name": "count", "arguments": {"n": 2}}]},
            {"text": "done"}]"#,
    )
    .unwrap();
    let out = agent(cut, vec![counting_tool("count", &n)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(
        n.load(Ordering::SeqCst),
        2,
        "the complete call and the one made again ran"
    );
    let cut = &out.tool_calls[1];
    assert_eq!(&*cut.call_id, "b");
    assert_eq!(cut.outcome.code.as_deref(), Some("truncated"));
    assert!(cut.outcome.content.to_text().contains("cut off"));
    assert_tool_cycle(&out.transcript);

    // A response flagged cut with no call left is not an answer either.
    let mut flagged = calls(&[("a", "count", r#"{"n": 1}"#)]);
    flagged.message.tool_calls.clear();
    flagged.truncated = true;
    let out = agent(
        ScriptedModel::new([flagged]),
        vec![counting_tool("count", &n)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Truncated);
}

#[tokio::test]
async fn every_tool_start_is_followed_by_exactly_one_finish() {
    let log = CallLog::default();
    let events = Events::default();
    let model = ScriptedModel::new([
        calls(&[
            ("a", "alpha", "{}"),
            ("b", "nope", "{}"),
            ("c", "alpha", r#"{"ms": "x"}"#),
        ]),
        ModelResponse::text("done"),
    ])
    .streaming(true);
    let a = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .sink(events.sink())
        .build()
        .unwrap();
    let out = a.run("go").await;
    let all = events.all();
    assert!(all.iter().all(|e| &*e.run_id == out.run_id.as_str()));
    let started: Vec<&str> = all
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolStarted { .. }))
        .filter_map(|e| e.call_id())
        .collect();
    let finished: Vec<&str> = all
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolFinished { .. }))
        .filter_map(|e| e.call_id())
        .collect();
    assert_eq!(started, vec!["a"]);
    assert_eq!(finished, vec!["a"]);
    let rejected = all
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolRejected { .. }))
        .count();
    assert_eq!(rejected, 2);
    assert!(matches!(
        all.first().unwrap().kind,
        EventKind::RunStarted { .. }
    ));
    assert!(matches!(
        all.last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));
    assert!(
        all.iter()
            .any(|e| matches!(&e.kind, EventKind::TextDelta { text } if text == "done"))
    );
    assert!(
        all.iter().any(
            |e| matches!(&e.kind, EventKind::ToolCallDelta { call_id: Some(c), .. } if c == "a")
        )
    );
    let turns: Vec<u32> = all
        .iter()
        .filter(|e| matches!(e.kind, EventKind::TurnStarted))
        .map(|e| e.turn)
        .collect();
    assert_eq!(turns, vec![1, 2]);
}

#[tokio::test]
async fn tool_progress_becomes_an_event() {
    let events = Events::default();
    let t = Tool::dynamic(
        "p",
        "Progress.",
        json!({"type": "object"}),
        |_a: Value, ctx: agentloop::ToolContext| async move {
            ctx.progress.send(json!({"done": 0.5}));
            Ok(ToolOutput::text("ok"))
        },
    );
    let model = ScriptedModel::new([calls(&[("a", "p", "{}")]), ModelResponse::text("k")]);
    Agent::builder()
        .model(model)
        .tool(t)
        .sink(events.sink())
        .build()
        .unwrap()
        .run("go")
        .await;
    assert!(events.all().iter().any(
        |e| matches!(&e.kind, EventKind::ToolProgress { call_id, .. } if call_id == "a")
            && e.turn == 1
    ));
}

#[tokio::test]
async fn stream_yields_events_then_the_outcome() {
    let log = CallLog::default();
    let model = ScriptedModel::new([calls(&[("a", "alpha", "{}")]), ModelResponse::text("done")]);
    let a = agent(model, vec![sleeper("alpha", &log)], Limits::default());
    let items: Vec<StreamItem> = a.stream("go").collect().await;
    assert!(items.len() > 3);
    let last = items.last().unwrap();
    let StreamItem::Outcome(out) = last else {
        panic!("the last item is the outcome")
    };
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(
        items
            .iter()
            .filter(|i| matches!(i, StreamItem::Outcome(_)))
            .count(),
        1
    );
}

#[tokio::test]
async fn a_session_carries_the_transcript_into_the_next_run() {
    let model = FunctionModel::new(|req| {
        let users = req
            .messages
            .iter()
            .filter(|m| matches!(m, Message::User { .. }))
            .count();
        Ok(ModelResponse::text(format!(
            "I have seen {users} user messages"
        )))
    });
    let a = Agent::builder().model(model).build().unwrap();
    let mut session = Session::new();
    a.run_in(&mut session, "one").await;
    let out = a.run_in(&mut session, "two").await;
    assert_eq!(out.output.as_deref(), Some("I have seen 2 user messages"));
    assert_eq!(session.messages.len(), 4);
    assert_eq!(out.new_messages().len(), 2);
}

#[tokio::test]
async fn registration_refuses_bad_names_duplicates_and_invalid_schemas() {
    let ok = |n: &str| {
        Tool::dynamic(n, "d", json!({"type": "object"}), |_a: Value, _c| async {
            Ok(ToolOutput::text(""))
        })
    };
    let model = || ScriptedModel::new([]);
    for bad in ["", "1abc", "has space", "dot.name", &"a".repeat(129)] {
        let err = Agent::builder()
            .model(model())
            .tool(ok("first"))
            .tool(ok(bad))
            .build()
            .unwrap_err();
        assert_eq!(err.code(), "tool.invalid_name", "{bad:?}");
        assert!(
            err.to_string().contains("first"),
            "lists what is registered: {err}"
        );
    }
    assert!(
        Agent::builder()
            .model(model())
            .tool(ok(&"a".repeat(128)))
            .tool(ok("x-y_z9"))
            .build()
            .is_ok()
    );
    let err = Agent::builder()
        .model(model())
        .tool(ok("same"))
        .tool(ok("same"))
        .build()
        .unwrap_err();
    assert_eq!(err.code(), "tool.duplicate");
    let bad_schema = Tool::dynamic(
        "s",
        "d",
        json!({"type": "object", "properties": {"a": {"type": 12}}}),
        |_a: Value, _c| async { Ok(ToolOutput::text("")) },
    );
    let err = Agent::builder()
        .model(model())
        .tool(bad_schema)
        .build()
        .unwrap_err();
    assert_eq!(err.code(), "tool.invalid_schema");
    let not_object = Tool::dynamic("s", "d", json!({"type": "string"}), |_a: Value, _c| async {
        Ok(ToolOutput::text(""))
    });
    assert_eq!(
        Agent::builder()
            .model(model())
            .tool(not_object)
            .build()
            .unwrap_err()
            .code(),
        "tool.invalid_schema"
    );
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct WeatherArgs {
    /// The city to look up.
    city: String,
    /// Units: celsius or fahrenheit.
    #[serde(default = "celsius")]
    unit: String,
}

fn celsius() -> String {
    "celsius".into()
}

#[tokio::test]
async fn a_typed_tool_gets_its_schema_from_its_argument_type() {
    let t =
        Tool::builder("weather").description("Weather.").handler(
            |a: WeatherArgs, _ctx| async move {
                Ok::<_, ToolError>(format!("{}: 18 {}", a.city, a.unit))
            },
        );
    let schema = &t.spec().input_schema;
    assert_eq!(
        schema["properties"]["city"]["description"],
        "The city to look up."
    );
    assert_eq!(schema["required"], json!(["city"]));
    assert!(schema.get("$schema").is_none());
    let model = ScriptedModel::new([
        calls(&[("a", "weather", r#"{"city": "Paris"}"#)]),
        ModelResponse::text("ok"),
    ]);
    let out = agent(model, vec![t], Limits::default()).run("go").await;
    assert_eq!(
        out.tool_calls[0].outcome.output().cloned(),
        Some(agentloop::message::ToolContent::Text(
            "Paris: 18 celsius".into()
        ))
    );
}

#[tokio::test]
async fn a_script_file_runs_with_raw_argument_strings() {
    let log = CallLog::default();
    let model = ScriptedModel::from_json(
        r#"[{"tool_calls": [{"id": "a", "name": "alpha", "arguments": "{\"tag\": \"raw\"}"}, {"name": "alpha", "arguments": {"tag": "obj"}}]},
            {"text": "done", "usage": {"input_tokens": 3, "output_tokens": 2}}]"#,
    )
    .unwrap();
    let out = agent(model, vec![sleeper("alpha", &log)], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.tool_calls[1].arguments, json!({"tag": "obj"}));
    assert_eq!(out.usage.output_tokens, 2);
    let exhausted = agent(ScriptedModel::new([]), vec![], Limits::default())
        .run("go")
        .await;
    assert_eq!(exhausted.error.unwrap().code(), "model.exhausted");
}

/// A tool that fails recoverably (code `busy`) on its first `failures` calls, then succeeds;
/// `fatal` makes the failures fatal instead.
fn flaky(name: &str, failures: usize, fatal: bool, runs: &Arc<AtomicUsize>) -> Tool {
    let runs = runs.clone();
    Tool::builder(name)
        .description("Fails a few times, then works.")
        .retries(2)
        .dynamic(json!({"type": "object"}), move |_a: Value, _c| {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < failures {
                    if fatal {
                        return Err(ToolError::fatal("the disk is gone"));
                    }
                    return Err(ToolError::new("busy", format!("attempt {} failed", n + 1)));
                }
                Ok(ToolOutput::text("it worked"))
            }
        })
}

#[tokio::test(start_paused = true)]
async fn a_tool_with_retries_runs_again_and_the_model_reads_only_the_last_attempt() {
    let runs = Arc::new(AtomicUsize::new(0));
    let events = Events::default();
    let model = ScriptedModel::new([calls(&[("a", "flaky", "{}")]), ModelResponse::text("done")]);
    let a = Agent::builder()
        .model(model)
        .tool(flaky("flaky", 2, false, &runs))
        .sink(events.sink())
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let record = &out.tool_calls[0];
    assert_eq!(record.outcome.status, CallStatus::Ok);
    assert_eq!(record.outcome.retries, 2);
    assert_eq!(out.tool_calls_run, 1, "one call, however many attempts");
    // 100 ms, then 200 ms between the attempts.
    assert!(started.elapsed() >= Duration::from_millis(300));
    let result = out
        .transcript
        .iter()
        .find_map(|m| m.as_tool_result())
        .unwrap();
    assert!(!result.is_error);
    assert_eq!(result.content.to_text(), "it worked");
    // The transcript the model continued from holds one call and its one (successful) result.
    assert_eq!(
        out.transcript
            .iter()
            .filter(|m| m.as_tool_result().is_some())
            .count(),
        1
    );
    let retrying: Vec<(u32, String)> = events
        .all()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolRetrying {
                retry,
                message,
                code,
                ..
            } => {
                assert_eq!(code, "busy");
                Some((*retry, message.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        retrying,
        [
            (1, "attempt 1 failed".to_owned()),
            (2, "attempt 2 failed".to_owned())
        ]
    );
    assert_tool_cycle(&out.transcript);
}

/// A tool given a whole retry policy waits its backoff; the jitter it asks for is drawn from the
/// call id, so two runs with the same ids wait the same.
#[tokio::test(start_paused = true)]
async fn a_tools_retry_policy_sets_its_waits_and_its_jitter_replays_exactly() {
    let policy = RetryPolicy::attempts(3)
        .with_base_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter(0.5);
    let mut runs_delays = Vec::new();
    for _ in 0..2 {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let tool = Tool::builder("flaky").retry(policy.clone()).dynamic(
            json!({"type": "object"}),
            move |_a: Value, _c| {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 2 {
                        return Err(ToolError::new("busy", "not yet"));
                    }
                    Ok(ToolOutput::text("it worked"))
                }
            },
        );
        assert_eq!(tool.policy().retry, policy);
        let events = Events::default();
        let model =
            ScriptedModel::new([calls(&[("a", "flaky", "{}")]), ModelResponse::text("done")]);
        let a = Agent::builder()
            .model(model)
            .tool(tool)
            .sink(events.sink())
            .build()
            .unwrap();
        let started = tokio::time::Instant::now();
        let out = a.run("go").await;
        assert_eq!(out.tool_calls[0].outcome.retries, 2);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        let delays: Vec<Duration> = events
            .all()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolRetrying { delay, .. } => Some(*delay),
                _ => None,
            })
            .collect();
        assert_eq!(delays.len(), 2);
        for (retry, delay) in (1..).zip(&delays) {
            let backoff = policy.backoff(retry);
            assert!(*delay <= backoff && *delay >= backoff / 2, "{delay:?}");
        }
        assert!(started.elapsed() >= delays.iter().sum());
        runs_delays.push(delays);
    }
    assert_eq!(runs_delays[0], runs_delays[1]);
}

#[tokio::test(start_paused = true)]
async fn when_retries_run_out_the_model_reads_the_last_failure_and_fatal_errors_are_never_retried()
{
    let runs = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([calls(&[("a", "flaky", "{}")]), ModelResponse::text("done")]);
    let out = agent(
        model,
        vec![flaky("flaky", 5, false, &runs)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "one attempt and two retries"
    );
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Error);
    assert_eq!(out.tool_calls[0].outcome.retries, 2);
    assert_eq!(
        out.tool_calls[0].outcome.error_text().as_deref(),
        Some("attempt 3 failed")
    );

    let runs = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([calls(&[("a", "flaky", "{}")]), ModelResponse::text("never")]);
    let out = agent(
        model,
        vec![flaky("flaky", 5, true, &runs)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a fatal error is not retried"
    );
    assert_eq!(out.tool_calls[0].outcome.retries, 0);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_is_retried_and_arguments_the_handler_cannot_read_are_not() {
    let runs = Arc::new(AtomicUsize::new(0));
    let slow_once = {
        let runs = runs.clone();
        Tool::builder("slow_once")
            .description("Hangs the first time.")
            .timeout(Duration::from_secs(1))
            .retries(1)
            .dynamic(json!({"type": "object"}), move |_a: Value, _c| {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    Ok(ToolOutput::text("fast now"))
                }
            })
    };
    let model = ScriptedModel::new([
        calls(&[("a", "slow_once", "{}")]),
        ModelResponse::text("done"),
    ]);
    let out = agent(model, vec![slow_once], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Ok);
    assert_eq!(out.tool_calls[0].outcome.retries, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A typed handler whose arguments do not deserialize fails the same way every time.
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Exact {
        // The schema says any integer; the handler's type takes 0-255.
        #[allow(dead_code)]
        #[schemars(with = "i64")]
        n: u8,
    }
    let typed_runs = Arc::new(AtomicUsize::new(0));
    let counter = typed_runs.clone();
    let typed = Tool::builder("typed")
        .retries(3)
        .handler(move |_args: Exact, _c| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ToolError>("ran") }
        });
    // 300 passes the schema's integer type but not u8: the handler cannot read it.
    let model = ScriptedModel::new([
        calls(&[("a", "typed", r#"{"n": 300}"#)]),
        ModelResponse::text("done"),
    ]);
    let out = agent(model, vec![typed], Limits::default()).run("go").await;
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Error);
    assert_eq!(out.tool_calls[0].outcome.retries, 0);
    assert_eq!(typed_runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn no_retry_starts_after_the_deadline() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let watcher = Tool::builder("watcher")
        .description("Waits, and fails recoverably when the run is cancelled.")
        .retries(3)
        .dynamic(json!({"type": "object"}), move |_a: Value, ctx| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(60)) => Ok(ToolOutput::text("late")),
                    _ = ctx.cancel.cancelled() => Err(ToolError::new("interrupted", "the run stopped")),
                }
            }
        });
    let model = ScriptedModel::new([
        calls(&[("a", "watcher", "{}")]),
        ModelResponse::text("never"),
    ]);
    let limits = Limits {
        timeout: Some(Duration::from_millis(50)),
        grace_period: Duration::from_secs(5),
        ..Limits::default()
    };
    let out = agent(model, vec![watcher], limits).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the failed attempt was not retried"
    );
    assert_eq!(out.tool_calls[0].outcome.retries, 0);
    assert_tool_cycle(&out.transcript);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_tool_error_is_not_retried() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let lookup = Tool::builder("lookup")
        .description("Knows no city.")
        .retries(3)
        .dynamic(json!({"type": "object"}), move |_a: Value, _c| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Err::<ToolOutput, _>(ToolError::new("not_found", "no such city").permanent()) }
        });
    let model = ScriptedModel::new([calls(&[("a", "lookup", "{}")]), ModelResponse::text("done")]);
    let out = agent(model, vec![lookup], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(out.tool_calls[0].outcome.retries, 0);
    assert_eq!(
        out.tool_calls[0].outcome.error_text().as_deref(),
        Some("no such city")
    );
    // Permanence is about retries only: the model still reads the error, and a fatal one stays fatal.
    assert!(ToolError::fatal("x").permanent().is_fatal());
}

/// A tool on its own task that blocks its thread for 1.5 s, a model that calls it once, and a
/// deadline of 100 ms with a grace period of 100 ms.
fn blocked_past_the_deadline() -> (Tool, ScriptedModel, Limits) {
    let blocking = Tool::builder("blocking")
        .description("Blocks its thread.")
        .own_task(true)
        .dynamic(json!({"type": "object"}), |_a: Value, _c| async {
            std::thread::sleep(Duration::from_millis(1500));
            Ok(ToolOutput::text("late"))
        });
    let model = ScriptedModel::new([
        calls(&[("a", "blocking", "{}")]),
        ModelResponse::text("never"),
    ]);
    let limits = Limits {
        timeout: Some(Duration::from_millis(100)),
        grace_period: Duration::from_millis(100),
        ..Limits::default()
    };
    (blocking, model, limits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_tool_on_its_own_task_does_not_hold_up_the_deadline() {
    let (blocking, model, limits) = blocked_past_the_deadline();
    let started = std::time::Instant::now();
    let out = agent(model, vec![blocking], limits).run("go").await;
    assert_cut_at_the_deadline(&out, started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_run_ends_at_its_deadline_past_a_blocking_tool_on_its_own_task() {
    // The stream, not only `run`: its last item, the outcome, comes at the deadline and the
    // grace period, while the handler still blocks its thread.
    let (blocking, model, limits) = blocked_past_the_deadline();
    let started = std::time::Instant::now();
    let items: Vec<StreamItem> = agent(model, vec![blocking], limits)
        .stream("go")
        .collect()
        .await;
    let Some(StreamItem::Outcome(out)) = items.last() else {
        panic!("the last item is the outcome: {items:?}")
    };
    assert_cut_at_the_deadline(out, started);
}

/// The run stopped at its deadline with the blocking call cancelled, at the deadline and the
/// grace period, not the 1.5 s the handler blocks for.
fn assert_cut_at_the_deadline(out: &agentloop::RunOutcome, started: std::time::Instant) {
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Cancelled);
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "{:?}",
        started.elapsed()
    );
    assert_tool_cycle(&out.transcript);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_of_a_blocking_tool_on_its_own_task_fires() {
    let blocking = Tool::builder("blocking")
        .description("Blocks its thread.")
        .own_task(true)
        .timeout(Duration::from_millis(100))
        .dynamic(json!({"type": "object"}), |_a: Value, _c| async {
            std::thread::sleep(Duration::from_millis(600));
            Ok(ToolOutput::text("late"))
        });
    let model = ScriptedModel::new([
        calls(&[("a", "blocking", "{}")]),
        ModelResponse::text("done"),
    ]);
    let started = std::time::Instant::now();
    let out = agent(model, vec![blocking], Limits::default())
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Error);
    assert_eq!(out.tool_calls[0].outcome.code.as_deref(), Some("timeout"));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_result_that_breaks_the_tools_output_schema_is_an_error_the_model_reads() {
    let typed = Tool::builder("typed")
        .description("Declares its output.")
        .output_schema(json!({"type": "object", "required": ["ok"]}))
        .dynamic(json!({"type": "object"}), |a: Value, _c| async move {
            Ok(ToolOutput::json(a))
        });
    let model = ScriptedModel::new([
        calls(&[
            ("a", "typed", r#"{"ok": true}"#),
            ("b", "typed", r#"{"no": 1}"#),
        ]),
        ModelResponse::text("done"),
    ]);
    let out = agent(model, vec![typed], Limits::default()).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Ok);
    let bad = &out.tool_calls[1].outcome;
    assert_eq!(bad.status, CallStatus::Error);
    assert_eq!(bad.code.as_deref(), Some("invalid_output"));
    assert!(bad.content.to_text().contains("ok"), "{bad:?}");
}

#[tokio::test]
async fn what_the_model_reads_of_an_error_is_bounded() {
    let loud = Tool::dynamic(
        "loud",
        "Fails loudly.",
        json!({"type": "object"}),
        |_a: Value, _c| async {
            Err::<ToolOutput, _>(ToolError::new("x".repeat(1000), "é".repeat(100_000)))
        },
    );
    let model = ScriptedModel::new([calls(&[("a", "loud", "{}")]), ModelResponse::text("done")]);
    let out = agent(model, vec![loud], Limits::default()).run("go").await;
    let o = &out.tool_calls[0].outcome;
    assert!(o.code.as_ref().unwrap().chars().count() <= agentloop::outcome::codes::MAX_CODE_LEN);
    let text = o.content.to_text();
    assert!(
        text.len() <= agentloop::outcome::codes::MAX_ERROR_TEXT,
        "{}",
        text.len()
    );
    assert!(text.contains("cut"), "says it was cut");
}

#[tokio::test]
async fn a_stop_condition_and_a_review_hook_steer_a_real_run() {
    struct CiteASource;
    impl agentloop::Hook for CiteASource {
        fn name(&self) -> &str {
            "cite"
        }
        fn review_answer<'a>(
            &'a self,
            _ctx: agentloop::hooks::HookContext<'a>,
            answer: &'a ModelResponse,
        ) -> futures::future::BoxFuture<'a, agentloop::hooks::HookResult<Option<String>>> {
            let missing = !answer.message.text.contains("[source]");
            Box::pin(async move { Ok(missing.then(|| "you did not cite a source".to_owned())) })
        }
    }
    let model = ScriptedModel::new([
        ModelResponse::text("it is so"),
        ModelResponse::text("it is so [source]"),
    ]);
    let a = Agent::builder()
        .model(model)
        .hook(CiteASource)
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.output.as_deref(), Some("it is so [source]"));
    assert!(
        out.transcript
            .iter()
            .any(|m| m.text() == "you did not cite a source")
    );

    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new(
        (0..5)
            .map(|i| calls(&[("c", "count", &*format!(r#"{{"n": {i}}}"#))]))
            .chain([ModelResponse::text("never")]),
    );
    let a = Agent::builder()
        .model(model)
        .tool(counting_tool("count", &n))
        .stop_when("two_calls", |s| s.tool_calls_run >= 2)
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Terminated);
    assert_eq!(n.load(Ordering::SeqCst), 2);
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn on_limit_answer_makes_no_model_call_past_max_model_calls_when_the_turn_limit_trips_with_it()
 {
    // The second response reaches both the turn limit and the model-call limit. The turn limit
    // is reported, but no model call is left for a last answer: the run stops at once.
    let model = ScriptedModel::new([
        calls(&[("a", "same", r#"{"n": 1}"#)]),
        calls(&[("b", "same", r#"{"n": 2}"#)]),
        ModelResponse::text("past the limit"),
    ]);
    let n = Arc::new(AtomicUsize::new(0));
    let limits = Limits {
        max_turns: Some(2),
        max_model_calls: Some(2),
        on_limit: agentloop::OnLimit::Answer,
        ..Limits::default()
    };
    let out = agent(model.clone(), vec![constant_tool("same", &n)], limits)
        .run("go")
        .await;
    assert_eq!(model.calls(), 2, "the model was called past its limit");
    assert_eq!(out.model_calls, 2);
    assert_eq!(out.stop_reason, StopReason::MaxTurns);
    assert_eq!(out.output, None);
    assert_eq!(
        n.load(Ordering::SeqCst),
        1,
        "the last turn's call never ran"
    );
    let last = &out.tool_calls[1].outcome;
    assert!(last.content.to_text().starts_with("not run:"), "{last:?}");
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn a_dry_run_that_polls_the_same_call_is_not_a_stuck_loop() {
    // The real tool would answer `running`, `running`, `done`; a dry run reads `skipped` each
    // time, which says nothing of whether the real results would repeat.
    let n = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        calls(&[("a", "same", r#"{"n": 1}"#)]),
        calls(&[("b", "same", r#"{"n": 1}"#)]),
        calls(&[("c", "same", r#"{"n": 1}"#)]),
        ModelResponse::text("the job is done"),
    ]);
    let options = RunOptions {
        skip_tools: true,
        ..RunOptions::default()
    };
    let out = agent(model, vec![constant_tool("same", &n)], Limits::default())
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.limit);
    assert_eq!(out.output.as_deref(), Some("the job is done"));
    assert_eq!(n.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(out.tool_calls.len(), 3);
    assert!(
        out.tool_calls
            .iter()
            .all(|r| r.outcome.status == CallStatus::Skipped)
    );
    assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn batches_of_many_and_few_calls_one_after_another_keep_each_turns_results_in_order() {
    // A batch's slots are inline in its box up to four calls and spill past that: batches of
    // 6, 2, 5, 1 and 3 calls (with a refused call among them) must each fold their own calls,
    // in decision order, with nothing left from the batch before.
    let sizes = [6usize, 2, 5, 1, 3];
    let mut script: Vec<ModelResponse> = sizes
        .iter()
        .enumerate()
        .map(|(t, &n)| {
            ModelResponse::tool_calls((0..n).map(|k| {
                // The second call of the third turn names no tool of the agent.
                let tool = if t == 2 && k == 1 { "missing" } else { "echo" };
                (
                    format!("t{t}_{k}"),
                    tool.to_owned(),
                    format!(r#"{{"tag": "t{t}_{k}", "ms": {}}}"#, (n - k) * 2),
                )
            }))
        })
        .collect();
    script.push(ModelResponse::text("done"));
    let log = CallLog::default();
    let out = agent(
        ScriptedModel::new(script),
        vec![sleeper("echo", &log)],
        Limits::default(),
    )
    .run("go")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    let expected: Vec<(u32, String)> = sizes
        .iter()
        .enumerate()
        .flat_map(|(t, &n)| (0..n).map(move |k| (t as u32 + 1, format!("t{t}_{k}"))))
        .collect();
    let records: Vec<(u32, String)> = out
        .tool_calls
        .iter()
        .map(|r| (r.turn, r.call_id.to_string()))
        .collect();
    assert_eq!(records, expected);
    for r in &out.tool_calls {
        if &*r.call_id == "t2_1" {
            assert_eq!(r.outcome.status, CallStatus::Rejected, "{r:?}");
        } else {
            assert!(r.ok(), "{r:?}");
            assert_eq!(r.arguments.to_value()["tag"], json!(&*r.call_id));
        }
    }
    // The transcript: each turn's assistant message, then its results in the same order.
    let results: Vec<String> = out
        .transcript
        .iter()
        .filter_map(|m| match m {
            Message::Tool(r) => Some(r.call_id.to_string()),
            _ => None,
        })
        .collect();
    let ids: Vec<String> = expected.into_iter().map(|(_, id)| id).collect();
    assert_eq!(results, ids);
    assert_eq!(log.len(), ids.len() - 1);
}
