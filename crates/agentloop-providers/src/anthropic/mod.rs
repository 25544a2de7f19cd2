//! The Anthropic Messages API (`POST /v1/messages`): request encoding from the provider-neutral
//! transcript, a pure stream parser that turns server-sent events into
//! [`ModelEvent`](agentloop::model::ModelEvent)s, and the [`Anthropic`] model that sends requests through
//! the shared HTTP client.
//!
//! Thinking blocks come back with their signatures and are sent back unchanged on tool turns; all
//! tool results of a turn travel in one user message. A `tool_use` whose JSON was cut off is never
//! executed: the stream maps to [`FinishReason::Length`](agentloop::model::FinishReason::Length) and the
//! accumulator drops the call.
//!
//! Tools marked [`deferred`](agentloop::tool::ToolSpec::deferred) go with `defer_loading: true` beside
//! the server's tool search tool (BM25 by default, [`ToolSearchVariant`]) and its beta header
//! ([`TOOL_SEARCH_BETA`]); the search's `server_tool_use` and `tool_search_tool_result` blocks
//! are kept in the answer's reasoning and sent back on later turns, where they load the tools
//! found. The blocks of the server's other tools (web search and fetch, code execution, MCP
//! connectors: their `server_tool_use` or `mcp_tool_use` and `*_tool_result` blocks) are kept
//! and sent back the same way.
//!
//! A turn the server paused (`stop_reason: "pause_turn"`, its loop of server tools run long) is
//! continued: its blocks go back unchanged as the last assistant message, up to
//! [`MAX_PAUSE_CONTINUATIONS`] times, and the call answers with the whole turn.
//!
//! The module's files: `request.rs` encodes the request, `stream.rs` reads answers (streamed or
//! whole) into events, `pause.rs` continues a paused turn.

mod pause;
mod request;
mod stream;

use agentloop::{
    Model, ModelError,
    model::{CacheIdentity, ModelRequest, ModelStream},
};

use crate::http::{ANTHROPIC_API_KEY_ENV, AuthStyle, HttpClient, HttpConfig, KeySource};

pub use pause::MAX_PAUSE_CONTINUATIONS;
pub use stream::{AnthropicStreamParser, map_stop_reason, parse_message, parse_stream_bytes};

const PROVIDER: &str = "anthropic";
/// The API version header value this adapter speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `max_tokens` sent when the settings give none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The `anthropic-beta` header a request with deferred tools carries.
pub const TOOL_SEARCH_BETA: &str = "advanced-tool-use-2025-11-20";

/// Which server-side tool search a request with deferred tools offers the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolSearchVariant {
    /// `tool_search_tool_bm25_20251119`: the model searches in natural language (the default).
    #[default]
    Bm25,
    /// `tool_search_tool_regex_20251119`: the model searches with regular expressions.
    Regex,
}

impl ToolSearchVariant {
    /// The tool's `type` and `name` on the wire.
    fn wire(self) -> (&'static str, &'static str) {
        match self {
            ToolSearchVariant::Bm25 => ("tool_search_tool_bm25_20251119", "tool_search_tool_bm25"),
            ToolSearchVariant::Regex => {
                ("tool_search_tool_regex_20251119", "tool_search_tool_regex")
            }
        }
    }
}

/// Extended thinking settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkingConfig {
    /// Tokens the model may spend thinking; must be below `max_tokens`.
    pub budget_tokens: u32,
}

/// Where requests mark `cache_control` breakpoints, so that Anthropic caches the prompt up to
/// them: a cache read costs a tenth of the input price, a write a quarter more. All three by
/// default (three of the four breakpoints the API allows); [`CacheBreakpoints::off`] sends none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheBreakpoints {
    /// After the instructions (the system prompt).
    pub instructions: bool,
    /// After the last tool: the tools and instructions form the prefix every turn shares.
    pub tools: bool,
    /// After the latest turn's last block, so the next request reads the whole conversation
    /// so far from the cache.
    pub latest_turn: bool,
}

impl Default for CacheBreakpoints {
    fn default() -> Self {
        CacheBreakpoints {
            instructions: true,
            tools: true,
            latest_turn: true,
        }
    }
}

impl CacheBreakpoints {
    /// No breakpoint: nothing is cached.
    pub fn off() -> Self {
        CacheBreakpoints {
            instructions: false,
            tools: false,
            latest_turn: false,
        }
    }
}

/// A model served by the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct Anthropic {
    model: String,
    client: HttpClient,
    /// The same client, with the tool search's beta header.
    search_client: HttpClient,
    stream: bool,
    max_tokens: u32,
    thinking: Option<ThinkingConfig>,
    cache: CacheBreakpoints,
    tool_search: ToolSearchVariant,
}

/// Builds an [`Anthropic`] model. Setters never fail; [`AnthropicBuilder::build`] reports problems.
#[derive(Debug, Clone)]
#[must_use]
pub struct AnthropicBuilder {
    model: String,
    config: HttpConfig,
    stream: bool,
    max_tokens: u32,
    thinking: Option<ThinkingConfig>,
    cache: CacheBreakpoints,
    tool_search: ToolSearchVariant,
}

impl Anthropic {
    /// A builder for this model id (`claude-sonnet-4-5`), with the key read from `ANTHROPIC_API_KEY`.
    pub fn builder(model: impl Into<String>) -> AnthropicBuilder {
        let mut config = HttpConfig::new(DEFAULT_BASE_URL);
        config.key = KeySource::Env(ANTHROPIC_API_KEY_ENV.to_owned());
        config.auth = AuthStyle::Header("x-api-key".to_owned());
        AnthropicBuilder {
            model: model.into(),
            config,
            stream: true,
            max_tokens: DEFAULT_MAX_TOKENS,
            thinking: None,
            cache: CacheBreakpoints::default(),
            tool_search: ToolSearchVariant::default(),
        }
    }
}

impl AnthropicBuilder {
    crate::http::http_builder_methods!();

    /// Streams responses (the default) or asks for whole ones.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// The `max_tokens` sent when the request's settings give none (default 4096).
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Enables extended thinking with this token budget.
    pub fn thinking(mut self, budget_tokens: u32) -> Self {
        self.thinking = Some(ThinkingConfig { budget_tokens });
        self
    }

    /// Prompt caching on (the default: every breakpoint of [`CacheBreakpoints`]) or off.
    pub fn prompt_caching(mut self, on: bool) -> Self {
        self.cache = if on {
            CacheBreakpoints::default()
        } else {
            CacheBreakpoints::off()
        };
        self
    }

    /// The server-side tool search a request with deferred tools offers (BM25 by default).
    pub fn tool_search(mut self, variant: ToolSearchVariant) -> Self {
        self.tool_search = variant;
        self
    }

    /// Sets where the `cache_control` breakpoints go.
    pub fn cache_breakpoints(mut self, cache: CacheBreakpoints) -> Self {
        self.cache = cache;
        self
    }

    /// Builds the model.
    pub fn build(mut self) -> Result<Anthropic, ModelError> {
        if !self
            .config
            .extra_headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("anthropic-version"))
        {
            self.config
                .extra_headers
                .push(("anthropic-version".to_owned(), ANTHROPIC_VERSION.to_owned()));
        }
        let client = HttpClient::new(self.config, PROVIDER)?;
        let search_client = client.with_header("anthropic-beta", TOOL_SEARCH_BETA);
        Ok(Anthropic {
            model: self.model,
            client,
            search_client,
            stream: self.stream,
            max_tokens: self.max_tokens,
            thinking: self.thinking,
            cache: self.cache,
            tool_search: self.tool_search,
        })
    }
}

impl Model for Anthropic {
    fn id(&self) -> &str {
        &self.model
    }

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        self.continued_turn(request)
    }
    /// The server's URL and headers (the tool search's beta among them, when the request
    /// offers deferred tools) and the body this request encodes to (thinking, cache breakpoints
    /// and `max_tokens` are all in it).
    fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        let body = self.encode_request(request).ok()?;
        let client = if request::uses_tool_search(request) {
            &self.search_client
        } else {
            &self.client
        };
        Some(client.cache_identity("/v1/messages", &body))
    }
}
