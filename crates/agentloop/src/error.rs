//! The errors of a run, each with a stable code.
//!
//! | code | meaning |
//! |---|---|
//! | `decision.invalid` | the model's decision broke a rule that cannot be fed back (blank, overlong or duplicate call id), or policy made an unknown tool or invalid arguments fatal |
//! | `tool.invalid_name`, `tool.duplicate`, `tool.invalid_schema` | a tool could not be registered |
//! | `config.unpriced_model` | `max_cost_usd` is set for a model the pricing cannot price: refused before any model call |
//! | `limit.reached` | a limit stopped the run (which limit, bound, consumed, requested) |
//! | `limit.cost_unknown` | `max_cost_usd` is set and an answer's cost is unknown (the pricing has no price for the model that answered): the run stopped before spending more |
//! | `model.*` | a model call failed: see [`crate::model::ModelErrorKind::code`]; also an answer cut off (`model.truncated`), refused (`model.refused`) or filtered (`model.content_filter`), or a turn the provider kept paused (`model.paused`) |
//! | `tool.fatal` | a tool failed fatally |
//! | `tool.panicked` | a tool handler panicked |
//! | `run.cancelled` | the run was cancelled |
//! | `run.deadline` | the run's deadline passed |
//! | `output.invalid` | the final answer did not match the output schema after the retries |
//! | `hook.failed` | a hook failed |
//! | `guardrail.tripped` | a guardrail tripped |
//! | `journal.write` | a durable run's journal could not be written: the run stopped, and resumes from its last written step |
//! | `run.other` | anything else |

use serde::Serialize;

use crate::limits::LimitHit;
use crate::model::ModelError;
use crate::tool::ToolDefinitionError;

/// Why a run failed, or what stopped it, as an error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The decision broke a rule that cannot be fed back to the model.
    #[error("invalid decision: {reason}")]
    InvalidDecision {
        /// What was wrong.
        reason: String,
    },
    /// A tool could not be registered.
    #[error(transparent)]
    InvalidToolDefinition(#[from] ToolDefinitionError),
    /// `max_cost_usd` is set, but the agent's pricing has no price for its model, so the budget
    /// could never hold. Refused by [`crate::AgentBuilder::build`], or at the start of a run
    /// whose own limits set the budget, before any model call.
    #[error(
        "max_cost_usd is set but the model {model:?} (provider {provider}) has no price: give the \
         agent a pricing that prices it, e.g. a PriceTable with an entry for {model:?} \
         (Price::new(input, output), USD per million tokens)"
    )]
    UnpricedModel {
        /// The model's id.
        model: String,
        /// The provider's name.
        provider: String,
    },
    /// A limit stopped the run.
    #[error("limit reached: {0}")]
    LimitReached(LimitHit),
    /// `max_cost_usd` is set and an answer's cost is unknown (the pricing has no price for the
    /// model that answered), so the budget can no longer be held: the run stopped before
    /// anything more was spent.
    #[error(
        "the cost of an answer of the model {model:?} is unknown (the pricing has no price for \
         it), so max_cost_usd cannot be held: the run stopped before spending more"
    )]
    CostUnknown {
        /// The model that answered, as it named itself (empty when it did not).
        model: String,
    },
    /// A model call failed.
    #[error("model error: {0}")]
    Model(#[from] ModelError),
    /// A tool failed fatally.
    #[error("tool {tool} (call {call_id}) failed fatally: {message}")]
    ToolFatal {
        /// The tool.
        tool: String,
        /// The call id.
        call_id: String,
        /// The diagnostic.
        message: String,
    },
    /// A tool handler panicked.
    #[error("tool {tool} (call {call_id}) panicked: {message}")]
    ToolPanicked {
        /// The tool.
        tool: String,
        /// The call id.
        call_id: String,
        /// The panic message.
        message: String,
    },
    /// The run was cancelled.
    #[error("the run was cancelled")]
    Cancelled,
    /// The deadline passed.
    #[error("the run's deadline passed after {elapsed_ms} ms")]
    Deadline {
        /// Elapsed time when it stopped.
        elapsed_ms: u64,
    },
    /// The final answer failed its schema after the retries.
    #[error("the final answer does not match the output schema: {message}")]
    OutputInvalid {
        /// The violations.
        message: String,
    },
    /// A hook failed.
    #[error("hook {hook} failed: {message}")]
    Hook {
        /// The hook's name.
        hook: String,
        /// Its message.
        message: String,
    },
    /// A guardrail tripped.
    #[error("guardrail {name} tripped: {message}")]
    Guardrail {
        /// The guardrail's name.
        name: String,
        /// Its message.
        message: String,
    },
    /// A durable run's journal could not be written; the run stopped at its last written step.
    #[error("the run's journal could not be written: {message}")]
    Journal {
        /// What went wrong.
        message: String,
    },
    /// Anything else.
    #[error("{message}")]
    Other {
        /// The message.
        message: String,
    },
}

impl RunError {
    /// The stable code (see the module's table).
    pub fn code(&self) -> &'static str {
        match self {
            RunError::InvalidDecision { .. } => "decision.invalid",
            RunError::InvalidToolDefinition(e) => e.code(),
            RunError::UnpricedModel { .. } => "config.unpriced_model",
            RunError::LimitReached(_) => "limit.reached",
            RunError::CostUnknown { .. } => "limit.cost_unknown",
            RunError::Model(e) => e.code(),
            RunError::ToolFatal { .. } => "tool.fatal",
            RunError::ToolPanicked { .. } => "tool.panicked",
            RunError::Cancelled => "run.cancelled",
            RunError::Deadline { .. } => "run.deadline",
            RunError::OutputInvalid { .. } => "output.invalid",
            RunError::Hook { .. } => "hook.failed",
            RunError::Guardrail { .. } => "guardrail.tripped",
            RunError::Journal { .. } => "journal.write",
            RunError::Other { .. } => "run.other",
        }
    }

    /// The broad kind, for callers (and the CLI's exit codes) to match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RunError::InvalidDecision { .. } | RunError::OutputInvalid { .. } => {
                ErrorKind::Decision
            }
            RunError::InvalidToolDefinition(_) | RunError::UnpricedModel { .. } => {
                ErrorKind::Definition
            }
            RunError::LimitReached(_)
            | RunError::CostUnknown { .. }
            | RunError::Deadline { .. } => ErrorKind::Limit,
            RunError::Model(_) => ErrorKind::Model,
            RunError::ToolFatal { .. } | RunError::ToolPanicked { .. } => ErrorKind::Tool,
            RunError::Cancelled => ErrorKind::Cancelled,
            RunError::Hook { .. }
            | RunError::Guardrail { .. }
            | RunError::Journal { .. }
            | RunError::Other { .. } => ErrorKind::Other,
        }
    }

    /// The message without the code in front (for displays that show the code beside it).
    pub fn message(&self) -> String {
        match self {
            RunError::Model(e) => e.message.clone(),
            other => other.to_string(),
        }
    }

    /// The model error, if a model call failed.
    pub fn as_model_error(&self) -> Option<&ModelError> {
        match self {
            RunError::Model(e) => Some(e),
            _ => None,
        }
    }
}

/// The broad kind of a [`RunError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The model's decision or answer was invalid.
    Decision,
    /// The agent's definition was invalid: a tool, or a cost budget for an unpriced model.
    Definition,
    /// A limit or the deadline.
    Limit,
    /// The model or its provider.
    Model,
    /// A tool failed fatally.
    Tool,
    /// Cancelled.
    Cancelled,
    /// Anything else.
    Other,
}
