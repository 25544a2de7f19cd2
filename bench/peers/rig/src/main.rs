//! rig's side of the loop benchmark (rig-core + rig-agent 0.44): one agent, reused for N runs of
//! T tool turns × K parallel no-op calls, then a final text turn. The model is rig-core's scripted
//! test wire (`MockScript`) over a custom transport that reads the turn from the last tool
//! result's call id and parses each call's raw JSON argument string, as a provider's decoder
//! does. Prints one JSON line, as every harness of `bench/run.sh` does.

#[path = "../../common.rs"]
mod common;

use std::sync::atomic::Ordering;

use rig_agent::AgentBuilder;
use rig_agent::tool::{Tool, ToolContext};
use rig_core::completion::{AssistantContent, CompletionRequest, CompletionResponse, Usage};
use rig_core::driver::{Exchange, Opened, Opening, Transport};
use rig_core::error::ProviderError;
use rig_core::message::{Message, Origin, ToolName, UserContent};
use rig_core::test_utils::{MOCK_API, MockFrame, MockScript};
use rig_core::wire::Mode;
use serde::Deserialize;
use serde_json::json;

/// How the harness names its system in the table.
const SYSTEM: &str = "rig (custom transport)";
/// The versions it runs.
const VERSION: &str = "rig-core 0.44.0, rig-agent 0.44.0";

/// Answers T turns of K calls, then "done".
#[derive(Clone)]
struct ScriptTransport {
    turns: u32,
    calls: u32,
}

impl ScriptTransport {
    fn answer(&self, request: &CompletionRequest) -> Result<CompletionResponse, ProviderError> {
        common::MODEL_CALLS.fetch_add(1, Ordering::Relaxed);
        let last_call = request.chat_history.iter().last().and_then(|m| match m {
            Message::User { content } => content.iter().rev().find_map(|c| match c {
                UserContent::ToolResult(r) => Some(r.call.wire().into_owned()),
                _ => None,
            }),
            _ => None,
        });
        let turn = match last_call {
            None => 0,
            Some(id) => id
                .strip_prefix('t')
                .and_then(|rest| rest.split('_').next())
                .and_then(|t| t.parse::<u32>().ok())
                .map_or(u32::MAX, |t| t + 1),
        };
        let choice = if turn >= self.turns {
            vec![AssistantContent::text("done")]
        } else {
            let name = ToolName::new("noop").map_err(|e| ProviderError::Provider(e.to_string()))?;
            let mut choice = Vec::with_capacity(self.calls as usize);
            for k in 0..self.calls {
                // The raw argument string a provider sends, parsed as rig's decoders parse it.
                let raw = format!(r#"{{"turn":{turn},"k":{k},"note":"no-op call"}}"#);
                let arguments: serde_json::Value = serde_json::from_str(&raw)
                    .map_err(|e| ProviderError::Provider(e.to_string()))?;
                choice.push(AssistantContent::tool_call(
                    format!("t{turn}_{k}"),
                    name.clone(),
                    arguments,
                ));
            }
            choice
        };
        let origin = Origin::new(MOCK_API, "mock", "mock-model");
        Ok(CompletionResponse::new(
            choice,
            Usage::default(),
            origin,
            serde_json::Value::Null,
        ))
    }
}

impl Transport<MockScript> for ScriptTransport {
    fn send(&self, request: CompletionRequest, exchange: Exchange) -> Opening<MockFrame> {
        if !matches!(exchange.mode, Mode::Unary) {
            return Opening::failed(ProviderError::Provider(
                "the benchmark does not stream".into(),
            ));
        }
        match self.answer(&request) {
            Ok(response) => Opening::ready(Opened::new(futures::stream::iter([Ok(
                MockFrame::Response(Box::new(response)),
            )]))),
            Err(e) => Opening::failed(e),
        }
    }
}

#[derive(Deserialize)]
struct NoopArgs {
    turn: u32,
    k: u32,
    note: String,
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

struct Noop;

impl Tool for Noop {
    const NAME: &'static str = "noop";
    type Args = NoopArgs;
    type Output = String;
    type Error = Never;

    fn description(&self) -> String {
        "Does nothing and says ok.".into()
    }

    fn parameters(&self) -> serde_json::Value {
        json!({
            "type": "object",
            "properties": {
                "turn": {"type": "integer"},
                "k": {"type": "integer"},
                "note": {"type": "string"}
            },
            "required": ["turn", "k", "note"]
        })
    }

    async fn call(&self, _context: &mut ToolContext, args: NoopArgs) -> Result<String, Never> {
        let _ = (args.turn, args.k, args.note);
        common::TOOL_EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        Ok("ok".into())
    }
}

fn main() -> Result<(), String> {
    let (shape, warmup) = common::shape()?;
    let common::Shape { runs, turns, calls } = shape;
    let model = rig_core::Model::new(MockScript::default(), ScriptTransport { turns, calls });
    let agent = AgentBuilder::new(model)
        .preamble("You are a benchmark.")
        .tool(Noop)
        .build();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let run_once = || async {
        let response = agent
            .prompt("Call the no-op tool as told.")
            .max_turns(turns as usize + 1)
            .tool_concurrency(calls as usize)
            .run()
            .await
            .map_err(|e| e.to_string())?;
        if response.output() != "done" {
            return Err(format!("the run ended with {:?}", response.output()));
        }
        Ok::<_, String>(())
    };
    rt.block_on(async {
        for _ in 0..warmup {
            run_once().await?;
        }
        Ok::<_, String>(())
    })?;
    let started = common::start_timing();
    rt.block_on(async {
        for _ in 0..runs {
            run_once().await?;
        }
        Ok::<_, String>(())
    })?;
    common::print_loop(SYSTEM, VERSION, &shape, started);
    Ok(())
}
