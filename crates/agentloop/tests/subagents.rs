#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! Subagents: an agent as a tool of another, one budget for the whole tree, depth, cancellation
//! through every level, and failures that reach the parent's model as readable results.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop::model::Usage;
use agentloop::subagent::SubagentTool;
use agentloop::testing::FunctionModel;
use agentloop::{
    Agent, CancellationToken, Limits, Message, ModelResponse, RunOptions, StopReason, Tool,
    ToolOutput,
};
use common::{calls, counting_tool};
use proptest::prelude::*;
use serde_json::{Value, json};

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    }
}

/// The text of the last tool result the model was shown, if any.
fn last_result(messages: &[Message]) -> Option<String> {
    messages
        .iter()
        .rev()
        .find_map(Message::as_tool_result)
        .map(|r| r.content.to_text())
}

/// A worker: makes `n` calls of `count` in one turn, then answers. Each model call uses 10 in
/// and 5 out.
fn worker(n: usize, counter: &Arc<AtomicUsize>, limits: Limits) -> Agent {
    let model = FunctionModel::new(move |req| {
        let response = if last_result(req.messages).is_some() {
            ModelResponse::text("worked")
        } else {
            let list: Vec<(String, String, String)> = (0..n)
                .map(|i| {
                    (
                        format!("w{i}"),
                        "count".to_owned(),
                        format!(r#"{{"n":{i}}}"#),
                    )
                })
                .collect();
            ModelResponse::tool_calls(list)
        };
        Ok(response.with_usage(usage(10, 5)))
    });
    Agent::builder()
        .name("worker")
        .model(model)
        .tool(counting_tool("count", counter))
        .limits(limits)
        .build()
        .unwrap()
}

/// A coordinator: calls `tool` `k` times at once in its first turn, then answers with what it
/// last read. Each model call uses 100 in and 50 out.
fn coordinator(k: usize, tools: Vec<Tool>, limits: Limits) -> Agent {
    let model = FunctionModel::new(move |req| {
        let response = match last_result(req.messages) {
            Some(text) => ModelResponse::text(format!("read: {text}")),
            None => {
                let list: Vec<(String, String, String)> = (0..k)
                    .map(|i| {
                        (
                            format!("s{i}"),
                            "delegate".to_owned(),
                            format!(r#"{{"task":"part {i}"}}"#),
                        )
                    })
                    .collect();
                ModelResponse::tool_calls(list)
            }
        };
        Ok(response.with_usage(usage(100, 50)))
    });
    Agent::builder()
        .name("coordinator")
        .model(model)
        .tools(tools)
        .limits(limits)
        .build()
        .unwrap()
}

#[tokio::test]
async fn usage_and_counts_roll_up_and_the_outcome_carries_the_tree() {
    let counter = Arc::new(AtomicUsize::new(0));
    let sub = worker(2, &counter, Limits::default());
    let parent = coordinator(
        3,
        vec![sub.as_tool("delegate", "Hands a part to a worker.")],
        Limits::default(),
    );
    let out = parent.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    assert_eq!(counter.load(Ordering::SeqCst), 6);
    assert_eq!(out.subagents.len(), 3);
    for s in &out.subagents {
        assert_eq!(s.agent, "worker");
        assert_eq!(s.stop_reason, "finished");
        assert_eq!(s.usage, usage(20, 10), "two model calls of the worker");
        assert_eq!((s.turns, s.model_calls, s.tool_calls), (2, 2, 2));
        assert!(s.call_id.starts_with('s'));
        // Nothing here is priced: each answer's cost is unknown, not zero.
        assert_eq!(s.unpriced_model_calls, 2);
    }
    // The parent's own two model calls, plus the sum of the leaves.
    let leaves: u64 = out.subagents.iter().map(|s| s.usage.total_tokens()).sum();
    assert_eq!(out.usage.total_tokens(), 300 + leaves);
    assert_eq!(out.model_calls, 2 + 6);
    assert_eq!(
        out.unpriced_model_calls,
        2 + 6,
        "the tree's unknown costs roll up"
    );
    assert_eq!(out.tool_calls_run, 3 + 6);
    assert_eq!(out.output.as_deref(), Some("read: worked"));
    // The subagents' events reach the parent's sinks, with the parent's run id.
}

#[tokio::test]
async fn subagent_events_carry_their_parent_run_id() {
    let counter = Arc::new(AtomicUsize::new(0));
    let sub = worker(1, &counter, Limits::default());
    let parent = coordinator(
        1,
        vec![sub.as_tool("delegate", "Delegates.")],
        Limits::default(),
    );
    let events = common::Events::default();
    let options = RunOptions {
        sinks: vec![Arc::new(events.sink())],
        ..RunOptions::default()
    };
    let out = parent
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    let child = &out.subagents[0].run_id;
    let started: Vec<(String, Option<String>)> = events
        .all()
        .iter()
        .filter_map(|e| match &e.kind {
            agentloop::EventKind::RunStarted { parent_run_id, .. } => {
                Some((e.run_id.to_string(), parent_run_id.clone()))
            }
            _ => None,
        })
        .collect();
    assert!(started.contains(&(out.run_id.clone(), None)));
    assert!(started.contains(&(child.clone(), Some(out.run_id.clone()))));
}

#[tokio::test]
async fn a_call_past_the_depth_limit_is_an_error_result_the_model_reads() {
    let counter = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    // Four levels: top -> a -> b -> leaf. With max_depth 2, b's call of the leaf is refused.
    let leaf = worker(1, &counter, Limits::default());
    let mut below = leaf.as_tool("delegate", "Delegates.");
    for name in ["b", "a"] {
        let seen = seen.clone();
        let model = FunctionModel::new(move |req| {
            if let Some(text) = last_result(req.messages) {
                seen.lock().unwrap().push(text.clone());
                return Ok(ModelResponse::text(text));
            }
            Ok(calls(&[("d", "delegate", r#"{"task":"deeper"}"#)]))
        });
        let agent = Agent::builder()
            .name(name)
            .model(model)
            .tool(below)
            .build()
            .unwrap();
        below = agent.as_tool("delegate", "Delegates.");
    }
    let top = coordinator(
        1,
        vec![below],
        Limits {
            max_depth: 2,
            ..Limits::default()
        },
    );
    let out = top.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(counter.load(Ordering::SeqCst), 0, "the leaf never ran");
    let a = &out.subagents[0];
    assert_eq!(a.agent, "a");
    assert_eq!(a.subagents[0].agent, "b");
    assert!(a.subagents[0].subagents.is_empty());
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter().any(|t| t.contains("nest 2 deep")),
        "b's model read why: {seen:?}"
    );
}

/// A worker that needs two turns, capped at one: it stops with `max_turns`.
fn cut_short() -> SubagentTool {
    let counter = Arc::new(AtomicUsize::new(0));
    SubagentTool::new(
        worker(1, &counter, Limits::default()),
        "delegate",
        "Delegates.",
    )
    .cap(Limits {
        max_turns: Some(1),
        ..Limits::unlimited()
    })
}

#[tokio::test]
async fn a_subagent_stopped_by_a_limit_reaches_the_parent_as_a_readable_result() {
    let sub = cut_short().into_tool();
    let parent = coordinator(1, vec![sub], Limits::default());
    let out = parent.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.subagents[0].stop_reason, "max_turns");
    let read = out.output.unwrap();
    assert!(
        read.contains("stopped before it finished: max_turns"),
        "{read}"
    );
    let record = &out.tool_calls[0];
    assert_eq!(record.outcome.code.as_deref(), Some("subagent.max_turns"));
}

#[tokio::test]
async fn a_fatal_subagent_fails_its_parent() {
    let sub = cut_short().fatal(true).into_tool();
    let out = coordinator(1, vec![sub], Limits::default()).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "tool.fatal");
}

/// A leaf agent: calls its tool `count` once, then answers. Each model call uses 10 in and 5 out.
fn leaf(count: Tool) -> Agent {
    let model = FunctionModel::new(|req| {
        let response = match last_result(req.messages) {
            Some(_) => ModelResponse::text("late"),
            None => calls(&[("x", "count", "{}")]),
        };
        Ok(response.with_usage(usage(10, 5)))
    });
    Agent::builder()
        .name("leaf")
        .model(model)
        .tool(count)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_child_cut_short_at_the_deadline_reports_what_it_spent_before_its_parent_stops_waiting() {
    // The leaf's tool ignores cancellation: the leaf waits out its grace period for it. Were
    // that as long as its parent's, the parent would drop the leaf first and lose its spend.
    let leaf = leaf(Tool::dynamic(
        "count",
        "Takes ten seconds, whatever it is told.",
        json!({"type": "object"}),
        |_a: Value, _ctx| async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(ToolOutput::text("late"))
        },
    ));
    let limits = Limits {
        timeout: Some(Duration::from_millis(300)),
        grace_period: Duration::from_millis(600),
        ..Limits::default()
    };
    let parent = coordinator(1, vec![leaf.as_tool("delegate", "Delegates.")], limits);
    let out = tokio::time::timeout(Duration::from_secs(5), parent.run("go"))
        .await
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(out.subagents.len(), 1, "{:?}", out.tool_calls);
    assert_eq!(out.subagents[0].usage, usage(10, 5));
    assert_eq!(
        out.usage,
        usage(110, 55),
        "the parent's call and the leaf's"
    );
}

#[tokio::test]
async fn cancelling_the_top_run_drains_every_level() {
    let leaf = waiting_leaf();
    let middle = coordinator(
        1,
        vec![leaf.as_tool("delegate", "Delegates.")],
        Limits::default(),
    );
    let top = coordinator(
        1,
        vec![middle.as_tool("delegate", "Delegates.")],
        Limits::default(),
    );
    let cancel = CancellationToken::new();
    let options = RunOptions {
        cancel: Some(cancel.clone()),
        ..RunOptions::default()
    };
    let run = tokio::spawn(async move {
        top.run_with(Vec::new(), Some(Message::user("go")), options)
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("every level drained")
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    let middle = &out.subagents[0];
    assert_eq!(middle.stop_reason, "cancelled");
    assert_eq!(middle.subagents[0].stop_reason, "cancelled");
}

/// A leaf whose one tool waits until it is cancelled.
fn waiting_leaf() -> Agent {
    leaf(Tool::dynamic(
        "count",
        "Waits until cancelled.",
        json!({"type": "object"}),
        |_a: Value, ctx: agentloop::ToolContext| async move {
            ctx.cancel.cancelled().await;
            Ok(ToolOutput::text("cancelled"))
        },
    ))
}

#[tokio::test]
async fn a_subagent_cut_short_by_its_parents_cancel_or_deadline_is_cancelled_even_when_fatal() {
    for fatal in [false, true] {
        for deadline in [false, true] {
            let case = format!("fatal {fatal}, deadline {deadline}");
            let tool = SubagentTool::new(waiting_leaf(), "delegate", "Delegates.")
                .fatal(fatal)
                .into_tool();
            let limits = Limits {
                timeout: deadline.then_some(Duration::from_millis(200)),
                ..Limits::default()
            };
            let parent = coordinator(1, vec![tool], limits);
            let cancel = CancellationToken::new();
            let options = RunOptions {
                cancel: Some(cancel.clone()),
                ..RunOptions::default()
            };
            let run = tokio::spawn(async move {
                parent
                    .run_with(Vec::new(), Some(Message::user("go")), options)
                    .await
            });
            if !deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                cancel.cancel();
            }
            let out = tokio::time::timeout(Duration::from_secs(5), run)
                .await
                .expect("the run drained")
                .unwrap();
            let (stop, code) = if deadline {
                (StopReason::Deadline, "run.deadline")
            } else {
                (StopReason::Cancelled, "run.cancelled")
            };
            assert_eq!(out.stop_reason, stop, "{case}: {:?}", out.error);
            assert_eq!(out.error.unwrap().code(), code, "{case}");
            let call = &out.tool_calls[0].outcome;
            assert_eq!(call.status, agentloop::CallStatus::Cancelled, "{case}");
            assert_eq!(call.code.as_deref(), Some("cancelled"), "{case}");
            assert_eq!(out.subagents.len(), 1, "{case}: its spend is charged");
            assert_eq!(out.usage, usage(110, 55), "{case}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Subagents racing in parallel for the last units of a tool-call budget never overspend it;
    /// the ones that find nothing left are refused with a result the model reads.
    #[test]
    fn parallel_subagents_never_overspend_the_tree_budget(
        budget in 1u32..14,
        k in 1usize..5,
        per in 1usize..4,
        cap in proptest::option::of(1u32..5),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let counter = Arc::new(AtomicUsize::new(0));
            let mut tool = SubagentTool::new(
                worker(per, &counter, Limits::default()),
                "delegate",
                "Delegates.",
            );
            if let Some(c) = cap {
                tool = tool.cap(Limits { max_tool_calls: Some(c), ..Limits::unlimited() });
            }
            let parent = coordinator(
                k,
                vec![tool.into_tool()],
                Limits { max_tool_calls: Some(budget), max_concurrency: 8, ..Limits::default() },
            );
            let out = parent.run("go").await;
            let ran = counter.load(Ordering::SeqCst) as u32;
            let subagent_calls = out.tool_calls.iter().filter(|r| r.outcome.status != agentloop::CallStatus::Refused).count() as u32;
            assert!(
                ran + subagent_calls <= budget,
                "budget {budget}: {ran} worker calls and {subagent_calls} subagent calls"
            );
            assert!(out.tool_calls_run <= budget, "{} > {budget}", out.tool_calls_run);
            for r in &out.tool_calls {
                if r.outcome.code.as_deref() == Some("subagent.budget") {
                    assert!(r.outcome.content.to_text().contains("left in the budget"));
                }
            }
        });
    }
}

#[tokio::test]
async fn a_subagent_can_take_typed_input() {
    #[derive(schemars::JsonSchema, serde::Deserialize)]
    #[allow(dead_code)]
    struct Lookup {
        /// The city.
        city: String,
    }
    let echo = FunctionModel::new(|req| {
        let first = req.messages.first().map(Message::text).unwrap_or_default();
        Ok(ModelResponse::text(format!("got {first}")))
    });
    let sub = Agent::builder().name("echo").model(echo).build().unwrap();
    let tool = SubagentTool::new(sub, "lookup", "Looks a city up.")
        .input::<Lookup>()
        .into_tool();
    assert_eq!(tool.spec().input_schema["required"][0], "city");
    let model = FunctionModel::new(|req| {
        Ok(match last_result(req.messages) {
            Some(text) => ModelResponse::text(text),
            None => calls(&[("l", "lookup", r#"{"city":"Paris"}"#)]),
        })
    });
    let parent = Agent::builder().model(model).tool(tool).build().unwrap();
    let out = parent.run("go").await;
    let text = out.output.unwrap();
    assert!(text.contains("\"city\": \"Paris\""), "{text}");
}

#[tokio::test]
async fn a_subagents_ask_is_labelled_with_its_path_in_the_tree() {
    use agentloop::permissions::{
        Answer, ApprovalPrompter, ApprovalRequest, Permission, PermissionGate, PermissionStore,
    };
    #[derive(Clone, Default)]
    struct Recorder(Arc<std::sync::Mutex<Vec<ApprovalRequest>>>);
    impl ApprovalPrompter for Recorder {
        fn ask<'a>(
            &'a self,
            requests: &'a [ApprovalRequest],
        ) -> futures::future::BoxFuture<'a, Result<Vec<Answer>, String>> {
            self.0.lock().unwrap().extend(requests.iter().cloned());
            Box::pin(async move { Ok(vec![Answer::AllowOnce; requests.len()]) })
        }
    }
    let recorder = Recorder::default();
    let mut store = PermissionStore::new(Permission::Allow);
    store.set("count", Permission::Ask);
    let gate = PermissionGate::new(store).with_prompter(Arc::new(recorder.clone()));
    let counter = Arc::new(AtomicUsize::new(0));
    let model = FunctionModel::new(|req| {
        Ok(match last_result(req.messages) {
            Some(_) => ModelResponse::text("done"),
            None => calls(&[("w", "count", r#"{"n":1}"#)]),
        })
    });
    let sub = Agent::builder()
        .name("worker")
        .model(model)
        .tool(counting_tool("count", &counter))
        .gate(gate)
        .build()
        .unwrap();
    let parent = coordinator(
        1,
        vec![sub.as_tool("delegate", "Delegates.")],
        Limits::default(),
    );
    let out = parent.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    let asked = recorder.0.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].agent, "coordinator/worker");
}

/// A worker that never answers by itself: each turn it calls its tool again, until a limit
/// stops it, so it spends all it is granted.
fn greedy(counter: &Arc<AtomicUsize>) -> Agent {
    let turn = Arc::new(AtomicUsize::new(0));
    let model = FunctionModel::new(move |_req| {
        let i = turn.fetch_add(1, Ordering::SeqCst);
        Ok(calls(&[(
            &format!("g{i}"),
            "count",
            &format!(r#"{{"n":{i}}}"#),
        )]))
    });
    Agent::builder()
        .name("greedy")
        .model(model)
        .tool(counting_tool("count", counter))
        .build()
        .unwrap()
}

#[tokio::test]
async fn subagents_leave_their_parent_a_turn_and_a_model_call_to_read_what_they_did() {
    for (case, limits) in [
        (
            "max_turns",
            Limits {
                max_turns: Some(5),
                ..Limits::default()
            },
        ),
        (
            "max_model_calls",
            Limits {
                max_model_calls: Some(5),
                ..Limits::default()
            },
        ),
    ] {
        let counter = Arc::new(AtomicUsize::new(0));
        let tool = greedy(&counter).as_tool("delegate", "Delegates.");
        let out = coordinator(2, vec![tool], limits).run("go").await;
        // Turn 1 asked both; of the 4 left, one is the parent's: the children share 3.
        assert_eq!(
            out.stop_reason,
            StopReason::Finished,
            "{case}: {:?}",
            out.error
        );
        let spent: Vec<(u32, u32)> = out
            .subagents
            .iter()
            .map(|s| (s.turns, s.model_calls))
            .collect();
        assert_eq!(
            spent.iter().map(|s| s.0).sum::<u32>(),
            3,
            "{case}: {spent:?}"
        );
        assert_eq!(spent.iter().map(|s| s.1).sum::<u32>(), 3, "{case}");
        assert!(
            out.subagents.iter().all(|s| s.stop_reason == case),
            "{case}"
        );
        let read = out.output.unwrap();
        assert!(read.starts_with("read: "), "{case}: {read}");
        assert_eq!(
            out.model_calls, 5,
            "{case}: the tree's whole budget, no more"
        );
    }
}
