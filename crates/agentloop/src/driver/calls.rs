//! A batch's tool calls: each call's context and handler (the agent's own tools, or a tool
//! source's, listed again when it changed), started inside the run's task, awaited, drained at
//! a suspension, and their outcomes handed back as inputs. Apart from the loop, which only asks
//! for a call to start or the next to end.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use futures::future::Either;
use futures::{Future, FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::event::EventKind;
use crate::machine::{Action, AdmittedCall, Input, Interrupt, RunMachine};
use crate::model::Model;
use crate::outcome::CallOutcome;
use crate::tool::{Layered, ProgressSender, Tool, ToolContext};

use super::interrupts::sleep_until_or_never;
use super::running::Running;
use super::seams;
use super::{Driver, Parts, Tree};

/// A running call: its position, its outcome (none when the driver has no handler for it: the
/// machine answers it), and its after-tool hooks' failures.
type CallDone = (usize, Option<CallOutcome>, Vec<crate::machine::HookFailure>);

/// What the run holds of its tool calls beside their futures: the tokens that stop them and
/// the progress senders to close as each ends. Made once a run, and shared by starting,
/// awaiting and draining its calls.
pub(super) struct CallControls {
    /// The tools' cancellation, and the end of their retries: a child of the run's token.
    cancel: CancellationToken,
    /// Not a child of `cancel`: the drain, which every interruption of the run reaches (its
    /// token cancelled, a deadline), cancels both; and a token of its own is one allocation a
    /// run where a child is two (its node and its place in its parent's list).
    pub(super) stop_retries: CancellationToken,
    /// The subagent calls' own, made at the first one (a child of `cancel`): a suspension
    /// stops them (their children are left to resume) and not the other calls.
    children: Option<CancellationToken>,
    /// The running calls' progress senders, by position.
    pub(super) progress: Vec<(usize, ProgressSender)>,
}

impl CallControls {
    /// The controls of a run whose token is `run`: its calls' cancellation is a child of it.
    pub(super) fn new(run: &CancellationToken) -> Self {
        CallControls {
            cancel: run.child_token(),
            stop_retries: CancellationToken::new(),
            children: None,
            progress: Vec::new(),
        }
    }
}

/// A call's outcome as it ended: timed, with the subagent run it left in its batch's scope.
fn ended(
    outcome: CallOutcome,
    started: Instant,
    scope: Option<(Arc<crate::budget::Scope>, Arc<str>)>,
) -> CallOutcome {
    let mut outcome = outcome.took(started.elapsed());
    if let Some((scope, call_id)) = scope {
        outcome.subagent = scope.take_run(&call_id).map(Box::new);
    }
    outcome
}

impl<'a> Driver<'a> {
    /// What a starting call's handler knows: its ids, the calls' tokens (the subagent calls'
    /// cancellation made at the first subagent call), its progress channel (kept in `calls` to
    /// close when it ends) and, for a subagent, the batch's scope.
    fn call_context(
        &mut self,
        m: &RunMachine,
        call: &AdmittedCall,
        deadline: Option<Instant>,
        calls: &mut CallControls,
    ) -> ToolContext {
        let progress = self.progress(m, call);
        if let Some(p) = &progress {
            calls.progress.push((call.position, p.clone()));
        }
        let scope = self.subagent_scope(m, call, deadline);
        let subagent = m.tools().spec(call.index).is_some_and(|s| s.subagent);
        ToolContext {
            call_id: Arc::clone(&call.call_id),
            tool: Arc::clone(&call.tool),
            run_id: Arc::clone(m.run_id()),
            turn: m.turn(),
            cancel: if subagent {
                calls
                    .children
                    .get_or_insert_with(|| calls.cancel.child_token())
                    .clone()
            } else {
                calls.cancel.clone()
            },
            progress: progress.unwrap_or_default(),
            stop_retries: calls.stop_retries.clone(),
            scope,
            approved: call.approved,
        }
    }

    /// A call as [`Action::StartCall`] asks for it, with its context: a future not yet polled
    /// (the running set polls it), so nothing of the call has run.
    pub(super) fn start_call(
        &mut self,
        m: &RunMachine,
        call: &AdmittedCall,
        deadline: Option<Instant>,
        calls: &mut CallControls,
    ) -> impl Future<Output = CallDone> + Send + use<'a> {
        let ctx = self.call_context(m, call, deadline, calls);
        self.run_call(m, call, ctx)
    }

    /// A journaled run's answer to [`Action::StartCall`]: the calls that start together have
    /// their starts committed together, and a call that starts alone (a restarted one, or one
    /// past the concurrency cap) has its start committed first as well. None runs before that
    /// commit (a call's future is first polled while the batch is awaited), and a call whose
    /// start was not kept never runs: one whose start the journal lost would answer
    /// `cancelled` to a drain for a call the machine never saw start. The machine is fed here,
    /// so the loop only asks it again.
    ///
    /// `start` is [`Driver::start_call`], passed in because the type of the futures it makes,
    /// which `running` holds, has no name to write here.
    pub(super) async fn start_journaled<F, S>(
        &mut self,
        m: &mut RunMachine,
        deadline: Option<Instant>,
        calls: &mut CallControls,
        running: &mut Running<F>,
        start: S,
    ) where
        F: Future<Output = CallDone>,
        S: Fn(&mut Self, &RunMachine, &AdmittedCall, Option<Instant>, &mut CallControls) -> F,
    {
        if m.starts_ahead().len() > 1 || self.held.is_some() {
            let mut futures = Vec::new();
            let mut starts = Vec::new();
            for call in m.starts_ahead() {
                futures.push(start(self, m, call, deadline, calls));
                starts.push(Input::CallStarted {
                    position: call.position,
                });
            }
            let kept = self.record_batch(m, starts).await;
            running.extend(futures.into_iter().take(kept));
            return;
        }
        // Alone: the call the machine asks for (the loop comes here only then), asked again, as
        // the loop's borrow of it cannot come beside the machine the journal's write feeds.
        let Action::StartCall(call) = m.action() else {
            return;
        };
        let position = call.position;
        let started = start(self, m, call, deadline, calls);
        let start = Input::CallStarted { position };
        if self.record_batch(m, vec![start]).await == 1 {
            running.push(started);
        }
    }

    /// The answer to [`Action::Drain`]. A suspension's drain tells only the subagent calls to
    /// stop and waits for the others until the deadline or a cancel (after which the machine
    /// drains them as in any drain); any other drain tells every running handler, and gives
    /// it the grace period (`until`) to finish.
    ///
    /// Not an `async fn`: its future would keep its arguments beside the drain's, which made
    /// every running run's future 64 bytes larger (the drain is its largest wait).
    pub(super) fn drain_calls<'s, F: Future<Output = CallDone>>(
        &'s self,
        m: &RunMachine,
        until: std::time::Duration,
        deadline: Option<Instant>,
        calls: &'s mut CallControls,
        running: &'s mut Running<F>,
    ) -> impl Future<Output = Input> + 's {
        if m.suspending() {
            if let Some(children) = &calls.children {
                children.cancel();
            }
            let drained = self.drain(until, running, &mut calls.progress);
            Either::Left(self.until_stopped(deadline, drained))
        } else {
            calls.cancel.cancel();
            calls.stop_retries.cancel();
            Either::Right(self.drain(until, running, &mut calls.progress))
        }
    }

    pub(super) fn emit_started(
        &self,
        m: &RunMachine,
        parent_run_id: Option<String>,
        parent_call_id: Option<String>,
    ) {
        self.emit(
            m,
            EventKind::RunStarted {
                agent: m.config().name().to_owned(),
                model: self.inner.model.id().to_owned(),
                parent_run_id,
                parent_call_id,
                input: m.input_text().to_owned(),
            },
        );
    }

    /// The batch drains: a call that finishes within the grace period (`until`, on the run's
    /// clock) is reported; when it is over, the calls still running are dropped.
    pub(super) async fn drain<F: Future<Output = CallDone>>(
        &self,
        until: std::time::Duration,
        running: &mut Running<F>,
        senders: &mut Vec<(usize, ProgressSender)>,
    ) -> Input {
        let sleep = sleep_until_or_never(self.start.checked_add(until));
        tokio::select! {
            biased;
            done = running.next() => finished(done, senders),
            _ = sleep => {
                // Dropping the calls still running cancels them; a handler whose drop panics
                // must not take the run down with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| running.clear()));
                for (_, s) in senders.drain(..) {
                    s.close();
                }
                Input::GraceOver
            }
        }
    }

    /// A suspension's drain, `drained`, unless the deadline passes or the run is cancelled
    /// first, which is answered instead. Not [`Driver::race`]: the run's interrupt token is
    /// already cancelled by the suspension, which this wait must not answer again.
    pub(super) async fn until_stopped(
        &self,
        deadline: Option<Instant>,
        drained: impl Future<Output = Input>,
    ) -> Input {
        if let Some(by) = self.interrupted_now(deadline) {
            return Input::Interrupted { by };
        }
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Input::Interrupted { by: Interrupt::Cancelled },
            () = sleep_until_or_never(deadline) => Input::Interrupted { by: Interrupt::Deadline },
            input = drained => input,
        }
    }

    /// Asks the tool source to list its tools again where they changed.
    pub(super) async fn refresh_source(&self) -> bool {
        match &self.inner.source {
            Some(source) => source.refresh().await,
            None => false,
        }
    }

    /// The answer to [`Action::ListTools`]: the source's specs at this driver's first turn, so
    /// that the step log (a journal) holds the tools the run had whatever the agent was built
    /// with, and later when the source says they changed. Their handlers are kept by name, for
    /// the calls that follow.
    pub(super) fn list_tools(&mut self, m: &RunMachine, changed: bool) -> Input {
        self.source_output(m);
        let Some(source) = &self.inner.source else {
            return Input::ToolsListed { tools: None };
        };
        if !changed && self.tools_synced {
            return Input::ToolsListed { tools: None };
        }
        self.tools_synced = true;
        let tools = source.tools_for(m.transcript());
        let specs: Vec<crate::tool::ToolSpec> = tools.iter().map(|t| t.spec().clone()).collect();
        self.source_tools = Some(Box::new(handlers(tools)));
        Input::ToolsListed { tools: Some(specs) }
    }

    /// What the tool source wrote for the operator, as events.
    pub(super) fn source_output(&self, m: &RunMachine) {
        let Some(source) = &self.inner.source else {
            return;
        };
        for (origin, lines) in source.take_output() {
            if !lines.is_empty() && !self.sinks.is_empty() {
                self.emit(m, EventKind::ToolSourceOutput { origin, lines });
            }
        }
    }

    /// The handler of an admitted call: the agent's own tool at its index while the run's tools
    /// are the agent's, else the source's tool of that name as last listed.
    ///
    /// The agent's own is borrowed for the call: every run's calls of a tool would otherwise
    /// count on its one handler's `Arc`, a cache line the cores of a multi-threaded runtime take
    /// from each other at every call (`agentloop-bench scale`).
    fn handler(&self, m: &RunMachine, call: &AdmittedCall) -> Option<Cow<'a, Layered>> {
        let cfg = m.config();
        if call.index < cfg.own_tools || Arc::ptr_eq(m.tools(), cfg.tools.catalog()) {
            let parts: &'a Parts = self.inner;
            if Arc::ptr_eq(cfg, &parts.cfg) {
                return parts
                    .cfg
                    .tools
                    .entry(call.index)
                    .map(|e| Cow::Borrowed(&e.call));
            }
            return cfg
                .tools
                .entry(call.index)
                .map(|e| Cow::Owned(e.call.clone()));
        }
        self.source_tools
            .as_ref()?
            .get(&*call.tool)
            .map(|h| Cow::Owned(h.clone()))
    }

    /// The scope of a subagent's call: the batch's share of the run's remaining budget (one per
    /// batch, so that its subagents draw from it together), its depth and deadline. `None` for
    /// any other tool.
    fn subagent_scope(
        &mut self,
        m: &RunMachine,
        call: &AdmittedCall,
        deadline: Option<Instant>,
    ) -> Option<Arc<crate::budget::Scope>> {
        if !self.inner.has_subagents || !m.tools().spec(call.index).is_some_and(|s| s.subagent) {
            return None;
        }
        if let Some((turn, scope)) = &self.scope
            && *turn == m.turn()
        {
            return Some(Arc::clone(scope));
        }
        let place = crate::budget::Place {
            path: self
                .agent_path
                .clone()
                .unwrap_or_else(|| m.config().name().to_owned()),
            sinks: self.sinks.clone(),
            depth: self.depth,
            max_depth: m.limits().max_depth,
            deadline,
            grace: m.limits().grace_period,
            tree: Arc::new(Tree {
                // Children are journaled with the run while it journals, in a journal that
                // reads them back.
                journal: self
                    .journal
                    .clone()
                    .filter(|j| self.journaling && j.holds_children()),
                approvals: Arc::clone(&self.approvals),
            }),
            // A hand-off is alone in its batch (the machine's rule): its scope is its own.
            history: m
                .tools()
                .spec(call.index)
                .is_some_and(|s| s.handoff)
                .then(|| m.handoff_history()),
        };
        let scope = crate::budget::scope(place, m.subagent_pool());
        self.scope = Some((m.turn(), Arc::clone(&scope)));
        Some(scope)
    }

    /// A progress sender for a call, when anyone listens.
    fn progress(&self, m: &RunMachine, call: &AdmittedCall) -> Option<ProgressSender> {
        if self.sinks.is_empty() {
            return None;
        }
        Some(ProgressSender::new(
            Arc::new(self.sinks.clone()),
            Arc::clone(m.run_id()),
            m.turn(),
            Arc::clone(&call.call_id),
            Arc::clone(&call.tool),
        ))
    }

    /// One call: the tool under its layers, then the after-tool hooks, timed.
    fn run_call(
        &self,
        m: &RunMachine,
        call: &AdmittedCall,
        ctx: ToolContext,
    ) -> impl Future<Output = CallDone> + Send + use<'a> {
        let service = self.handler(m, call);
        let arguments = call.arguments.clone();
        let position = call.position;
        // Boxed: after-tool hooks are rare, and what they need (96 bytes) held inline would be
        // in every running call's future.
        let hooks = (!self.inner.hooks.is_empty())
            .then(|| Box::new(seams::AfterTool::new(self.inner, m, call)));
        // A subagent's call leaves its run in the batch's scope; it rides on the call's outcome.
        let scope = ctx
            .scope
            .as_ref()
            .map(|s| (Arc::clone(s), Arc::clone(&ctx.call_id)));
        async move {
            // The future is first polled after `CallStarted` is written: a cancel or a deadline
            // that fired meanwhile (during that write, or with the drain) must not start the
            // handler for the first time. Its effect would happen after the run said it stopped.
            if ctx.cancel.is_cancelled() {
                return (position, Some(CallOutcome::cancelled()), Vec::new());
            }
            let Some(service) = &service else {
                return (position, None, Vec::new());
            };
            let started = Instant::now();
            // A failure to start (a handler that panicked before it gave its future) is boxed:
            // matched in place, it took its 144 bytes beside the running handler in every
            // running call's future.
            let running = service.start(&arguments, ctx).map_err(Box::new);
            let outcome = match running {
                Ok(running) => running.await,
                Err(failed) => *failed,
            };
            let outcome = ended(outcome, started, scope);
            // Boxed: after-tool hooks are rare, and their future (800 bytes) held inline would
            // more than double every running call's (`agentloop-bench scale`: a run holds its
            // calls' futures while they run). The outcome goes into it whole: one the block kept
            // across that wait would be in every running call's future too.
            let Some(hooks) = hooks else {
                return (position, Some(outcome), Vec::new());
            };
            let (outcome, failures) = Box::pin((*hooks).run(outcome)).await;
            (position, Some(outcome), failures)
        }
    }
}

/// The calls that have finished by now, without waiting.
pub(super) fn finished_now<F: Future<Output = CallDone>>(
    running: &mut Running<F>,
    senders: &mut Vec<(usize, ProgressSender)>,
) -> Vec<Input> {
    let mut ready = Vec::new();
    while let Some(Some(done)) = running.next().now_or_never() {
        ready.push(finished(Some(done), senders));
    }
    ready
}

/// Tools by name under their layers: of two of one name, the first listed, as the machine's
/// catalog keeps the first listed spec of a name ([`RunMachine::tools`]). A later one kept here
/// would run under the first's spec: the one the model, the gates and the read-only flags saw.
pub(super) fn handlers(tools: Vec<Tool>) -> HashMap<String, Layered> {
    let mut out = HashMap::with_capacity(tools.len());
    for t in tools {
        out.entry(t.name().to_owned())
            .or_insert_with(|| t.layered());
    }
    out
}

/// A call that finished, or the end of a set that ran dry (the machine folds what it has).
pub(super) fn finished(
    done: Option<CallDone>,
    senders: &mut Vec<(usize, ProgressSender)>,
) -> Input {
    match done {
        Some((position, outcome, failures)) => {
            // The call's progress ends with it.
            if let Some(i) = senders.iter().position(|(p, _)| *p == position) {
                senders.swap_remove(i).1.close();
            }
            match outcome {
                Some(outcome) => Input::CallFinished {
                    position,
                    outcome,
                    failures,
                },
                None => Input::CallUnhandled { position },
            }
        }
        None => Input::GraceOver,
    }
}
