//! Retries: a transiently failed call runs again after a backoff, announced first.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{CallFuture, CallService};
use crate::outcome::{CallOutcome, CallStatus, codes};
use crate::tool::ToolContext;

/// The wait before retry number `retry` (1-based) of a failed tool call: 100 ms, doubling, at most
/// 2 s.
pub fn tool_retry_delay(retry: u32) -> Duration {
    let factor = 1u32 << retry.saturating_sub(1).min(5);
    Duration::from_millis(100)
        .saturating_mul(factor)
        .min(Duration::from_secs(2))
}

/// Runs a transiently failed call again, up to `retries` times.
pub(crate) struct Retry {
    pub(super) inner: Arc<dyn CallService>,
    pub(super) retries: u32,
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
