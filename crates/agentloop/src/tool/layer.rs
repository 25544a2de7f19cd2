//! A tool's execution policies as layers over its handler, in the shape of tower's middleware:
//! each layer is a [`CallService`] wrapping another. Composed once, at registration, from the
//! tool's spec, innermost first:
//!
//! - [`CatchPanic`]: a handler that panics (making its future or while it runs) fails its call,
//!   never the run's task;
//! - [`OwnTask`]: each attempt runs on a tokio task of its own (`own_task`), for blocking or
//!   CPU-heavy handlers;
//! - [`Timeout`]: an attempt that runs past the tool's timeout ends with the `timeout` error; it
//!   sits outside the task, where a handler blocking its thread cannot stop it firing;
//! - [`Retry`]: a transient failure (a recoverable error or a timeout, not marked permanent, not
//!   about unreadable arguments) runs again after a backoff, announced first; no new attempt
//!   starts once the batch stops dispatching or the run is interrupted.
//!
//! Every layer speaks [`CallOutcome`], the one vocabulary of how a call ended.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::task::AbortOnDropHandle;

use super::{ToolContext, ToolHandler, ToolSpec, tool_retry_delay};
use crate::outcome::{CallOutcome, CallStatus, codes};

/// One call of a tool, its layers included.
pub(crate) type CallFuture = BoxFuture<'static, CallOutcome>;

/// A tool call as the run makes it. Object-safe, so layers stack behind one `Arc`.
pub(crate) trait CallService: Send + Sync {
    /// Runs the call.
    fn call(&self, args: &Arc<Value>, ctx: ToolContext) -> CallFuture;
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
    /// Runs one call through the layers.
    pub(crate) async fn call(self, args: Arc<Value>, ctx: ToolContext) -> CallOutcome {
        match self {
            Layered::Bare(handler) => catch_panic(&handler, &args, ctx).await,
            Layered::Wrapped(service) => service.call(&args, ctx).await,
        }
    }
}

/// Calls a handler; a panic while it makes its future, or while the future runs, fails the call.
async fn catch_panic(
    handler: &Arc<dyn ToolHandler>,
    args: &Value,
    ctx: ToolContext,
) -> CallOutcome {
    match std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(args, ctx))) {
        Ok(fut) => match AssertUnwindSafe(fut).catch_unwind().await {
            Ok(result) => CallOutcome::from_result(result),
            Err(panic) => CallOutcome::panicked(panic_message(&panic)),
        },
        Err(panic) => CallOutcome::panicked(panic_message(&panic)),
    }
}

/// The layers a spec asks for, around `handler`.
pub(crate) fn compose(handler: Arc<dyn ToolHandler>, spec: &ToolSpec) -> Layered {
    if !spec.own_task && spec.timeout.is_none() && spec.retries == 0 {
        return Layered::Bare(handler);
    }
    let mut call: Arc<dyn CallService> = Arc::new(CatchPanic(handler));
    if spec.own_task {
        call = Arc::new(OwnTask(call));
    }
    if let Some(after) = spec.timeout {
        call = Arc::new(Timeout { inner: call, after });
    }
    if spec.retries > 0 {
        call = Arc::new(Retry {
            inner: call,
            retries: spec.retries,
        });
    }
    Layered::Wrapped(call)
}

/// Turns a handler's panic into a failed call.
pub(crate) struct CatchPanic(Arc<dyn ToolHandler>);

impl CallService for CatchPanic {
    fn call(&self, args: &Arc<Value>, ctx: ToolContext) -> CallFuture {
        let handler = Arc::clone(&self.0);
        let args = Arc::clone(args);
        Box::pin(async move { catch_panic(&handler, &args, ctx).await })
    }
}

/// Runs each attempt on a task of its own, aborted when the attempt is dropped (cancellation,
/// the end of the grace period, a timeout).
pub(crate) struct OwnTask(Arc<dyn CallService>);

impl CallService for OwnTask {
    fn call(&self, args: &Arc<Value>, ctx: ToolContext) -> CallFuture {
        let inner = Arc::clone(&self.0);
        let args = Arc::clone(args);
        // The handler is called in the task as well, so that its synchronous work runs there.
        let task =
            AbortOnDropHandle::new(tokio::spawn(async move { inner.call(&args, ctx).await }));
        Box::pin(async move {
            match task.await {
                Ok(outcome) => outcome,
                Err(e) if e.is_panic() => CallOutcome::panicked(panic_message(&e.into_panic())),
                // Only a runtime shutting down cancels the task: nothing to retry.
                Err(_) => CallOutcome {
                    permanent: true,
                    ..CallOutcome::error(codes::CANCELLED, "the call's task was cancelled")
                },
            }
        })
    }
}

/// Ends an attempt that runs past `after`.
pub(crate) struct Timeout {
    inner: Arc<dyn CallService>,
    after: Duration,
}

impl CallService for Timeout {
    fn call(&self, args: &Arc<Value>, ctx: ToolContext) -> CallFuture {
        let attempt = self.inner.call(args, ctx);
        let after = self.after;
        Box::pin(async move {
            tokio::time::timeout(after, attempt)
                .await
                .unwrap_or_else(|_| CallOutcome::timed_out(after))
        })
    }
}

/// Runs a transiently failed call again, up to `retries` times.
pub(crate) struct Retry {
    inner: Arc<dyn CallService>,
    retries: u32,
}

impl CallService for Retry {
    fn call(&self, args: &Arc<Value>, ctx: ToolContext) -> CallFuture {
        let inner = Arc::clone(&self.inner);
        let args = Arc::clone(args);
        let retries = self.retries;
        Box::pin(async move {
            let mut outcome = inner.call(&args, ctx.clone()).await;
            let mut retried = 0u32;
            while retried < retries && retryable(&outcome) {
                let delay = tool_retry_delay(retried + 1);
                ctx.progress.retrying(
                    retried + 1,
                    outcome.code.as_deref().unwrap_or_default(),
                    &outcome.content.to_text(),
                    delay,
                );
                // The grace period of an interrupted run, and the drain of a batch that stopped
                // dispatching, are for attempts already running: an announced retry that they
                // stop does not run (nor count).
                tokio::select! {
                    biased;
                    _ = ctx.stop_retries.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
                retried += 1;
                outcome = inner.call(&args, ctx.clone()).await;
            }
            outcome.retries = retried;
            outcome
        })
    }
}

/// A failure worth another attempt: a recoverable error or a timeout that is not marked
/// permanent, nor about arguments the handler could not read (they would fail the same way
/// again, however the handler said so).
fn retryable(outcome: &CallOutcome) -> bool {
    outcome.status == CallStatus::Error
        && !outcome.permanent
        && outcome.code.as_deref() != Some(codes::INVALID_ARGUMENTS)
}

pub(crate) fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a tool handler panicked".to_owned()
    }
}
