//! Model providers for agentloop: OpenAI Chat Completions (and every server that speaks it),
//! the OpenAI Responses API and Anthropic Messages, each implementing [`agentloop::Model`],
//! plus the policies that wrap any model: retry and fallback, and a default price table.
//!
//! Providers never retry internally: wrap a provider in one retry layer (and, if you like, a
//! fallback over several retried models).
//!
//! Where things are:
//! - `http.rs`: client settings, the API key, the JSON POST with its byte budget;
//!   `error.rs`: how a failed call becomes a classified [`agentloop::ModelError`];
//!   `gist.rs`: what a body that is not the API's JSON is, in a few words, for its error;
//!   `content_coding.rs`: a body compressed though the request asked for none, decoded;
//!   `sse.rs`: the event-stream reader and the one `sse()` every streamed call goes through.
//! - `decode.rs`: the `StreamDecoder` each provider implements, and the one path from an HTTP
//!   answer (streamed or whole) through the decoder and the core's accumulator;
//!   `wire_text.rs`: delta strings whose JSON escapes split a character between two events;
//!   `surrogates.rs`: bodies and events whose escapes hold a lone half of a character, read with
//!   it as U+FFFD instead of failing (the core's repair; an event's delta keeps its halves).
//! - `openai_chat/`, `openai_responses/`, `anthropic/`: per provider, `mod.rs` (the model and its
//!   builder), `request.rs` (the request body) and `stream.rs` (its answers, streamed or whole,
//!   with usage converted to what [`agentloop::model::Usage`] means on every provider).
//! - `layer/`: [`Retry`] and [`Fallback`]; `pricing.rs`: [`default_prices`].
#![forbid(unsafe_code)]
// Built without any provider feature, the shared plumbing (decoding helpers, the builder macro)
// has no user; that build is for the layers and pricing alone.
#![cfg_attr(
    not(any(
        feature = "openai",
        feature = "anthropic",
        feature = "openai-responses"
    )),
    allow(dead_code, unused_macros)
)]

mod content_coding;
#[cfg(any(
    feature = "openai",
    feature = "anthropic",
    feature = "openai-responses"
))]
mod decode;
#[cfg(any(feature = "openai", feature = "openai-responses"))]
mod digest;
pub mod error;
mod gist;
pub mod http;
mod layer;
pub mod pricing;
pub mod sse;
mod surrogates;
#[cfg(any(
    feature = "openai",
    feature = "anthropic",
    feature = "openai-responses"
))]
mod wire_text;

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(feature = "openai")]
pub mod openai_chat;
#[cfg(feature = "openai-responses")]
pub mod openai_responses;

pub use http::{ANTHROPIC_API_KEY_ENV, HttpConfig, OPENAI_API_KEY_ENV};
pub use layer::fallback::Fallback;
pub use layer::retry::{Retry, RetryPolicy};
pub use pricing::default_prices;

#[cfg(feature = "openai")]
pub use openai_chat::OpenAiChat;
