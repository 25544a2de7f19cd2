//! The local tokio driver: the I/O around a [`RunMachine`], and no rule of its own.
//!
//! It asks the machine for the next [`Action`], performs it (calls the model, streaming deltas out
//! as events; runs hooks, guardrails and gates with their panics isolated; starts and awaits tool
//! calls inside the run's own task), races every step against cancellation and the deadline, and
//! hands the result back as an [`Input`]. Whatever it learns, the machine decides what follows.
//!
//! - `mod.rs`: the loop, the model call, interrupts.
//! - `seams.rs`: hooks, guardrails, gates and pricing, each panic-isolated.
//! - `replay.rs`: the replay driver, which feeds a recorded step log to a fresh machine.
//!
//! A durable run's driver writes each step to its journal before feeding it to the machine, or,
//! for a model's response followed by a call's start or the run's end, before anything acts on
//! it (`Driver::record`); resuming starts this same driver on a machine fed from the journal.

mod chain;
pub mod replay;
mod running;
mod seams;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use std::task::Poll;

use futures::{Future, FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::AgentConfig;
use crate::event::{Event, EventKind, EventSink, Sinks};
use crate::gate::{Approvals, Gate};
use crate::guardrail::Guardrail;
use crate::hooks::{Hook, HookRole};
use crate::ids::IdSource;
use crate::journal::{Definition, Journal};
use crate::limits::Pricing;
use crate::machine::{Action, AdmittedCall, Input, Interrupt, RunMachine, Step};
use crate::model::{Model, ModelEvent, ModelRequest, ResponseAccumulator};
use crate::outcome::{CallOutcome, RunOutcome};
use crate::steering::Steering;
use crate::tool::{Layered, ProgressSender, Tool, ToolContext, ToolSource};
use running::Running;

pub use replay::{RunLog, StepLog, replay};

/// What an agent is, as its runs are driven: the agent holds it behind an `Arc`, and each
/// run's driver borrows it.
#[derive(Clone)]
pub(crate) struct Parts {
    pub(crate) cfg: Arc<AgentConfig>,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) sinks: Sinks,
    pub(crate) pricing: Option<Arc<dyn Pricing>>,
    pub(crate) ids: Arc<dyn IdSource>,
    pub(crate) gates: Vec<Arc<dyn Gate>>,
    pub(crate) hooks: Vec<(Arc<dyn Hook>, HookRole)>,
    pub(crate) input_guardrails: Vec<Arc<dyn Guardrail>>,
    pub(crate) output_guardrails: Vec<Arc<dyn Guardrail>>,
    pub(crate) definition: Definition,
    /// True when a tool of the agent is a subagent (the driver looks its calls up only then).
    pub(crate) has_subagents: bool,
    /// Tools that may change between turns (an MCP server's).
    pub(crate) source: Option<Arc<dyn ToolSource>>,
}

/// A running call: its position, its outcome (none when the driver has no handler for it: the
/// machine answers it), and its after-tool hooks' failures.
type CallDone = (usize, Option<CallOutcome>, Vec<crate::machine::HookFailure>);

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

/// Sleeps until `at`; with no `at` (a time past what the clock holds, or no bound), forever.
async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pin_project_lite::pin_project! {
    /// [`Driver::race`]'s future: `step` polled once, then raced against the run's interrupts,
    /// which are checked first (biased), as `tokio::select!` with `biased` does.
    struct Race<'d, 'a, F> {
        driver: &'d Driver<'a>,
        deadline: Option<Instant>,
        polled: bool,
        #[pin]
        step: F,
    }
}

impl<'d, 'a, F: Future> Future for Race<'d, 'a, F> {
    type Output = Result<F::Output, Interrupt>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !*this.polled {
            *this.polled = true;
            if let Some(by) = this.driver.interrupted_already(*this.deadline) {
                return Poll::Ready(Err(by));
            }
            if let Poll::Ready(value) = this.step.as_mut().poll(cx) {
                return Poll::Ready(Ok(value));
            }
        }
        if let Poll::Ready(by) = this.driver.poll_interrupts(*this.deadline, cx) {
            return Poll::Ready(Err(by));
        }
        this.step.poll(cx).map(Ok)
    }
}

pin_project_lite::pin_project! {
    /// What interrupts a run's steps while they wait: its interrupt token (its cancellation, or
    /// a suspension) and its deadline. One for the whole run, made when a step first waits: a
    /// waiter and a timer made for each step that waits were an allocation and a registration
    /// with the token and the timer wheel each time (two a turn of a run that waits for its
    /// model and its tools).
    pub(crate) struct Interrupts {
        // The interrupt token is the run's cancel token, or a child of it that a suspension
        // also fires (a durable run's): one waiter for both, told apart by `cancel`.
        #[pin]
        cancelled: tokio_util::sync::WaitForCancellationFutureOwned,
        cancel: CancellationToken,
        fired: bool,
        // The deadline's timer, when the run has one.
        sleep: Option<(Instant, std::pin::Pin<Box<tokio::time::Sleep>>)>,
    }
}

impl Interrupts {
    fn new(driver: &Driver<'_>, deadline: Option<Instant>) -> Self {
        Interrupts {
            cancelled: driver.interrupt.clone().cancelled_owned(),
            cancel: driver.cancel.clone(),
            fired: false,
            sleep: deadline.map(|d| (d, Box::pin(tokio::time::sleep_until(d)))),
        }
    }

    fn poll_interrupt(
        self: std::pin::Pin<&mut Self>,
        deadline: Option<Instant>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Interrupt> {
        let this = self.project();
        if !*this.fired && this.cancelled.poll(cx).is_ready() {
            *this.fired = true;
        }
        if *this.fired {
            return Poll::Ready(if this.cancel.is_cancelled() {
                Interrupt::Cancelled
            } else {
                Interrupt::Suspended
            });
        }
        let sleep = match (deadline, this.sleep.as_mut()) {
            (None, _) => return Poll::Pending,
            (Some(d), Some((at, sleep))) => {
                if *at != d {
                    // Every step of a run races the same deadline; were one to differ, the timer
                    // is set to it.
                    *at = d;
                    sleep.as_mut().reset(d);
                }
                sleep
            }
            (Some(d), None) => {
                &mut this
                    .sleep
                    .insert((d, Box::pin(tokio::time::sleep_until(d))))
                    .1
            }
        };
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Interrupt::Deadline);
        }
        Poll::Pending
    }
}

pub(crate) struct Driver<'a> {
    pub(crate) inner: &'a Parts,
    pub(crate) sinks: Sinks,
    pub(crate) cancel: CancellationToken,
    pub(crate) steering: Option<Steering>,
    pub(crate) start: Instant,
    /// The run's step log, kept when the caller asked for it (or to check the replay). Boxed:
    /// most runs keep none, and inline it is 280 bytes of every running run's future.
    pub(crate) log: Option<Box<RunLog>>,
    pub(crate) log_out: Option<StepLog>,
    /// A durable run's journal.
    pub(crate) journal: Option<Arc<dyn Journal>>,
    /// True while steps are journaled: a failed write ends it.
    pub(crate) journaling: bool,
    /// True once the run suspends: from then on only the calls that finish while its batch
    /// drains are journaled (a finished call is never lost); the suspension itself and what
    /// follows are not, so that a resume asks again.
    pub(crate) suspended: bool,
    /// The sequence number of the next step to journal.
    pub(crate) seq: u64,
    /// Recorded answers and the way to suspend (a durable run's); shared with the run's
    /// subagent calls, whose children's questions suspend it.
    pub(crate) approvals: Arc<Approvals>,
    /// Fires on cancellation, and on a suspension (see [`Approvals::link`]).
    pub(crate) interrupt: CancellationToken,
    /// The run's interrupts as its waiting steps race them, made when a step first waits. In a
    /// mutex only because a step's race reaches them through a shared borrow of the driver;
    /// only the run's task locks it.
    pub(crate) interrupts: std::sync::Mutex<Option<std::pin::Pin<Box<Interrupts>>>>,
    /// A subagent's parent call, for its start event. Boxed, as the fields below that most
    /// runs leave empty: every running run's future holds the driver (480 bytes with them
    /// inline, 192 boxed).
    pub(crate) parent: Option<Box<crate::journal::ParentCall>>,
    /// A subagent's path from the top of its tree (`coordinator/worker`).
    pub(crate) agent_path: Option<String>,
    /// The run's depth in a tree of subagents (0 at the top).
    pub(crate) depth: u32,
    /// The subagent scope of the current batch, by turn.
    pub(crate) scope: Option<(u32, Arc<crate::budget::Scope>)>,
    /// The handlers of the tool source's tools as last listed, by name: a call of one is looked
    /// up here once the run's tools are no longer the agent's own.
    #[expect(
        clippy::box_collection,
        reason = "inline, the map is 48 bytes of every running run's future; only a run with a tool source fills it"
    )]
    pub(crate) source_tools: Option<Box<HashMap<String, Layered>>>,
    /// True once this driver told the machine the source's tools (the first turn it drives
    /// always does).
    pub(crate) tools_synced: bool,
    /// A model's response the machine was fed and the journal has not committed yet: it goes
    /// to the journal with the start of the first call it asks for (see [`Driver::record`]).
    /// Boxed: only a journaled run holds one, between a response and its first call's start.
    pub(crate) held: Option<Box<Step>>,
}

impl<'a> Driver<'a> {
    fn emit(&self, m: &RunMachine, kind: EventKind) {
        self.sinks.emit(&Event {
            run_id: m.run_id().clone(),
            turn: m.turn(),
            kind,
        });
    }

    fn flush(&self, m: &mut RunMachine) {
        if self.sinks.is_empty() {
            return;
        }
        let run_id = m.run_id().clone();
        for (turn, kind) in m.drain_events() {
            self.sinks.emit(&Event {
                run_id: run_id.clone(),
                turn,
                kind,
            });
        }
    }

    /// The interrupt that has already happened, if any, without waiting.
    fn interrupted_now(&self, deadline: Option<Instant>) -> Option<Interrupt> {
        if self.cancel.is_cancelled() {
            Some(Interrupt::Cancelled)
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Interrupt::Deadline)
        } else {
            None
        }
    }

    /// Polls the run's interrupts (made at the first call), for a step racing them.
    fn poll_interrupts(
        &self,
        deadline: Option<Instant>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Interrupt> {
        let mut interrupts = self
            .interrupts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        interrupts
            .get_or_insert_with(|| Box::pin(Interrupts::new(self, deadline)))
            .as_mut()
            .poll_interrupt(deadline, cx)
    }

    /// The interrupt that has already happened, suspension included, without waiting: what
    /// [`Driver::interrupted`] would answer at once.
    fn interrupted_already(&self, deadline: Option<Instant>) -> Option<Interrupt> {
        // Cancelling the run cancels the interrupt token too (it is the same token or a child).
        if self.interrupt.is_cancelled() {
            Some(if self.cancel.is_cancelled() {
                Interrupt::Cancelled
            } else {
                Interrupt::Suspended
            })
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Interrupt::Deadline)
        } else {
            None
        }
    }

    /// Awaits `step` unless an interrupt comes first; one that already happened wins, so nothing
    /// new starts after a cancel or a passed deadline. Most steps are ready at their first poll:
    /// those are taken without polling the run's [`Interrupts`] (a cancellation waiter and a
    /// timer, made when a step first waits). A future of its own rather
    /// than an `async fn`: that kept `step` three times over (as passed, moved into a local,
    /// pinned), and the model call's race was the largest part of every running run's future.
    fn race<F: Future>(&self, deadline: Option<Instant>, step: F) -> Race<'_, 'a, F> {
        Race {
            driver: self,
            deadline,
            polled: false,
            step,
        }
    }

    /// Performs a step unless an interrupt came first (see [`Driver::race`]). `stop` is told
    /// when the step loses.
    fn raced<'s>(
        &'s self,
        deadline: Option<Instant>,
        stop: Option<&'s CancellationToken>,
        step: impl Future<Output = Input> + 's,
    ) -> impl Future<Output = Input> + 's {
        self.race(deadline, step).map(move |raced| match raced {
            Ok(input) => input,
            Err(by) => {
                if let Some(t) = stop {
                    t.cancel();
                }
                Input::Interrupted { by }
            }
        })
    }

    /// Drives the run to its end. Not an `async fn`: an async fn's future keeps its arguments
    /// twice (as passed, and moved into locals), which was 1.9 KB of every running run's
    /// future (the machine and the driver); an `async move` block uses what it captured in
    /// place.
    ///
    /// `restarted` is a resumed run's first step (`Input::Restarted`, with whether its journal
    /// holds its children's), recorded here rather than by the caller, whose future would then
    /// keep the machine and the driver beside this one.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future"
    )]
    pub(crate) fn drive(
        mut self,
        mut m: RunMachine,
        restarted: Option<bool>,
    ) -> impl Future<Output = RunOutcome> {
        async move {
            if let Some(children) = restarted {
                self.record(&mut m, Input::Restarted { children }).await;
            }
            let observed = !self.sinks.is_empty();
            if observed {
                let (run_id, call_id) = match self.parent.take() {
                    Some(parent) => (Some(parent.run_id), Some(parent.call_id)),
                    None => (None, None),
                };
                self.emit_started(&m, run_id, call_id);
            }
            let deadline = m.deadline().and_then(|d| self.start.checked_add(d));
            if let Some(source) = &self.inner.source {
                // A resumed run may call the source's tools before its first turn here.
                self.source_tools = Some(Box::new(handlers(source.tools_for(m.transcript()))));
            }
            // The tools' cancellation, and the end of their retries: children of the run's token.
            let calls_cancel = self.cancel.child_token();
            // Not a child of the calls' token: the drain, which every interruption of the run
            // reaches (its token cancelled, a deadline), cancels both; and a token of its own
            // is one allocation a run where a child is two (its node and its place in its
            // parent's list).
            let stop_retries = CancellationToken::new();
            // The subagent calls' own, made at the first one (a child of the calls' token): a
            // suspension stops them (their children are left to resume) and not the other calls.
            let mut children_cancel: Option<CancellationToken> = None;
            // The calls run concurrently inside the run's own task: no task per call to spawn,
            // schedule and free on another thread (a tool marked `own_task` gets one).
            let mut running = Running::default();
            let mut senders: Vec<(usize, ProgressSender)> = Vec::new();
            loop {
                if self.held.is_none() {
                    // A held response's events wait for its commit.
                    self.flush(&mut m);
                }
                if self.sinks.full() {
                    // A reader that lags holds the run here. Boxed: only a run whose reader lags
                    // waits, and inline the wait grew every running run's future. An interrupt
                    // ends the wait, and the step after sees it.
                    let _ = Box::pin(self.race(deadline, self.sinks.room())).await;
                }
                let input = match m.action() {
                    Action::Finish => break,
                    Action::StartCall(call) => match self.interrupted_now(deadline) {
                        Some(by) => Input::Interrupted { by },
                        None if self.journaling
                            && (m.starts_ahead().len() > 1 || self.held.is_some()) =>
                        {
                            // The calls that start together have their starts committed together;
                            // none runs before that commit (a call's future is first polled while
                            // the batch is awaited), and a call whose start was not kept never runs.
                            let mut calls = Vec::new();
                            let mut starts = Vec::new();
                            for call in m.starts_ahead() {
                                let tokens = (&calls_cancel, &stop_retries, &mut children_cancel);
                                let ctx =
                                    self.call_context(&m, call, deadline, tokens, &mut senders);
                                calls.push(self.run_call(&m, call, ctx));
                                starts.push(Input::CallStarted {
                                    position: call.position,
                                });
                            }
                            let kept = self.record_batch(&mut m, starts).await;
                            running.extend(calls.into_iter().take(kept));
                            continue;
                        }
                        None if self.journaling => {
                            // A call that starts alone (a restarted one, or one past the
                            // concurrency cap) is started the same way: its start committed
                            // first, and its future kept only if it was (one whose start the
                            // journal lost would answer `cancelled` to a drain for a call the
                            // machine never saw start).
                            let tokens = (&calls_cancel, &stop_retries, &mut children_cancel);
                            let ctx = self.call_context(&m, call, deadline, tokens, &mut senders);
                            let position = call.position;
                            let started = self.run_call(&m, call, ctx);
                            let start = Input::CallStarted { position };
                            if self.record_batch(&mut m, vec![start]).await == 1 {
                                running.push(started);
                            }
                            continue;
                        }
                        None => {
                            let tokens = (&calls_cancel, &stop_retries, &mut children_cancel);
                            let ctx = self.call_context(&m, call, deadline, tokens, &mut senders);
                            running.push(self.run_call(&m, call, ctx));
                            Input::CallStarted {
                                position: call.position,
                            }
                        }
                    },
                    Action::AwaitCalls { retries } => {
                        if !retries {
                            stop_retries.cancel();
                        }
                        let input = match self.race(deadline, running.next()).await {
                            Ok(done) => finished(done, &mut senders),
                            Err(by) => Input::Interrupted { by },
                        };
                        if self.journaling && matches!(input, Input::CallFinished { .. }) {
                            // The calls that finished together are committed together.
                            let mut ready = finished_now(&mut running, &mut senders);
                            if !ready.is_empty() {
                                ready.insert(0, input);
                                self.record_batch(&mut m, ready).await;
                                continue;
                            }
                        }
                        input
                    }
                    Action::Drain { until } => {
                        if m.suspending() {
                            // The machine waits for the other calls until the deadline, or a
                            // cancel: then they are told to stop as in any drain.
                            if let Some(children) = &children_cancel {
                                children.cancel();
                            }
                            let drained = self.drain(until, &mut running, &mut senders);
                            self.until_stopped(deadline, drained).await
                        } else {
                            // Running handlers are told, and given the grace period to finish.
                            calls_cancel.cancel();
                            stop_retries.cancel();
                            self.drain(until, &mut running, &mut senders).await
                        }
                    }
                    action => self.answer(&m, action, deadline).await,
                };
                let journaled = self.journaling
                    && (!self.suspended
                        || matches!(
                            input,
                            Input::CallFinished { .. } | Input::CallUnhandled { .. }
                        ));
                if journaled {
                    self.record(&mut m, input).await;
                } else {
                    self.feed_plain(&mut m, input);
                }
            }
            if self.held.is_none() {
                self.flush(&mut m);
            }
            self.source_output(&m);
            drop(running);
            for (_, s) in senders.drain(..) {
                s.close();
            }
            let elapsed = self.start.elapsed();
            let pending = self.approvals.take_pending();
            if self.journal.is_some() {
                // Boxed: it holds the outcome while it writes it (1 KB), which held inline would
                // be in every running run's future, journaled or not.
                Box::pin(self.close_journal(&mut m, elapsed, pending)).await;
            }
            self.conclude(m, observed, elapsed)
        }
    }

    /// The input that answers an action of the machine's other than the calls' own (starting,
    /// awaiting and draining them), each raced against the deadline and cancellation where it
    /// waits.
    async fn answer(
        &mut self,
        m: &RunMachine,
        action: Action<'_>,
        deadline: Option<Instant>,
    ) -> Input {
        match action {
            Action::CheckInput(text) => {
                let check = self.check_guardrails(&self.inner.input_guardrails, text);
                self.raced(deadline, None, check).await
            }
            Action::CheckOutput(text) => {
                let check = self.check_guardrails(&self.inner.output_guardrails, text);
                self.raced(deadline, None, check).await
            }
            Action::TakeMessages { follow_up } => self.take_messages(follow_up),
            Action::ListTools => match self.race(deadline, self.refresh_source()).await {
                Ok(changed) => self.list_tools(m, changed),
                Err(by) => Input::Interrupted { by },
            },
            Action::PrepareRequest => {
                let prepare = self.before_model_call(m);
                self.raced(deadline, None, prepare).await
            }
            Action::CallModel(request) => {
                let call = self.call_model(m, request, true);
                self.raced(deadline, None, call).await
            }
            Action::Summarize(request) => {
                let call = self.call_model(m, request, false);
                self.raced(deadline, None, call).await
            }
            Action::Review { response, answer } => {
                let review = self.after_model_call(m, response, answer);
                self.raced(deadline, None, review).await
            }
            Action::CheckStop => {
                let check = self.check_stop(m);
                self.raced(deadline, None, check).await
            }
            Action::Admit { gate, batch } => {
                let stop = self.cancel.child_token();
                let admit = self.admit(m, gate, &batch.calls, &stop);
                self.raced(deadline, Some(&stop), admit).await
            }
            // Boxed: only a run with hooks gets here, and the outcome it holds while they run
            // (900 bytes with their future) would be in every running run's future.
            Action::Finalize => {
                Box::pin(async {
                    let outcome = m.outcome(self.start.elapsed());
                    Input::Finalized {
                        failures: self.finish_hooks(&outcome).await,
                    }
                })
                .await
            }
            // Never here: `drive` answers these itself, as they hold its calls' bookkeeping. Were
            // one to come, the run would stop as cancelled rather than run a call outside it.
            Action::Finish
            | Action::StartCall(_)
            | Action::AwaitCalls { .. }
            | Action::Drain { .. } => Input::Interrupted {
                by: crate::machine::Interrupt::Cancelled,
            },
        }
    }

    /// The run is over, its journal closed: its last event, the replay check and the step log.
    /// Not async: the future of a run holds the largest of its waits, and this one held the
    /// machine twice more.
    fn conclude(
        &mut self,
        mut m: RunMachine,
        observed: bool,
        elapsed: std::time::Duration,
    ) -> RunOutcome {
        // The events of a last answer held for the journal's end.
        self.flush(&mut m);
        let cfg = Arc::clone(m.config());
        let outcome = m.into_outcome(elapsed);
        if observed {
            self.sinks.emit(&Event {
                run_id: Arc::from(outcome.run_id.as_str()),
                turn: outcome.turns,
                kind: EventKind::RunFinished {
                    stop_reason: outcome.stop_reason.clone(),
                    usage: outcome.usage,
                    cost_usd: outcome.cost_usd,
                    turns: outcome.turns,
                    error: outcome.error.as_ref().map(Into::into),
                },
            });
        }
        if let Some(log) = self.log.take() {
            #[cfg(feature = "verify-replay")]
            replay::verify(&cfg, &log, &outcome);
            if let Some(out) = &self.log_out {
                out.put(*log);
            }
        }
        drop(cfg);
        outcome
    }

    /// The steering messages or follow-ups waiting now.
    fn take_messages(&self, follow_up: bool) -> Input {
        let messages = match &self.steering {
            Some(s) if follow_up => s.take_follow_ups(),
            Some(s) => s.take_steering(),
            None => Vec::new(),
        };
        Input::Messages {
            messages,
            follow_up,
        }
    }

    /// What a starting call's handler knows: its ids, the calls' tokens (`tokens`: their
    /// cancellation, the end of their retries, and the subagent calls' cancellation, made at the
    /// first subagent call), its progress channel (kept in `senders` to close when it ends) and,
    /// for a subagent, the batch's scope.
    fn call_context(
        &mut self,
        m: &RunMachine,
        call: &AdmittedCall,
        deadline: Option<Instant>,
        tokens: (
            &CancellationToken,
            &CancellationToken,
            &mut Option<CancellationToken>,
        ),
        senders: &mut Vec<(usize, ProgressSender)>,
    ) -> ToolContext {
        let progress = self.progress(m, call);
        if let Some(p) = &progress {
            senders.push((call.position, p.clone()));
        }
        let scope = self.subagent_scope(m, call, deadline);
        let subagent = m.tools().spec(call.index).is_some_and(|s| s.subagent);
        ToolContext {
            call_id: Arc::clone(&call.call_id),
            tool: Arc::clone(&call.tool),
            run_id: Arc::clone(m.run_id()),
            turn: m.turn(),
            cancel: if subagent {
                tokens
                    .2
                    .get_or_insert_with(|| tokens.0.child_token())
                    .clone()
            } else {
                tokens.0.clone()
            },
            progress: progress.unwrap_or_default(),
            stop_retries: tokens.1.clone(),
            scope,
            approved: call.approved,
        }
    }

    fn emit_started(
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
    async fn drain<F: Future<Output = CallDone>>(
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
    async fn until_stopped(
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

    /// Ends a step of a journaling run: its result is journaled, kept in the log, and fed to the
    /// machine, in that order. A step that cannot be journaled is not fed: the machine is told
    /// the journal failed instead, and the run stops at its last written step.
    ///
    /// One exception saves a commit a turn: a model's response is fed first, and when the
    /// machine's next step is a call's start (no hook, gate or check between them), it is held
    /// and committed with that start, in one transaction, before the call runs; when the run is
    /// over with it, it is committed with the run's end. Nothing outside the run sees it before
    /// that commit: its events wait, and no model, tool or hook runs in between. A crash before
    /// the commit loses the response as a crash during the model call would: the resumed run
    /// asks the model again, and the spend of a response is in the journal before anything
    /// acts on it.
    ///
    /// Not an `async fn`, which would keep `input` twice in its future (as passed, and moved
    /// into a local): that made this the largest wait in every running run's future.
    #[inline(never)]
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future"
    )]
    pub(crate) fn record<'s>(
        &'s mut self,
        m: &'s mut RunMachine,
        mut input: Input,
    ) -> impl Future<Output = ()> + Send + 's {
        async move {
            m.settle(&mut input);
            let suspends = matches!(
                input,
                Input::Interrupted {
                    by: Interrupt::Suspended
                }
            );
            if self.held.is_some() && !suspends {
                self.record_batch(m, vec![input]).await;
                return;
            }
            let at = self.start.elapsed();
            let mut step = Step { at, input };
            if !self.journaling || self.journal.is_none() {
                self.feed(m, step);
                return;
            }
            if suspends {
                // The journal ends before the gate's step, so a resume asks the gate again (or,
                // in a batch, starts its subagent calls again): only the calls that finish
                // while the batch drains are journaled after it.
                self.commit_held(m).await;
                self.suspended = true;
                self.feed(m, step);
                return;
            }
            if matches!(step.input, Input::ModelResponded { .. }) {
                let copy = step.clone();
                self.feed(m, step);
                self.held = Some(Box::new(copy));
                if !m.starts_next() && !m.is_done() {
                    self.commit_held(m).await;
                }
                return;
            }
            let failed = self.append(m, &mut step).await.err().flatten();
            for step in std::iter::once(step).chain(failed) {
                self.feed(m, step);
            }
        }
    }

    /// Writes `step` as the run's next step. On a failure journaling ends and `step` becomes
    /// the journal's failure, or, for a finished call, keeps its outcome (with a diagnostic)
    /// and the failure is the step returned to feed after it.
    async fn append(&mut self, m: &RunMachine, step: &mut Step) -> Result<(), Option<Step>> {
        let Some(journal) = self.journal.as_ref().filter(|_| self.journaling) else {
            return Ok(());
        };
        match journal.append(m.run_id(), self.seq, step).await {
            Ok(()) => {
                self.seq += 1;
                Ok(())
            }
            Err(e) => {
                self.journaling = false;
                Err(not_journaled(step, &e))
            }
        }
    }

    /// Commits the held response on its own (the machine was fed it, and what comes next is
    /// not a call's start); a failed write is fed as the journal's failure.
    async fn commit_held(&mut self, m: &mut RunMachine) {
        let Some(mut step) = self.held.take().map(|held| *held) else {
            return;
        };
        if self.append(m, &mut step).await.is_err() {
            // A response, not a finished call: the step became the journal's failure.
            self.feed(m, step);
        }
    }

    /// [`Driver::record`] for steps that are ready together (calls of a batch that finished,
    /// or that start, together): their steps go to the journal together (one commit where the
    /// journal groups them), then each is fed, in order. The step the journal could not keep is
    /// fed as in `record`'s failure; a finished call past it is fed as such, a start past it is
    /// not fed at all (the machine no longer asks for it). Returns how many steps were kept.
    /// A held response goes first, in the same commit (it was fed already).
    async fn record_batch(&mut self, m: &mut RunMachine, inputs: Vec<Input>) -> usize {
        let at = self.start.elapsed();
        let fed = usize::from(self.held.is_some());
        let mut steps: Vec<Step> = Vec::with_capacity(fed + inputs.len());
        // Straight from its field: a local would keep a second step (192 bytes) in the future
        // while the batch is written.
        steps.extend(self.held.take().map(|held| *held));
        steps.extend(inputs.into_iter().map(|mut input| {
            m.settle(&mut input);
            Step { at, input }
        }));
        let mut failure = None;
        if let Some(journal) = self.journal.as_ref().filter(|_| self.journaling) {
            match journal.append_batch(m.run_id(), self.seq, &steps).await {
                Ok(()) => self.seq += steps.len() as u64,
                Err((written, e)) => {
                    self.journaling = false;
                    self.seq += written as u64;
                    failure = Some((written, e));
                }
            }
        }
        let kept = failure.as_ref().map_or(steps.len(), |(at, _)| *at);
        for (i, mut step) in steps.drain(..).enumerate() {
            let failed = match &failure {
                Some((at, e)) if *at == i => not_journaled(&mut step, e),
                Some(_) if i > kept && matches!(step.input, Input::CallStarted { .. }) => break,
                // The held response, fed when it came.
                _ if i < fed => continue,
                _ => None,
            };
            for step in std::iter::once(step).chain(failed) {
                self.feed(m, step);
            }
        }
        kept.saturating_sub(fed)
    }

    /// A step of a run that does not journal: the plain path stays as lean as it was (no
    /// future, no extra move of the input).
    #[inline]
    fn feed_plain(&mut self, m: &mut RunMachine, input: Input) {
        let step = Step {
            at: self.start.elapsed(),
            input,
        };
        match &mut self.log {
            Some(log) => m.feed_logged(step, &mut log.steps),
            None => m.feed(step),
        }
    }

    /// A journaled step goes to the log and then to the machine.
    fn feed(&mut self, m: &mut RunMachine, step: Step) {
        if let Some(log) = &mut self.log {
            log.steps.push(step.clone());
        }
        m.feed(step);
    }

    /// After the run: the journal learns how it ended (or what it waits on). A failed write is
    /// a step the machine folds into the outcome (and the log keeps, so a replay sees it).
    /// A model's last answer held for it is committed with the run's end. `pending`: the calls
    /// the run suspended on.
    async fn close_journal(
        &mut self,
        m: &mut RunMachine,
        elapsed: std::time::Duration,
        pending: Vec<crate::gate::ApprovalRequest>,
    ) {
        let Some(journal) = self.journal.clone() else {
            return;
        };
        let outcome = m.outcome(elapsed);
        let suspended = outcome.stop_reason == crate::outcome::StopReason::Suspended;
        if suspended {
            self.commit_held(m).await;
        }
        let written = if suspended {
            journal.suspend(&outcome.run_id, &pending).await
        } else if !self.journaling {
            return;
        } else if let Some(step) = self.held.take() {
            let written = journal.append_and_finish(&outcome.run_id, self.seq, &step, &outcome);
            let written = written.await;
            if written.is_ok() {
                self.seq += 1;
            }
            written
        } else {
            journal.finish(&outcome.run_id, &outcome).await
        };
        if let Err(e) = written {
            let step = Step {
                at: elapsed,
                input: Input::JournalFailed {
                    message: e.to_string(),
                },
            };
            if let Some(log) = &mut self.log {
                log.steps.push(step.clone());
            }
            m.feed(step);
        }
    }

    /// Asks the tool source to list its tools again where they changed.
    async fn refresh_source(&self) -> bool {
        match &self.inner.source {
            Some(source) => source.refresh().await,
            None => false,
        }
    }

    /// The answer to [`Action::ListTools`]: the source's specs at this driver's first turn, so
    /// that the step log (a journal) holds the tools the run had whatever the agent was built
    /// with, and later when the source says they changed. Their handlers are kept by name, for
    /// the calls that follow.
    fn list_tools(&mut self, m: &RunMachine, changed: bool) -> Input {
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
    fn source_output(&self, m: &RunMachine) {
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
    ) -> impl Future<Output = CallDone> + Send + 'a {
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

    /// One model call. `stream` sends its deltas to the sinks (a summary call's are not the
    /// run's output).
    async fn call_model(&self, m: &RunMachine, request: ModelRequest<'_>, stream: bool) -> Input {
        let observed = !self.sinks.is_empty() && stream;
        let model = &self.inner.model;
        if observed {
            self.emit(
                m,
                EventKind::ModelRequestStarted {
                    model: model.id().to_owned(),
                    provider: model.provider().to_owned(),
                    messages: request.messages.len(),
                },
            );
        }
        let mut stream = model.stream(request);
        let mut acc = ResponseAccumulator::new();
        let mut names: Vec<(u32, Arc<str>, crate::message::SmolStr)> = Vec::new();
        loop {
            if observed && self.sinks.full() {
                // The model's stream is not read while its reader lags (the call is raced with
                // the run's interrupts). Here, where no event is held: waiting with one held
                // made every running run's future larger.
                Box::pin(self.sinks.room()).await;
            }
            let Some(event) = stream.next().await else {
                break;
            };
            let event = match event {
                Ok(e) => e,
                Err(error) => return self.failed(error, &acc),
            };
            if observed {
                if let ModelEvent::Retrying(retry) = &event {
                    names.clear();
                    self.emit(m, retrying(retry, acc.streamed()));
                } else {
                    self.stream_event(m, &event, &mut names);
                }
            }
            if let Err(error) = acc.push(event) {
                return self.failed(error, &acc);
            }
        }
        // After a retry, each abandoned attempt is priced at its own model's rate (a fallback's
        // primary is not the model that answers), before finishing sums their tokens.
        let retried = acc.retried().map(|(abandoned, own)| {
            let priced = abandoned
                .iter()
                .map(|(model, usage)| self.price_quietly(model.as_deref(), usage));
            (priced.fold(Some(0.0), seams::add_cost), own)
        });
        match acc.finish_or_keep() {
            Ok(response) => {
                let (cost, failures) = match retried {
                    None => self.price(response.model.as_deref(), &response.usage),
                    Some((abandoned, own)) => {
                        let (cost, failures) = self.price(response.model.as_deref(), &own);
                        (seams::add_cost(cost, abandoned), failures)
                    }
                };
                Input::ModelResponded {
                    response,
                    cost,
                    failures,
                }
            }
            Err((error, acc)) => self.failed(error, &acc),
        }
    }

    /// A failed call, with what its attempts reported spending, each priced at the rate of the
    /// model that spent it.
    fn failed(&self, error: crate::model::ModelError, acc: &ResponseAccumulator) -> Input {
        let spent = acc.spent();
        let spent = (!spent.is_zero()).then(|| {
            let priced = acc
                .spent_by_model()
                .map(|(model, usage)| self.price_quietly(model, usage));
            Box::new(crate::machine::Spent {
                usage: spent,
                cost: priced.fold(Some(0.0), seams::add_cost),
            })
        });
        Input::ModelFailed { error, spent }
    }

    fn stream_event(
        &self,
        m: &RunMachine,
        event: &ModelEvent,
        names: &mut Vec<(u32, Arc<str>, crate::message::SmolStr)>,
    ) {
        match event {
            ModelEvent::TextDelta(t) => self.emit(m, EventKind::TextDelta { text: t.clone() }),
            ModelEvent::ReasoningDelta(t) => {
                self.emit(m, EventKind::ReasoningDelta { text: t.clone() })
            }
            ModelEvent::ToolCallStart { index, id, name } => {
                names.push((*index, Arc::clone(id), name.clone()))
            }
            ModelEvent::ToolCallDelta { index, arguments } => {
                let known = names.iter().find(|(i, _, _)| i == index);
                self.emit(
                    m,
                    EventKind::ToolCallDelta {
                        index: *index,
                        call_id: known.map(|k| k.1.to_string()).filter(|s| !s.is_empty()),
                        name: known.map(|k| k.2.to_string()),
                        arguments: arguments.clone(),
                    },
                );
            }
            _ => {}
        }
    }
}

/// The event of an abandoned attempt: what it streamed is discarded.
fn retrying(retry: &crate::model::ModelRetry, discarded: crate::model::Discarded) -> EventKind {
    EventKind::ModelRetrying {
        retry: retry.retry,
        model: retry.model.clone(),
        code: retry.error.code().to_owned(),
        message: retry.error.message.clone(),
        delay: retry.delay,
        discarded,
        usage: retry.usage,
    }
}

/// What a subagent call needs of the run above its budget, carried on its scope.
pub(crate) struct Tree {
    /// The run's journal, when its subagents are journaled with it (as child journals).
    pub(crate) journal: Option<Arc<dyn Journal>>,
    /// The run's approvals: a child's question suspends the tree through them, and the answers
    /// recorded for a child's calls reach it through them.
    pub(crate) approvals: Arc<Approvals>,
}

/// The calls that have finished by now, without waiting.
fn finished_now<F: Future<Output = CallDone>>(
    running: &mut Running<F>,
    senders: &mut Vec<(usize, ProgressSender)>,
) -> Vec<Input> {
    let mut ready = Vec::new();
    while let Some(Some(done)) = running.next().now_or_never() {
        ready.push(finished(Some(done), senders));
    }
    ready
}

/// A step the journal could not keep becomes the journal's failure. A call that did complete
/// keeps its outcome, which says so (and that the journal does not hold it, so a resume answers
/// it interrupted), and the failure follows it: the run stops on the journal's failure next,
/// instead of calling a finished call cancelled.
fn not_journaled(step: &mut Step, e: &crate::journal::JournalError) -> Option<Step> {
    let journal_failed = Input::JournalFailed {
        message: e.to_string(),
    };
    if let Input::CallFinished { outcome, .. } = &mut step.input {
        outcome.diagnostic = Some(
            format!(
                "completed, but not recorded in the journal: {e}{}",
                outcome
                    .diagnostic
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            )
            .into(),
        );
        Some(Step {
            at: step.at,
            input: journal_failed,
        })
    } else {
        step.input = journal_failed;
        None
    }
}

/// Tools by name under their layers: of two of one name, the first listed, as the machine's
/// catalog keeps the first listed spec of a name ([`RunMachine::tools`]). A later one kept here
/// would run under the first's spec: the one the model, the gates and the read-only flags saw.
fn handlers(tools: Vec<Tool>) -> HashMap<String, Layered> {
    let mut out = HashMap::with_capacity(tools.len());
    for t in tools {
        out.entry(t.name().to_owned())
            .or_insert_with(|| t.layered());
    }
    out
}

/// A call that finished, or the end of a set that ran dry (the machine folds what it has).
fn finished(done: Option<CallDone>, senders: &mut Vec<(usize, ProgressSender)>) -> Input {
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
