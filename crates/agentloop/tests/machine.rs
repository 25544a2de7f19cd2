//! The state machine on its own: no async, no clock, no I/O. Each test plays the driver by hand:
//! it asks for the action, answers with an input, and checks what the machine decides.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use agentloop::machine::{
    Action, HookFailure, Input, Interrupt, RunMachine, RunStart, Seams, Step,
};
use agentloop::{
    Agent, CallOutcome, CallStatus, Limits, Message, ModelResponse, StopReason, Tool, ToolOutput,
    Verdict, hooks::HookRole, ids::SequentialIds, testing::ScriptedModel,
};
use serde_json::{Value, json};

/// A tool that answers with its arguments.
fn echo() -> Tool {
    Tool::dynamic(
        "echo",
        "Echo.",
        json!({"type": "object"}),
        |a: Value, _c| async { Ok(ToolOutput::json(a)) },
    )
}

fn agent(limits: Limits) -> Agent {
    Agent::builder()
        .model(ScriptedModel::new([]))
        .instructions("be brief")
        .tool(echo())
        .limits(limits)
        .build()
        .unwrap()
}

fn machine_with(limits: Limits, seams: Seams) -> RunMachine {
    machine_of(&agent(limits), seams)
}

/// A fresh run of `agent`, asked "hi".
fn machine_of(agent: &Agent, seams: Seams) -> RunMachine {
    started(agent, seams, false)
}

/// A fresh run of `agent`, asked "hi", its events kept when `observed`.
fn started(agent: &Agent, seams: Seams, observed: bool) -> RunMachine {
    RunMachine::new(
        Arc::clone(agent.config()),
        RunStart {
            run_id: Arc::from("r"),
            ids: Arc::new(SequentialIds::default()),
            seams,
            limits: None,
            transcript: Vec::new(),
            input: Some(Message::user("hi")),
            observed,
        },
    )
}

fn machine(limits: Limits) -> RunMachine {
    machine_with(limits, Seams::default())
}

fn feed(m: &mut RunMachine, ms: u64, input: Input) {
    m.feed(Step {
        at: Duration::from_millis(ms),
        input,
    });
}

fn respond(m: &mut RunMachine, ms: u64, response: ModelResponse) {
    assert!(matches!(m.action(), Action::CallModel(_)), "{m:?}");
    feed(
        m,
        ms,
        Input::ModelResponded {
            response: Box::new(response),
            cost: None,
            failures: Vec::new(),
        },
    );
}

/// Plays a whole batch: starts every call the machine hands out and finishes each with `ok`.
/// Returns how many calls ran, or `None` when the machine asked for no batch.
fn run_batch(m: &mut RunMachine, ms: u64) -> Option<usize> {
    let mut ran = 0;
    let mut started = Vec::new();
    loop {
        match m.action() {
            Action::StartCall(call) => {
                let position = call.position;
                started.push(position);
                feed(m, ms, Input::CallStarted { position });
            }
            Action::AwaitCalls { .. } => {
                let position = started.remove(0);
                ran += 1;
                feed(
                    m,
                    ms,
                    Input::CallFinished {
                        position,
                        outcome: CallOutcome::ok(ToolOutput::text("ok")),
                        failures: Vec::new(),
                    },
                );
            }
            _ => return (ran > 0).then_some(ran),
        }
    }
}

#[test]
fn the_machine_asks_for_the_model_then_the_calls_then_finishes() {
    let mut m = machine(Limits::default());
    let Action::CallModel(req) = m.action() else {
        panic!("expected a model call")
    };
    assert_eq!(req.instructions, Some("be brief"));
    assert_eq!(req.messages.len(), 1);
    assert_eq!(req.tools.len(), 1);
    respond(
        &mut m,
        1,
        ModelResponse::tool_calls([("", "echo", r#"{"a":1}"#)]),
    );
    let Action::StartCall(call) = m.action() else {
        panic!("expected a call to start")
    };
    assert_eq!(
        &*call.call_id, "call_1",
        "blank ids come from the injected id source"
    );
    assert_eq!(*call.arguments, json!({"a": 1}));
    assert_eq!(run_batch(&mut m, 2), Some(1));
    m.feed(Step {
        at: Duration::from_millis(3),
        input: Input::ModelResponded {
            response: Box::new(ModelResponse::text("bye")),
            cost: Some(0.25),
            failures: Vec::new(),
        },
    });
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::from_millis(3));
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.output.as_deref(), Some("bye"));
    assert_eq!(out.cost_usd, 0.25);
    assert_eq!(out.transcript.len(), 4);
}

#[test]
fn the_same_inputs_give_the_same_run() {
    let drive = || {
        let mut m = machine(Limits::default());
        respond(
            &mut m,
            0,
            ModelResponse::tool_calls([("", "echo", "{}"), ("", "echo", r#"{"x":2}"#)]),
        );
        run_batch(&mut m, 1);
        respond(&mut m, 2, ModelResponse::text("end"));
        serde_json::to_string(&m.into_outcome(Duration::ZERO).transcript).unwrap()
    };
    assert_eq!(drive(), drive());
}

#[test]
fn the_deadline_is_checked_before_each_model_call_with_the_injected_time() {
    let mut m = machine(Limits {
        timeout: Some(Duration::from_secs(5)),
        ..Limits::default()
    });
    respond(
        &mut m,
        1000,
        ModelResponse::tool_calls([("a", "echo", "{}")]),
    );
    assert_eq!(run_batch(&mut m, 6000), Some(1));
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::from_secs(6));
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(out.limit.unwrap().consumed, 6000.0);
}

#[test]
fn a_denied_call_gives_its_slot_in_the_budget_back() {
    let seams = Seams {
        gates: 1,
        ..Seams::default()
    };
    let mut m = machine_with(
        Limits {
            max_tool_calls: Some(1),
            ..Limits::default()
        },
        seams,
    );
    respond(&mut m, 0, ModelResponse::tool_calls([("a", "echo", "{}")]));
    assert!(matches!(m.action(), Action::Admit { gate: 0, .. }));
    feed(
        &mut m,
        0,
        Input::Admitted {
            verdicts: vec![Verdict::Deny("no".into())],
            failures: Vec::new(),
        },
    );
    respond(
        &mut m,
        0,
        ModelResponse::tool_calls([("b", "echo", r#"{"k":1}"#)]),
    );
    assert!(
        matches!(m.action(), Action::Admit { .. }),
        "the denied call did not use the budget"
    );
}

#[test]
fn a_follow_up_message_continues_a_finished_run() {
    let seams = Seams {
        steering: true,
        ..Seams::default()
    };
    let mut m = machine_with(Limits::default(), seams);
    let messages = |messages: Vec<Message>, follow_up| Input::Messages {
        messages,
        follow_up,
    };
    assert!(matches!(
        m.action(),
        Action::TakeMessages { follow_up: false }
    ));
    feed(&mut m, 0, messages(Vec::new(), false));
    respond(&mut m, 0, ModelResponse::text("first"));
    assert!(matches!(
        m.action(),
        Action::TakeMessages { follow_up: false }
    ));
    feed(&mut m, 0, messages(Vec::new(), false));
    assert!(matches!(
        m.action(),
        Action::TakeMessages { follow_up: true }
    ));
    feed(&mut m, 0, messages(vec![Message::user("and then?")], true));
    respond(&mut m, 0, ModelResponse::text("second"));
    feed(&mut m, 0, messages(Vec::new(), false));
    feed(&mut m, 0, messages(Vec::new(), true));
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.output.as_deref(), Some("second"));
    assert_eq!(out.turns, 2);
}

/// One tool turn: the model's calls, then an ok outcome for each admitted call.
fn tool_turn(m: &mut RunMachine, now: u64, calls: &[(&str, &str, &str)]) -> Option<usize> {
    respond(m, now, ModelResponse::tool_calls(calls.iter().copied()));
    run_batch(m, now + 1)
}

fn owned(calls: &[(String, String, String)]) -> Vec<(&str, &str, &str)> {
    calls
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect()
}

#[test]
fn the_stuck_loop_rule_judges_whole_turns_by_their_calls_and_results() {
    // Each turn: a call to an unknown tool (rejected, fed back the same each time) and the same
    // echo call (the same "ok" each time), plus, in the first run, an echo call whose arguments
    // change: progress, so never a loop.
    let turn = |n: Option<u32>| {
        let mut calls = vec![
            (String::new(), "nope".to_owned(), r#"{"x": 1}"#.to_owned()),
            (
                String::new(),
                "echo".to_owned(),
                r#"{"b": 2, "a": 1}"#.to_owned(),
            ),
        ];
        if let Some(n) = n {
            calls.push((String::new(), "echo".to_owned(), format!(r#"{{"n": {n}}}"#)));
        }
        calls
    };
    let mut m = machine(Limits::default());
    for n in 1..=5u32 {
        let calls = turn(Some(n));
        assert_eq!(
            tool_turn(&mut m, u64::from(n) * 10, &owned(&calls)),
            Some(2)
        );
    }
    assert!(
        matches!(m.action(), Action::CallModel(_)),
        "progress goes on"
    );

    let mut m = machine(Limits::default());
    for n in 1..=3u64 {
        assert_eq!(tool_turn(&mut m, n * 10, &owned(&turn(None))), Some(1));
    }
    assert!(matches!(m.action(), Action::Finish), "three same turns");
    let out = m.into_outcome(Duration::from_millis(40));
    assert_eq!(out.stop_reason, StopReason::StuckLoop);
    assert_eq!(out.tool_calls_run, 3);
    assert_every_call_answered(&out.transcript);
}

#[test]
fn the_response_that_crosses_the_token_budget_runs_no_tool() {
    let mut m = machine(Limits {
        max_tokens: Some(100),
        ..Limits::default()
    });
    let mut r = ModelResponse::tool_calls([("a", "echo", "{}")]);
    r.usage.input_tokens = 90;
    r.usage.output_tokens = 20;
    respond(&mut m, 1, r);
    assert!(matches!(m.action(), Action::Finish), "no call is started");
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Budget);
    assert_eq!(out.tool_calls_run, 0);
    assert_eq!(
        out.tool_calls[0].outcome.code.as_deref(),
        Some("limit.max_tokens")
    );
    assert_every_call_answered(&out.transcript);
}

#[test]
fn a_cut_answer_is_asked_again_once_with_a_larger_limit_then_stops_truncated() {
    let cfg = Agent::builder()
        .model(ScriptedModel::new([]))
        .settings(agentloop::model::ModelSettings {
            max_tokens: Some(100),
            ..Default::default()
        })
        .build()
        .unwrap();
    let mut m = machine_of(&cfg, Seams::default());
    let cut = || {
        let mut r = ModelResponse::text("the answer is lo");
        r.finish_reason = agentloop::model::FinishReason::Length;
        r
    };
    respond(&mut m, 1, cut());
    let Action::CallModel(req) = m.action() else {
        panic!("asked again")
    };
    assert_eq!(req.settings.max_tokens, Some(200));
    assert_eq!(
        req.messages.len(),
        1,
        "the cut answer is not kept for the retry"
    );
    respond(&mut m, 2, cut());
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Truncated);
    assert_eq!(out.output.as_deref(), Some("the answer is lo"));
    assert_eq!(out.error.unwrap().code(), "model.truncated");
    assert_eq!(out.turns, 1);
    assert_eq!(out.model_calls, 2);
}

#[test]
fn a_refused_response_runs_none_of_its_calls_and_is_not_finished() {
    let mut m = machine(Limits::default());
    let mut r = ModelResponse::tool_calls([("a", "echo", "{}")]);
    r.message.text = "I can't help with that.".into();
    r.finish_reason = agentloop::model::FinishReason::Refusal;
    respond(&mut m, 1, r);
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Refused);
    assert_eq!(out.tool_calls_run, 0);
    let err = out.error.unwrap();
    assert_eq!(err.code(), "model.refused");
    assert!(err.to_string().contains("can't help"), "{err}");
    assert_every_call_answered(&out.transcript);

    let mut m = machine(Limits::default());
    let mut r = ModelResponse::text("");
    r.finish_reason = agentloop::model::FinishReason::ContentFilter;
    respond(&mut m, 1, r);
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::ContentFilter);
    assert_eq!(out.error.unwrap().code(), "model.content_filter");
}

#[test]
fn the_calls_of_a_refused_response_are_not_run_cancelled_and_announced() {
    // `not_run` has one status wherever it is given (the code table's `cancelled`), and the calls
    // of a refused response are still announced, each as rejected.
    let mut m = started(&agent(Limits::default()), Seams::default(), true);
    let mut r = ModelResponse::tool_calls([("a", "echo", "{}"), ("b", "echo", "{}")]);
    r.finish_reason = agentloop::model::FinishReason::Refusal;
    respond(&mut m, 1, r);
    let rejected: Vec<(String, CallStatus)> = m
        .drain_events()
        .filter_map(|(_, k)| match k {
            agentloop::event::EventKind::ToolRejected {
                call_id,
                code,
                outcome,
                ..
            } => {
                assert_eq!(code, "not_run");
                Some((call_id, outcome.status))
            }
            _ => None,
        })
        .collect();
    let cancelled = CallStatus::Cancelled;
    assert_eq!(
        rejected,
        [("a".to_owned(), cancelled), ("b".to_owned(), cancelled)]
    );
    let out = m.into_outcome(Duration::ZERO);
    for record in &out.tool_calls {
        assert_eq!(record.outcome.status, cancelled);
        assert_eq!(record.outcome.code.as_deref(), Some("not_run"));
        assert_eq!(record.outcome.status, CallOutcome::not_run().status);
    }
    assert_eq!(out.tool_calls.len(), 2);
}

#[test]
fn on_limit_answer_makes_one_last_call_without_tools_and_keeps_the_limit_as_the_stop() {
    let mut m = machine(Limits {
        max_turns: Some(1),
        on_limit: agentloop::OnLimit::Answer,
        ..Limits::default()
    });
    respond(&mut m, 1, ModelResponse::tool_calls([("a", "echo", "{}")]));
    let Action::CallModel(req) = m.action() else {
        panic!("a last model call")
    };
    assert_eq!(
        req.settings.tool_choice,
        Some(agentloop::model::ToolChoice::None)
    );
    respond(&mut m, 2, ModelResponse::text("partial answer"));
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::MaxTurns);
    assert_eq!(out.output.as_deref(), Some("partial answer"));
    assert_eq!(out.tool_calls_run, 0);
    let pending = &out.tool_calls[0].outcome;
    assert!(
        pending.content.to_text().starts_with("stopped:"),
        "{pending:?}"
    );
    assert_eq!(out.model_calls, 2);
    assert_every_call_answered(&out.transcript);
}

#[test]
fn a_stop_condition_ends_the_run_as_terminated_and_a_review_sends_the_model_back() {
    let seams = Seams {
        hooks: true,
        ..Seams::default()
    };
    let mut m = machine_with(Limits::default(), seams);
    let prepare = |m: &mut RunMachine| {
        assert!(matches!(m.action(), Action::PrepareRequest), "{m:?}");
        feed(
            m,
            0,
            Input::Prepared {
                changes: Default::default(),
                failures: Vec::new(),
            },
        );
    };
    prepare(&mut m);
    respond(&mut m, 1, ModelResponse::text("no source"));
    feed(
        &mut m,
        2,
        Input::Reviewed {
            failures: Vec::new(),
            reask: Some("cite a source".into()),
        },
    );
    prepare(&mut m);
    let Action::CallModel(req) = m.action() else {
        panic!("asked again")
    };
    assert_eq!(req.messages.last().unwrap().text(), "cite a source");
    respond(&mut m, 3, ModelResponse::tool_calls([("a", "echo", "{}")]));
    feed(
        &mut m,
        4,
        Input::Reviewed {
            failures: Vec::new(),
            reask: None,
        },
    );
    assert!(matches!(m.action(), Action::Admit { .. }));
    feed(
        &mut m,
        5,
        Input::Admitted {
            verdicts: vec![Verdict::Allow],
            failures: Vec::new(),
        },
    );
    assert_eq!(run_batch(&mut m, 6), Some(1));
    assert!(matches!(m.action(), Action::CheckStop));
    assert_eq!(m.state().tool_calls.len(), 1);
    feed(
        &mut m,
        7,
        Input::StopChecked {
            stop: Some("done_when_echoed".into()),
            failures: Vec::new(),
        },
    );
    assert!(matches!(m.action(), Action::Finalize));
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Terminated);
}

/// Every tool call of the transcript is followed, before the next non-tool message, by exactly
/// one result with its id.
fn assert_every_call_answered(transcript: &[Message]) {
    let mut i = 0;
    while let Some(msg) = transcript.get(i) {
        i += 1;
        let Some(a) = msg.as_assistant() else {
            continue;
        };
        for call in &a.tool_calls {
            let r = transcript
                .get(i)
                .and_then(Message::as_tool_result)
                .unwrap_or_else(|| panic!("call {} has no result: {transcript:?}", call.call_id));
            assert_eq!(r.call_id, call.call_id);
            i += 1;
        }
    }
}

#[test]
fn a_cancel_between_the_response_and_the_dispatch_answers_every_call() {
    // B1: the cancel lands while the batch waits for its gate.
    let mut m = machine_with(
        Limits::default(),
        Seams {
            gates: 1,
            ..Seams::default()
        },
    );
    respond(
        &mut m,
        0,
        ModelResponse::tool_calls([("a", "echo", "{}"), ("b", "echo", r#"{"x":1}"#)]),
    );
    assert!(matches!(m.action(), Action::Admit { .. }));
    feed(
        &mut m,
        1,
        Input::Interrupted {
            by: Interrupt::Cancelled,
        },
    );
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_every_call_answered(&out.transcript);
    assert!(
        out.tool_calls
            .iter()
            .all(|r| r.outcome.code.as_deref() == Some("not_run"))
    );
}

#[test]
fn a_failing_after_model_hook_answers_every_call_of_the_response() {
    // B2: a required after-model hook fails on a response that calls tools.
    let mut m = machine_with(
        Limits::default(),
        Seams {
            hooks: true,
            ..Seams::default()
        },
    );
    assert!(matches!(m.action(), Action::PrepareRequest));
    feed(
        &mut m,
        0,
        Input::Prepared {
            changes: Default::default(),
            failures: Vec::new(),
        },
    );
    respond(&mut m, 0, ModelResponse::tool_calls([("a", "echo", "{}")]));
    assert!(matches!(m.action(), Action::Review { .. }));
    feed(
        &mut m,
        0,
        Input::Reviewed {
            reask: None,
            failures: vec![HookFailure {
                hook: "policy".into(),
                role: HookRole::Required,
                stage: agentloop::machine::HookStage::AfterModelCall,
                message: "no".into(),
            }],
        },
    );
    assert!(matches!(m.action(), Action::Finalize));
    feed(
        &mut m,
        0,
        Input::Finalized {
            failures: Vec::new(),
        },
    );
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "hook.failed");
    assert_every_call_answered(&out.transcript);
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Cancelled);
}

#[test]
fn a_fatal_call_stops_dispatch_and_the_siblings_still_running_are_drained() {
    let mut m = machine(Limits {
        max_concurrency: 1,
        ..Limits::default()
    });
    respond(
        &mut m,
        0,
        ModelResponse::tool_calls([("a", "echo", "{}"), ("b", "echo", r#"{"x":1}"#)]),
    );
    let Action::StartCall(call) = m.action() else {
        panic!()
    };
    let position = call.position;
    feed(&mut m, 0, Input::CallStarted { position });
    assert!(matches!(m.action(), Action::AwaitCalls { retries: true }));
    feed(
        &mut m,
        1,
        Input::CallFinished {
            position,
            outcome: CallOutcome::fatal("disk on fire"),
            failures: Vec::new(),
        },
    );
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "tool.fatal");
    assert_eq!(out.tool_calls[1].outcome.code.as_deref(), Some("not_run"));
    assert_every_call_answered(&out.transcript);
}

#[test]
fn an_interrupted_batch_drains_then_cancels_what_still_runs() {
    let mut m = machine(Limits {
        timeout: Some(Duration::from_secs(1)),
        grace_period: Duration::from_millis(500),
        ..Limits::default()
    });
    respond(
        &mut m,
        0,
        ModelResponse::tool_calls([("a", "echo", "{}"), ("b", "echo", r#"{"x":1}"#)]),
    );
    for position in [0, 1] {
        feed(&mut m, 0, Input::CallStarted { position });
    }
    feed(
        &mut m,
        1000,
        Input::Interrupted {
            by: Interrupt::Deadline,
        },
    );
    let Action::Drain { until } = m.action() else {
        panic!("expected a drain: {m:?}")
    };
    assert_eq!(until, Duration::from_millis(1500));
    feed(
        &mut m,
        1200,
        Input::CallFinished {
            position: 1,
            outcome: CallOutcome::ok(ToolOutput::text("made it")),
            failures: Vec::new(),
        },
    );
    assert!(matches!(m.action(), Action::Drain { .. }));
    feed(&mut m, 1500, Input::GraceOver);
    let out = m.into_outcome(Duration::from_millis(1500));
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(out.tool_calls[0].outcome.code.as_deref(), Some("cancelled"));
    assert_eq!(out.tool_calls[1].outcome.status, CallStatus::Ok);
    assert_every_call_answered(&out.transcript);
}

/// A lead with `echo` and a subagent tool `ask`, for the suspension drains.
fn lead_with_a_worker(limits: Limits) -> Agent {
    let worker = agent(Limits::default());
    Agent::builder()
        .model(ScriptedModel::new([]))
        .tool(echo())
        .tool(worker.as_tool("ask", "A worker."))
        .limits(limits)
        .build()
        .unwrap()
}

#[test]
fn a_suspension_waits_for_the_calls_beside_its_subagents_and_not_for_them() {
    // A subagent's question suspends its parent while a plain call runs beside it: the plain
    // call runs to its end (bounded by the deadline, not cut at the grace period), and the batch
    // is over once only the subagent calls (their children left to resume) still run.
    let limits = Limits {
        timeout: Some(Duration::from_secs(60)),
        grace_period: Duration::from_millis(500),
        ..Limits::default()
    };
    let lead = lead_with_a_worker(limits);
    let mut m = machine_of(&lead, Seams::default());
    respond(
        &mut m,
        0,
        ModelResponse::tool_calls([
            ("a", "ask", r#"{"task":"t"}"#),
            ("b", "echo", "{}"),
            ("c", "ask", r#"{"task":"u"}"#),
        ]),
    );
    for position in [0, 1] {
        feed(&mut m, 0, Input::CallStarted { position });
    }
    assert!(!m.suspending());
    feed(
        &mut m,
        100,
        Input::Interrupted {
            by: Interrupt::Suspended,
        },
    );
    assert!(m.suspending());
    let Action::Drain { until } = m.action() else {
        panic!("expected a drain: {m:?}")
    };
    assert_eq!(until, Duration::from_secs(60), "bounded by the deadline");
    feed(
        &mut m,
        2000,
        Input::CallFinished {
            position: 1,
            outcome: CallOutcome::ok(ToolOutput::text("made it")),
            failures: Vec::new(),
        },
    );
    assert!(
        matches!(m.action(), Action::Finish),
        "only the subagent call is left: {m:?}"
    );
    let out = m.into_outcome(Duration::from_millis(2000));
    assert_eq!(out.stop_reason, StopReason::Suspended);
    assert_eq!(out.tool_calls[1].outcome.status, CallStatus::Ok);
    assert_every_call_answered(&out.transcript);

    // With only subagent calls running, a suspension ends the batch at once.
    let mut m = machine_of(&lead, Seams::default());
    respond(
        &mut m,
        0,
        ModelResponse::tool_calls([("a", "ask", r#"{"task":"t"}"#)]),
    );
    feed(&mut m, 0, Input::CallStarted { position: 0 });
    feed(
        &mut m,
        100,
        Input::Interrupted {
            by: Interrupt::Suspended,
        },
    );
    assert!(matches!(m.action(), Action::Finish), "{m:?}");
    assert_eq!(
        m.into_outcome(Duration::from_millis(100)).stop_reason,
        StopReason::Suspended
    );
}

#[test]
fn a_suspensions_drain_that_the_deadline_or_a_cancel_reaches_gives_its_calls_the_grace_period() {
    // The calls a suspension lets run are stopped by the deadline (or a cancel) as any call is:
    // told (`suspending()` turns false), given the grace period from then, and each one still
    // running after it is cut short with its `cancelled` record. The run still ends suspended.
    let limits = Limits {
        timeout: Some(Duration::from_secs(1)),
        grace_period: Duration::from_millis(500),
        ..Limits::default()
    };
    let lead = lead_with_a_worker(limits);
    for by in [Interrupt::Deadline, Interrupt::Cancelled] {
        let mut m = machine_of(&lead, Seams::default());
        respond(
            &mut m,
            0,
            ModelResponse::tool_calls([
                ("a", "ask", r#"{"task":"t"}"#),
                ("b", "echo", "{}"),
                ("c", "echo", r#"{"x":1}"#),
            ]),
        );
        for position in [0, 1, 2] {
            feed(&mut m, 0, Input::CallStarted { position });
        }
        feed(
            &mut m,
            100,
            Input::Interrupted {
                by: Interrupt::Suspended,
            },
        );
        assert!(m.suspending());
        let at = if by == Interrupt::Deadline { 1000 } else { 300 };
        feed(&mut m, at, Input::Interrupted { by });
        assert!(!m.suspending(), "{by:?}: every call is told now");
        let Action::Drain { until } = m.action() else {
            panic!("expected a drain: {m:?}")
        };
        assert_eq!(
            until,
            Duration::from_millis(at + 500),
            "{by:?}: the grace period"
        );
        feed(
            &mut m,
            at + 100,
            Input::CallFinished {
                position: 1,
                outcome: CallOutcome::ok(ToolOutput::text("wrapped up")),
                failures: Vec::new(),
            },
        );
        // A second interrupt changes nothing: the grace period runs from the first.
        feed(&mut m, at + 200, Input::Interrupted { by });
        let Action::Drain { until: still } = m.action() else {
            panic!("expected a drain: {m:?}")
        };
        assert_eq!(still, until, "{by:?}");
        feed(&mut m, at + 500, Input::GraceOver);
        assert!(matches!(m.action(), Action::Finish), "{by:?}: {m:?}");
        let out = m.into_outcome(Duration::from_millis(at + 500));
        assert_eq!(out.stop_reason, StopReason::Suspended, "{by:?}");
        assert_eq!(out.tool_calls[1].outcome.status, CallStatus::Ok, "{by:?}");
        assert_eq!(
            out.tool_calls[2].outcome.code.as_deref(),
            Some("cancelled"),
            "{by:?}: cut short at the end of the grace period"
        );
        assert_every_call_answered(&out.transcript);
    }
}

#[test]
fn a_call_that_answers_cancelled_once_interrupted_is_recorded_cancelled() {
    // A tool that stops when told (its task cancelled) answers `cancelled` at once: the run
    // records it as it records a call the grace period cut short, and ends without that wait.
    let mut m = machine(Limits::default());
    respond(
        &mut m,
        0,
        ModelResponse::tool_calls([("a", "echo", "{}"), ("b", "echo", r#"{"x":1}"#)]),
    );
    for position in [0, 1] {
        feed(&mut m, 0, Input::CallStarted { position });
    }
    // Before any interruption, `cancelled` is the tool's own error (an awaited future that
    // someone else cancelled): the model reads it as any error.
    feed(
        &mut m,
        5,
        Input::CallFinished {
            position: 1,
            outcome: CallOutcome::error("cancelled", "CancelledError"),
            failures: Vec::new(),
        },
    );
    feed(
        &mut m,
        10,
        Input::Interrupted {
            by: Interrupt::Cancelled,
        },
    );
    assert!(matches!(m.action(), Action::Drain { .. }));
    feed(
        &mut m,
        20,
        Input::CallFinished {
            position: 0,
            outcome: CallOutcome::error("cancelled", "CancelledError: the task was cancelled"),
            failures: Vec::new(),
        },
    );
    assert!(
        !matches!(m.action(), Action::Drain { .. }),
        "the batch is over once its calls answered"
    );
    let out = m.into_outcome(Duration::from_millis(20));
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    let [cut, own] = [&out.tool_calls[0].outcome, &out.tool_calls[1].outcome];
    assert_eq!(cut.status, CallStatus::Cancelled);
    assert_eq!(cut.code.as_deref(), Some("cancelled"));
    assert_eq!(own.status, CallStatus::Error);
    assert_every_call_answered(&out.transcript);
}

#[test]
fn an_input_that_answers_another_step_fails_the_run_instead_of_guessing() {
    let mut m = machine(Limits::default());
    feed(&mut m, 0, Input::GraceOver);
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert!(
        out.error
            .unwrap()
            .to_string()
            .contains("asked for a model call")
    );
}

/// The call ids of a transcript's calls, in order.
fn call_ids(transcript: &[Message]) -> Vec<String> {
    transcript
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => Some(a.tool_calls.iter().map(|c| c.call_id.to_string())),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The call ids of the tool results of a transcript, in order.
fn result_ids(transcript: &[Message]) -> Vec<String> {
    transcript
        .iter()
        .filter_map(|m| match m {
            Message::Tool(r) => Some(r.call_id.to_string()),
            _ => None,
        })
        .collect()
}

fn machine_continuing(transcript: Vec<Message>) -> RunMachine {
    RunMachine::new(
        Arc::clone(agent(Limits::default()).config()),
        RunStart {
            run_id: Arc::from("r"),
            ids: Arc::new(SequentialIds::default()),
            seams: Seams::default(),
            limits: None,
            transcript,
            input: Some(Message::user("again")),
            observed: false,
        },
    )
}

#[test]
fn a_call_id_repeated_from_an_earlier_turn_is_renamed_and_its_result_answers_the_new_id() {
    let mut m = machine(Limits::default());
    respond(
        &mut m,
        1,
        ModelResponse::tool_calls([("c1", "echo", r#"{"n":1}"#)]),
    );
    assert_eq!(run_batch(&mut m, 2), Some(1));
    respond(
        &mut m,
        3,
        ModelResponse::tool_calls([("c1", "echo", r#"{"n":2}"#), ("c1_2", "echo", r#"{"n":3}"#)]),
    );
    let Action::StartCall(call) = m.action() else {
        panic!("expected a call to start: {m:?}")
    };
    assert_eq!(&*call.call_id, "c1_3", "c1 and c1_2 are both taken");
    assert_eq!(run_batch(&mut m, 4), Some(2));
    respond(
        &mut m,
        5,
        ModelResponse::tool_calls([("c1", "echo", r#"{"n":4}"#)]),
    );
    assert_eq!(run_batch(&mut m, 6), Some(1));
    respond(&mut m, 7, ModelResponse::text("done"));
    let transcript = m.state().transcript.to_vec();
    assert_eq!(call_ids(&transcript), ["c1", "c1_3", "c1_2", "c1_4"]);
    assert_eq!(result_ids(&transcript), call_ids(&transcript));
    assert_eq!(m.stop_reason(), Some(&StopReason::Finished));
}

#[test]
fn ids_of_the_continued_transcript_are_never_used_again_blank_ones_included() {
    // A session's earlier run: a blank id filled as `call_1` (ids restart in every process) and
    // a provider's `c1`.
    let mut earlier = machine(Limits::default());
    respond(
        &mut earlier,
        1,
        ModelResponse::tool_calls([("", "echo", "{}"), ("c1", "echo", "{}")]),
    );
    run_batch(&mut earlier, 2);
    respond(&mut earlier, 3, ModelResponse::text("done"));
    let transcript = earlier.state().transcript.to_vec();
    assert_eq!(call_ids(&transcript), ["call_1", "c1"]);

    let mut m = machine_continuing(transcript);
    respond(
        &mut m,
        1,
        ModelResponse::tool_calls([
            ("", "echo", "{}"),
            ("c1", "echo", "{}"),
            ("c2", "echo", "{}"),
        ]),
    );
    assert_eq!(run_batch(&mut m, 2), Some(3));
    respond(&mut m, 3, ModelResponse::text("done"));
    let transcript = m.state().transcript.to_vec();
    assert_eq!(
        call_ids(&transcript),
        ["call_1", "c1", "call_1_2", "c1_2", "c2"]
    );
    assert_eq!(result_ids(&transcript), call_ids(&transcript));
}

#[test]
fn two_calls_of_one_response_repeating_an_old_id_are_still_refused_as_duplicates() {
    let mut m = machine(Limits::default());
    respond(&mut m, 1, ModelResponse::tool_calls([("c1", "echo", "{}")]));
    run_batch(&mut m, 2);
    respond(
        &mut m,
        3,
        ModelResponse::tool_calls([("c1", "echo", "{}"), ("c1", "echo", "{}")]),
    );
    let error = m.error().expect("the decision is refused").to_string();
    assert!(error.contains("duplicate call id \"c1_2\""), "{error}");
}

#[test]
fn a_renamed_id_stays_within_the_longest_id_accepted() {
    let long = "x".repeat(agentloop::machine::MAX_CALL_ID_LEN);
    let mut m = machine(Limits::default());
    respond(
        &mut m,
        1,
        ModelResponse::tool_calls([(long.as_str(), "echo", "{}")]),
    );
    run_batch(&mut m, 2);
    respond(
        &mut m,
        3,
        ModelResponse::tool_calls([(long.as_str(), "echo", "{}")]),
    );
    let Action::StartCall(call) = m.action() else {
        panic!("expected a call to start: {m:?}")
    };
    assert_eq!(call.call_id.len(), agentloop::machine::MAX_CALL_ID_LEN);
    assert!(call.call_id.ends_with("x_2"), "{}", call.call_id);
}

#[test]
fn a_logged_run_and_its_raw_steps_replay_to_the_same_renamed_ids() {
    // The driver's path: ids are made unique before the step is logged.
    let mut m = machine(Limits::default());
    let mut log = Vec::new();
    let mut raw = Vec::new();
    let mut play = |m: &mut RunMachine, input: Input, log: &mut Vec<Step>| {
        let step = Step {
            at: Duration::ZERO,
            input,
        };
        raw.push(step.clone());
        m.feed_logged(step, log);
    };
    for turn in 0..2 {
        let response = ModelResponse::tool_calls([("c1", "echo", "{}"), ("", "echo", "{}")]);
        play(
            &mut m,
            Input::ModelResponded {
                response: Box::new(response),
                cost: None,
                failures: Vec::new(),
            },
            &mut log,
        );
        for position in 0..2 {
            assert!(matches!(m.action(), Action::StartCall(_)), "turn {turn}");
            play(&mut m, Input::CallStarted { position }, &mut log);
        }
        for position in 0..2 {
            play(
                &mut m,
                Input::CallFinished {
                    position,
                    outcome: CallOutcome::ok(ToolOutput::text("ok")),
                    failures: Vec::new(),
                },
                &mut log,
            );
        }
    }
    let live = call_ids(m.state().transcript);
    assert_eq!(live, ["c1", "call_1", "c1_2", "call_2"]);
    let Input::ModelResponded { response, .. } = &log[5].input else {
        panic!("the second response: {:?}", log[5])
    };
    assert_eq!(
        &*response.message.tool_calls[0].call_id, "c1_2",
        "logged renamed"
    );

    // A fresh machine fed the log, with an id source that would draw other ids: the same.
    let mut fresh = machine(Limits::default());
    for s in &log {
        fresh.feed(s.clone());
    }
    assert_eq!(call_ids(fresh.state().transcript), live);
    // The repeated id alone needs no log: the raw `c1` of the second response is renamed alike.
    let mut raw_fed = machine(Limits::default());
    for s in &raw {
        raw_fed.feed(s.clone());
    }
    let ids = call_ids(raw_fed.state().transcript);
    assert_eq!(ids[0], "c1");
    assert_eq!(ids[2], "c1_2");
}

#[test]
fn blank_ids_of_calls_cut_by_the_output_limit_are_drawn_before_the_step_is_logged() {
    let cut = |arguments: &str| agentloop::message::ToolCall {
        call_id: "".into(),
        tool: "echo".into(),
        arguments: arguments.into(),
    };
    let mut response = ModelResponse::tool_calls([("", "echo", "{}")]);
    response.cut_calls = vec![cut("{\"a\": 1"), cut("")];
    response.finish_reason = agentloop::model::FinishReason::Length;
    response.truncated = true;
    let mut m = machine(Limits::default());
    let mut log = Vec::new();
    m.feed_logged(
        Step {
            at: Duration::ZERO,
            input: Input::ModelResponded {
                response: Box::new(response),
                cost: None,
                failures: Vec::new(),
            },
        },
        &mut log,
    );
    let Input::ModelResponded { response, .. } = &log[0].input else {
        panic!("{:?}", log[0])
    };
    let mut ids: Vec<&str> = response
        .message
        .tool_calls
        .iter()
        .chain(&response.cut_calls)
        .map(|c| &*c.call_id)
        .collect();
    assert!(ids.iter().all(|id| !id.is_empty()), "{ids:?}");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "two cut calls do not collide: {ids:?}");
    // A fresh machine fed the logged step keeps the ids it holds.
    let mut again = machine(Limits::default());
    let mut relog = Vec::new();
    again.feed_logged(log[0].clone(), &mut relog);
    assert_eq!(relog[0].input, log[0].input);
}

#[test]
fn a_failed_write_of_the_end_fails_a_finished_run_and_leaves_another_stop_as_it_was() {
    let failed_write = || Input::JournalFailed {
        message: "disk full at the end".into(),
    };
    let mut m = machine(Limits::default());
    respond(&mut m, 1, ModelResponse::text("bye"));
    assert!(matches!(m.action(), Action::Finish));
    feed(&mut m, 2, failed_write());
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::from_millis(2));
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.as_ref().map(|e| e.code()), Some("journal.write"));
    assert_eq!(out.output.as_deref(), Some("bye"), "the answer stays");

    let mut m = machine(Limits::default());
    feed(
        &mut m,
        1,
        Input::Interrupted {
            by: Interrupt::Cancelled,
        },
    );
    assert!(matches!(m.action(), Action::Finish));
    feed(&mut m, 2, failed_write());
    let out = m.into_outcome(Duration::from_millis(2));
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(
        out.error.as_ref().map(|e| e.code()),
        Some("run.cancelled"),
        "the run's own error stays first"
    );
}

#[test]
fn a_run_restarted_past_its_deadline_stops_there_without_running_what_waited() {
    let limits = Limits {
        timeout: Some(Duration::from_secs(5)),
        ..Limits::default()
    };
    // Restarted before the deadline: the batch goes on.
    let mut m = machine(limits.clone());
    respond(
        &mut m,
        1000,
        ModelResponse::tool_calls([("a", "echo", "{}")]),
    );
    feed(&mut m, 3000, Input::Restarted { children: false });
    assert!(matches!(m.action(), Action::StartCall(_)), "{m:?}");
    // Restarted at or past it (a wait for approvals that long): nothing more runs.
    let mut m = machine(limits);
    respond(
        &mut m,
        1000,
        ModelResponse::tool_calls([("a", "echo", "{}")]),
    );
    feed(&mut m, 5000, Input::Restarted { children: false });
    assert_eq!(run_batch(&mut m, 5000), None, "no call starts");
    while !matches!(m.action(), Action::Finish) {
        assert!(matches!(m.action(), Action::Finalize), "{m:?}");
        feed(
            &mut m,
            5000,
            Input::Finalized {
                failures: Vec::new(),
            },
        );
    }
    let out = m.into_outcome(Duration::from_secs(5));
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(out.tool_calls_run, 0);
    assert_eq!(out.tool_calls.len(), 1, "the call has its result");
}

#[test]
fn a_forced_tool_choice_holds_until_the_model_has_called_a_tool_then_the_model_chooses() {
    use agentloop::model::{ModelSettings, ToolChoice};
    for forced in [ToolChoice::Required, ToolChoice::Tool("echo".into())] {
        let agent = Agent::builder()
            .model(ScriptedModel::new([]))
            .tool(Tool::dynamic(
                "echo",
                "Echo.",
                json!({"type": "object"}),
                |a: Value, _c| async { Ok(ToolOutput::json(a)) },
            ))
            .settings(ModelSettings {
                tool_choice: Some(forced.clone()),
                ..ModelSettings::default()
            })
            .build()
            .unwrap();
        let mut m = machine_of(&agent, Seams::default());
        let Action::CallModel(req) = m.action() else {
            panic!("a model call")
        };
        assert_eq!(req.settings.tool_choice, Some(forced.clone()));
        respond(&mut m, 1, ModelResponse::tool_calls([("a", "echo", "{}")]));
        assert_eq!(run_batch(&mut m, 2), Some(1));
        let Action::CallModel(req) = m.action() else {
            panic!("the model's next turn")
        };
        assert_eq!(
            req.settings.tool_choice,
            Some(ToolChoice::Auto),
            "{forced:?}"
        );
        respond(&mut m, 3, ModelResponse::text("done"));
        assert!(matches!(m.action(), Action::Finish));
    }
}
