//! The admission seam. After a decision is validated and before any of its calls starts, each
//! gate sees the calls still admitted and answers each: allow, deny (the model reads why), or run
//! with rewritten arguments (validated again). Gates compose in the order they were added, after
//! the hooks' `before_tool_call`; a call denied by one is never put to the next. Permission rules
//! with human approval ([`crate::permissions::PermissionGate`]) are one gate; an application adds its own.
//!
//! A gate sees the run's cancellation: a prompt waiting for a human should end when it fires. The
//! driver also races every gate against cancellation and the deadline.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::machine::{AdmittedCall, Verdict};

/// What a gate knows of the run it admits calls for.
#[derive(Debug, Clone, Copy)]
pub struct GateContext<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The agent's name.
    pub agent: &'a str,
    /// The turn of the batch.
    pub turn: u32,
    /// Fires when the run is cancelled or its deadline passes while the gate waits.
    pub cancel: &'a CancellationToken,
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
