//! A durable run's steps into its journal: each written before the machine is fed it, a
//! response held to be committed with the starts or the end that follow it, a batch's
//! finished calls in one write, and a failed write turned into the journal's failure. Apart
//! from the loop, which feeds every step through it.

use futures::Future;

use crate::machine::{Input, Interrupt, RunMachine, Step};

use super::Driver;

impl<'a> Driver<'a> {
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
    pub(super) async fn record_batch(&mut self, m: &mut RunMachine, inputs: Vec<Input>) -> usize {
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
    pub(super) fn feed_plain(&mut self, m: &mut RunMachine, input: Input) {
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
    pub(super) async fn close_journal(
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
