//! AutoAgents' side of the loop benchmark (autoagents 0.4.0 from crates.io): one ReAct agent
//! (`ReActAgent` under a `DirectAgent` handle), reused for N runs of T tool turns × K no-op calls,
//! then a final text turn. The model is a custom `LLMProvider` that reads the turn from the last
//! tool result's call id and answers with K calls whose arguments are raw JSON strings, as a
//! provider does; AutoAgents parses them and the tool deserializes its typed arguments. The
//! agent's memory holds the run's transcript and is cleared before each run. Prints one JSON
//! line, as every harness of `bench/run.sh` does.
//!
//! AutoAgents runs a response's tool calls one after another (its tool processor awaits each in
//! turn): it has no setting for running them concurrently.

#[path = "../../common.rs"]
mod common;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use autoagents::async_trait;
use autoagents::core::agent::memory::SlidingWindowMemory;
use autoagents::core::agent::prebuilt::executor::ReActAgent;
use autoagents::core::agent::task::Task;
use autoagents::core::agent::{AgentBuilder, DirectAgent};
use autoagents::core::tool::{ToolCallError, ToolRuntime, ToolT};
use autoagents::llm::chat::{
    ChatMessage, ChatProvider, ChatResponse, MessageType, StructuredOutputFormat, Tool,
};
use autoagents::llm::completion::{CompletionProvider, CompletionRequest, CompletionResponse};
use autoagents::llm::embedding::EmbeddingProvider;
use autoagents::llm::error::LLMError;
use autoagents::llm::models::ModelsProvider;
use autoagents::llm::{FunctionCall, LLMProvider, ToolCall};
use autoagents_derive::{AgentHooks, ToolInput, agent, tool};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How the harness names its system in the table.
const SYSTEM: &str = "AutoAgents (ReActAgent, custom LLMProvider)";
/// The versions it runs.
const VERSION: &str = "autoagents 0.4.0";

static TURNS: AtomicU64 = AtomicU64::new(10);
static CALLS: AtomicU64 = AtomicU64::new(3);

/// The no-op tool's arguments; every call's differ.
#[derive(Serialize, Deserialize, ToolInput, Debug)]
pub struct NoopArgs {
    #[input(description = "The turn that asked for the call")]
    turn: u32,
    #[input(description = "The call's position in its batch")]
    k: u32,
    #[input(description = "A short string")]
    note: String,
}

#[tool(
    name = "noop",
    description = "Does nothing and says ok.",
    input = NoopArgs,
)]
struct Noop {}

#[async_trait]
impl ToolRuntime for Noop {
    async fn execute(&self, args: Value) -> Result<Value, ToolCallError> {
        let args: NoopArgs = serde_json::from_value(args)?;
        let _ = (args.turn, args.k, args.note);
        common::TOOL_EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        Ok(Value::String("ok".into()))
    }
}

#[agent(
    name = "bench",
    description = "You are a benchmark.",
    tools = [Noop],
)]
#[derive(Default, Clone, AgentHooks)]
pub struct BenchAgent {}

/// A scripted model's answer.
#[derive(Debug)]
struct Answer {
    text: Option<String>,
    calls: Option<Vec<ToolCall>>,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text.as_deref().unwrap_or_default())
    }
}

impl ChatResponse for Answer {
    fn text(&self) -> Option<String> {
        self.text.clone()
    }

    fn tool_calls(&self) -> Option<Vec<ToolCall>> {
        self.calls.clone()
    }
}

/// Answers T turns of K calls, then "done"; the turn is read from the last tool result's id.
struct Script;

#[async_trait]
impl ChatProvider for Script {
    async fn chat_with_tools(
        &self,
        messages: &[ChatMessage],
        _tools: Option<&[Tool]>,
        _json_schema: Option<StructuredOutputFormat>,
    ) -> Result<Box<dyn ChatResponse>, LLMError> {
        common::MODEL_CALLS.fetch_add(1, Ordering::Relaxed);
        let last_call = messages.iter().rev().find_map(|m| match &m.message_type {
            MessageType::ToolResult(results) => results.first().map(|r| r.id.clone()),
            _ => None,
        });
        let turn = match last_call {
            Some(id) => id
                .strip_prefix('t')
                .and_then(|rest| rest.split('_').next())
                .and_then(|t| t.parse::<u64>().ok())
                .map_or(u64::MAX, |t| t + 1),
            None => 0,
        };
        if turn >= TURNS.load(Ordering::Relaxed) {
            return Ok(Box::new(Answer {
                text: Some("done".into()),
                calls: None,
            }));
        }
        let calls = (0..CALLS.load(Ordering::Relaxed))
            .map(|k| ToolCall {
                id: format!("t{turn}_{k}"),
                call_type: "function".into(),
                function: FunctionCall {
                    name: "noop".into(),
                    arguments: format!(r#"{{"turn":{turn},"k":{k},"note":"no-op call"}}"#),
                },
            })
            .collect();
        Ok(Box::new(Answer {
            text: None,
            calls: Some(calls),
        }))
    }
}

#[async_trait]
impl CompletionProvider for Script {
    async fn complete(
        &self,
        _req: &CompletionRequest,
        _json_schema: Option<StructuredOutputFormat>,
    ) -> Result<CompletionResponse, LLMError> {
        Err(LLMError::ProviderError("not used by the benchmark".into()))
    }
}

#[async_trait]
impl EmbeddingProvider for Script {
    async fn embed(&self, _text: Vec<String>) -> Result<Vec<Vec<f32>>, LLMError> {
        Err(LLMError::ProviderError("not used by the benchmark".into()))
    }
}

#[async_trait]
impl ModelsProvider for Script {}

impl LLMProvider for Script {}

fn main() -> Result<(), String> {
    let (shape, warmup) = common::shape()?;
    let common::Shape { runs, turns, calls } = shape;
    TURNS.store(u64::from(turns), Ordering::Relaxed);
    CALLS.store(u64::from(calls), Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let llm: Arc<dyn LLMProvider> = Arc::new(Script);
        // The agent's memory is its run's transcript (without one the model sees no tool
        // results): a window that holds a whole run, cleared before each run so that every run
        // starts from its task alone, as the other harnesses' runs do.
        let window = 4 * (turns as usize + 1) + 4;
        let mut handle = AgentBuilder::<_, DirectAgent>::new(ReActAgent::with_max_turns(
            BenchAgent {},
            turns as usize + 1,
        ))
        .llm(llm)
        .memory(Box::new(SlidingWindowMemory::new(window)))
        .build()
        .await
        .map_err(|e| e.to_string())?;
        // The agent sends its events into a bounded channel: drained, so that it never waits.
        let mut events = std::mem::replace(&mut handle.rx, Box::pin(futures::stream::empty()));
        tokio::spawn(async move { while events.next().await.is_some() {} });
        let agent = &handle.agent;
        let run_once = || async {
            if let Some(memory) = agent.memory() {
                memory
                    .lock()
                    .await
                    .clear()
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let output = agent
                .run(Task::new("Call the no-op tool as told."))
                .await
                .map_err(|e| e.to_string())?;
            if output != "done" {
                return Err(format!("the run ended with {output:?}"));
            }
            Ok::<_, String>(())
        };
        for _ in 0..warmup {
            run_once().await?;
        }
        let started = common::start_timing();
        for _ in 0..runs {
            run_once().await?;
        }
        common::print_loop(SYSTEM, VERSION, &shape, started);
        Ok(())
    })
}
