//! A tool's execution policies ([`ToolPolicy`]) as layers over its handler, in the shape of tower's
//! middleware: each layer is a [`CallService`] wrapping another, composed once, at registration,
//! innermost first: [`CatchPanic`], [`OwnTask`], [`Timeout`] (outside the task, where a handler
//! blocking its thread cannot stop it firing), [`Retry`] (around the timeout, so that a timed-out
//! attempt is retried). Every layer speaks [`CallOutcome`], the one vocabulary of how a call ended.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Either};

use super::{Arguments, ToolContext, ToolHandler};
use crate::outcome::CallOutcome;
use crate::retry::RetryPolicy;

mod catch_panic;
mod retry;
mod spawn;
mod timeout;

use catch_panic::{CatchPanic, Caught, call_caught};
use retry::{Retry, tool_retries};
use spawn::OwnTask;
use timeout::Timeout;

/// How a tool's calls run, beside what its [`ToolSpec`](super::ToolSpec) tells the model and the
/// gate: the policies its layers apply. Set with the [`ToolBuilder`](super::ToolBuilder)'s setters
/// or [`Tool::with_policy`](super::Tool::with_policy); the default asks for no layer but panic
/// isolation, which every tool has.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolPolicy {
    /// How long one attempt may run: a slower attempt ends with a recoverable error of code
    /// `timeout`, which [`retry`](Self::retry) may run again. `None`: no limit but the run's own.
    pub timeout: Option<Duration>,
    /// How often a failed call runs again before the model sees the failure, and the wait before
    /// each retry. A recoverable error or a timeout is retried; an error marked
    /// [`permanent`](super::ToolError::permanent) (unreadable arguments are), a fatal error or a
    /// panic is not. For tools whose failures are transient and which are safe to run again with
    /// the same arguments: a timed-out attempt may have done part of its work. The model reads only
    /// the last attempt's result; hooks, the gate and `max_tool_calls` see one call. Each retry is
    /// announced (`EventKind::ToolRetrying`) before its wait, and none starts once the run is
    /// interrupted or its batch stops on a fatal failure. Default: one attempt; retries wait
    /// 100 ms, doubling, at most 2 s, with no jitter (a jitter given is drawn from the call id and
    /// the retry's number, so a run with fixed ids waits the same each time).
    pub retry: RetryPolicy,
    /// Each attempt runs as a tokio task of its own instead of inside the run's task: on a
    /// multi-thread runtime another worker can run it, so a CPU-heavy or blocking handler runs in
    /// parallel with the run (its deadline, its timeouts) and its siblings, as far as there are
    /// workers; on a current-thread runtime it changes nothing. A blocking handler cannot be
    /// stopped: when its call is abandoned it runs on until it returns. Costs one task per call.
    pub own_task: bool,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        ToolPolicy {
            timeout: None,
            retry: tool_retries(0),
            own_task: false,
        }
    }
}

/// One call of a tool, its layers included.
pub(crate) type CallFuture = BoxFuture<'static, CallOutcome>;

/// A tool call as the run makes it. Object-safe, so layers stack behind one `Arc`.
pub(crate) trait CallService: Send + Sync {
    /// Runs the call.
    fn call(&self, args: &Arguments, ctx: ToolContext) -> CallFuture;
}

const _: Option<&dyn CallService> = None;

/// A tool's handler under its layers. A tool that asks for no layer but panic isolation is called
/// straight, its panics caught inline: no allocation of the layers' own on the hot path.
#[derive(Clone)]
pub(crate) enum Layered {
    /// The handler alone.
    Bare(Arc<dyn ToolHandler>),
    /// The handler under one or more layers.
    Wrapped(Arc<dyn CallService>),
}

impl Layered {
    /// Starts one call through the layers: the bare handler is called now (its panic caught: the
    /// call failed), the layers' future made. The caller polls what it gets: nothing in it holds
    /// the arguments or the context a second time.
    pub(crate) fn start(
        &self,
        args: &Arguments,
        ctx: ToolContext,
    ) -> Result<Either<Caught, CallFuture>, CallOutcome> {
        match self {
            Layered::Bare(handler) => call_caught(handler, args, ctx).map(Either::Left),
            Layered::Wrapped(service) => Ok(Either::Right(service.call(args, ctx))),
        }
    }
}

/// The layers a policy asks for, around `handler`.
pub(crate) fn compose(handler: Arc<dyn ToolHandler>, policy: &ToolPolicy) -> Layered {
    let retries = policy.retry.retries() > 0;
    if !policy.own_task && policy.timeout.is_none() && !retries {
        return Layered::Bare(handler);
    }
    let mut call: Arc<dyn CallService> = Arc::new(CatchPanic(handler));
    if policy.own_task {
        call = Arc::new(OwnTask(call));
    }
    if let Some(after) = policy.timeout {
        call = Arc::new(Timeout { inner: call, after });
    }
    if retries {
        call = Arc::new(Retry {
            inner: call,
            policy: policy.retry.clone(),
        });
    }
    Layered::Wrapped(call)
}
