#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
// What a user cannot reach is not `pub`: the public face is what `lib.rs` exports.
#![warn(unreachable_pub)]

mod agent;
mod budget;
pub mod compaction;
pub mod config;
pub mod driver;
mod error;
pub mod event;
pub(crate) mod fingerprint;
pub mod gate;
pub mod guardrail;
pub mod hooks;
pub mod ids;
pub mod journal;
pub mod limits;
pub mod machine;
pub mod message;
pub mod model;
pub mod outcome;
mod panic;
pub mod printable;
mod retry;
mod serde_duration;
pub mod steering;
pub mod surrogates;
pub mod testing;
pub mod tool;
pub mod url_secrets;

// What an application uses; everything else is at its module's path.
pub use agent::{Agent, AgentBuilder, RunOptions, RunStream, STREAM_BACKLOG, Session, StreamItem};
pub use agent::{ask, handoff, permissions, session, subagent};
pub use error::{ErrorKind, RunError};
pub use event::{Backlog, Event, EventKind, EventSink};
pub use gate::Gate;
pub use hooks::Hook;
pub use limits::{Limits, OnLimit, Price, PriceTable};
pub use machine::Verdict;
pub use message::Message;
pub use model::{Model, ModelError, ModelResponse};
pub use outcome::{
    CallArguments, CallOutcome, CallStatus, RunOutcome, StopReason, SubagentRun, ToolCallRecord,
};
pub use retry::RetryPolicy;
pub use tokio_util::sync::CancellationToken;
pub use tool::{Tool, ToolContext, ToolError, ToolOutput, ToolSource};

#[cfg(feature = "macros")]
pub use agentloop_macros::tool;

/// Re-exports that `#[tool]` expansions use.
#[doc(hidden)]
pub mod __private {
    pub use schemars;
    pub use serde;
    pub use serde_json;
}
