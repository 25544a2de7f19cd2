//! The events of a model's stream.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;

use super::{FinishReason, ModelError, ModelResponse, Usage};
use crate::message::{Reasoning, ToolCall};

/// The stream a model call yields.
pub type ModelStream<'a> = Pin<Box<dyn Stream<Item = Result<ModelEvent, ModelError>> + Send + 'a>>;

/// One event of a model's stream. New events are added as the APIs gain them (`Retrying` was),
/// so a consumer of a stream matches them with a wildcard arm.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ModelEvent {
    /// The provider's response id and the model that answered, when known.
    Start {
        /// The provider's id for the response.
        id: Option<String>,
        /// The model that answered.
        model: Option<String>,
    },
    /// A piece of visible text.
    TextDelta(String),
    /// A piece of reasoning text.
    ReasoningDelta(String),
    /// A complete reasoning block (with its signature or provider data). It replaces the
    /// reasoning text streamed since the last complete block.
    Reasoning(Reasoning),
    /// A tool call begins at `index` (the provider's own position key).
    ToolCallStart {
        /// The provider's position key for the call.
        index: u32,
        /// The call id (may be empty; one is generated then). An `Arc`: a decoder makes it from
        /// the wire's text once, and the call, its record and the run's set of ids share it.
        id: Arc<str>,
        /// The tool's name (inline when short: a decoder reads it without an allocation).
        name: crate::message::SmolStr,
    },
    /// A piece of a tool call's raw argument string.
    ToolCallDelta {
        /// The provider's position key for the call.
        index: u32,
        /// The piece of the JSON argument string.
        arguments: String,
    },
    /// A whole tool call in one event.
    ToolCall(ToolCall),
    /// The usage so far: it replaces what an earlier usage event said.
    Usage(Usage),
    /// Something odd but recoverable the provider noticed.
    Warning(String),
    /// The answer did not come from the model this time: it was kept by a response cache
    /// ([`crate::model::cache`]).
    Cached,
    /// The response is complete.
    Finish {
        /// Why the model stopped.
        reason: FinishReason,
        /// The provider's own word for it.
        raw: Option<String>,
    },
    /// A whole response at once (the non-streaming path, and scripted models).
    Response(ModelResponse),
    /// The attempt streamed so far failed and the call starts over (a retry or a fallback
    /// layer): everything of the attempt before this event is void, and the response is the
    /// one the events after it make. Boxed: it is rare, and inline its error would grow every
    /// event of every stream.
    Retrying(Box<ModelRetry>),
}

/// An abandoned attempt of a model call, as [`ModelEvent::Retrying`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRetry {
    /// The retry about to run (1 for the first).
    pub retry: u32,
    /// The model the next attempt asks (a fallback's next model, else the same one).
    pub model: String,
    /// Why the attempt was abandoned.
    pub error: ModelError,
    /// The wait before the next attempt.
    pub delay: Duration,
    /// The tokens the provider reported for the abandoned attempt, if it reported any: they
    /// count toward the call's usage beside the answer's own.
    pub usage: Option<Usage>,
}
