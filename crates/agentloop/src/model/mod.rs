//! The model side of the loop: one small streaming trait, the request it receives, the events it
//! yields, and one accumulator that turns those events into a [`ModelResponse`].
//!
//! Every provider implements [`Model::stream`]; a non-streaming provider call is a stream of one
//! [`ModelEvent::Response`]. Policies (retry, fallback, timeouts) are models that wrap a model.

//!
//! - `mod.rs`: the trait, the request and its settings.
//! - `event.rs`: the events of a stream.
//! - `response.rs`: a whole response, its usage and finish reason.
//! - `accumulate.rs`: events into a response, the one accumulator.
//! - `error.rs`: how a call failed.
//! - `cache.rs`: the response cache, a model that wraps a model.
//! - `identity.rs`: what a model's answers depend on beyond the request, for the cache's key.

mod accumulate;
pub mod cache;
mod error;
mod event;
mod identity;
mod response;

use std::sync::Arc;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use accumulate::{Discarded, ResponseAccumulator, cut_by_the_limit};
pub use error::{ModelError, ModelErrorKind};
pub use event::{ModelEvent, ModelRetry, ModelStream};
pub use identity::CacheIdentity;
pub use response::{FinishReason, ModelResponse, Usage};

use crate::message::Message;
use crate::tool::ToolSpec;

/// A language model that the loop can call. Keep it small: one streaming call.
///
/// The request borrows the run's transcript, so a call never copies the conversation; an
/// implementation that needs owned data (an HTTP body) encodes it before its first `.await`.
pub trait Model: Send + Sync {
    /// The model's identifier, as used for pricing and in events (`gpt-4.1-mini`).
    fn id(&self) -> &str;

    /// The provider's name, for events and telemetry (`openai`, `anthropic`, `scripted`).
    fn provider(&self) -> &str {
        "unknown"
    }

    /// Starts one call. The stream ends after a [`ModelEvent::Finish`] or a
    /// [`ModelEvent::Response`], or with an error.
    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a>;

    /// This model for a durable run that resumes after `model_calls` answered calls, when its
    /// answers depend on how many calls came before (a script goes on at that step); `None`
    /// (the default) when the same model goes on. [`crate::Agent::resume`] asks it.
    fn resumed(&self, model_calls: usize) -> Option<Arc<dyn Model>> {
        let _ = model_calls;
        None
    }

    /// What this model's answer to `request` depends on beyond the request: the server it
    /// goes to and what it sends there (see [`CacheIdentity`]). A response cache keys by it, so
    /// that two models of one name at two servers never share answers. `None` (the default)
    /// when it cannot be told; a cache then keys by the provider's and model's names alone, and
    /// says so. A model that wraps models gives theirs.
    fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        let _ = request;
        None
    }

    /// True when this model, or one it wraps, keeps answers by the call that paid for them (a
    /// response cache, [`cache::CachedModel`]): the driver then makes each call as the run's
    /// numbered call ([`cache::as_call`]), which a model that keeps nothing does not pay for.
    /// `false` by default; a model that wraps models gives theirs.
    fn keeps_answers(&self) -> bool {
        false
    }
}

/// A model behind a pointer (`Arc`, `Box`) is that model: every method forwards, default or not,
/// so a wrapper never loses what the model overrides.
macro_rules! forward_model {
    ($($pointer:ident),+) => {$(
        impl<M: Model + ?Sized> Model for $pointer<M> {
            fn id(&self) -> &str {
                (**self).id()
            }
            fn provider(&self) -> &str {
                (**self).provider()
            }
            fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
                (**self).stream(request)
            }
            fn resumed(&self, model_calls: usize) -> Option<Arc<dyn Model>> {
                (**self).resumed(model_calls)
            }
            fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
                (**self).cache_identity(request)
            }
            fn keeps_answers(&self) -> bool {
                (**self).keeps_answers()
            }
        }
    )+};
}

forward_model!(Arc, Box);

/// Calls a model and collects its stream into one response, without emitting deltas anywhere.
pub async fn complete(
    model: &dyn Model,
    request: ModelRequest<'_>,
) -> Result<ModelResponse, ModelError> {
    let mut stream = model.stream(request);
    let mut acc = ResponseAccumulator::new();
    while let Some(event) = stream.next().await {
        acc.push(event?)?;
    }
    acc.finish()
}

/// Everything a model call needs. It borrows from the run, so building one copies nothing.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The system instructions, if any.
    pub instructions: Option<&'a str>,
    /// The transcript so far, oldest first.
    pub messages: &'a [Message],
    /// The tools the model may call.
    pub tools: &'a [ToolSpec],
    /// The JSON Schema the final answer must match, if any.
    pub output_schema: Option<&'a Value>,
    /// Sampling and output settings.
    pub settings: &'a ModelSettings,
}

/// Settings sent with every model call. `None` leaves the provider's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Seed for providers that support reproducible sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// The most tokens one response may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Whether the model may call several tools in one response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// How the model must choose tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

/// How the model must choose tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Tool(String),
}

/// A whole response as the events a provider would stream: its text in pieces, its tool calls
/// as starts and argument pieces, its usage, its finish (a scripted model's deltas, a cached
/// answer's replay).
pub(crate) fn replay_events(response: &ModelResponse) -> Vec<Result<ModelEvent, ModelError>> {
    let mut events = vec![Ok(ModelEvent::Start {
        id: response.id.clone(),
        model: response.model.clone(),
    })];
    for r in &response.message.reasoning {
        events.push(Ok(ModelEvent::ReasoningDelta(r.text.clone())));
        events.push(Ok(ModelEvent::Reasoning(r.clone())));
    }
    let mut rest = response.message.text.as_str();
    while !rest.is_empty() {
        let cut = rest
            .char_indices()
            .find(|(i, c)| *i > 0 && c.is_whitespace())
            .map_or(rest.len(), |(i, _)| i);
        let (piece, tail) = rest.split_at(cut);
        events.push(Ok(ModelEvent::TextDelta(piece.to_owned())));
        rest = tail;
    }
    for (i, call) in response.message.tool_calls.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        events.push(Ok(ModelEvent::ToolCallStart {
            index,
            id: call.call_id.clone(),
            name: call.tool.clone(),
        }));
        events.push(Ok(ModelEvent::ToolCallDelta {
            index,
            arguments: call.arguments.clone(),
        }));
    }
    events.push(Ok(ModelEvent::Usage(response.usage)));
    events.push(Ok(ModelEvent::Finish {
        reason: response.finish_reason,
        raw: response.raw_finish_reason.clone(),
    }));
    events
}
