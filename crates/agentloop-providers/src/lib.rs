//! Model providers for agentloop: OpenAI Chat Completions (and every server that speaks it),
//! the OpenAI Responses API and Anthropic Messages, each implementing [`agentloop::Model`],
//! plus the policies that wrap any model: retry and fallback, and a default price table.
//!
//! Providers never retry internally: wrap a provider in one retry layer (and, if you like, a
//! fallback over several retried models).
#![forbid(unsafe_code)]
// `agentloop::ModelError` (the core's type) is 168 bytes; every provider function returns it, and
// boxing it is the core's decision, not ours.
#![allow(clippy::result_large_err)]

#[cfg(any(
    feature = "openai",
    feature = "anthropic",
    feature = "openai-responses"
))]
mod decode;
pub mod error;
pub mod fallback;
pub mod http;
pub mod pricing;
pub mod retry;
pub mod sse;

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(feature = "openai")]
pub mod openai_chat;
#[cfg(feature = "openai-responses")]
pub mod openai_responses;

pub use fallback::Fallback;
pub use http::{ANTHROPIC_API_KEY_ENV, HttpConfig, OPENAI_API_KEY_ENV};
pub use pricing::default_prices;
pub use retry::{Retry, RetryPolicy};

#[cfg(feature = "openai")]
pub use openai_chat::OpenAiChat;
