#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod client;
pub mod guard;
mod server;
mod task;
mod wire;

pub use client::{A2aClient, AgentCard, DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_OUTPUT_BYTES};
pub use server::{A2aServer, serve};
pub use task::{
    BuildAgent, ClaimRun, DEFAULT_ANSWER_TIMEOUT, DEFAULT_MAX_RUNS, ReleaseRun, RunOptionsFor,
    ServedAgent,
};
pub use wire::{PROTOCOL_VERSION, TaskState};

/// Why an A2A request failed, with its JSON-RPC code (A2A's own codes where it has one).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum A2aError {
    /// The body is not JSON.
    #[error("the request is not JSON: {reason}")]
    Parse {
        /// Why.
        reason: String,
    },
    /// The request is not a JSON-RPC 2.0 request.
    #[error("not a JSON-RPC 2.0 request: {reason}")]
    InvalidRequest {
        /// Why.
        reason: String,
    },
    /// The method is not one this server serves.
    #[error("no method {method:?}")]
    MethodNotFound {
        /// The method asked for.
        method: String,
    },
    /// The parameters do not fit the method.
    #[error("invalid params: {reason}")]
    InvalidParams {
        /// Why.
        reason: String,
    },
    /// No task has this id.
    #[error("no task {id:?}")]
    TaskNotFound {
        /// The id.
        id: String,
    },
    /// The task has ended: it cannot be cancelled.
    #[error("the task {id:?} has ended ({state}) and cannot be cancelled")]
    TaskNotCancelable {
        /// The id.
        id: String,
        /// Its state.
        state: TaskState,
    },
    /// The agent could not be built for the run.
    #[error("the agent could not be started: {reason}")]
    Internal {
        /// Why.
        reason: String,
    },
    /// A remote agent's card could not be read.
    #[error("cannot read the agent card of {url}: {reason}")]
    Card {
        /// The agent's URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server runs as many tasks as it may at once: the message starts none.
    #[error(
        "the server is running its most tasks at once ({most}); send the message again when one ends"
    )]
    Busy {
        /// The most runs at once.
        most: usize,
    },
    /// The request speaks a version of the protocol this server does not (`A2A-Version`; none
    /// is 0.3): it serves 1.x.
    #[error("A2A version {version} is not served here: send `A2A-Version: 1.0`")]
    VersionNotSupported {
        /// The version the request named.
        version: String,
    },
    /// The server stopped while a caller waited for its task to settle (`SendMessage` without
    /// `returnImmediately`).
    #[error(
        "the server stopped while task {id} was working: {}",
        if *journaled {
            "its run is journaled and goes on when the server starts again (GetTask)"
        } else {
            "its run ended with the server"
        }
    )]
    Stopped {
        /// The task.
        id: String,
        /// Its run is journaled: it goes on after a restart.
        journaled: bool,
    },
    /// The address could not be served.
    #[error("cannot serve A2A: {reason}")]
    Serve {
        /// Why.
        reason: String,
    },
}

impl A2aError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            A2aError::Parse { .. } => "a2a.parse",
            A2aError::InvalidRequest { .. } => "a2a.invalid_request",
            A2aError::MethodNotFound { .. } => "a2a.method_not_found",
            A2aError::InvalidParams { .. } => "a2a.invalid_params",
            A2aError::TaskNotFound { .. } => "a2a.task_not_found",
            A2aError::TaskNotCancelable { .. } => "a2a.task_not_cancelable",
            A2aError::Internal { .. } => "a2a.internal",
            A2aError::Serve { .. } => "a2a.serve",
            A2aError::Busy { .. } => "a2a.busy",
            A2aError::Card { .. } => "a2a.card",
            A2aError::VersionNotSupported { .. } => "a2a.version_not_supported",
            A2aError::Stopped { .. } => "a2a.stopped",
        }
    }

    /// The JSON-RPC error code the protocol gives it.
    pub fn rpc_code(&self) -> i64 {
        match self {
            A2aError::Parse { .. } => -32700,
            A2aError::InvalidRequest { .. } => -32600,
            A2aError::MethodNotFound { .. } => -32601,
            A2aError::InvalidParams { .. } => -32602,
            A2aError::TaskNotFound { .. } => -32001,
            A2aError::TaskNotCancelable { .. } => -32002,
            A2aError::VersionNotSupported { .. } => -32009,
            // JSON-RPC's range for a server's own errors; the protocol names none for this.
            A2aError::Busy { .. } => -32000,
            // Not -32000 (busy), which a client may answer by sending the message again.
            A2aError::Internal { .. }
            | A2aError::Serve { .. }
            | A2aError::Card { .. }
            | A2aError::Stopped { .. } => -32603,
        }
    }
}
