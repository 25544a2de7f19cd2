//! What agentloop's observers share, without a database or an exporter: the trace writer
//! (`agentloop-store`), the OpenTelemetry exporter (`agentloop-otel`) and the CLI's terminal all
//! build on it.
//!
//! - [`Tracker`] turns a stream of events into the lifecycle of runs, turns, model calls and tool
//!   calls (parents, orphans, superseded calls, what a run leaves open), and a [`Render`] makes
//!   each observer's spans from it (see [`tracker`]).
//! - [`redact()`] and [`redact_text`] take credentials out of recorded payloads (see
//!   [`mod@redact`]).
#![forbid(unsafe_code)]

pub mod redact;
pub mod tracker;

pub use tracker::{Render, Tracked, Tracker};

pub use redact::{redact, redact_text};
