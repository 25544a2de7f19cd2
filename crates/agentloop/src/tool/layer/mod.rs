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

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::{ToolContext, ToolHandler, ToolSpec};
use crate::outcome::CallOutcome;

mod catch_panic;
mod retry;
mod spawn;
mod timeout;

pub(crate) use catch_panic::panic_message;
use catch_panic::{CatchPanic, catch_panic};
use retry::{Retry, tool_retries};
use spawn::OwnTask;
use timeout::Timeout;

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
            policy: tool_retries(spec.retries),
        });
    }
    Layered::Wrapped(call)
}
