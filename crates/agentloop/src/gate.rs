//! The admission seam. After a decision is validated and before any of its calls starts, each
//! gate sees the calls still admitted and answers each: allow, deny (the model reads why), or run
//! with rewritten arguments (validated again). Gates compose in the order they were added, after
//! the hooks' `before_tool_call`; a call denied by one is never put to the next. Permission rules
//! with human approval ([`crate::permissions::PermissionGate`]) are one gate; an application adds its own.
//!
//! A gate sees the run's cancellation: a prompt waiting for a human should end when it fires. The
//! driver also races every gate against cancellation and the deadline.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::machine::{AdmittedCall, Verdict};
use crate::permissions::{Answer, ApprovalRequest};

/// What a gate knows of the run it admits calls for.
#[derive(Debug, Clone, Copy)]
pub struct GateContext<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The agent's name; a subagent's path from the top of its tree (`coordinator/worker`).
    pub agent: &'a str,
    /// The turn of the batch.
    pub turn: u32,
    /// Fires when the run is cancelled or its deadline passes while the gate waits.
    pub cancel: &'a CancellationToken,
    /// Answers recorded for a durable run, and its way to suspend.
    pub approvals: &'a Approvals,
}

/// The durable side of asking a human, for one run: the answers already recorded in its journal
/// (by call id), and, for a journaled run, the way to suspend it until the rest are answered.
/// A run without a journal has no answers and cannot suspend.
#[derive(Debug, Default)]
pub struct Approvals {
    answers: HashMap<String, Answer>,
    suspend: Option<Suspension>,
}

#[derive(Debug, Default)]
struct Suspension {
    fired: CancellationToken,
    pending: Mutex<Vec<ApprovalRequest>>,
}

impl Approvals {
    /// No answers, no suspension: a run without a journal.
    pub fn none() -> Self {
        Self::default()
    }

    /// A journaled run's: these recorded answers, and suspension allowed.
    pub fn durable(answers: impl IntoIterator<Item = (String, Answer)>) -> Self {
        Approvals {
            answers: answers.into_iter().collect(),
            suspend: Some(Suspension::default()),
        }
    }

    /// The recorded answer for a call.
    pub fn answer(&self, call_id: &str) -> Option<Answer> {
        self.answers.get(call_id).copied()
    }

    /// True when the run can suspend.
    pub fn can_suspend(&self) -> bool {
        self.suspend.is_some()
    }

    /// Suspends the run on these calls. The driver stops the run as soon as this is called (the
    /// gate's own future is abandoned), so a gate then waits forever:
    /// `approvals.suspend(requests); std::future::pending().await`. Without suspension
    /// (see [`Approvals::can_suspend`]) it does nothing and returns false.
    pub fn suspend(&self, requests: Vec<ApprovalRequest>) -> bool {
        let Some(s) = &self.suspend else {
            return false;
        };
        s.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(requests);
        s.fired.cancel();
        true
    }

    /// The token a driver races its steps against: `cancel` itself without suspension, else a
    /// child of it that a suspension also fires (so one wait covers both).
    pub(crate) fn link(&mut self, cancel: &CancellationToken) -> CancellationToken {
        match &mut self.suspend {
            Some(s) => {
                s.fired = cancel.child_token();
                s.fired.clone()
            }
            None => cancel.clone(),
        }
    }

    /// The calls the run suspended on.
    pub(crate) fn take_pending(&self) -> Vec<ApprovalRequest> {
        match &self.suspend {
            Some(s) => std::mem::take(&mut *s.pending.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        }
    }
}

/// Decides, per call, whether an admitted batch may run. Sees the batch once per turn, before any
/// tool of it starts.
pub trait Gate: Send + Sync {
    /// The gate's name, for errors and events.
    fn name(&self) -> &str {
        "gate"
    }

    /// One verdict per call of `calls`, in order. An error fails the run (the calls are answered
    /// "not run").
    fn check<'a>(
        &'a self,
        cx: GateContext<'a>,
        calls: &'a [AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>>;
}

impl<G: Gate + ?Sized> Gate for std::sync::Arc<G> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn check<'a>(
        &'a self,
        cx: GateContext<'a>,
        calls: &'a [AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>> {
        (**self).check(cx, calls)
    }
}

const _: Option<&dyn Gate> = None;
