//! A task of its own for each attempt ([`ToolPolicy::own_task`](super::ToolPolicy::own_task)).

use std::sync::Arc;

use tokio_util::task::AbortOnDropHandle;

use super::{CallFuture, CallService};
use crate::outcome::{CallOutcome, codes};
use crate::panic::panic_message;
use crate::tool::{Arguments, ToolContext};

/// Runs each attempt on a task of its own, aborted when the attempt is dropped (cancellation,
/// the end of the grace period, a timeout).
pub(crate) struct OwnTask(pub(super) Arc<dyn CallService>);

impl CallService for OwnTask {
    fn call(&self, args: &Arguments, ctx: ToolContext) -> CallFuture {
        let inner = Arc::clone(&self.0);
        let args = args.clone();
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
