//! OpenAI Chat Completions, and every server that speaks it (DeepSeek, Groq, xAI, OpenRouter,
//! Gemini's and Anthropic's compatible endpoints, Ollama, vLLM, llama.cpp's server).
//!
//! The wire types are our own serde structs. Requests borrow from the run's transcript; stream
//! chunks are read into borrowing structs (no `Value` tree per chunk). The stream parser is a
//! pure [`ChatStreamParser`] that the live path, [`parse_stream_bytes`] (fuzzing, benchmarks) and
//! the tests all share.
//!
//! Rules that are ours to pick, documented here:
//! - `max_tokens` is sent as `max_completion_tokens` when the provider name is `openai` (the
//!   reasoning models require it) and as `max_tokens` for every other provider name, which is what
//!   compatible servers understand. [`OpenAiChatBuilder::max_tokens_field`] overrides it.
//! - A stream that ends without a `finish_reason` and without `[DONE]` is an error, never a half
//!   response. `[DONE]` without a `finish_reason` finishes the response with a warning.
//! - The `Finish` event is held until the stream ends, so the trailing usage chunk
//!   (`stream_options.include_usage`, whose `choices` is empty) is read before it.
//!
//! The module's files: `request.rs` encodes the request, `strict.rs` adapts schemas to strict
//! mode, `stream.rs` reads answers (streamed or whole) into events.

mod dialect;
mod open_json;
mod request;
mod stream;
mod strict;

use agentloop::{
    Model, ModelError,
    model::{CacheIdentity, ModelRequest, ModelStream},
};

use crate::decode::post_and_decode;
use crate::error::samples;
use crate::http::{HttpClient, HttpConfig, KeySource};

pub use dialect::ToolDialect;
pub use stream::{ChatStreamParser, map_finish_reason, parse_completion, parse_stream_bytes};
pub use strict::strict_schema;

/// The default base URL.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub use crate::http::OPENAI_API_KEY_ENV;

/// Which request field carries the output token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_completion_tokens` (OpenAI; required by its reasoning models).
    MaxCompletionTokens,
    /// `max_tokens` (compatible servers).
    MaxTokens,
}

/// The small, named departures of compatible servers from OpenAI's own API that the one Chat
/// Completions adapter handles. [`OpenAiCompat::for_model`] picks them for a model family; the
/// builder (and the agent file's `[model]` keys) override them.
///
/// Departures that a correct reader handles for every server need no option: tool calls keyed by
/// id when a server reuses or leaves out `index`, `content` as a list of typed parts, arguments
/// sent as an object, an answer whose framing differs from the one asked for, an error inside a
/// 200 answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiCompat {
    /// Send earlier reasoning back as `reasoning_content` on assistant messages (on every one,
    /// empty when the turn had none): DeepSeek's thinking mode answers 400 without it once tools
    /// are in play, and V4 for any assistant message that lacks it; OpenAI does not accept it.
    pub reasoning_content: bool,
    /// Send a tool call's `extra_content` back on it (Gemini's thought signatures, without which
    /// its endpoint answers 400). Only a server that sent one gets it back.
    pub tool_call_extra: bool,
    /// The `prompt_cache_key` sent with each request, where the API accepts one (OpenAI's).
    pub prompt_cache_key: PromptCacheKey,
    /// Tool calls in plain text, for a model served without a tool-call parser: the tools go in
    /// the prompt, the calls are read out of the text. Off unless set.
    pub tool_dialect: Option<ToolDialect>,
    /// Send each call id as Mistral's API and its models' chat templates take one, nine letters
    /// or digits: an id of another shape (another provider's `call_...`, one the run gave a call
    /// that came without) goes as a digest of it, the same on the call and on its result. Without
    /// it they answer 400 "Tool call id was ... but must be a-z, A-Z, 0-9, with a length of 9".
    /// On for Mistral's host and its models' names.
    pub mistral_call_ids: bool,
}

/// What `prompt_cache_key` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptCacheKey {
    /// None is sent (compatible servers, which may reject the field).
    Off,
    /// A key derived from the model, the instructions and the tools: requests of one agent share
    /// it, so OpenAI routes them to the same cache.
    Derived,
    /// This key.
    Fixed(String),
}

impl OpenAiCompat {
    /// The options for `model` served at `base_url` under the provider name `provider`.
    pub fn for_model(provider: &str, base_url: &str, model: &str) -> Self {
        let host = host_of(base_url);
        let deepseek = model.to_ascii_lowercase().contains("deepseek") || host.contains("deepseek");
        let openai = host == "api.openai.com" || (provider == "openai" && host.is_empty());
        let family = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        let mistral = host.ends_with("mistral.ai")
            || provider.eq_ignore_ascii_case("mistral")
            || MISTRAL_MODELS.iter().any(|m| family.contains(m));
        OpenAiCompat {
            reasoning_content: deepseek,
            tool_call_extra: true,
            prompt_cache_key: if openai {
                PromptCacheKey::Derived
            } else {
                PromptCacheKey::Off
            },
            tool_dialect: None,
            mistral_call_ids: mistral,
        }
    }
}

/// What the names of Mistral's models hold (`mistral-large-latest`, `devstral-small-2507`,
/// `Ministral-8B-Instruct`, `open-mixtral-8x22b`), served by Mistral or by another server with
/// their chat template, which checks the ids as the API does.
const MISTRAL_MODELS: [&str; 8] = [
    "mistral",
    "mixtral",
    "devstral",
    "magistral",
    "ministral",
    "codestral",
    "pixtral",
    "voxtral",
];

/// The host of a URL (`api.openai.com`), lowercased; empty when there is none.
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', ':', '?'])
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// An OpenAI Chat Completions model.
#[derive(Debug, Clone)]
pub struct OpenAiChat {
    model: String,
    provider: String,
    client: HttpClient,
    stream: bool,
    stream_usage: bool,
    strict: bool,
    max_tokens_field: MaxTokensField,
    compat: OpenAiCompat,
}

/// Builds an [`OpenAiChat`].
#[derive(Debug, Clone)]
#[must_use]
pub struct OpenAiChatBuilder {
    model: String,
    provider: String,
    config: HttpConfig,
    stream: bool,
    stream_usage: bool,
    strict: bool,
    max_tokens_field: Option<MaxTokensField>,
    compat: Option<OpenAiCompat>,
    reasoning_in_history: Option<bool>,
    tool_call_extra: Option<bool>,
    prompt_cache_key: Option<PromptCacheKey>,
    tool_dialect: Option<ToolDialect>,
}

impl OpenAiChat {
    /// A builder for `model` on api.openai.com, with the key from `OPENAI_API_KEY`.
    pub fn builder(model: impl Into<String>) -> OpenAiChatBuilder {
        let mut config = HttpConfig::new(OPENAI_BASE_URL);
        config.key = KeySource::Env(OPENAI_API_KEY_ENV.to_owned());
        OpenAiChatBuilder {
            model: model.into(),
            provider: "openai".to_owned(),
            config,
            stream: true,
            stream_usage: true,
            strict: false,
            max_tokens_field: None,
            compat: None,
            reasoning_in_history: None,
            tool_call_extra: None,
            prompt_cache_key: None,
            tool_dialect: None,
        }
    }

    /// A builder for a compatible server: its provider name (`deepseek`, `groq`, `local`), base URL
    /// and model. No key is sent until one is set.
    pub fn compatible(
        provider: impl Into<String>,
        base_url: impl Into<String>,
        model: impl Into<String>,
    ) -> OpenAiChatBuilder {
        OpenAiChat::builder(model)
            .provider_name(provider)
            .base_url(base_url)
            .no_api_key()
    }
}

impl OpenAiChatBuilder {
    crate::http::http_builder_methods!();

    /// Streams responses (the default) or asks for whole ones.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Asks for the trailing usage chunk when streaming (`stream_options.include_usage`, the
    /// default). Turn it off for a server that rejects `stream_options`.
    pub fn stream_usage(mut self, include: bool) -> Self {
        self.stream_usage = include;
        self
    }

    /// Strict mode: tool and output schemas are sent with `strict: true`, adapted to what strict
    /// mode accepts (every property required, optional ones nullable, `additionalProperties: false`).
    /// The `null`s the model then writes for the optional properties it leaves out are taken out
    /// of its calls' arguments and its structured answer (unless the original schema accepts
    /// `null` there), so that they pass the run's check against the original schemas; for that,
    /// the arguments and a structured answer's text arrive whole when the response ends, not as
    /// deltas.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The provider name reported in events, errors and pricing (`openai` by default).
    pub fn provider_name(mut self, name: impl Into<String>) -> Self {
        self.provider = name.into();
        self
    }

    /// Which field carries `max_tokens` (by default: `max_completion_tokens` for `openai`,
    /// `max_tokens` for any other provider name).
    pub fn max_tokens_field(mut self, field: MaxTokensField) -> Self {
        self.max_tokens_field = Some(field);
        self
    }

    /// Sends earlier reasoning back as `reasoning_content` on assistant messages, an empty one
    /// where a turn had none (DeepSeek's thinking mode with tools asks for it on every assistant
    /// message; OpenAI does not accept it). By default on for
    /// DeepSeek models and hosts ([`OpenAiCompat::for_model`]), off for the rest.
    pub fn reasoning_in_history(mut self, send: bool) -> Self {
        self.reasoning_in_history = Some(send);
        self
    }

    /// Sends a tool call's `extra_content` (Gemini's thought signatures) back on it (the default)
    /// or drops it.
    pub fn tool_call_extra(mut self, send: bool) -> Self {
        self.tool_call_extra = Some(send);
        self
    }

    /// Calls tools in this plain-text dialect instead of the API's `tools` (for a model served
    /// without a tool-call parser).
    pub fn tool_dialect(mut self, dialect: ToolDialect) -> Self {
        self.tool_dialect = Some(dialect);
        self
    }

    /// Replaces the compatibility options picked from the model and base URL.
    pub fn compat(mut self, compat: OpenAiCompat) -> Self {
        self.compat = Some(compat);
        self
    }

    /// Sets what `prompt_cache_key` carries (by default a derived key on api.openai.com, none
    /// elsewhere).
    pub fn prompt_cache_key(mut self, key: PromptCacheKey) -> Self {
        self.prompt_cache_key = Some(key);
        self
    }

    /// Builds the model.
    pub fn build(self) -> Result<OpenAiChat, ModelError> {
        let mut compat = self.compat.unwrap_or_else(|| {
            OpenAiCompat::for_model(&self.provider, &self.config.base_url, &self.model)
        });
        if let Some(send) = self.reasoning_in_history {
            compat.reasoning_content = send;
        }
        if let Some(send) = self.tool_call_extra {
            compat.tool_call_extra = send;
        }
        if let Some(key) = self.prompt_cache_key {
            compat.prompt_cache_key = key;
        }
        if let Some(dialect) = self.tool_dialect {
            compat.tool_dialect = Some(dialect);
        }
        let client = HttpClient::new(self.config, self.provider.clone())?;
        let max_tokens_field = self
            .max_tokens_field
            .unwrap_or(if self.provider == "openai" {
                MaxTokensField::MaxCompletionTokens
            } else {
                MaxTokensField::MaxTokens
            });
        Ok(OpenAiChat {
            model: self.model,
            provider: self.provider,
            client,
            stream: self.stream,
            stream_usage: self.stream_usage,
            strict: self.strict,
            max_tokens_field,
            compat,
        })
    }
}

impl OpenAiChat {
    /// The compatibility options in force.
    pub fn compat_options(&self) -> &OpenAiCompat {
        &self.compat
    }
}

impl Model for OpenAiChat {
    fn id(&self) -> &str {
        &self.model
    }

    fn provider(&self) -> &str {
        &self.provider
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let body = self.encode_request(&request);
        let mut decoder = ChatStreamParser::new(&self.provider)
            .with_dialect_tools(
                self.compat.tool_dialect,
                request.tools.iter().map(|t| t.name.clone()),
            )
            // A block held longer than the largest event is no call (and holding it is unbounded).
            .with_dialect_max_block(self.client.config().max_event_bytes);
        if self.strict {
            decoder = decoder.with_strict_schemas(
                request
                    .tools
                    .iter()
                    .map(|t| (t.name.clone(), t.input_schema.clone())),
                request.output_schema.cloned(),
            );
        }
        // The seed goes out with the request whenever it is set (see `wire_request`).
        let sampled = samples(request.settings.temperature, request.settings.seed);
        post_and_decode(
            &self.client,
            "/chat/completions",
            body,
            decoder,
            self.stream,
            sampled,
        )
    }
    /// The server's URL and headers and the body this request encodes to (its tool dialect,
    /// reasoning sent back, strict schemas, prompt cache key are all in it).
    fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        let body = self.encode_request(request).ok()?;
        Some(self.client.cache_identity("/chat/completions", &body))
    }
}
