//! The benchmark workload, shared by the criterion bench (`crates/agentloop/benches/loop.rs`
//! includes this file) and the side-by-side binary: a run of T tool turns, each a model answer of
//! K parallel calls to a no-op tool whose arguments arrive as raw JSON strings (as a provider sends
//! them, so the loop parses and validates them), then one final text turn.
//!
//! The model keeps no state: it reads the turn from the id of the last tool result (`t{turn}_{k}`),
//! so one agent serves any number of runs at once and each call costs the same whatever the
//! transcript's length.
//!
//! It makes its calls as a provider's decoder does: each call id is written into one buffer an
//! answer reuses for all its calls (a decoder's event buffer) and copied from there into the call's
//! `Arc<str>`, one allocation an id; each call's arguments are a `String` of their own, as a
//! decoder gathers them.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentloop::{
    Agent, Limits, Message, Model, ModelError, ModelResponse, RunOutcome, StopReason, Tool,
    ToolError,
    model::{ModelEvent, ModelRequest, ModelStream},
};
use futures::stream;
use serde::Deserialize;

/// The arguments of the no-op tool; every call's differ, so the stuck-loop rule never fires.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct NoopArgs {
    /// The turn that asked for the call.
    pub turn: u32,
    /// The call's position in its batch.
    pub k: u32,
    /// A short string, so that there is text to parse.
    pub note: String,
}

/// A scripted model: T answers of K tool calls, then a final text answer, each after `delay`.
#[derive(Debug, Clone)]
pub(crate) struct WorkloadModel {
    /// Tool turns per run.
    pub turns: u32,
    /// Parallel calls per tool turn.
    pub calls: u32,
    /// Simulated latency of each call (a tokio timer), if any.
    pub delay: Option<Duration>,
    /// Model calls answered, over all runs.
    pub answered: Arc<AtomicU64>,
}

impl WorkloadModel {
    /// A model for `turns` tool turns of `calls` calls each.
    pub(crate) fn new(turns: u32, calls: u32, delay: Option<Duration>) -> Self {
        WorkloadModel {
            turns,
            calls,
            delay,
            answered: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The answer for the run whose transcript is `messages`.
    pub(crate) fn answer(&self, messages: &[Message]) -> ModelResponse {
        let turn = match messages.last() {
            Some(Message::Tool(result)) => result
                .call_id
                .strip_prefix('t')
                .and_then(|rest| rest.split('_').next())
                .and_then(|t| t.parse::<u32>().ok())
                .map_or(u32::MAX, |t| t + 1),
            _ => 0,
        };
        self.answered.fetch_add(1, Ordering::Relaxed);
        if turn >= self.turns {
            return ModelResponse::text("done");
        }
        let mut id = String::new();
        ModelResponse::tool_calls((0..self.calls).map(|k| {
            id.clear();
            let _ = write!(id, "t{turn}_{k}");
            (
                Arc::<str>::from(id.as_str()),
                "noop",
                format!(r#"{{"turn":{turn},"k":{k},"note":"no-op call"}}"#),
            )
        }))
    }
}

impl Model for WorkloadModel {
    fn id(&self) -> &str {
        "workload"
    }

    fn provider(&self) -> &str {
        "scripted"
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let response = self.answer(request.messages);
        match self.delay {
            None => Box::pin(stream::iter([Ok::<_, ModelError>(ModelEvent::Response(
                response,
            ))])),
            Some(d) => Box::pin(stream::once(async move {
                tokio::time::sleep(d).await;
                Ok(ModelEvent::Response(response))
            })),
        }
    }
}

/// The no-op tool: it counts its executions and, with a delay, waits on a tokio timer.
pub(crate) fn noop_tool(executed: Arc<AtomicU64>, delay: Option<Duration>) -> Tool {
    Tool::builder("noop")
        .description("Does nothing and says ok.")
        .handler(move |args: NoopArgs, _ctx| {
            let executed = executed.clone();
            async move {
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                executed.fetch_add(1, Ordering::Relaxed);
                let _ = (args.turn, args.k, args.note);
                Ok::<_, ToolError>("ok")
            }
        })
}

/// The workload's agent and its counters.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    /// The agent (one for all runs).
    pub agent: Agent,
    /// The model's answer counter.
    pub model_calls: Arc<AtomicU64>,
    /// The tool's execution counter.
    pub tool_executions: Arc<AtomicU64>,
}

impl Workload {
    /// An agent for `turns` × `calls`, with optional model and tool latencies.
    pub(crate) fn new(
        turns: u32,
        calls: u32,
        model_delay: Option<Duration>,
        tool_delay: Option<Duration>,
    ) -> Result<Self, String> {
        Self::build(turns, calls, model_delay, tool_delay, None)
    }

    /// The same agent with an event sink that counts its events in `events` (the cost of
    /// building and delivering them, to a sink that does nothing else).
    pub(crate) fn observed(turns: u32, calls: u32, events: Arc<AtomicU64>) -> Result<Self, String> {
        Self::build(turns, calls, None, None, Some(events))
    }

    fn build(
        turns: u32,
        calls: u32,
        model_delay: Option<Duration>,
        tool_delay: Option<Duration>,
        events: Option<Arc<AtomicU64>>,
    ) -> Result<Self, String> {
        let model = WorkloadModel::new(turns, calls, model_delay);
        let model_calls = model.answered.clone();
        let tool_executions = Arc::new(AtomicU64::new(0));
        let mut builder = Agent::builder()
            .name("bench")
            .instructions("You are a benchmark.")
            .model(model)
            .tool(noop_tool(tool_executions.clone(), tool_delay))
            // The workload's shapes run past the default bounds (T=50 is 51 model calls).
            .limits(Limits::unlimited());
        if let Some(events) = events {
            builder = builder.sink(move |_: &agentloop::Event| {
                events.fetch_add(1, Ordering::Relaxed);
            });
        }
        let agent = builder.build().map_err(|e| e.to_string())?;
        Ok(Workload {
            agent,
            model_calls,
            tool_executions,
        })
    }

    /// Runs once and checks that the run did all its work.
    pub(crate) async fn run_once(&self, turns: u32, calls: u32) -> Result<RunOutcome, String> {
        let outcome = self.agent.run("Call the no-op tool as told.").await;
        check(&outcome, turns, calls)?;
        Ok(outcome)
    }

    /// Runs once with these options (a journal) and checks that the run did all its work.
    pub(crate) async fn run_once_with(
        &self,
        turns: u32,
        calls: u32,
        options: agentloop::RunOptions,
    ) -> Result<RunOutcome, String> {
        let input = agentloop::Message::user("Call the no-op tool as told.");
        let outcome = self.agent.run_with(Vec::new(), Some(input), options).await;
        check(&outcome, turns, calls)?;
        Ok(outcome)
    }

    /// Resets both counters.
    pub(crate) fn reset(&self) {
        self.model_calls.store(0, Ordering::Relaxed);
        self.tool_executions.store(0, Ordering::Relaxed);
    }
}

/// Checks a run: finished, with `turns + 1` model calls and `turns × calls` tool calls.
pub(crate) fn check(outcome: &RunOutcome, turns: u32, calls: u32) -> Result<(), String> {
    if outcome.stop_reason != StopReason::Finished {
        return Err(format!(
            "the run stopped with {:?}: {:?}",
            outcome.stop_reason, outcome.error
        ));
    }
    if outcome.model_calls != turns + 1 || outcome.tool_calls_run != turns * calls {
        return Err(format!(
            "the run made {} model calls and {} tool calls; expected {} and {}",
            outcome.model_calls,
            outcome.tool_calls_run,
            turns + 1,
            turns * calls
        ));
    }
    Ok(())
}
