//! Panic isolation: a handler that panics, while it makes its future or while the future runs,
//! fails its call, never the run's task.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::Value;

use super::{CallFuture, CallService};
use crate::outcome::CallOutcome;
use crate::panic::panic_message;
use crate::tool::{ToolContext, ToolHandler};

/// Calls a handler; a panic while it makes its future, or while the future runs, fails the call.
pub(super) async fn catch_panic(
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

/// Turns a handler's panic into a failed call.
pub(crate) struct CatchPanic(pub(super) Arc<dyn ToolHandler>);

impl CallService for CatchPanic {
    fn call(&self, args: &Arc<Value>, ctx: ToolContext) -> CallFuture {
        let handler = Arc::clone(&self.0);
        let args = Arc::clone(args);
        Box::pin(async move { catch_panic(&handler, &args, ctx).await })
    }
}
