//! Panic isolation: a handler that panics, while it makes its future or while the future runs,
//! fails its call, never the run's task.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::CatchUnwind;

use super::{CallFuture, CallService};
use crate::outcome::CallOutcome;
use crate::panic::panic_message;
use crate::tool::{Arguments, ToolContext, ToolFuture, ToolHandler};

/// Calls a handler; a panic while it makes its future, or while the future runs, fails the call.
async fn catch_panic(
    handler: &Arc<dyn ToolHandler>,
    args: &Arguments,
    ctx: ToolContext,
) -> CallOutcome {
    match call_caught(handler, args, ctx) {
        Ok(running) => running.await,
        Err(outcome) => outcome,
    }
}

/// Calls a handler now, a panic while it makes its future caught: its future, or the failed
/// call. Not an `async fn`, so that a caller's future holds the arguments and the context only
/// until the call, not beside the handler's future too.
pub(super) fn call_caught(
    handler: &Arc<dyn ToolHandler>,
    args: &Arguments,
    ctx: ToolContext,
) -> Result<Caught, CallOutcome> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| handler.call_arguments(args, ctx))) {
        Ok(fut) => Ok(Caught(AssertUnwindSafe(fut).catch_unwind())),
        Err(panic) => Err(CallOutcome::panicked(panic_message(&panic))),
    }
}

/// A handler's future, a panic while it runs caught.
pub(crate) struct Caught(CatchUnwind<AssertUnwindSafe<ToolFuture>>);

impl Future for Caught {
    type Output = CallOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CallOutcome> {
        self.0.poll_unpin(cx).map(|ended| match ended {
            Ok(result) => CallOutcome::from_result(result),
            Err(panic) => CallOutcome::panicked(panic_message(&panic)),
        })
    }
}

/// Turns a handler's panic into a failed call.
pub(crate) struct CatchPanic(pub(super) Arc<dyn ToolHandler>);

impl CallService for CatchPanic {
    fn call(&self, args: &Arguments, ctx: ToolContext) -> CallFuture {
        let handler = Arc::clone(&self.0);
        let args = args.clone();
        Box::pin(async move { catch_panic(&handler, &args, ctx).await })
    }
}
