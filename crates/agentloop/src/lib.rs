#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod agent;
pub mod error;
pub mod event;
pub mod guardrail;
pub mod hooks;
pub mod ids;
pub mod limits;
pub mod machine;
pub mod message;
pub mod model;
pub mod outcome;
pub mod permissions;
pub mod scripted;
mod serde_duration;
pub mod steering;
pub mod tool;

pub use agent::{Agent, AgentBuilder, BatchGate, RunOptions, RunStream, Session, StreamItem};
pub use error::{ErrorKind, RunError};
pub use event::{Event, EventKind, EventSink};
pub use guardrail::{Guardrail, guardrail_fn};
pub use hooks::{
    Hook, HookContext, HookError, HookResult, HookRole, RequestChanges, ToolCallDecision,
    ToolCallView,
};
pub use ids::{IdSource, SequentialIds, UuidIds};
pub use limits::{LimitHit, LimitKind, Limits, Price, PriceTable, Pricing};
pub use machine::{
    Action, AdmittedCall, AgentConfig, Batch, CallOutcome, CallResult, DecisionPolicy,
    OnInvalidCall, RunMachine,
};
pub use message::{
    AssistantMessage, ContentPart, Message, Reasoning, ToolCall, ToolContent, ToolResult,
};
pub use model::{
    FinishReason, Model, ModelError, ModelErrorKind, ModelEvent, ModelRequest, ModelResponse,
    ModelSettings, ModelStream, ResponseAccumulator, ToolChoice, Usage,
};
pub use outcome::{CallStatus, RunOutcome, StopReason, ToolCallRecord};
pub use permissions::{
    Answer, ApprovalPrompter, ApprovalRequest, ArgumentMatch, FixedAnswer, Permission,
    PermissionGate, PermissionRule, PermissionStore,
};
pub use scripted::{FunctionModel, ScriptStep, ScriptedModel};
pub use steering::{Delivery, Steering};
pub use tokio_util::sync::CancellationToken;
pub use tool::{
    ExecutionMode, IntoToolOutput, ProgressSender, SchemaViolation, Tool, ToolBuilder, ToolContext,
    ToolDefinitionError, ToolError, ToolHandler, ToolOutput, ToolSet, ToolSpec, schema_for,
    tool_retry_delay,
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
