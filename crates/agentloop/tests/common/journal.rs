//! A journal in memory, for the durable-run tests: a crash is a cut of its steps.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use std::sync::Mutex;

use agentloop::RunOutcome;
use agentloop::journal::{Journal, JournalError, JournalHeader, JournaledRun, RunStatus};
use agentloop::machine::Step;
use agentloop::permissions::ApprovalRequest;
use futures::future::BoxFuture;

/// Keeps everything in memory; fails every write from `fail_at` on; cancels `cancel_at_start`
/// while it writes the first `CallStarted` step (a Ctrl-C that lands during that write).
#[derive(Default)]
pub(crate) struct Memory {
    pub header: Mutex<Option<JournalHeader>>,
    pub steps: Mutex<Vec<Step>>,
    pub fail_at: Option<u64>,
    pub cancel_at_start: Option<agentloop::CancellationToken>,
    /// Fails the write that says how the run ended.
    pub fail_finish: bool,
    /// Fails the write that suspends the run.
    pub fail_suspend: bool,
    /// The sizes of the step batches written together.
    pub batches: Mutex<Vec<usize>>,
}

impl Journal for Memory {
    fn begin<'a>(&'a self, header: &'a JournalHeader) -> BoxFuture<'a, Result<(), JournalError>> {
        *self.header.lock().unwrap() = Some(header.clone());
        Box::pin(async { Ok(()) })
    }
    fn append<'a>(
        &'a self,
        _run_id: &'a str,
        seq: u64,
        step: &'a Step,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        if let (Some(token), agentloop::machine::Input::CallStarted { .. }) =
            (&self.cancel_at_start, &step.input)
        {
            token.cancel();
        }
        let result = if self.fail_at.is_some_and(|f| seq >= f) {
            Err(JournalError::Io {
                message: "disk full".into(),
            })
        } else {
            let mut steps = self.steps.lock().unwrap();
            assert_eq!(steps.len() as u64, seq, "steps are written in order");
            steps.push(step.clone());
            Ok(())
        };
        Box::pin(async move { result })
    }
    fn append_batch<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        steps: &'a [Step],
    ) -> BoxFuture<'a, Result<(), (usize, JournalError)>> {
        self.batches.lock().unwrap().push(steps.len());
        agentloop::journal::append_in_turn(self, run_id, seq, steps)
    }
    fn suspend<'a>(
        &'a self,
        _run_id: &'a str,
        _pending: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        let fail = self.fail_suspend;
        Box::pin(async move {
            if fail {
                return Err(JournalError::Io {
                    message: "disk full at the suspension".into(),
                });
            }
            Ok(())
        })
    }
    fn finish<'a>(
        &'a self,
        _run_id: &'a str,
        _outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        let fail = self.fail_finish;
        Box::pin(async move {
            if fail {
                return Err(JournalError::Io {
                    message: "disk full at the end".into(),
                });
            }
            Ok(())
        })
    }
}

impl Memory {
    /// The run as a crash after `n` written steps leaves it.
    pub(crate) fn cut(&self, n: usize) -> JournaledRun {
        JournaledRun {
            header: self.header.lock().unwrap().clone().unwrap(),
            steps: self.steps.lock().unwrap()[..n].to_vec(),
            status: RunStatus::Running,
            approvals: Vec::new(),
        }
    }
}
