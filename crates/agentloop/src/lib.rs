#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod agent;
mod config;
pub mod driver;
mod error;
mod event;
mod gate;
mod guardrail;
mod hooks;
mod ids;
mod limits;
pub mod machine;
mod message;
pub mod model;
mod outcome;
mod permissions;
mod serde_duration;
mod steering;
pub mod testing;
pub mod tool;

pub use agent::{Agent, AgentBuilder, RunOptions, RunStream, Session, StreamItem};
pub use config::{AgentConfig, DecisionPolicy, OnInvalidCall, OnToolPanic};
pub use error::{ErrorKind, RunError};
pub use event::{ErrorSummary, Event, EventKind, EventSink};
pub use gate::{Gate, GateContext};
pub use guardrail::{Guardrail, guardrail_fn};
pub use hooks::{
    Hook, HookContext, HookError, HookResult, HookRole, RequestChanges, RunState, StopWhen,
    ToolCallDecision, ToolCallView,
};
pub use ids::{IdSource, SequentialIds, UuidIds};
pub use limits::{LimitHit, LimitKind, Limits, OnLimit, Price, PriceTable, Pricing};
pub use machine::Verdict;
pub use message::{
    AssistantMessage, ContentPart, Message, Reasoning, ToolCall, ToolContent, ToolResult,
};
pub use model::{
    FinishReason, Model, ModelError, ModelErrorKind, ModelEvent, ModelRequest, ModelResponse,
    ModelSettings, ModelStream, ResponseAccumulator, ToolChoice, Usage,
};
pub use outcome::{CallOutcome, CallStatus, RunOutcome, StopReason, ToolCallRecord, codes};
pub use permissions::{
    Answer, ApprovalPrompter, ApprovalRequest, ArgumentMatch, FixedAnswer, Permission,
    PermissionGate, PermissionRule, PermissionStore, PermissionStoreError, SaveRules,
};
pub use steering::{Delivery, Steering};
pub use testing::{FunctionModel, ScriptStep, ScriptedModel};
pub use tokio_util::sync::CancellationToken;
pub use tool::{
    ExecutionMode, IntoToolOutput, ProgressSender, Tool, ToolBuilder, ToolContext, ToolError,
    ToolHandler, ToolOutput, ToolSet, ToolSpec,
};

#[cfg(feature = "macros")]
pub use agentloop_macros::tool;

/// Re-exports that `#[tool]` expansions use.
#[doc(hidden)]
pub mod __private {
    pub use schemars;
    pub use serde;
    pub use serde_json;
}
