//! How a call and a run ended. A run's outcome always keeps the transcript, usage, cost, counts
//! and every tool outcome so far, whatever stopped the run; [`RunOutcome::into_result`] turns a
//! non-finished outcome into an error for callers who want that.
//!
//! - `call.rs`: the call's vocabulary, which the tool layer and the machine share.
//! - `run.rs`: the run's, which only the machine builds.

mod call;
mod run;

pub use call::{CallArguments, CallOutcome, CallStatus, SubagentRun, ToolCallRecord, codes};
pub(crate) use run::{OVER_BUDGET, journal_failed_at_end};
pub use run::{RunOutcome, StopReason};
