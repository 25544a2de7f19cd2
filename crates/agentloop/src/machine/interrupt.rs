//! Interrupts (cancel, deadline, suspension), a restart in a new process, and a journal that
//! failed.

use std::time::Duration;

use super::{Closing, Interrupt, Pending, Phase, RunMachine, hit};
use crate::error::RunError;
use crate::event::EventKind;
use crate::limits::LimitKind;
use crate::outcome::{CallOutcome, StopReason, journal_failed_at_end};

impl RunMachine {
    pub(super) fn on_interrupt(&mut self, phase: Phase, by: Interrupt) {
        match phase {
            Phase::Run(mut p) => {
                if p.interrupted.is_none() {
                    let grace = self.now.saturating_add(self.limits().grace_period);
                    // A suspension is planned, not a stop: the calls it does not wait on (its
                    // subagents' children are left to resume) run to their end, bounded by the
                    // deadline rather than a grace period, so that none is cut or lost.
                    let until = match by {
                        Interrupt::Suspended => self
                            .limits()
                            .deadline()
                            .map_or(Duration::MAX, |d| d.max(grace)),
                        _ => grace,
                    };
                    p.interrupted = Some((by, until));
                } else if let Some((Interrupt::Suspended, until)) = &mut p.interrupted
                    && matches!(by, Interrupt::Deadline | Interrupt::Cancelled)
                    && !p.stopping
                {
                    // The calls a suspension let run are stopped by what stops any other call,
                    // and given the same grace: their results within it are kept (journaled),
                    // and those still running after it are cut short. The run still ends
                    // suspended: its question stands, and a resume past the deadline stops
                    // there.
                    p.stopping = true;
                    *until = self.now.saturating_add(self.limits().grace_period);
                }
                p.open = false;
                if p.running == 0 {
                    self.end_batch(p);
                } else if self.only_children_left(&p) {
                    self.on_grace_over(p);
                } else {
                    self.phase = Phase::Run(p);
                }
            }
            Phase::Done | Phase::Closing(Closing::Finalize) => {
                // Nothing is left to interrupt.
                self.phase = phase;
                if matches!(self.phase, Phase::Closing(_)) {
                    self.phase = Phase::Done;
                }
            }
            phase => {
                self.phase = phase;
                self.stop_interrupted(by);
            }
        }
    }

    // Rare steps, kept out of the hot path's code.
    #[cold]
    #[inline(never)]
    pub(super) fn on_journal_failed(&mut self, phase: Phase, message: String) {
        if matches!(phase, Phase::Done) {
            // The run is over and the journal could not record how it ended: a run that would
            // have ended well fails, since a resume would not find it ended.
            self.phase = phase;
            let stop = self.ending.stop.get_or_insert(StopReason::Failed);
            let mut error = self.ending.error.take().map(|e| *e);
            journal_failed_at_end(stop, &mut error, message);
            self.ending.error = error.map(Box::new);
            return;
        }
        self.journal_failure = Some(message);
        self.on_interrupt(phase, Interrupt::JournalFailed);
    }

    /// A new process goes on with the run. Only a batch that was running holds anything of the
    /// old process: its calls that were running are started again when their tool is
    /// idempotent (or a subagent whose child is journaled with the run: it resumes) and the
    /// batch was still open, and answered as interrupted otherwise. Every other step is simply
    /// asked for again.
    #[cold]
    #[inline(never)]
    pub(super) fn on_restarted(&mut self, phase: Phase, children: bool) {
        self.restart_batch(phase, children);
        // A run that goes on at or past its deadline (it waited that long for approvals, on a
        // driver that counts the wait) stops there: what it waited on is not run, whether or
        // not it was answered. One rule for every driver: the local one and Restate's.
        if self.limits().deadline().is_some_and(|t| self.now >= t) {
            let phase = std::mem::replace(&mut self.phase, Phase::Done);
            self.on_interrupt(phase, Interrupt::Deadline);
        }
    }

    fn restart_batch(&mut self, phase: Phase, children: bool) {
        let Phase::Run(mut p) = phase else {
            self.phase = phase;
            return;
        };
        for (i, call) in p.batch.calls.iter().enumerate() {
            let Some(slot) = p
                .slots
                .get_mut(call.position)
                .filter(|s| s.started && s.outcome.is_none())
            else {
                continue;
            };
            p.running = p.running.saturating_sub(1);
            let idempotent = self
                .tools
                .spec(call.index)
                .is_some_and(|s| s.idempotent || (children && s.subagent));
            if idempotent && p.open {
                slot.started = false;
                p.restart.push(i);
            } else {
                self.emit(|| EventKind::ToolFinished {
                    call_id: slot.call_id.to_string(),
                    tool: slot.tool.to_string(),
                    outcome: CallOutcome::interrupted(),
                });
                slot.outcome = Some(CallOutcome::interrupted());
            }
        }
        if p.running == 0 && (!p.open || (p.next >= p.batch.calls.len() && p.restart.is_empty())) {
            self.end_batch(p);
        } else {
            self.phase = Phase::Run(p);
        }
    }

    /// True when a batch drains for a suspension and the calls still running are all
    /// subagents': their children stay as they are, to resume with the run, so nothing is left
    /// to wait for.
    pub(super) fn only_children_left(&self, p: &Pending) -> bool {
        matches!(p.interrupted, Some((Interrupt::Suspended, _)))
            && p.running > 0
            && p.batch.calls.iter().all(|call| {
                let running = p
                    .slots
                    .get(call.position)
                    .is_some_and(|s| s.started && s.outcome.is_none());
                !running || self.tools.spec(call.index).is_some_and(|s| s.subagent)
            })
    }

    pub(super) fn stop_interrupted(&mut self, by: Interrupt) {
        match by {
            Interrupt::Cancelled => {
                self.ending.error = Some(Box::new(RunError::Cancelled));
                self.finish(StopReason::Cancelled);
            }
            Interrupt::Suspended => self.finish(StopReason::Suspended),
            Interrupt::JournalFailed => {
                let message = self
                    .journal_failure
                    .take()
                    .unwrap_or_else(|| "a step could not be written".into());
                self.fail(RunError::Journal { message });
            }
            Interrupt::Deadline => {
                let bound = self.limits().deadline().unwrap_or(self.now);
                self.stop_on_limit(hit(
                    LimitKind::Deadline,
                    bound.as_millis() as f64,
                    self.now.as_millis() as f64,
                    0.0,
                ));
            }
        }
    }
}
