//! Runs stopped at random points, continued on each provider. Whatever stops a scripted run
//! (a cancel, the deadline, a required hook that fails after the model or before the tools, a
//! fatal tool, a limit) and wherever, its transcript answers every tool call; and that transcript,
//! sent by each of the three adapters over real loopback HTTP to a server that checks the API's
//! tool-pairing rule (as OpenAI and Anthropic do, answering 400 otherwise), continues a session.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agentloop::{
    Agent, CancellationToken, Hook, Limits, Message, Model, ModelResponse, RunOptions, Session,
    StopReason, Tool, ToolError, ToolOutput,
    hooks::{HookContext, HookError, HookResult, ToolCallDecision, ToolCallView},
    testing::ScriptedModel,
};
use agentloop_providers::OpenAiChat;
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::openai_responses::OpenAiResponses;
use futures::future::BoxFuture;
use proptest::prelude::*;
use serde_json::{Value, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

#[derive(Debug, Clone)]
enum Turn {
    Text,
    Calls(Vec<(u8, u8, u8)>),
}

#[derive(Debug, Clone)]
enum Stop {
    Cancel(u64),
    Deadline(u64),
    AfterModelHook(u32),
    BeforeToolHook(u32),
    Nothing,
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        1 => Just(Turn::Text),
        4 => prop::collection::vec((0u8..4, 0u8..5, 0u8..3), 1..4).prop_map(Turn::Calls),
    ]
}

fn stop() -> impl Strategy<Value = Stop> {
    prop_oneof![
        (0u64..400).prop_map(Stop::Cancel),
        (0u64..400).prop_map(Stop::Deadline),
        (1u32..4).prop_map(Stop::AfterModelHook),
        (1u32..4).prop_map(Stop::BeforeToolHook),
        Just(Stop::Nothing),
    ]
}

fn response(turn: &Turn, n: usize) -> ModelResponse {
    match turn {
        Turn::Text => ModelResponse::text("final"),
        Turn::Calls(calls) => {
            ModelResponse::tool_calls(calls.iter().enumerate().map(|(i, (id, tool, args))| {
                // Blank ids are filled by the run; the others are unique per response.
                let id = if *id == 0 {
                    String::new()
                } else {
                    format!("c{n}_{i}")
                };
                let tool = ["fast", "slow", "fatal", "flaky", "missing"][*tool as usize % 5];
                let args = match args {
                    0 => "{}".to_owned(),
                    1 => format!(r#"{{"n": {n}}}"#),
                    _ => "{broken".to_owned(),
                };
                (id, tool.to_owned(), args)
            }))
        }
    }
}

fn tool(name: &'static str) -> Tool {
    Tool::dynamic(
        name,
        "A test tool.",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        move |_args: Value, ctx| async move {
            match name {
                "slow" => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(120)) => Ok(ToolOutput::text("slow done")),
                        _ = ctx.cancel.cancelled() => Err(ToolError::new("cancelled", "stopped")),
                    }
                }
                "fatal" => Err(ToolError::fatal("the disk is gone")),
                "flaky" => Err(ToolError::new("busy", "try later")),
                _ => Ok(ToolOutput::text("done")),
            }
        },
    )
}

/// A required hook that fails after the model, or before the tools, on one turn.
struct FailOn {
    turn: u32,
    after_model: bool,
    seen: AtomicU32,
}

impl Hook for FailOn {
    fn name(&self) -> &str {
        "fail-on"
    }
    fn after_model_call<'a>(
        &'a self,
        ctx: HookContext<'a>,
        _r: &'a ModelResponse,
    ) -> BoxFuture<'a, HookResult<()>> {
        let fail = self.after_model && ctx.turn == self.turn;
        Box::pin(async move {
            if fail {
                Err(HookError::from("policy says no"))
            } else {
                Ok(())
            }
        })
    }
    fn before_tool_call<'a>(
        &'a self,
        ctx: HookContext<'a>,
        _c: ToolCallView<'a>,
    ) -> BoxFuture<'a, HookResult<ToolCallDecision>> {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let fail = !self.after_model && ctx.turn == self.turn;
        Box::pin(async move {
            if fail {
                Err(HookError::from("policy says no"))
            } else {
                Ok(ToolCallDecision::Continue)
            }
        })
    }
}

/// Runs the script on a paused clock until `stop` stops it.
fn stopped_run(turns: &[Turn], stop: &Stop) -> agentloop::RunOutcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let script: Vec<ModelResponse> = turns
            .iter()
            .enumerate()
            .map(|(n, t)| response(t, n))
            .collect();
        let mut b = Agent::builder()
            .model(ScriptedModel::new(script))
            .tools(["fast", "slow", "fatal", "flaky"].map(tool))
            .limits(Limits {
                max_turns: Some(6),
                timeout: match stop {
                    Stop::Deadline(ms) => Some(Duration::from_millis(*ms)),
                    _ => None,
                },
                grace_period: Duration::from_millis(30),
                ..Limits::default()
            });
        match stop {
            Stop::AfterModelHook(turn) | Stop::BeforeToolHook(turn) => {
                b = b.hook(FailOn {
                    turn: *turn,
                    after_model: matches!(stop, Stop::AfterModelHook(_)),
                    seen: AtomicU32::new(0),
                });
            }
            _ => {}
        }
        let agent = b.build().unwrap();
        let cancel = CancellationToken::new();
        if let Stop::Cancel(ms) = stop {
            let c = cancel.clone();
            let ms = *ms;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                c.cancel();
            });
        }
        let options = RunOptions {
            cancel: Some(cancel),
            ..RunOptions::default()
        };
        agent
            .run_with(Vec::new(), Some(Message::user("go")), options)
            .await
    })
}

/// What a provider says of a request that breaks its tool-pairing rule, or `None` when it holds.
type Check = fn(&Value) -> Option<String>;

fn chat_pairs(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    let mut waiting: Vec<String> = Vec::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            if waiting.first().map(String::as_str) != Some(id) {
                return Some(format!("tool message {id} answers no waiting call"));
            }
            waiting.remove(0);
            continue;
        }
        if !waiting.is_empty() {
            return Some(format!(
                "tool_calls must be followed by tool messages: {waiting:?}"
            ));
        }
        for call in m["tool_calls"].as_array().into_iter().flatten() {
            waiting.push(call["id"].as_str().unwrap_or_default().to_owned());
        }
    }
    (!waiting.is_empty()).then(|| format!("unanswered calls at the end: {waiting:?}"))
}

fn responses_pairs(body: &Value) -> Option<String> {
    let items = body["input"].as_array()?;
    let mut waiting: Vec<String> = Vec::new();
    for item in items {
        match item["type"].as_str() {
            Some("function_call") => {
                waiting.push(item["call_id"].as_str().unwrap_or_default().to_owned())
            }
            Some("function_call_output") => {
                let id = item["call_id"].as_str().unwrap_or_default();
                let Some(at) = waiting.iter().position(|w| w == id) else {
                    return Some(format!("no tool call found for function call output {id}"));
                };
                waiting.remove(at);
            }
            _ if !waiting.is_empty() => {
                return Some(format!("function calls without output: {waiting:?}"));
            }
            _ => {}
        }
    }
    (!waiting.is_empty()).then(|| format!("function calls without output: {waiting:?}"))
}

fn anthropic_pairs(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    let blocks = |m: &Value, kind: &str, key: &str| -> Vec<String> {
        m["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == kind)
            .map(|b| b[key].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    for (i, m) in messages.iter().enumerate() {
        let uses = blocks(m, "tool_use", "id");
        if uses.is_empty() {
            continue;
        }
        let Some(next) = messages.get(i + 1) else {
            return Some("tool_use ids were found without tool_result blocks".into());
        };
        let results = blocks(next, "tool_result", "tool_use_id");
        if next["role"] != "user" || results != uses {
            return Some(format!(
                "tool_use ids were found without tool_result blocks immediately after: {uses:?}"
            ));
        }
    }
    None
}

/// Answers like the API: 400 with the API's complaint when the tool pairing is broken, else a
/// final text answer in the API's own shape.
struct Api {
    check: Check,
    answer: Value,
}

impl Respond for Api {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        match (self.check)(&body) {
            Some(problem) => ResponseTemplate::new(400).set_body_json(json!({
                "error": {"type": "invalid_request_error", "message": problem}
            })),
            None => ResponseTemplate::new(200).set_body_json(self.answer.clone()),
        }
    }
}

async fn api(check: Check, answer: Value) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(Api { check, answer })
        .mount(&server)
        .await;
    server
}

struct Providers {
    rt: tokio::runtime::Runtime,
    models: Vec<(&'static str, Arc<dyn Model>)>,
    _servers: Vec<MockServer>,
}

fn providers() -> Providers {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (servers, models) = rt.block_on(async {
        let chat = api(
            chat_pairs,
            json!({"id": "x", "object": "chat.completion", "model": "m", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": "continued"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        )
        .await;
        let responses = api(
            responses_pairs,
            json!({"id": "r", "object": "response", "model": "m", "status": "completed",
                "output": [{"type": "message", "id": "msg", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "continued", "annotations": []}]}],
                "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}),
        )
        .await;
        let anthropic = api(
            anthropic_pairs,
            json!({"id": "m", "type": "message", "role": "assistant", "model": "c",
                "content": [{"type": "text", "text": "continued"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1}}),
        )
        .await;
        let models: Vec<(&'static str, Arc<dyn Model>)> = vec![
            (
                "openai chat",
                Arc::new(
                    OpenAiChat::builder("gpt-4.1-mini")
                        .base_url(chat.uri())
                        .api_key("sk-test")
                        .stream(false)
                        .build()
                        .unwrap(),
                ),
            ),
            (
                "openai responses",
                Arc::new(
                    OpenAiResponses::builder("gpt-4.1-mini")
                        .base_url(responses.uri())
                        .api_key("sk-test")
                        .stream(false)
                        .build()
                        .unwrap(),
                ),
            ),
            (
                "anthropic",
                Arc::new(
                    Anthropic::builder("claude-sonnet-4-5")
                        .base_url(anthropic.uri())
                        .api_key("sk-ant-test")
                        .stream(false)
                        .build()
                        .unwrap(),
                ),
            ),
        ];
        (vec![chat, responses, anthropic], models)
    });
    Providers {
        rt,
        models,
        _servers: servers,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn a_run_stopped_anywhere_continues_on_every_provider(
        turns in prop::collection::vec(turn(), 1..6),
        stop in stop(),
    ) {
        thread_local! {
            static PROVIDERS: Providers = providers();
        }
        let out = stopped_run(&turns, &stop);
        prop_assert!(out.stop_reason != StopReason::Finished || out.transcript.last().and_then(Message::as_assistant).is_some());
        PROVIDERS.with(|p| -> Result<(), TestCaseError> {
            for (name, model) in &p.models {
                let agent = Agent::builder().model(Arc::clone(model)).build().unwrap();
                let mut session = Session { messages: out.transcript.clone() };
                let next = p.rt.block_on(agent.run_in(&mut session, "continue"));
                prop_assert_eq!(
                    &next.stop_reason,
                    &StopReason::Finished,
                    "{} refused the transcript of a run stopped by {:?} ({}): {:?}",
                    name, stop, out.stop_reason, next.error
                );
                prop_assert_eq!(next.output.as_deref(), Some("continued"));
            }
            Ok(())
        })?;
    }
}

#[test]
fn a_transcript_with_an_unanswered_call_is_refused_by_every_checking_server() {
    // The servers' checks are live: the transcript a run stopped between a response and its
    // dispatch used to leave (B1) is refused by each, as the real APIs refuse it.
    let p = providers();
    let dangling = vec![
        Message::user("go"),
        Message::Assistant(agentloop::message::AssistantMessage {
            tool_calls: vec![agentloop::message::ToolCall {
                call_id: "call_1".into(),
                tool: "fast".into(),
                arguments: "{}".into(),
            }],
            ..Default::default()
        }),
    ];
    for (name, model) in &p.models {
        let agent = Agent::builder().model(Arc::clone(model)).build().unwrap();
        let mut session = Session {
            messages: dangling.clone(),
        };
        let next = p.rt.block_on(agent.run_in(&mut session, "continue"));
        assert_eq!(next.stop_reason, StopReason::Failed, "{name}");
        assert_eq!(
            next.error.unwrap().as_model_error().unwrap().status,
            Some(400),
            "{name}"
        );
    }
}
