//! Model providers for agentloop: OpenAI Chat Completions (and every server that speaks it),
//! the OpenAI Responses API and Anthropic Messages, each implementing [`agentloop::Model`],
//! plus the policies that wrap any model: retry and fallback, and a default price table.
//!
//! Providers never retry internally: wrap a provider in one retry layer (and, if you like, a
//! fallback over several retried models).
#![forbid(unsafe_code)]

pub mod http;
#[cfg(any(feature = "anthropic", feature = "openai-responses"))]
mod stream;
pub mod pricing;

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(feature = "openai-responses")]
pub mod openai_responses;

pub use http::HttpConfig;
pub use pricing::default_prices;
