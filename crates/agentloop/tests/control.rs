//! Control over a running agent: hooks, the permission gate, steering and follow-ups, guardrails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::{
    Agent, CallOutcome, CallStatus, EventKind, Gate, Hook, Message, ModelResponse, RunError,
    RunOptions, StopReason, ToolOutput, Verdict,
    gate::GateContext,
    guardrail::guardrail_fn,
    hooks::{HookContext, HookError, HookResult, RequestChanges, ToolCallDecision, ToolCallView},
    permissions::{
        Answer, ApprovalPrompter, ApprovalRequest, ArgumentMatch, FixedAnswer, Permission,
        PermissionGate, PermissionRule, PermissionStore, PermissionStoreError, SaveRules,
    },
    steering::Steering,
    testing::{FunctionModel, ScriptedModel},
};
use common::{CallLog, Events, calls, sleeper};
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// A gate that records the batches it saw and when, relative to the tool log.
struct RecordingGate {
    seen: Mutex<Vec<(usize, usize)>>,
    log: CallLog,
}

impl Gate for RecordingGate {
    fn check<'a>(
        &'a self,
        _cx: GateContext<'a>,
        calls: &'a [agentloop::machine::AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>> {
        self.seen
            .lock()
            .unwrap()
            .push((calls.len(), self.log.len()));
        Box::pin(async move { Ok(vec![Verdict::Allow; calls.len()]) })
    }
}

/// Keeps saved rules in memory, as a file would across runs.
#[derive(Debug, Default)]
struct MemorySaver(Mutex<Vec<PermissionRule>>);

impl SaveRules for MemorySaver {
    fn save(&self, rules: &[PermissionRule]) -> Result<(), PermissionStoreError> {
        *self.0.lock().unwrap() = rules.to_vec();
        Ok(())
    }
}

fn reopen(saver: &Arc<MemorySaver>, fallback: Permission) -> PermissionStore {
    let saved = saver.0.lock().unwrap().clone();
    PermissionStore::with_saved(saved, fallback, saver.clone())
}

#[tokio::test]
async fn the_gate_runs_once_per_turn_before_any_tool_starts() {
    let log = CallLog::default();
    let gate = Arc::new(RecordingGate {
        seen: Mutex::new(Vec::new()),
        log: log.clone(),
    });
    let model = ScriptedModel::new([
        calls(&[("a", "alpha", "{}"), ("b", "alpha", r#"{"tag": "b"}"#)]),
        calls(&[("c", "alpha", r#"{"tag": "c"}"#)]),
        ModelResponse::text("done"),
    ]);
    let out = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .gate(gate.clone())
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    // (calls in the batch, tools that had run when the gate saw it)
    assert_eq!(*gate.seen.lock().unwrap(), vec![(2, 0), (1, 2)]);
}

#[tokio::test]
async fn a_denied_call_never_runs_and_the_model_sees_why() {
    let log = CallLog::default();
    let mut store = PermissionStore::new(Permission::Allow);
    store.set("danger", Permission::Deny);
    let seen = Arc::new(Mutex::new(String::new()));
    let seen2 = seen.clone();
    let model = FunctionModel::new(move |req| {
        if let Some(r) = req.messages.iter().rev().find_map(Message::as_tool_result) {
            *seen2.lock().unwrap() = r.content.to_text();
            return Ok(ModelResponse::text("ok"));
        }
        Ok(calls(&[("a", "danger", "{}")]))
    });
    let out = Agent::builder()
        .model(model)
        .tool(sleeper("danger", &log))
        .gate(Arc::new(PermissionGate::new(store)))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(log.len(), 0, "the denied call never ran");
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Denied);
    assert!(
        seen.lock().unwrap().contains("denied"),
        "{}",
        seen.lock().unwrap()
    );
    assert_eq!(out.tool_calls_run, 0);
}

struct ScriptedPrompter {
    answers: Mutex<Vec<Answer>>,
    asked: Mutex<Vec<Vec<String>>>,
}

impl ApprovalPrompter for ScriptedPrompter {
    fn ask<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        self.asked
            .lock()
            .unwrap()
            .push(requests.iter().map(|r| r.call_id.clone()).collect());
        let mut a = self.answers.lock().unwrap();
        let take = requests.len().min(a.len());
        let out: Vec<Answer> = a.drain(..take).collect();
        Box::pin(async move { Ok(out) })
    }
}

#[tokio::test]
async fn always_answers_persist_across_two_runs_with_a_file_store() {
    let saver = Arc::new(MemorySaver::default());
    let log = CallLog::default();
    let script = || {
        ScriptedModel::new([
            calls(&[("a", "alpha", "{}"), ("b", "beta", "{}")]),
            ModelResponse::text("done"),
        ])
    };
    let prompter = Arc::new(ScriptedPrompter {
        answers: Mutex::new(vec![Answer::AllowAlways, Answer::DenyAlways]),
        asked: Mutex::new(Vec::new()),
    });
    let gate = PermissionGate::new(reopen(&saver, Permission::Ask)).with_prompter(prompter.clone());
    let agent = |gate: PermissionGate| {
        Agent::builder()
            .model(script())
            .tool(sleeper("alpha", &log))
            .tool(sleeper("beta", &log))
            .gate(Arc::new(gate))
            .build()
            .unwrap()
    };
    let first = agent(gate).run("go").await;
    assert_eq!(
        prompter.asked.lock().unwrap().clone(),
        vec![vec!["a".to_owned(), "b".to_owned()]],
        "one prompt for the batch"
    );
    assert_eq!(first.tool_calls[0].outcome.status, CallStatus::Ok);
    assert_eq!(first.tool_calls[1].outcome.status, CallStatus::Denied);

    // A second run with a fresh store from the same file asks nobody.
    let nobody = Arc::new(ScriptedPrompter {
        answers: Mutex::new(Vec::new()),
        asked: Mutex::new(Vec::new()),
    });
    let gate = PermissionGate::new(reopen(&saver, Permission::Ask)).with_prompter(nobody.clone());
    let second = agent(gate).run("go").await;
    assert!(nobody.asked.lock().unwrap().is_empty());
    assert_eq!(second.tool_calls[0].outcome.status, CallStatus::Ok);
    assert_eq!(second.tool_calls[1].outcome.status, CallStatus::Denied);
}

#[tokio::test]
async fn an_ask_with_nobody_to_ask_is_a_denial_with_that_reason() {
    let log = CallLog::default();
    let gate = PermissionGate::new(PermissionStore::new(Permission::Ask))
        .unattended_reason("no terminal; use --yes");
    let model = ScriptedModel::new([calls(&[("a", "alpha", "{}")]), ModelResponse::text("done")]);
    let out = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .gate(Arc::new(gate))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Denied);
    assert!(
        out.tool_calls[0]
            .outcome
            .error_text()
            .as_deref()
            .unwrap()
            .contains("no terminal; use --yes")
    );
    let yes = PermissionGate::new(PermissionStore::new(Permission::Ask))
        .with_prompter(Arc::new(FixedAnswer(Answer::AllowOnce)));
    let model = ScriptedModel::new([calls(&[("a", "alpha", "{}")]), ModelResponse::text("done")]);
    let out = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .gate(Arc::new(yes))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Ok);
}

#[test]
fn rules_match_command_prefixes_and_path_globs_with_deny_first() {
    let mut store = PermissionStore::new(Permission::Ask);
    store
        .add(PermissionRule::command_prefix(
            "shell",
            "git status",
            Permission::Allow,
        ))
        .add(PermissionRule {
            tool: "write".into(),
            arguments: Some(ArgumentMatch::PathGlob {
                field: "path".into(),
                glob: "src/**/*.rs".into(),
            }),
            permission: Permission::Allow,
        })
        .add(PermissionRule {
            tool: "*".into(),
            arguments: Some(ArgumentMatch::PathGlob {
                field: "path".into(),
                glob: "**/.env".into(),
            }),
            permission: Permission::Deny,
        });
    assert_eq!(
        store.decide("shell", &json!({"command": "git status --short"})),
        Permission::Allow
    );
    assert_eq!(
        store.decide("shell", &json!({"command": ["git", "status"]})),
        Permission::Allow
    );
    assert_eq!(
        store.decide("shell", &json!({"command": "git statusx"})),
        Permission::Ask
    );
    assert_eq!(
        store.decide("shell", &json!({"command": "rm -rf /"})),
        Permission::Ask
    );
    assert_eq!(
        store.decide("write", &json!({"path": "src/a/b.rs"})),
        Permission::Allow
    );
    assert_eq!(
        store.decide("write", &json!({"path": "docs/a.md"})),
        Permission::Ask
    );
    assert_eq!(
        store.decide("write", &json!({"path": "src/.env"})),
        Permission::Deny
    );
}

#[tokio::test(start_paused = true)]
async fn steering_arrives_between_turns_and_not_mid_batch() {
    let log = CallLog::default();
    let steering = Steering::new();
    let seen: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen2 = seen.clone();
    let model = FunctionModel::new(move |req| {
        let roles: Vec<String> = req
            .messages
            .iter()
            .map(|m| match m {
                Message::User { content } => format!(
                    "user:{}",
                    serde_json::to_value(content).unwrap()[0]["text"]
                        .as_str()
                        .unwrap()
                ),
                Message::Assistant(_) => "assistant".into(),
                Message::Tool(_) => "tool".into(),
            })
            .collect();
        let n = seen2.lock().unwrap().len();
        seen2.lock().unwrap().push(roles);
        Ok(match n {
            0 => calls(&[
                ("a", "alpha", r#"{"ms": 100}"#),
                ("b", "alpha", r#"{"ms": 100, "tag": "b"}"#),
            ]),
            _ => ModelResponse::text("done"),
        })
    });
    let agent = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .build()
        .unwrap();
    let s2 = steering.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        s2.steer("use metric units");
    });
    let out = run_steered(&agent, &steering, "go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[1],
        vec![
            "user:go",
            "assistant",
            "tool",
            "tool",
            "user:use metric units"
        ],
        "after the batch, before the next call"
    );
}

#[tokio::test]
async fn a_follow_up_continues_a_finished_run() {
    let steering = Steering::new();
    steering.follow_up("and in Fahrenheit?");
    let model = ScriptedModel::new([ModelResponse::text("18 C"), ModelResponse::text("64 F")]);
    let agent = Agent::builder().model(model).build().unwrap();
    let out = run_steered(&agent, &steering, "weather?").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.output.as_deref(), Some("64 F"));
    assert_eq!(out.turns, 2);
    assert_eq!(steering.pending(), (0, 0));
}

#[tokio::test]
async fn follow_ups_do_not_bypass_a_limit() {
    let steering = Steering::new();
    steering.follow_up("more");
    let model = ScriptedModel::new([ModelResponse::text("a"), ModelResponse::text("b")]);
    let agent = Agent::builder()
        .model(model)
        .limits(agentloop::Limits {
            max_turns: Some(1),
            ..Default::default()
        })
        .build()
        .unwrap();
    let options = RunOptions {
        steering: Some(steering),
        ..Default::default()
    };
    let out = agent
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(out.stop_reason, StopReason::MaxTurns);
}

#[tokio::test]
async fn a_tripped_input_guardrail_stops_the_run_before_the_model_is_called() {
    let model = ScriptedModel::new([ModelResponse::text("never")]);
    let agent = Agent::builder()
        .model(model.clone())
        .input_guardrail(guardrail_fn("no-secrets", |t| {
            if t.contains("password") {
                Err("the input holds a password".into())
            } else {
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let out = agent.run("my password is hunter2").await;
    assert_eq!(
        out.stop_reason,
        StopReason::Guardrail {
            name: "no-secrets".into(),
            message: "the input holds a password".into()
        }
    );
    assert_eq!(out.stop_reason.as_str(), "guardrail");
    assert_eq!(model.calls(), 0);
    assert_eq!(out.error.unwrap().code(), "guardrail.tripped");
}

#[tokio::test]
async fn a_tripped_output_guardrail_stops_the_run_with_its_reason() {
    let model = ScriptedModel::new([ModelResponse::text("I think it's 451")]);
    let agent = Agent::builder()
        .model(model)
        .output_guardrail(guardrail_fn("no-numbers", |t| {
            if t.chars().any(|c| c.is_ascii_digit()) {
                Err("digits".into())
            } else {
                Ok(())
            }
        }))
        .build()
        .unwrap();
    let out = agent.run("go").await;
    assert!(
        matches!(out.stop_reason, StopReason::Guardrail { ref name, .. } if name == "no-numbers")
    );
    assert_eq!(out.output, None, "what the guardrail stopped is withheld");
    assert_eq!(out.structured_output, None);
    let last = out.transcript.last().and_then(Message::as_assistant);
    assert_eq!(
        last.map(|a| a.text.as_str()),
        Some("I think it's 451"),
        "the transcript keeps it"
    );
}

/// A guardrail that trips on the word "secret", named `name`.
fn no_secrets(name: &str) -> agentloop::guardrail::FnGuardrail {
    guardrail_fn(name, |t| {
        if t.contains("secret") {
            Err("it holds a secret".into())
        } else {
            Ok(())
        }
    })
}

/// A run a tool ends shows the tool's output as its own: the output guardrails read it as they
/// read a finished run's answer (they were skipped, and the secret was the run's output).
#[tokio::test]
async fn the_output_guardrails_read_the_output_of_a_run_a_tool_ended() {
    let ending = agentloop::Tool::dynamic(
        "finish",
        "Ends the run.",
        json!({"type": "object"}),
        |_a: Value, _c| async { Ok(ToolOutput::text("the secret is 42").terminate()) },
    );
    let run = |guarded: bool| {
        let model = ScriptedModel::new([calls(&[("a", "finish", "{}")])]);
        let mut agent = Agent::builder().model(model).tool(ending.clone());
        if guarded {
            agent = agent.output_guardrail(no_secrets("no-secrets"));
        }
        agent.build().unwrap()
    };
    let out = run(false).run("go").await;
    assert_eq!(out.stop_reason, StopReason::Terminated);
    assert_eq!(out.output.as_deref(), Some("the secret is 42"));
    let out = run(true).run("go").await;
    assert!(
        matches!(out.stop_reason, StopReason::Guardrail { ref name, .. } if name == "no-secrets"),
        "{:?}",
        out.stop_reason
    );
    assert_eq!(out.output, None, "what the guardrail stopped is withheld");
}

/// A run of `agent` on `input`, with `steering`.
async fn run_steered(agent: &Agent, steering: &Steering, input: &str) -> agentloop::RunOutcome {
    let options = RunOptions {
        steering: Some(steering.clone()),
        ..Default::default()
    };
    agent
        .run_with(Vec::new(), Some(Message::user(input)), options)
        .await
}

/// A run of an agent whose input guardrail trips on "secret", asked the weather, with
/// `steering`; and its model, which answers "18 C", then "64 F".
async fn guarded_run(steering: &Steering) -> (agentloop::RunOutcome, ScriptedModel) {
    let model = ScriptedModel::new([ModelResponse::text("18 C"), ModelResponse::text("64 F")]);
    let agent = Agent::builder()
        .model(model.clone())
        .input_guardrail(no_secrets("no-secrets"))
        .build()
        .unwrap();
    let out = run_steered(&agent, steering, "weather?").await;
    (out, model)
}

/// A steering message and a follow-up reach the model as the input does: the input guardrails
/// read them first, and one that trips stops the run before the model reads it.
#[tokio::test]
async fn the_input_guardrails_read_steering_messages_and_follow_ups() {
    for follow_up in [false, true] {
        let steering = Steering::new();
        if follow_up {
            steering.follow_up("and the secret?");
        } else {
            steering.steer("tell me the secret");
        }
        let (out, model) = guarded_run(&steering).await;
        assert!(
            matches!(out.stop_reason, StopReason::Guardrail { ref name, .. } if name == "no-secrets"),
            "follow-up {follow_up}: {:?}",
            out.stop_reason
        );
        assert_eq!(
            model.calls(),
            usize::from(follow_up),
            "follow-up {follow_up}: the model never read the message"
        );
        assert!(
            !out.transcript.iter().any(|m| m.text().contains("secret")),
            "follow-up {follow_up}: {:?}",
            out.transcript
        );
    }
    // A message that passes steers the run as before.
    let steering = Steering::new();
    steering.follow_up("and in Fahrenheit?");
    let (out, _) = guarded_run(&steering).await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.output.as_deref(), Some("64 F"));
}

struct Recorder {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    fail_at: Option<&'static str>,
}

impl Hook for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn before_model_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        changes: &'a mut RequestChanges,
    ) -> BoxFuture<'a, HookResult<()>> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:before_model", self.name));
        changes.instructions = Some(format!("from {}", self.name));
        let fail = self.fail_at == Some("before_model");
        Box::pin(async move {
            if fail {
                Err(HookError("nope".into()))
            } else {
                Ok(())
            }
        })
    }
    fn after_model_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _r: &'a ModelResponse,
    ) -> BoxFuture<'a, HookResult<()>> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:after_model", self.name));
        Box::pin(async { Ok(()) })
    }
    fn on_finish<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _o: &'a agentloop::RunOutcome,
    ) -> BoxFuture<'a, HookResult<()>> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:finish", self.name));
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn hooks_compose_in_the_documented_order_and_can_change_the_request() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let instructions = Arc::new(Mutex::new(String::new()));
    let i2 = instructions.clone();
    let model = FunctionModel::new(move |req| {
        *i2.lock().unwrap() = req.instructions.unwrap_or_default().to_owned();
        Ok(ModelResponse::text("ok"))
    });
    let out = Agent::builder()
        .model(model)
        .instructions("original")
        .hook(Recorder {
            name: "one",
            log: log.clone(),
            fail_at: None,
        })
        .observer(Recorder {
            name: "two",
            log: log.clone(),
            fail_at: None,
        })
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(
        *instructions.lock().unwrap(),
        "from two",
        "the later hook's change wins"
    );
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            "one:before_model",
            "two:before_model",
            "two:after_model",
            "one:after_model",
            "one:finish",
            "two:finish"
        ]
    );
}

#[tokio::test]
async fn a_failing_hook_fails_the_run_or_is_reported_as_registered() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let out = Agent::builder()
        .model(model.clone())
        .hook(Recorder {
            name: "strict",
            log: log.clone(),
            fail_at: Some("before_model"),
        })
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    let err = out.error.unwrap();
    assert_eq!(err.code(), "hook.failed");
    assert!(err.to_string().contains("strict"));
    assert_eq!(model.calls(), 0);

    let events = Events::default();
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let out = Agent::builder()
        .model(model)
        .observer(Recorder {
            name: "lenient",
            log,
            fail_at: Some("before_model"),
        })
        .sink(events.sink())
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert!(
        events
            .all()
            .iter()
            .any(|e| matches!(&e.kind, EventKind::HookFailed { hook, .. } if hook == "lenient"))
    );
}

struct ToolPolicy;

impl Hook for ToolPolicy {
    fn name(&self) -> &str {
        "tool-policy"
    }
    fn before_tool_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        call: ToolCallView<'a>,
    ) -> BoxFuture<'a, HookResult<ToolCallDecision>> {
        let d = match call.arguments.get("tag").and_then(Value::as_str) {
            Some("veto") => ToolCallDecision::Veto("tag veto is not allowed".into()),
            Some("rewrite") => ToolCallDecision::Rewrite(json!({"tag": "rewritten"})),
            Some("bad") => ToolCallDecision::Rewrite(json!({"ms": "not a number"})),
            _ => ToolCallDecision::Continue,
        };
        Box::pin(async move { Ok(d) })
    }
    fn after_tool_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        call: ToolCallView<'a>,
        _r: &'a CallOutcome,
    ) -> BoxFuture<'a, HookResult<Option<CallOutcome>>> {
        let replace = call.arguments.get("tag").and_then(Value::as_str) == Some("replace");
        Box::pin(async move { Ok(replace.then(|| CallOutcome::ok(ToolOutput::text("replaced")))) })
    }
}

#[tokio::test]
async fn tool_hooks_veto_rewrite_and_replace() {
    let log = CallLog::default();
    let model = ScriptedModel::new([
        calls(&[
            ("v", "alpha", r#"{"tag": "veto"}"#),
            ("r", "alpha", r#"{"tag": "rewrite"}"#),
            ("p", "alpha", r#"{"tag": "replace"}"#),
        ]),
        ModelResponse::text("done"),
    ]);
    let out = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .hook(ToolPolicy)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.tool_calls[0].outcome.status, CallStatus::Denied);
    assert!(
        out.tool_calls[0]
            .outcome
            .error_text()
            .as_deref()
            .unwrap()
            .contains("tag veto")
    );
    assert_eq!(
        out.tool_calls[1].outcome.output().cloned(),
        Some(agentloop::message::ToolContent::Json(
            json!({"tag": "rewritten"})
        ))
    );
    assert_eq!(
        out.tool_calls[2].outcome.output().cloned(),
        Some(agentloop::message::ToolContent::Text("replaced".into()))
    );
    assert_eq!(log.len(), 2);

    let model = ScriptedModel::new([
        calls(&[("b", "alpha", r#"{"tag": "bad"}"#)]),
        ModelResponse::text("never"),
    ]);
    let out = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .hook(ToolPolicy)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(
        out.error.unwrap().code(),
        "hook.failed",
        "a rewrite is validated again"
    );
}

#[test]
fn configured_rules_count_but_only_saved_answers_reach_the_store_file() {
    let saver = Arc::new(MemorySaver::default());
    let mut store = reopen(&saver, Permission::Allow);
    let rule = |tool: &str, permission| PermissionRule {
        tool: tool.into(),
        arguments: None,
        permission,
    };
    let ask_on_args = PermissionRule::command_prefix("alpha", "rm", Permission::Ask);
    store
        .configure(rule("alpha", Permission::Ask))
        .configure(ask_on_args)
        .configure(rule("beta", Permission::Deny));
    assert_eq!(store.decide("alpha", &json!({})), Permission::Ask);
    assert_eq!(
        store.decide("alpha", &json!({"command": "rm x"})),
        Permission::Ask
    );
    assert_eq!(store.decide("beta", &json!({})), Permission::Deny);
    // An "always" answer settles the configured ask for its tool at once, never the ask rule on
    // its arguments, and only the answer is saved.
    store.remember("alpha", Permission::Allow).unwrap();
    assert_eq!(store.decide("alpha", &json!({})), Permission::Allow);
    assert_eq!(
        store.decide("alpha", &json!({"command": "rm x"})),
        Permission::Ask
    );
    assert_eq!(store.configured().len(), 3, "configured rules stay");
    let reopened = reopen(&saver, Permission::Allow);
    assert_eq!(reopened.rules(), &[rule("alpha", Permission::Allow)]);
}

/// An after-tool hook that takes its time over the calls whose `tag` is `slow`, and records every
/// result it sees.
struct SlowAfter {
    seen: Mutex<Vec<(String, bool)>>,
}

impl Hook for SlowAfter {
    fn name(&self) -> &str {
        "slow-after"
    }
    fn after_tool_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        call: ToolCallView<'a>,
        r: &'a CallOutcome,
    ) -> BoxFuture<'a, HookResult<Option<CallOutcome>>> {
        self.seen
            .lock()
            .unwrap()
            .push((call.call_id.to_owned(), r.status == CallStatus::Ok));
        let slow = call.arguments.get("tag").and_then(Value::as_str) == Some("slow");
        Box::pin(async move {
            if slow {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok(None)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_after_tool_hook_does_not_hold_up_the_other_calls_of_the_batch() {
    let log = CallLog::default();
    let timed = {
        let log = log.clone();
        let inner = sleeper("timed", &log);
        let spec = inner.spec().clone();
        agentloop::Tool::builder("timed")
            .description(spec.description)
            .timeout(Duration::from_secs(1))
            .dynamic(spec.input_schema, move |args: Value, ctx| {
                inner.call(args, ctx)
            })
    };
    let model = ScriptedModel::new([
        calls(&[
            ("a", "alpha", r#"{"tag": "slow"}"#),
            ("b", "timed", r#"{"ms": 600}"#),
        ]),
        ModelResponse::text("done"),
    ]);
    let hook = Arc::new(SlowAfter {
        seen: Mutex::new(Vec::new()),
    });
    let a = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .tool(timed)
        .hook(HookRef(hook.clone()))
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    // The 600 ms call ran while the hook spent 2 s on its sibling: no false timeout.
    assert_eq!(
        out.tool_calls[1].outcome.status,
        CallStatus::Ok,
        "{:?}",
        out.tool_calls[1]
    );
    assert!(
        started.elapsed() < Duration::from_millis(2100),
        "{:?}",
        started.elapsed()
    );
    let seen = hook.seen.lock().unwrap().clone();
    assert_eq!(seen, [("a".to_owned(), true), ("b".to_owned(), true)]);
}

/// A hook shared with the test.
struct HookRef(Arc<SlowAfter>);

impl Hook for HookRef {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn after_tool_call<'a>(
        &'a self,
        ctx: HookContext<'a>,
        call: ToolCallView<'a>,
        r: &'a CallOutcome,
    ) -> BoxFuture<'a, HookResult<Option<CallOutcome>>> {
        self.0.after_tool_call(ctx, call, r)
    }
}

/// A tool that always fails recoverably, counting its runs.
fn always_busy(runs: &Arc<std::sync::atomic::AtomicUsize>, retries: u32) -> agentloop::Tool {
    let runs = runs.clone();
    agentloop::Tool::builder("busy")
        .description("Always busy.")
        .retries(retries)
        .dynamic(json!({"type": "object"}), move |_a: Value, _c| {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Err::<ToolOutput, _>(agentloop::ToolError::new("busy", "try later")) }
        })
}

#[tokio::test(start_paused = true)]
async fn no_retry_starts_when_the_deadline_passes_during_the_backoff() {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let model = ScriptedModel::new([calls(&[("a", "busy", "{}")]), ModelResponse::text("never")]);
    let a = Agent::builder()
        .model(model)
        .tool(always_busy(&runs, 3))
        .limits(agentloop::Limits {
            timeout: Some(Duration::from_millis(50)),
            grace_period: Duration::from_secs(5),
            ..agentloop::Limits::default()
        })
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(out.tool_calls[0].outcome.retries, 0);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_sibling_stops_the_retries_of_the_batch_but_lets_running_attempts_finish() {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fatal = agentloop::Tool::dynamic(
        "fatal",
        "Fails fatally after a moment.",
        json!({"type": "object"}),
        |_a: Value, _c| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err::<ToolOutput, _>(agentloop::ToolError::fatal("disk on fire"))
        },
    );
    let model = ScriptedModel::new([
        calls(&[("a", "busy", "{}"), ("b", "fatal", "{}")]),
        ModelResponse::text("never"),
    ]);
    let a = Agent::builder()
        .model(model)
        .tool(always_busy(&runs, 5))
        .tool(fatal)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no retry after the fatal call"
    );
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn with_retries_events_go_started_retrying_finished_and_the_after_hook_sees_the_last_result_once()
 {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let flaky = agentloop::Tool::builder("flaky")
        .description("Fails once.")
        .retries(2)
        .dynamic(json!({"type": "object"}), move |_a: Value, _c| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err(agentloop::ToolError::new("busy", "first attempt failed"))
                } else {
                    Ok(ToolOutput::text("fine"))
                }
            }
        });
    let events = Events::default();
    let hook = Arc::new(SlowAfter {
        seen: Mutex::new(Vec::new()),
    });
    let model = ScriptedModel::new([calls(&[("a", "flaky", "{}")]), ModelResponse::text("done")]);
    let a = Agent::builder()
        .model(model)
        .tool(flaky)
        .hook(HookRef(hook.clone()))
        .sink(events.sink())
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let kinds: Vec<&str> = events
        .all()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolStarted { .. } => Some("started"),
            EventKind::ToolRetrying { .. } => Some("retrying"),
            EventKind::ToolFinished { .. } => Some("finished"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["started", "retrying", "finished"]);
    assert_eq!(*hook.seen.lock().unwrap(), [("a".to_owned(), true)]);
    assert_eq!(out.tool_calls[0].outcome.retries, 1);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_holds_while_an_after_tool_hook_runs() {
    let log = CallLog::default();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook = Arc::new(SlowAfter {
        seen: Mutex::new(Vec::new()),
    });
    let model = ScriptedModel::new([
        calls(&[
            ("a", "alpha", r#"{"tag": "slow"}"#),
            ("b", "alpha", r#"{"tag": "slow"}"#),
            ("c", "alpha", r#"{"tag": "slow"}"#),
            ("d", "busy", "{}"),
        ]),
        ModelResponse::text("never"),
    ]);
    let a = Agent::builder()
        .model(model)
        .tool(sleeper("alpha", &log))
        .tool(always_busy(&runs, 5))
        .hook(HookRef(hook.clone()))
        .limits(agentloop::Limits {
            timeout: Some(Duration::from_millis(100)),
            grace_period: Duration::from_secs(5),
            ..agentloop::Limits::default()
        })
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Deadline);
    // Each call's after-tool hook runs inside the call's own future, so the three 2 s hooks run
    // side by side (and the busy tool's, once its retries stop at the deadline); the run ends
    // when the hooks do, inside the grace period.
    assert_eq!(hook.seen.lock().unwrap().len(), 4, "{:?}", hook.seen);
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert!(runs.load(std::sync::atomic::Ordering::SeqCst) <= 1);
    assert_eq!(out.tool_calls.len(), 4);
    for id in ["a", "b", "c"] {
        let r = out.tool_calls.iter().find(|r| &*r.call_id == id).unwrap();
        assert_eq!(r.outcome.status, CallStatus::Ok, "{id}: {r:?}");
    }
}

/// Records when each retry was announced.
struct RetryClock(Mutex<Vec<(u32, tokio::time::Instant)>>);

impl agentloop::EventSink for RetryClock {
    fn emit(&self, event: &agentloop::Event) {
        if let EventKind::ToolRetrying { retry, .. } = &event.kind {
            self.0
                .lock()
                .unwrap()
                .push((*retry, tokio::time::Instant::now()));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_announced_before_its_backoff_and_a_hand_made_invalid_arguments_error_is_not_retried()
 {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clock = Arc::new(RetryClock(Mutex::new(Vec::new())));
    let model = ScriptedModel::new([calls(&[("a", "busy", "{}")]), ModelResponse::text("done")]);
    let a = Agent::builder()
        .model(model)
        .tool(always_busy(&runs, 2))
        .sink({
            let clock = clock.clone();
            move |e: &agentloop::Event| agentloop::EventSink::emit(&*clock, e)
        })
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let out = a.run("go").await;
    assert_eq!(out.tool_calls[0].outcome.retries, 2);
    let at: Vec<(u32, Duration)> = clock
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(n, t)| (*n, t.duration_since(started)))
        .collect();
    // Retry 1 is announced when the first attempt fails, retry 2 after the first backoff.
    assert_eq!(at, [(1, Duration::ZERO), (2, Duration::from_millis(100))]);

    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let strict = agentloop::Tool::builder("strict")
        .description("Checks more than its schema says.")
        .retries(3)
        .dynamic(json!({"type": "object"}), move |_a: Value, _c| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                Err::<ToolOutput, _>(agentloop::ToolError::new(
                    "invalid_arguments",
                    "n must be even",
                ))
            }
        });
    let model = ScriptedModel::new([calls(&[("a", "strict", "{}")]), ModelResponse::text("done")]);
    let out = Agent::builder()
        .model(model)
        .tool(strict)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(out.tool_calls[0].outcome.retries, 0);
}

#[tokio::test(start_paused = true)]
async fn progress_sent_after_a_call_is_over_is_dropped() {
    let events = Events::default();
    let leaky = agentloop::Tool::dynamic(
        "leaky",
        "Reports progress, and leaves work behind that reports later.",
        json!({"type": "object"}),
        |_a: Value, ctx: agentloop::ToolContext| async move {
            ctx.progress.send("working");
            let late = ctx.progress.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                late.send("too late");
            });
            Ok(ToolOutput::text("done"))
        },
    );
    let model = ScriptedModel::new([calls(&[("a", "leaky", "{}")]), ModelResponse::text("ok")]);
    let a = Agent::builder()
        .model(model)
        .tool(leaky)
        .sink(events.sink())
        .build()
        .unwrap();
    let out = a.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let progress: Vec<Value> = events
        .all()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolProgress { progress, .. } => Some(progress.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(progress, [json!("working")]);
}

/// A hook that fails whenever the run's end is reported to it.
struct Grumbler;

impl Hook for Grumbler {
    fn name(&self) -> &str {
        "grumbler"
    }
    fn on_error<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _error: &'a RunError,
    ) -> BoxFuture<'a, HookResult<()>> {
        Box::pin(async { Err(HookError("on error".into())) })
    }
    fn on_finish<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _outcome: &'a agentloop::RunOutcome,
    ) -> BoxFuture<'a, HookResult<()>> {
        Box::pin(async { Err(HookError("on finish".into())) })
    }
}

#[tokio::test]
async fn a_required_failure_stops_the_chain_but_every_hook_hears_the_end_and_on_error_observers_are_not_reported()
 {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let events = Events::default();
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let out = Agent::builder()
        .model(model)
        .hook(Recorder {
            name: "strict",
            log: log.clone(),
            fail_at: Some("before_model"),
        })
        .observer(Recorder {
            name: "later",
            log: log.clone(),
            fail_at: None,
        })
        .observer(Grumbler)
        .sink(events.sink())
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.unwrap().code(), "hook.failed");
    assert_eq!(
        *log.lock().unwrap(),
        ["strict:before_model", "strict:finish", "later:finish"],
        "the hook after the failed required one is not asked before the model call"
    );
    let reported: Vec<(String, String)> = events
        .all()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::HookFailed { hook, stage, .. } => Some((hook.clone(), stage.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(reported, [("grumbler".to_owned(), "on_finish".to_owned())]);
}

/// Replaces every call's outcome with a plain "replaced".
struct Replacer;

impl Hook for Replacer {
    fn name(&self) -> &str {
        "replacer"
    }
    fn after_tool_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _call: ToolCallView<'a>,
        _r: &'a CallOutcome,
    ) -> BoxFuture<'a, HookResult<Option<CallOutcome>>> {
        Box::pin(async { Ok(Some(CallOutcome::ok(ToolOutput::text("replaced")))) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_replaced_outcome_keeps_the_calls_timing_and_retries() {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let flaky = agentloop::Tool::builder("flaky")
        .description("Fails once, slowly.")
        .retries(2)
        .dynamic(json!({"type": "object"}), move |_a: Value, _c| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(40)).await;
                if n == 0 {
                    Err(agentloop::ToolError::new("busy", "first attempt failed"))
                } else {
                    Ok(ToolOutput::text("fine"))
                }
            }
        });
    let model = ScriptedModel::new([calls(&[("a", "flaky", "{}")]), ModelResponse::text("done")]);
    let out = Agent::builder()
        .model(model)
        .tool(flaky)
        .hook(Replacer)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let outcome = &out.tool_calls[0].outcome;
    assert_eq!(
        outcome.output().cloned(),
        Some(agentloop::message::ToolContent::Text("replaced".into()))
    );
    assert_eq!(outcome.retries, 1);
    assert!(
        outcome.duration >= Duration::from_millis(80),
        "{:?}",
        outcome.duration
    );
}

/// A gate that rewrites the calls tagged `rewrite` (to the tag `rewritten`) and allows the rest.
struct RewritingGate;

impl Gate for RewritingGate {
    fn check<'a>(
        &'a self,
        _cx: GateContext<'a>,
        calls: &'a [agentloop::machine::AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>> {
        let verdicts = calls
            .iter()
            .map(
                |c| match c.arguments.to_value().get("tag").and_then(Value::as_str) {
                    Some("rewrite") => Verdict::Rewrite(json!({"tag": "rewritten"})),
                    _ => Verdict::Allow,
                },
            )
            .collect();
        Box::pin(async move { Ok(verdicts) })
    }
}

#[tokio::test]
async fn a_handler_knows_whether_a_person_approved_its_very_call() {
    // `free` runs on the rules alone; `asked` is asked about and approved; a call approved and
    // then rewritten by a later gate is no longer the call the person saw.
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let probe = |name: &str| {
        let seen = seen.clone();
        agentloop::Tool::dynamic(
            name,
            "Records whether its call was approved.",
            json!({"type": "object", "properties": {"tag": {"type": "string"}}}),
            move |args: Value, ctx: agentloop::ToolContext| {
                let seen = seen.clone();
                async move {
                    let tag = args
                        .get("tag")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().unwrap().push((tag, ctx.approved()));
                    Ok(ToolOutput::text("ok"))
                }
            },
        )
    };
    let mut store = PermissionStore::new(Permission::Allow);
    store.set("asked", Permission::Ask);
    let model = ScriptedModel::new([
        calls(&[
            ("a", "free", r#"{"tag": "free"}"#),
            ("b", "asked", r#"{"tag": "approved"}"#),
            ("c", "asked", r#"{"tag": "rewrite"}"#),
        ]),
        ModelResponse::text("done"),
    ]);
    let out = Agent::builder()
        .model(model)
        .tool(probe("free"))
        .tool(probe("asked"))
        .gate(Arc::new(
            PermissionGate::new(store).with_prompter(Arc::new(FixedAnswer(Answer::AllowOnce))),
        ))
        .gate(Arc::new(RewritingGate))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("approved".to_owned(), true),
            ("free".to_owned(), false),
            ("rewritten".to_owned(), false),
        ]
    );
    assert!(!agentloop::ToolContext::detached("c", "t").approved());
}

/// A person who never answers: the prompt waits until it is given up. Counts the prompts.
#[derive(Default)]
struct Silent(std::sync::atomic::AtomicUsize);

impl ApprovalPrompter for Silent {
    fn ask<'a>(
        &'a self,
        _requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(futures::future::pending())
    }
}

/// A gate whose `asked` tool needs asking, its prompter silent, and the rules it saves.
fn silently_asking_gate() -> (PermissionGate, Arc<Silent>, Arc<MemorySaver>) {
    let saver = Arc::new(MemorySaver::default());
    let mut store = reopen(&saver, Permission::Allow);
    store.configure(PermissionRule {
        tool: "asked".into(),
        arguments: None,
        permission: Permission::Ask,
    });
    let silent = Arc::new(Silent::default());
    let gate = PermissionGate::new(store).with_prompter(silent.clone());
    (gate, silent, saver)
}

fn cancel_in(token: &agentloop::CancellationToken, ms: u64) {
    let token = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        token.cancel();
    });
}

#[tokio::test]
async fn a_prompt_nobody_answers_ends_with_the_gates_cancellation_and_denies_the_asked_calls() {
    let (gate, silent, saver) = silently_asking_gate();
    let batch = [
        agentloop::machine::AdmittedCall::new(0, "a", "free", json!({})),
        agentloop::machine::AdmittedCall::new(1, "b", "asked", json!({})),
    ];
    let approvals = agentloop::gate::Approvals::none();
    let cancel = agentloop::CancellationToken::new();
    let cx = GateContext {
        run_id: "run",
        agent: "agent",
        turn: 1,
        cancel: &cancel,
        approvals: &approvals,
    };
    cancel_in(&cancel, 50);
    let verdicts = tokio::time::timeout(Duration::from_secs(10), gate.check(cx, &batch))
        .await
        .expect("the prompt outlived the run's cancellation")
        .unwrap();
    assert_eq!(
        verdicts,
        [
            Verdict::Allow,
            Verdict::Deny(agentloop::permissions::CANCELLED_REASON.to_owned())
        ]
    );
    assert_eq!(silent.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(saver.0.lock().unwrap().is_empty(), "nothing remembered");

    // Once the run is cancelled, nobody is asked at all.
    let verdicts = gate.check(cx, &batch).await.unwrap();
    assert_eq!(
        verdicts[1],
        Verdict::Deny(agentloop::permissions::CANCELLED_REASON.to_owned())
    );
    assert_eq!(silent.0.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_run_cancelled_at_an_approval_prompt_ends_cancelled_promptly_and_runs_nothing() {
    let log = CallLog::default();
    let (gate, silent, saver) = silently_asking_gate();
    let model = ScriptedModel::new([
        calls(&[("a", "free", "{}"), ("b", "asked", "{}")]),
        ModelResponse::text("never"),
    ]);
    let agent = Agent::builder()
        .model(model)
        .tool(sleeper("free", &log))
        .tool(sleeper("asked", &log))
        .gate(Arc::new(gate))
        .build()
        .unwrap();
    let cancel = agentloop::CancellationToken::new();
    cancel_in(&cancel, 50);
    let options = RunOptions {
        cancel: Some(cancel),
        ..Default::default()
    };
    let run = agent.run_with(Vec::new(), Some(Message::user("go")), options);
    let out = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the run outlived its cancellation at the prompt");
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(out.error.unwrap().code(), "run.cancelled");
    assert_eq!(silent.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(log.len(), 0, "no call of the batch ran");
    for call in &out.tool_calls {
        assert_eq!(call.outcome.status, CallStatus::Cancelled, "{call:?}");
        assert_eq!(call.outcome.code.as_deref(), Some("not_run"), "{call:?}");
    }
    assert!(saver.0.lock().unwrap().is_empty(), "nothing remembered");
}
