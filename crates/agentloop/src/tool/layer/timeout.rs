//! The per-attempt timeout ([`ToolPolicy::timeout`](super::ToolPolicy::timeout)).

use std::sync::Arc;
use std::time::Duration;

use super::{CallFuture, CallService};
use crate::outcome::CallOutcome;
use crate::tool::{Arguments, ToolContext};

/// Ends an attempt that runs past `after`.
pub(crate) struct Timeout {
    pub(super) inner: Arc<dyn CallService>,
    pub(super) after: Duration,
}

impl CallService for Timeout {
    fn call(&self, args: &Arguments, ctx: ToolContext) -> CallFuture {
        let attempt = self.inner.call(args, ctx);
        let after = self.after;
        Box::pin(async move {
            tokio::time::timeout(after, attempt)
                .await
                .unwrap_or_else(|_| CallOutcome::timed_out(after))
        })
    }
}
