//! The state machine on its own: no async, no clock, no I/O.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    Action, AgentConfig, CallOutcome, CallResult, DecisionPolicy, Limits, Message, ModelResponse,
    ModelSettings, RunMachine, SequentialIds, StopReason, Tool, ToolOutput, ToolSet,
};
use serde_json::{Value, json};

fn config(limits: Limits) -> Arc<AgentConfig> {
    let mut tools = ToolSet::new();
    tools
        .register(Tool::dynamic(
            "echo",
            "Echo.",
            json!({"type": "object"}),
            |a: Value, _c| async { Ok(ToolOutput::json(a)) },
        ))
        .unwrap();
    Arc::new(AgentConfig {
        name: "t".into(),
        instructions: Some("be brief".into()),
        tools,
        limits,
        policy: DecisionPolicy::default(),
        output_schema: None,
        settings: ModelSettings::default(),
    })
}

fn machine(limits: Limits) -> RunMachine {
    RunMachine::new(
        config(limits),
        Arc::new(SequentialIds::default()),
        Arc::from("r"),
        Vec::new(),
        Some(Message::user("hi")),
    )
}

#[test]
fn the_machine_asks_for_the_model_then_the_batch_then_finishes() {
    let mut m = machine(Limits::default());
    assert!(matches!(m.next_action(Duration::ZERO), Action::CallModel));
    let req = m.request();
    assert_eq!(req.instructions, Some("be brief"));
    assert_eq!(req.messages.len(), 1);
    assert_eq!(req.tools.len(), 1);
    m.on_model_response(
        ModelResponse::tool_calls([("", "echo", r#"{"a":1}"#)]),
        None,
    );
    let Action::RunTools(batch) = m.next_action(Duration::from_millis(1)) else {
        panic!("expected a batch")
    };
    assert_eq!(batch.calls.len(), 1);
    assert_eq!(
        &*batch.calls[0].call_id, "call_1",
        "blank ids come from the injected id source"
    );
    assert_eq!(*batch.calls[0].args, json!({"a": 1}));
    m.on_tool_outcomes(vec![CallOutcome::instant(CallResult::Ok(
        ToolOutput::text("done"),
    ))]);
    assert!(matches!(
        m.next_action(Duration::from_millis(2)),
        Action::CallModel
    ));
    m.on_model_response(ModelResponse::text("bye"), Some(0.25));
    assert!(matches!(
        m.next_action(Duration::from_millis(3)),
        Action::Finish
    ));
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
        m.next_action(Duration::ZERO);
        m.on_model_response(
            ModelResponse::tool_calls([("", "echo", "{}"), ("", "echo", r#"{"x":2}"#)]),
            None,
        );
        let Action::RunTools(b) = m.next_action(Duration::ZERO) else {
            panic!()
        };
        m.on_tool_outcomes(
            b.calls
                .iter()
                .map(|_| CallOutcome::instant(CallResult::Ok(ToolOutput::text("k"))))
                .collect(),
        );
        m.next_action(Duration::ZERO);
        m.on_model_response(ModelResponse::text("end"), None);
        m.next_action(Duration::ZERO);
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
    assert!(matches!(
        m.next_action(Duration::from_secs(1)),
        Action::CallModel
    ));
    m.on_model_response(ModelResponse::tool_calls([("a", "echo", "{}")]), None);
    let Action::RunTools(_) = m.next_action(Duration::from_secs(2)) else {
        panic!()
    };
    m.on_tool_outcomes(vec![CallOutcome::instant(CallResult::Ok(
        ToolOutput::text("k"),
    ))]);
    assert!(matches!(
        m.next_action(Duration::from_secs(6)),
        Action::Finish
    ));
    let out = m.into_outcome(Duration::from_secs(6));
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(out.limit.unwrap().consumed, 6000.0);
}

#[test]
fn a_denied_call_gives_its_slot_in_the_budget_back() {
    let mut m = machine(Limits {
        max_tool_calls: Some(1),
        ..Limits::default()
    });
    m.next_action(Duration::ZERO);
    m.on_model_response(ModelResponse::tool_calls([("a", "echo", "{}")]), None);
    let Action::RunTools(_) = m.next_action(Duration::ZERO) else {
        panic!()
    };
    m.on_tool_outcomes(vec![CallOutcome::instant(CallResult::Denied {
        reason: "no".into(),
    })]);
    m.next_action(Duration::ZERO);
    m.on_model_response(
        ModelResponse::tool_calls([("b", "echo", r#"{"k":1}"#)]),
        None,
    );
    assert!(
        matches!(m.next_action(Duration::ZERO), Action::RunTools(_)),
        "the denied call did not use the budget"
    );
}

#[test]
fn a_follow_up_message_continues_a_finished_run() {
    let mut m = machine(Limits::default());
    m.next_action(Duration::ZERO);
    m.on_model_response(ModelResponse::text("first"), None);
    assert!(matches!(m.next_action(Duration::ZERO), Action::Finish));
    m.push_user_message(Message::user("and then?"));
    assert!(matches!(m.next_action(Duration::ZERO), Action::CallModel));
    m.on_model_response(ModelResponse::text("second"), None);
    m.next_action(Duration::ZERO);
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.output.as_deref(), Some("second"));
    assert_eq!(out.turns, 2);
}

/// One tool turn: the model's calls, then an ok outcome for each admitted call.
fn tool_turn(m: &mut RunMachine, now: u64, calls: &[(&str, &str, &str)]) -> Option<usize> {
    assert!(matches!(
        m.next_action(Duration::from_millis(now)),
        Action::CallModel
    ));
    m.on_model_response(ModelResponse::tool_calls(calls.iter().copied()), None);
    match m.next_action(Duration::from_millis(now + 1)) {
        Action::RunTools(batch) => {
            let n = batch.calls.len();
            m.on_tool_outcomes(
                (0..n)
                    .map(|_| CallOutcome::instant(CallResult::Ok(ToolOutput::text("ok"))))
                    .collect(),
            );
            Some(n)
        }
        _ => None,
    }
}

#[test]
fn the_stuck_loop_rule_counts_rejected_and_admitted_calls_by_their_turn_records() {
    // Each turn: a call to an unknown tool (rejected, fed back), the same echo call, and an echo
    // call whose arguments change. The repeated pair reaches the threshold on the third turn,
    // the changing call never does.
    let mut m = machine(Limits::default());
    let turn = |n: u32| {
        [
            ("", "nope", r#"{"x": 1}"#.to_owned()),
            ("", "echo", r#"{"b": 2, "a": 1}"#.to_owned()),
            ("", "echo", format!(r#"{{"n": {n}}}"#)),
        ]
    };
    for (i, n) in [1u32, 2].into_iter().enumerate() {
        let calls = turn(n);
        let calls: Vec<(&str, &str, &str)> =
            calls.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
        assert_eq!(
            tool_turn(&mut m, i as u64 * 10, &calls),
            Some(2),
            "turn {n}"
        );
    }
    let calls = turn(3);
    let calls: Vec<(&str, &str, &str)> =
        calls.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
    assert_eq!(
        tool_turn(&mut m, 30, &calls),
        None,
        "the third turn is refused"
    );
    let out = m.into_outcome(Duration::from_millis(40));
    assert_eq!(out.stop_reason, StopReason::StuckLoop);
    assert_eq!(out.tool_calls_run, 4);
    // The records of the refused turn keep what the model sent.
    let refused: Vec<&str> = out
        .tool_calls
        .iter()
        .filter(|r| r.error_code.as_deref() == Some("limit.stuck_loop"))
        .map(|r| &*r.tool)
        .collect();
    assert_eq!(refused, ["nope", "echo", "echo"]);
}
