#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! Hand-offs in the library: the agent handed to answers for the run on the conversation as its
//! filter says, under the run's budget; a hand-off beside another call does not run; agents
//! built after the hand-offs that name them (a cycle) are reached through a target.

use agentloop::handoff::{Handoff, HandoffHistory, HandoffTarget};
use agentloop::model::Usage;
use agentloop::testing::{FunctionModel, ScriptedModel};
use agentloop::{Agent, EventKind, Limits, Message, ModelResponse, StopReason, Tool, ToolOutput};
use serde_json::Value;

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    }
}

/// Billing answers with how many messages it was sent and the last user text.
fn billing(limits: Limits) -> Agent {
    let model = FunctionModel::new(|req| {
        let last = req
            .messages
            .iter()
            .rev()
            .find(|m| matches!(m, Message::User { .. }))
            .map(Message::text)
            .unwrap_or_default();
        let text = format!("billing saw {} messages, last: {last}", req.messages.len());
        Ok(ModelResponse::text(text).with_usage(usage(7, 3)))
    });
    Agent::builder()
        .name("billing")
        .model(model)
        .limits(limits)
        .build()
        .unwrap()
}

fn note() -> Tool {
    Tool::dynamic(
        "note",
        "Keeps a note.",
        serde_json::json!({"type": "object"}),
        |_: Value, _| async { Ok(ToolOutput::text("noted")) },
    )
}

fn triage(script: Vec<ModelResponse>, handoff: Handoff) -> Agent {
    Agent::builder()
        .name("triage")
        .model(ScriptedModel::new(script))
        .tool(note())
        .handoff(handoff)
        .build()
        .unwrap()
}

fn call(id: &str, tool: &str) -> (String, String, String) {
    (id.to_owned(), tool.to_owned(), "{}".to_owned())
}

#[tokio::test]
async fn the_agent_handed_to_answers_for_the_run_on_the_whole_conversation() {
    let b = billing(Limits::default());
    let t = triage(
        vec![
            ModelResponse::tool_calls([call("n1", "note")]).with_usage(usage(5, 1)),
            ModelResponse::tool_calls([call("h1", "transfer_to_billing")]).with_usage(usage(5, 1)),
        ],
        Handoff::to(&b),
    );
    let out = t.run("charged twice").await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    assert_eq!(out.answered_by, "billing");
    // The user's message, triage's note call and its result: the hand-off's own response is
    // not passed on (its call has no result yet).
    assert_eq!(
        out.output.as_deref(),
        Some("billing saw 3 messages, last: charged twice")
    );
    assert_eq!(out.usage, usage(17, 5), "one budget: both agents' tokens");
    assert_eq!(out.model_calls, 3);
    assert_eq!(out.subagents[0].answered_by.as_deref(), Some("billing"));
}

#[tokio::test]
async fn last_user_passes_the_users_last_message_only() {
    let b = billing(Limits::default());
    let t = triage(
        vec![
            ModelResponse::tool_calls([call("n1", "note")]),
            ModelResponse::tool_calls([call("h1", "to_billing")]),
        ],
        Handoff::to(&b)
            .name("to_billing")
            .history(HandoffHistory::LastUser),
    );
    let out = t.run("charged twice").await;
    assert_eq!(out.answered_by, "billing");
    assert_eq!(
        out.output.as_deref(),
        Some("billing saw 1 messages, last: charged twice")
    );
}

#[tokio::test]
async fn a_handoff_beside_another_call_is_not_run_and_the_other_is() {
    let b = billing(Limits::default());
    let t = triage(
        vec![
            ModelResponse::tool_calls([call("n1", "note"), call("h1", "transfer_to_billing")]),
            ModelResponse::text("I kept a note."),
        ],
        Handoff::to(&b),
    );
    let (mut stream, mut events) = (t.stream("hi"), Vec::new());
    let out = loop {
        match futures_next(&mut stream).await {
            agentloop::StreamItem::Event(e) => events.push(e.kind),
            agentloop::StreamItem::Outcome(out) => break out,
        }
    };
    assert_eq!(out.answered_by, "triage");
    assert_eq!(out.tool_calls[0].outcome.code, None);
    assert_eq!(
        out.tool_calls[1].outcome.code.as_deref(),
        Some("handoff.not_alone")
    );
    assert!(out.subagents.is_empty());
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::HandedOff { .. }))
    );
}

async fn futures_next(stream: &mut agentloop::RunStream) -> agentloop::StreamItem {
    use futures::StreamExt;
    stream.next().await.unwrap()
}

#[tokio::test]
async fn a_target_set_after_the_handoff_is_built_is_reached_and_the_event_says_so() {
    let target = HandoffTarget::new();
    let t = triage(
        vec![ModelResponse::tool_calls([call(
            "h1",
            "transfer_to_billing",
        )])],
        Handoff::later("billing", &target),
    );
    assert!(target.set(billing(Limits::default())));
    let mut stream = t.stream("hi");
    let mut handed = None;
    let out = loop {
        match futures_next(&mut stream).await {
            agentloop::StreamItem::Event(e) => {
                if let EventKind::HandedOff {
                    from,
                    to,
                    answered_by,
                    ..
                } = e.kind
                {
                    handed = Some((from, to, answered_by));
                }
            }
            agentloop::StreamItem::Outcome(out) => break out,
        }
    };
    assert_eq!(out.answered_by, "billing");
    assert_eq!(
        handed,
        Some(("triage".into(), "billing".into(), "billing".into()))
    );
}

#[tokio::test]
async fn the_agent_handed_to_gets_what_is_left_of_the_runs_turns() {
    // Billing would take turns without end (a tool each turn); triage's run allows 3 and
    // spends one handing off.
    let looping = FunctionModel::new(|req| {
        let n = req.messages.len();
        Ok(ModelResponse::tool_calls([(
            format!("c{n}"),
            "note".to_owned(),
            format!(r#"{{"n":{n}}}"#),
        )]))
    });
    let b = Agent::builder()
        .name("billing")
        .model(looping)
        .tool(note())
        .build()
        .unwrap();
    let t = Agent::builder()
        .name("triage")
        .model(ScriptedModel::new([ModelResponse::tool_calls([call(
            "h1",
            "transfer_to_billing",
        )])]))
        .handoff(Handoff::to(&b))
        .limits(Limits {
            max_turns: Some(3),
            ..Limits::default()
        })
        .build()
        .unwrap();
    let out = t.run("go").await;
    assert_eq!(out.stop_reason, StopReason::MaxTurns, "{:?}", out.error);
    assert_eq!(out.answered_by, "billing");
    assert_eq!(out.subagents[0].turns, 2);
}
