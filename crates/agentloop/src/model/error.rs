//! How a model call failed: a kind that policies decide by, and the provider's own words.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What kind of failure a model call met. Retry and fallback policies decide by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ModelErrorKind {
    /// HTTP 429: too many requests.
    RateLimited,
    /// The account's quota or credit is exhausted (not worth retrying).
    QuotaExceeded,
    /// HTTP 529 or an `overloaded_error`.
    Overloaded,
    /// HTTP 5xx.
    Server,
    /// The request or the stream timed out.
    Timeout,
    /// The connection failed or dropped.
    Connection,
    /// HTTP 401/403: bad or missing credentials.
    Authentication,
    /// The model does not exist or is not available to this key.
    ModelNotFound,
    /// The prompt is longer than the model's context window.
    ContextLength,
    /// Any other rejected request (HTTP 400/404/422), with the provider's code and message.
    InvalidRequest,
    /// The encoded request is larger than the configured byte budget; it was never sent.
    RequestTooLarge,
    /// The stream was malformed or ended early.
    Stream,
    /// The response could not be decoded.
    Decode,
    /// The response was cut off by the output token limit.
    Truncated,
    /// The model refused to answer.
    Refused,
    /// A content filter stopped the answer.
    ContentFiltered,
    /// The model (or a test model) has nothing more to say: a script ran out.
    Exhausted,
    /// The provider paused the turn (Anthropic's `pause_turn`) more often than the adapter
    /// continues one: no answer came, and the turn's start is not one.
    Paused,
    /// Anything else.
    Other,
}

impl ModelErrorKind {
    /// The stable code of this kind (`model.rate_limited`).
    pub fn code(self) -> &'static str {
        match self {
            ModelErrorKind::RateLimited => "model.rate_limited",
            ModelErrorKind::QuotaExceeded => "model.quota_exceeded",
            ModelErrorKind::Overloaded => "model.overloaded",
            ModelErrorKind::Server => "model.server_error",
            ModelErrorKind::Timeout => "model.timeout",
            ModelErrorKind::Connection => "model.connection",
            ModelErrorKind::Authentication => "model.authentication",
            ModelErrorKind::ModelNotFound => "model.not_found",
            ModelErrorKind::ContextLength => "model.context_length_exceeded",
            ModelErrorKind::InvalidRequest => "model.invalid_request",
            ModelErrorKind::RequestTooLarge => "model.request_too_large",
            ModelErrorKind::Stream => "model.stream",
            ModelErrorKind::Decode => "model.decode",
            ModelErrorKind::Truncated => "model.truncated",
            ModelErrorKind::Refused => "model.refused",
            ModelErrorKind::ContentFiltered => "model.content_filter",
            ModelErrorKind::Exhausted => "model.exhausted",
            ModelErrorKind::Paused => "model.paused",
            ModelErrorKind::Other => "model.other",
        }
    }
}

impl fmt::Display for ModelErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A failed model call. It carries the provider's own type, code and message and the request id,
/// never a credential, and never the raw body beyond the provider's message.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[error("{kind}: {message}")]
#[non_exhaustive]
pub struct ModelError {
    /// What kind of failure.
    pub kind: ModelErrorKind,
    /// The provider's message, or ours.
    pub message: String,
    /// The provider (`openai`, `anthropic`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The HTTP status, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's error type (`invalid_request_error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// The provider's error code (`model_not_found`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
    /// The request parameter the provider blamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// The provider's request id header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// How long the provider asked us to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<Duration>,
    /// True once part of the response reached the caller and the layer that returned the error
    /// gave up on it: the caller holds a half response that no later event takes back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// The server's own word on whether a retry can succeed (OpenAI's and Anthropic's
    /// `x-should-retry` header); it overrides the kind's default in [`ModelError::is_retryable`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub should_retry: Option<bool>,
}

impl ModelError {
    /// A new error of this kind.
    pub fn new(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        ModelError {
            kind,
            message: message.into(),
            provider: None,
            status: None,
            error_type: None,
            provider_code: None,
            param: None,
            request_id: None,
            retry_after: None,
            partial: false,
            should_retry: None,
        }
    }

    /// The stable code (`model.rate_limited`).
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// Worth retrying: rate limits, overload, server errors, timeouts and dropped connections (or
    /// whatever the server said with `x-should-retry`), provided nothing of the response reached
    /// the caller yet.
    pub fn is_retryable(&self) -> bool {
        !self.partial && self.is_transient()
    }

    /// A new attempt can succeed: rate limits, overload, server errors, timeouts and dropped
    /// connections, or whatever the server said with `x-should-retry`, whether or not part of
    /// the response reached the caller. A retry layer that can tell the caller to discard what
    /// it received ([`crate::model::ModelEvent::Retrying`]) retries on this.
    pub fn is_transient(&self) -> bool {
        if let Some(said) = self.should_retry {
            return said;
        }
        matches!(
            self.kind,
            ModelErrorKind::RateLimited
                | ModelErrorKind::Overloaded
                | ModelErrorKind::Server
                | ModelErrorKind::Timeout
                | ModelErrorKind::Connection
        )
    }

    /// HTTP 429.
    pub fn is_rate_limited(&self) -> bool {
        self.kind == ModelErrorKind::RateLimited
    }

    /// A timeout (connect, request or idle stream).
    pub fn is_timeout(&self) -> bool {
        self.kind == ModelErrorKind::Timeout
    }

    /// Credentials were refused.
    pub fn is_authentication(&self) -> bool {
        self.kind == ModelErrorKind::Authentication
    }

    /// The prompt did not fit the model's context.
    pub fn is_context_length(&self) -> bool {
        self.kind == ModelErrorKind::ContextLength
    }

    /// The provider is overloaded.
    pub fn is_overloaded(&self) -> bool {
        self.kind == ModelErrorKind::Overloaded
    }

    /// Sets the provider name.
    #[must_use]
    pub fn with_provider(mut self, provider: impl Into<String>) -> Self {
        self.provider = Some(provider.into());
        self
    }

    /// Sets the HTTP status.
    #[must_use]
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the Retry-After delay.
    #[must_use]
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}
