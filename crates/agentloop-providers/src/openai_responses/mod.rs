//! The OpenAI Responses API (`POST /responses`): request encoding from the provider-neutral
//! transcript, a pure stream parser that turns its server-sent events into
//! [`ModelEvent`](agentloop::model::ModelEvent)s, and the [`OpenAiResponses`] model that sends requests
//! through the shared HTTP client.
//!
//! Nothing is stored server-side by default (`store: false`), so each request carries the whole
//! conversation: `function_call` items and their `function_call_output`s by `call_id`, and the
//! reasoning items of earlier turns, kept whole (id and encrypted content) in
//! [`Reasoning::provider_data`](agentloop::message::Reasoning::provider_data).
//!
//! The module's files: `request.rs` encodes the request, `stream.rs` reads answers (streamed or
//! whole) into events.

mod request;
mod stream;

use agentloop::{
    Model, ModelError,
    model::{CacheIdentity, ModelRequest, ModelStream},
};

use crate::decode::post_and_decode;
use crate::error::samples;
use crate::http::{AuthStyle, HttpClient, HttpConfig, KeySource, OPENAI_API_KEY_ENV};

pub use stream::{ResponsesStreamParser, parse_response, parse_stream_bytes};

const PROVIDER: &str = "openai";
/// The default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A model served by the OpenAI Responses API.
#[derive(Debug, Clone)]
pub struct OpenAiResponses {
    model: String,
    client: HttpClient,
    options: Options,
}

#[derive(Debug, Clone)]
struct Options {
    stream: bool,
    store: bool,
    reasoning_effort: Option<String>,
    reasoning_summary: Option<String>,
    encrypted_reasoning: Option<bool>,
}

/// Builds an [`OpenAiResponses`] model. Setters never fail; [`OpenAiResponsesBuilder::build`]
/// reports problems.
#[derive(Debug, Clone)]
#[must_use]
pub struct OpenAiResponsesBuilder {
    model: String,
    config: HttpConfig,
    options: Options,
}

impl OpenAiResponses {
    /// A builder for this model id (`gpt-5-mini`), with the key read from `OPENAI_API_KEY`.
    pub fn builder(model: impl Into<String>) -> OpenAiResponsesBuilder {
        let mut config = HttpConfig::new(DEFAULT_BASE_URL);
        config.key = KeySource::Env(OPENAI_API_KEY_ENV.to_owned());
        config.auth = AuthStyle::Bearer;
        OpenAiResponsesBuilder {
            model: model.into(),
            config,
            options: Options {
                stream: true,
                store: false,
                reasoning_effort: None,
                reasoning_summary: None,
                encrypted_reasoning: None,
            },
        }
    }
}

impl OpenAiResponsesBuilder {
    crate::http::http_builder_methods!();

    /// Streams responses (the default) or asks for whole ones.
    pub fn stream(mut self, stream: bool) -> Self {
        self.options.stream = stream;
        self
    }

    /// Lets OpenAI store responses (default `false`).
    pub fn store(mut self, store: bool) -> Self {
        self.options.store = store;
        self
    }

    /// The reasoning effort (`minimal`, `low`, `medium`, `high`).
    pub fn reasoning_effort(mut self, effort: impl Into<String>) -> Self {
        self.options.reasoning_effort = Some(effort.into());
        self
    }

    /// Asks for reasoning summaries (`auto`, `concise`, `detailed`).
    pub fn reasoning_summary(mut self, summary: impl Into<String>) -> Self {
        self.options.reasoning_summary = Some(summary.into());
        self
    }

    /// Whether to request `reasoning.encrypted_content` when `store` is false. By default it is
    /// requested for reasoning models (a reasoning effort set, or an `o*`/`gpt-5*`/`codex*` id
    /// that is not a `-chat` snapshot such as `gpt-5-chat-latest`); models without reasoning
    /// reject it.
    pub fn encrypted_reasoning(mut self, include: bool) -> Self {
        self.options.encrypted_reasoning = Some(include);
        self
    }

    /// Builds the model.
    pub fn build(self) -> Result<OpenAiResponses, ModelError> {
        let client = HttpClient::new(self.config, PROVIDER)?;
        Ok(OpenAiResponses {
            model: self.model,
            client,
            options: self.options,
        })
    }
}

impl Model for OpenAiResponses {
    fn id(&self) -> &str {
        &self.model
    }

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let body = self.encode_request(&request);
        let decoder = ResponsesStreamParser::new();
        // The Responses API takes no seed: the server draws its own.
        let sampled = samples(request.settings.temperature, None);
        post_and_decode(
            &self.client,
            "/responses",
            body,
            decoder,
            self.options.stream,
            sampled,
        )
    }
    /// The server's URL and headers and the body this request encodes to (reasoning options,
    /// `store`, encrypted reasoning are all in it).
    fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        let body = self.encode_request(request).ok()?;
        Some(self.client.cache_identity("/responses", &body))
    }
}
