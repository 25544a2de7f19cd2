//! The driver's seams: hooks, guardrails, admission gates and pricing, each run with its panics
//! isolated. What they answer goes back to the machine as an input; a panic is reported like a
//! failure of the hook (or gate, or guardrail), never unwinding through the run.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Driver;
use super::Parts;
use super::chain::{HookChain, replaced};
use crate::config::AgentConfig;
use crate::gate::GateContext;
use crate::guardrail::Guardrail;
use crate::hooks::{
    Hook, HookContext, HookResult, HookRole, RequestChanges, ToolCallDecision, ToolCallView,
};
use crate::machine::{AdmittedCall, HookFailure, HookStage, Input, RunMachine, Trip, Verdict};
use crate::model::ModelResponse;
use crate::outcome::{CallOutcome, RunOutcome};
use crate::panic::panic_message;

/// Awaits a seam's future, made by `make`; a panic while making or polling it is an error.
async fn guarded<T, F: Future<Output = T>>(make: impl FnOnce() -> F) -> Result<T, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(make)) {
        Ok(fut) => AssertUnwindSafe(fut)
            .catch_unwind()
            .await
            .map_err(|p| format!("panicked: {}", panic_message(&p))),
        Err(p) => Err(format!("panicked: {}", panic_message(&p))),
    }
}

/// A hook's answer, made by `make`, or why it has none: its error, or its panic.
async fn ask<T, F: Future<Output = HookResult<T>>>(make: impl FnOnce() -> F) -> Result<T, String> {
    guarded(make).await.and_then(|r| r.map_err(|e| e.0))
}

fn hook_context(m: &RunMachine) -> HookContext<'_> {
    HookContext {
        run_id: m.run_id(),
        agent: m.config().name(),
        turn: m.turn(),
    }
}

impl Driver<'_> {
    pub(super) async fn check_guardrails(
        &self,
        guardrails: &[Arc<dyn Guardrail>],
        text: &str,
    ) -> Input {
        for g in guardrails {
            // A guardrail that panics fails closed: it trips.
            let verdict = guarded(|| g.check(text)).await.and_then(|r| r);
            if let Err(message) = verdict {
                return Input::Checked {
                    tripped: Some(Trip {
                        name: g.name().to_owned(),
                        message,
                    }),
                };
            }
        }
        Input::Checked { tripped: None }
    }

    pub(super) async fn before_model_call(&self, m: &RunMachine) -> Input {
        let mut changes = RequestChanges::default();
        let mut chain = HookChain::new(&self.inner.hooks, HookStage::BeforeModelCall);
        for (hook, role) in chain.hooks() {
            if let Err(message) =
                ask(|| hook.before_model_call(hook_context(m), &mut changes)).await
                && chain.failed(hook.as_ref(), *role, message)
            {
                break;
            }
        }
        Input::Prepared {
            changes,
            failures: chain.into_failures(),
        }
    }

    pub(super) async fn after_model_call(
        &self,
        m: &RunMachine,
        response: &ModelResponse,
        answer: bool,
    ) -> Input {
        let mut chain = HookChain::new(&self.inner.hooks, HookStage::AfterModelCall);
        for (hook, role) in chain.hooks() {
            if let Err(message) = ask(|| hook.after_model_call(hook_context(m), response)).await
                && chain.failed(hook.as_ref(), *role, message)
            {
                break;
            }
        }
        // A final answer is put to the hooks' review; the first rejection sends the model back.
        let mut reask = None;
        let mut chain = chain.then(HookStage::ReviewAnswer);
        if answer && !chain.stopped() {
            for (hook, role) in chain.hooks() {
                match ask(|| hook.review_answer(hook_context(m), response)).await {
                    Ok(None) => {}
                    Ok(Some(again)) => {
                        reask = Some(again);
                        break;
                    }
                    Err(message) => {
                        if chain.failed(hook.as_ref(), *role, message) {
                            break;
                        }
                    }
                }
            }
        }
        Input::Reviewed {
            failures: chain.into_failures(),
            reask,
        }
    }

    /// Asks the stop conditions whether the run ends after this turn.
    pub(super) async fn check_stop(&self, m: &RunMachine) -> Input {
        let mut chain = HookChain::new(&self.inner.hooks, HookStage::ShouldStop);
        let mut stop = None;
        for (hook, role) in chain.hooks() {
            match ask(|| hook.should_stop(hook_context(m), m.state())).await {
                Ok(false) => {}
                Ok(true) => {
                    stop = Some(hook.name().to_owned());
                    break;
                }
                Err(message) => {
                    if chain.failed(hook.as_ref(), *role, message) {
                        break;
                    }
                }
            }
        }
        Input::StopChecked {
            stop,
            failures: chain.into_failures(),
        }
    }

    /// Asks admission gate `gate`: the hooks' `before_tool_call` first, when the agent has hooks.
    pub(super) async fn admit(
        &self,
        m: &RunMachine,
        gate: usize,
        calls: &[AdmittedCall],
        cancel: &CancellationToken,
    ) -> Input {
        let hooks = usize::from(!self.inner.hooks.is_empty());
        if gate < hooks {
            return self.before_tool_calls(m, calls).await;
        }
        let Some(g) = self.inner.gates.get(gate - hooks) else {
            return Input::Admitted {
                verdicts: Vec::new(),
                failures: vec![HookFailure {
                    hook: "gate".into(),
                    role: HookRole::Required,
                    stage: HookStage::Gate,
                    message: format!("the machine asked for gate {gate}, which does not exist"),
                }],
            };
        };
        let cx = GateContext {
            run_id: m.run_id(),
            agent: self.agent_path.as_deref().unwrap_or(m.config().name()),
            turn: m.turn(),
            cancel,
            approvals: &self.approvals,
        };
        let message = match guarded(|| g.check(cx, calls)).await {
            Ok(Ok(verdicts)) => {
                return Input::Admitted {
                    verdicts,
                    failures: Vec::new(),
                };
            }
            Ok(Err(e)) => e.to_string(),
            Err(panic) => format!("the gate {} {panic}", g.name()),
        };
        Input::Admitted {
            verdicts: Vec::new(),
            failures: vec![HookFailure {
                hook: g.name().to_owned(),
                role: HookRole::Required,
                stage: HookStage::Gate,
                message,
            }],
        }
    }

    async fn before_tool_calls(&self, m: &RunMachine, calls: &[AdmittedCall]) -> Input {
        let mut verdicts = Vec::with_capacity(calls.len());
        let mut chain = HookChain::new(&self.inner.hooks, HookStage::BeforeToolCall);
        for call in calls {
            let mut rewritten: Option<Value> = None;
            let mut verdict = Verdict::Allow;
            for (hook, role) in chain.hooks() {
                let view = ToolCallView {
                    call_id: &call.call_id,
                    tool: &call.tool,
                    arguments: rewritten.as_ref().unwrap_or(&call.arguments),
                };
                match ask(|| hook.before_tool_call(hook_context(m), view)).await {
                    Ok(ToolCallDecision::Continue) => {}
                    Ok(ToolCallDecision::Veto(reason)) => {
                        verdict = Verdict::Deny(reason);
                        break;
                    }
                    Ok(ToolCallDecision::Rewrite(args)) => rewritten = Some(args),
                    Err(message) => {
                        if chain.failed(hook.as_ref(), *role, message) {
                            return Input::Admitted {
                                verdicts,
                                failures: chain.into_failures(),
                            };
                        }
                    }
                }
            }
            if let (Verdict::Allow, Some(args)) = (&verdict, rewritten) {
                verdict = Verdict::Rewrite(args);
            }
            verdicts.push(verdict);
        }
        Input::Admitted {
            verdicts,
            failures: chain.into_failures(),
        }
    }

    /// The price of tokens a model spent: by the name it gave, else by the configured one (a
    /// gateway answers `openai/gpt-4o` for `gpt-4o`, a server its own alias). A pricing function
    /// that panics is reported and prices nothing.
    pub(super) fn price(
        &self,
        model: Option<&str>,
        usage: &crate::model::Usage,
    ) -> (Option<f64>, Vec<HookFailure>) {
        let Some(pricing) = &self.inner.pricing else {
            return (None, Vec::new());
        };
        let configured = &self.inner.model;
        let priced = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let by = |name: &str| pricing.cost(configured.provider(), name, usage);
            model.and_then(by).or_else(|| by(configured.id()))
        }));
        match priced {
            Ok(cost) => (cost, Vec::new()),
            Err(p) => (
                None,
                vec![HookFailure {
                    hook: "pricing".into(),
                    role: HookRole::Observer,
                    stage: HookStage::Price,
                    message: format!("panicked: {}", panic_message(&p)),
                }],
            ),
        }
    }

    /// [`Self::price`] where a panic has no place to be reported (an abandoned attempt, a
    /// failed call): the tokens count unpriced. No tokens cost nothing, priced or not.
    pub(super) fn price_quietly(
        &self,
        model: Option<&str>,
        usage: &crate::model::Usage,
    ) -> Option<f64> {
        if usage.is_zero() {
            return Some(0.0);
        }
        self.price(model, usage).0
    }

    /// The hooks' `on_error` and `on_finish`, on the run's outcome.
    pub(super) async fn finish_hooks(&self, outcome: &RunOutcome) -> Vec<HookFailure> {
        let ctx = HookContext {
            run_id: &outcome.run_id,
            agent: &self.inner.cfg.name,
            turn: outcome.turns,
        };
        let mut chain = HookChain::new(&self.inner.hooks, HookStage::OnError);
        if let Some(error) = &outcome.error {
            for (hook, role) in chain.hooks() {
                if let Err(message) = ask(|| hook.on_error(ctx, error)).await {
                    chain.failed(hook.as_ref(), *role, message);
                }
            }
        }
        let mut chain = chain.then(HookStage::OnFinish);
        for (hook, role) in chain.hooks() {
            if let Err(message) = ask(|| hook.on_finish(ctx, outcome)).await {
                chain.failed(hook.as_ref(), *role, message);
            }
        }
        chain.into_failures()
    }
}

/// A call's after-tool hooks, ready to run on its outcome inside the call's own future, so that
/// a slow hook holds up no other call.
pub(super) struct AfterTool {
    hooks: Vec<(Arc<dyn Hook>, HookRole)>,
    cfg: Arc<AgentConfig>,
    run_id: Arc<str>,
    turn: u32,
    call_id: Arc<str>,
    tool: Arc<str>,
    arguments: crate::tool::Arguments,
}

impl AfterTool {
    pub(super) fn new(inner: &Parts, m: &RunMachine, call: &AdmittedCall) -> Self {
        AfterTool {
            hooks: inner.hooks.clone(),
            cfg: Arc::clone(m.config()),
            run_id: Arc::clone(m.run_id()),
            turn: m.turn(),
            call_id: Arc::clone(&call.call_id),
            tool: Arc::clone(&call.tool),
            arguments: call.arguments.clone(),
        }
    }

    /// Runs the hooks on the call's outcome; a replacement outcome takes its place.
    pub(super) async fn run(self, mut outcome: CallOutcome) -> (CallOutcome, Vec<HookFailure>) {
        if self.hooks.is_empty() {
            return (outcome, Vec::new());
        }
        let ctx = HookContext {
            run_id: &self.run_id,
            agent: self.cfg.name(),
            turn: self.turn,
        };
        let mut chain = HookChain::new(&self.hooks, HookStage::AfterToolCall);
        for (hook, role) in chain.hooks() {
            let view = ToolCallView {
                call_id: &self.call_id,
                tool: &self.tool,
                arguments: &self.arguments,
            };
            match ask(|| hook.after_tool_call(ctx, view, &outcome)).await {
                Ok(Some(replacement)) => outcome = replaced(&outcome, replacement),
                Ok(None) => {}
                Err(message) => {
                    if chain.failed(hook.as_ref(), *role, message) {
                        break;
                    }
                }
            }
        }
        (outcome, chain.into_failures())
    }
}

/// Two prices of one call's parts: their sum, unknown when either is (an attempt the pricing
/// has no price for makes its call's cost unknown, as an unpriced answer's is: reported, and a
/// stop under a cost budget, never a silent part of a known cost).
pub(super) fn add_cost(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? + b?)
}
