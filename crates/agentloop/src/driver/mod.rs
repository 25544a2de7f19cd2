//! The local tokio driver: the I/O around a [`RunMachine`], and no rule of its own.
//!
//! It asks the machine for the next [`Action`], performs it (calls the model, streaming deltas out
//! as events; runs hooks, guardrails and gates with their panics isolated; starts and awaits tool
//! calls inside the run's own task), races every step against cancellation and the deadline, and
//! hands the result back as an [`Input`]. Whatever it learns, the machine decides what follows.
//!
//! - `mod.rs`: the agent's parts, the driver's state and the loop (`Driver::drive`), which
//!   performs each action or hands it to the file that does.
//! - `model_call.rs`: the model call, its events streamed out.
//! - `calls.rs`: tool calls, started, awaited and drained; the tool source's catalog.
//! - `record.rs`: a durable run's steps into its journal before the machine is fed them.
//! - `interrupts.rs`: cancellation, suspension and the deadline, raced against every step.
//! - `seams.rs` (with `chain.rs`, the hook chain's policy): hooks, guardrails, gates and
//!   pricing, each panic-isolated.
//! - `running.rs`: the set of running calls, polled inside the run's task.
//! - `replay.rs`: the replay driver, which feeds a recorded step log to a fresh machine.
//!
//! A durable run's driver writes each step to its journal before feeding it to the machine, or,
//! for a model's response followed by a call's start or the run's end, before anything acts on
//! it (`Driver::record`); resuming starts this same driver on a machine fed from the journal.

mod calls;
mod chain;
mod interrupts;
mod model_call;
mod record;
pub mod replay;
mod running;
mod seams;

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Future, StreamExt};
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
use crate::machine::{Action, Input, RunMachine, Step};
use crate::model::Model;
use crate::outcome::RunOutcome;
use crate::steering::Steering;
use crate::tool::{Layered, ToolSource};
use calls::{CallControls, finished, finished_now, handlers};
use interrupts::Interrupts;
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
            let mut calls = CallControls::new(&self.cancel);
            // The calls run concurrently inside the run's own task: no task per call to spawn,
            // schedule and free on another thread (a tool marked `own_task` gets one).
            let mut running = Running::default();
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
                        None if self.journaling => {
                            let start = Self::start_call;
                            self.start_journaled(&mut m, deadline, &mut calls, &mut running, start)
                                .await;
                            continue;
                        }
                        None => {
                            running.push(self.start_call(&m, call, deadline, &mut calls));
                            Input::CallStarted {
                                position: call.position,
                            }
                        }
                    },
                    Action::AwaitCalls { retries } => {
                        if !retries {
                            calls.stop_retries.cancel();
                        }
                        let input = match self.race(deadline, running.next()).await {
                            Ok(done) => finished(done, &mut calls.progress),
                            Err(by) => Input::Interrupted { by },
                        };
                        if self.journaling && matches!(input, Input::CallFinished { .. }) {
                            // The calls that finished together are committed together.
                            let mut ready = finished_now(&mut running, &mut calls.progress);
                            if !ready.is_empty() {
                                ready.insert(0, input);
                                self.record_batch(&mut m, ready).await;
                                continue;
                            }
                        }
                        input
                    }
                    Action::Drain { until } => {
                        self.drain_calls(&m, until, deadline, &mut calls, &mut running)
                            .await
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
            for (_, s) in calls.progress.drain(..) {
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
}

/// What a subagent call needs of the run above its budget, carried on its scope.
pub(crate) struct Tree {
    /// The run's journal, when its subagents are journaled with it (as child journals).
    pub(crate) journal: Option<Arc<dyn Journal>>,
    /// The run's approvals: a child's question suspends the tree through them, and the answers
    /// recorded for a child's calls reach it through them.
    pub(crate) approvals: Arc<Approvals>,
}
