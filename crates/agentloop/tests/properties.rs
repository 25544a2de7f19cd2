//! Property tests over random scripted runs: whatever the model does, the tool-cycle invariant and
//! the counts hold in every outcome.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use agentloop::{
    Agent, CallStatus, Limits, Message, ModelResponse, StopReason, Tool, ToolError, ToolOutput,
    testing::ScriptedModel,
};
use proptest::prelude::*;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
enum Step {
    Text,
    Calls(Vec<(u8, u8, u8)>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => Just(Step::Text),
        4 => prop::collection::vec((0u8..6, 0u8..4, 0u8..5), 0..5).prop_map(Step::Calls),
    ]
}

fn response(step: &Step, turn: usize) -> ModelResponse {
    match step {
        Step::Text => ModelResponse::text("final"),
        Step::Calls(calls) => {
            ModelResponse::tool_calls(calls.iter().enumerate().map(|(i, (id, tool, args))| {
                let id = match id {
                    0 => String::new(),
                    1 => "dup".to_owned(),
                    _ => format!("c{turn}_{i}"),
                };
                let tool = ["ok", "fail", "seq", "missing"][*tool as usize % 4].to_owned();
                let args = match args {
                    0 => r#"{"n": 1}"#.to_owned(),
                    1 => format!(r#"{{"n": {turn}}}"#),
                    2 => r#"{"n": "x"}"#.to_owned(),
                    3 => "{broken".to_owned(),
                    _ => String::new(),
                };
                (id, tool, args)
            }))
        }
    }
}

fn tool(name: &str, runs: &Arc<AtomicU32>, fail: bool, sequential: bool) -> Tool {
    let runs = runs.clone();
    let b = Tool::builder(name).description("t");
    let b = if sequential { b.sequential() } else { b };
    b.dynamic(
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        move |_a: Value, _c| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if fail {
                    Err(ToolError::new("nope", "failed"))
                } else {
                    Ok(ToolOutput::text("ok"))
                }
            }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn random_runs_keep_the_tool_cycle_and_the_counts(
        steps in prop::collection::vec(step(), 0..8),
        max_turns in prop::option::of(1u32..6),
        max_tool_calls in prop::option::of(1u32..8),
        stuck in prop_oneof![Just(0u32), 2u32..5],
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let script: Vec<ModelResponse> = steps.iter().enumerate().map(|(t, s)| response(s, t)).collect();
        let agent = Agent::builder()
            .model(ScriptedModel::new(script))
            .tool(tool("ok", &runs, false, false))
            .tool(tool("fail", &runs, true, false))
            .tool(tool("seq", &runs, false, true))
            .limits(Limits { max_turns, max_tool_calls, stuck_loop_threshold: stuck, ..Limits::default() })
            .build()
            .unwrap();
        let out = rt.block_on(agent.run("go"));

        // Every call is answered exactly once, right after its message, in decision order.
        let mut calls_in_transcript = 0usize;
        let t = &out.transcript;
        let mut i = 0;
        while i < t.len() {
            if let Message::Assistant(a) = &t[i] {
                for (k, call) in a.tool_calls.iter().enumerate() {
                    let r = t.get(i + 1 + k).and_then(Message::as_tool_result);
                    prop_assert!(r.is_some(), "call {} unanswered", call.call_id);
                    prop_assert_eq!(&r.unwrap().call_id, &call.call_id);
                }
                calls_in_transcript += a.tool_calls.len();
                i += 1 + a.tool_calls.len();
            } else {
                prop_assert!(t[i].as_tool_result().is_none());
                i += 1;
            }
        }
        prop_assert_eq!(out.tool_calls.len(), calls_in_transcript);
        let started = out.tool_calls.iter().filter(|r| matches!(r.outcome.status, CallStatus::Ok | CallStatus::Error)).count() as u32;
        prop_assert_eq!(started, runs.load(Ordering::SeqCst));
        prop_assert_eq!(out.tool_calls_run, runs.load(Ordering::SeqCst));
        if let Some(max) = max_tool_calls { prop_assert!(out.tool_calls_run <= max); }
        if let Some(max) = max_turns { prop_assert!(out.turns <= max); }
        prop_assert!(out.model_calls >= out.turns);
        if out.stop_reason == StopReason::Finished {
            let last = out.transcript.last().and_then(Message::as_assistant);
            prop_assert!(last.is_some_and(|a| a.tool_calls.is_empty()));
        }
        if !out.is_success() {
            prop_assert!(out.error.is_some() || out.limit.is_some());
        }
    }
}
