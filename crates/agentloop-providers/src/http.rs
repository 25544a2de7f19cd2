//! The HTTP plumbing every provider shares: client settings ([`HttpConfig`]), a JSON POST that
//! enforces the request byte budget and classifies failures into [`ModelError`]s, and a
//! server-sent-events reader with an idle timeout.
//!
//! Secrets stay here: the API key lives in a redacting wrapper, its header is marked sensitive, and
//! no error built in this module carries a header or the raw response body, only the provider's
//! own error type, code, message and parameter, the status and the request id.

use std::fmt;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agentloop::{ModelError, ModelErrorKind};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;

/// How a provider sends its API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthStyle {
    /// `Authorization: Bearer <key>` (OpenAI and the servers that speak its API).
    Bearer,
    /// The key as the value of this header (`x-api-key` for Anthropic).
    Header(String),
}

/// An API key. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for building the auth header.
    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where the API key comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeySource {
    /// No key (local servers such as Ollama or llama.cpp).
    #[default]
    None,
    /// This key.
    Value(ApiKey),
    /// The environment variable of this name, read at each request.
    Env(String),
}

/// Client settings shared by every provider.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The API's base URL, without a trailing slash (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Where the key comes from.
    pub key: KeySource,
    /// How the key is sent.
    pub auth: AuthStyle,
    /// Headers added to every request (organization, project, version headers...).
    pub extra_headers: Vec<(String, String)>,
    /// Time allowed to open the connection.
    pub connect_timeout: Duration,
    /// Time allowed for the whole request, body included (`None`: no limit).
    pub request_timeout: Option<Duration>,
    /// Longest silence allowed between two chunks of a streamed body.
    pub idle_timeout: Duration,
    /// The largest encoded request body sent; a larger one fails before it is sent.
    pub max_request_bytes: usize,
    /// The largest error body read to classify a failed request.
    pub max_error_body_bytes: usize,
    /// The largest single server-sent event (a line longer than this fails the stream).
    pub max_event_bytes: usize,
}

/// Defaults: 10 s to connect, 10 min per request, 60 s of stream silence, 8 MiB bodies.
impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            base_url: String::new(),
            key: KeySource::None,
            auth: AuthStyle::Bearer,
            extra_headers: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Some(Duration::from_secs(600)),
            idle_timeout: Duration::from_secs(60),
            max_request_bytes: 8 * 1024 * 1024,
            max_error_body_bytes: 64 * 1024,
            max_event_bytes: 16 * 1024 * 1024,
        }
    }
}

impl HttpConfig {
    /// Settings for this base URL, with the defaults above.
    pub fn new(base_url: impl Into<String>) -> Self {
        let mut base_url = base_url.into();
        while base_url.ends_with('/') {
            base_url.pop();
        }
        HttpConfig {
            base_url,
            ..Default::default()
        }
    }
}

/// The HTTP setters every provider builder shares. The builder needs a `config: HttpConfig` field;
/// invoke `crate::http::http_builder_methods!();` inside its `impl` block.
macro_rules! http_builder_methods {
    () => {
        /// Sets the base URL (`http://localhost:11434/v1`); a trailing `/` is dropped.
        pub fn base_url(mut self, url: impl Into<String>) -> Self {
            self.config.base_url = $crate::http::HttpConfig::new(url).base_url;
            self
        }

        /// Uses this API key.
        pub fn api_key(mut self, key: impl Into<String>) -> Self {
            self.config.key = $crate::http::KeySource::Value($crate::http::ApiKey::new(key));
            self
        }

        /// Reads the API key from this environment variable at each request.
        pub fn api_key_env(mut self, var: impl Into<String>) -> Self {
            self.config.key = $crate::http::KeySource::Env(var.into());
            self
        }

        /// Sends no API key (local servers).
        pub fn no_api_key(mut self) -> Self {
            self.config.key = $crate::http::KeySource::None;
            self
        }

        /// Adds a header to every request.
        pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
            self.config.extra_headers.push((name.into(), value.into()));
            self
        }

        /// Replaces the HTTP settings (base URL, key, headers, timeouts, byte budget) at once.
        pub fn http_config(mut self, config: $crate::http::HttpConfig) -> Self {
            self.config = config;
            self
        }

        /// Sets the connect timeout.
        pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.config.connect_timeout = timeout;
            self
        }

        /// Sets the whole-request timeout (`None`: none).
        pub fn request_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
            self.config.request_timeout = timeout;
            self
        }

        /// Sets the longest silence allowed inside a stream.
        pub fn idle_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.config.idle_timeout = timeout;
            self
        }

        /// Sets the request byte budget: a larger encoded request fails before it is sent.
        pub fn max_request_bytes(mut self, bytes: usize) -> Self {
            self.config.max_request_bytes = bytes;
            self
        }
    };
}
#[allow(unused_imports)]
pub(crate) use http_builder_methods;

/// A built HTTP client for one provider: cheap to clone.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    config: HttpConfig,
    provider: String,
}

impl HttpClient {
    /// Builds the client. `provider` names the provider in errors (`openai`, `anthropic`).
    pub fn new(config: HttpConfig, provider: impl Into<String>) -> Result<Self, ModelError> {
        let provider = provider.into();
        let mut builder = reqwest::Client::builder().connect_timeout(config.connect_timeout);
        if let Some(t) = config.request_timeout {
            builder = builder.timeout(t);
        }
        let client = builder.build().map_err(|e| {
            ModelError::new(
                ModelErrorKind::Other,
                format!("cannot build the HTTP client: {}", e.without_url()),
            )
            .with_provider(provider.clone())
        })?;
        Ok(HttpClient {
            client,
            config,
            provider,
        })
    }

    /// The settings.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// The provider name used in errors.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Sets the provider name used in errors.
    pub fn set_provider(&mut self, provider: impl Into<String>) {
        self.provider = provider.into();
    }

    fn error(&self, kind: ModelErrorKind, message: impl Into<String>) -> ModelError {
        ModelError::new(kind, message).with_provider(self.provider.clone())
    }

    fn auth_header(&self) -> Result<Option<(HeaderName, HeaderValue)>, ModelError> {
        let key = match &self.config.key {
            KeySource::None => return Ok(None),
            KeySource::Value(k) => k.expose().to_owned(),
            KeySource::Env(var) => match std::env::var(var) {
                Ok(k) if !k.trim().is_empty() => k,
                _ => {
                    return Err(self.error(
                        ModelErrorKind::Authentication,
                        format!("no API key: the environment variable {var} is not set"),
                    ));
                }
            },
        };
        let (name, value) = match &self.config.auth {
            AuthStyle::Bearer => (
                reqwest::header::AUTHORIZATION,
                format!("Bearer {}", key.trim()),
            ),
            AuthStyle::Header(h) => {
                let name = HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                    self.error(
                        ModelErrorKind::Other,
                        format!("invalid auth header name {h:?}"),
                    )
                })?;
                (name, key.trim().to_owned())
            }
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            self.error(
                ModelErrorKind::Authentication,
                "the API key holds characters a header cannot carry",
            )
        })?;
        value.set_sensitive(true);
        Ok(Some((name, value)))
    }

    /// POSTs an encoded JSON body to `base_url + path`. The body must fit the byte budget (checked
    /// before anything is sent). A non-2xx answer becomes a classified error; a 2xx answer is
    /// returned for the caller to read.
    pub async fn post_json(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<reqwest::Response, ModelError> {
        check_budget(&self.provider, body.len(), self.config.max_request_bytes)?;
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for (name, value) in &self.config.extra_headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                self.error(
                    ModelErrorKind::Other,
                    format!("invalid header name {name:?}"),
                )
            })?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                self.error(
                    ModelErrorKind::Other,
                    format!("invalid value for header {name}"),
                )
            })?;
            headers.insert(name, value);
        }
        if let Some((name, value)) = self.auth_header()? {
            headers.insert(name, value);
        }
        let url = format!("{}{}", self.config.base_url, path);
        let response = self
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| transport_error(&self.provider, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers().clone();
        let body = read_limited(response, self.config.max_error_body_bytes)
            .await
            .unwrap_or_default();
        let mut error = classify_http_error(&self.provider, status.as_u16(), &headers, &body);
        self.scrub(&mut error);
        Err(error)
    }

    /// Removes the API key from an error's text fields, should a server echo it back.
    fn scrub(&self, error: &mut ModelError) {
        let key = match &self.config.key {
            KeySource::None => return,
            KeySource::Value(k) => k.expose().trim().to_owned(),
            KeySource::Env(var) => std::env::var(var).unwrap_or_default().trim().to_owned(),
        };
        if key.len() < 4 {
            return;
        }
        let clean = |s: &mut String| {
            if s.contains(key.as_str()) {
                *s = s.replace(key.as_str(), "[redacted]");
            }
        };
        clean(&mut error.message);
        for field in [
            &mut error.error_type,
            &mut error.provider_code,
            &mut error.param,
            &mut error.request_id,
        ] {
            if let Some(s) = field.as_mut() {
                clean(s);
            }
        }
    }

    /// Reads a whole (non-streamed) response body.
    pub async fn read_body(&self, response: reqwest::Response) -> Result<Bytes, ModelError> {
        response
            .bytes()
            .await
            .map_err(|e| transport_error(&self.provider, &e))
    }

    /// Reads a streamed response as server-sent events, with this client's idle timeout.
    pub fn sse(&self, response: reqwest::Response) -> SseStream {
        let provider = self.provider.clone();
        let bytes = response
            .bytes_stream()
            .map(move |r| r.map_err(|e| transport_error(&provider, &e)));
        SseStream::new(
            bytes,
            &self.provider,
            Some(self.config.idle_timeout),
            self.config.max_event_bytes,
        )
    }
}

/// Fails with [`ModelErrorKind::RequestTooLarge`] when `len` exceeds `max`.
pub fn check_budget(provider: &str, len: usize, max: usize) -> Result<(), ModelError> {
    if len > max {
        return Err(ModelError::new(
            ModelErrorKind::RequestTooLarge,
            format!("the encoded request is {len} bytes, over the budget of {max} bytes; it was not sent"),
        )
        .with_provider(provider));
    }
    Ok(())
}

async fn read_limited(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
        if out.len() >= max {
            break;
        }
    }
    Ok(out)
}

/// Turns a transport failure into a [`ModelError`] (timeout or connection), without the URL.
/// A body that broke off mid-way (reqwest reports it as a body or decode error) is a connection
/// failure; only a body that arrived whole but could not be decoded is [`ModelErrorKind::Decode`].
pub fn transport_error(provider: &str, e: &reqwest::Error) -> ModelError {
    // The source chain names the cause (reset, closed before complete...) and holds no secret.
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        causes.push(s.to_string());
        source = s.source();
    }
    let cause = causes.join(": ");
    let lower = cause.to_ascii_lowercase();
    let broken = lower.contains("connection")
        || lower.contains("closed")
        || lower.contains("reset")
        || lower.contains("incomplete")
        || lower.contains("eof");
    let (kind, what) = if e.is_timeout() || lower.contains("timed out") {
        (ModelErrorKind::Timeout, "the request timed out")
    } else if e.is_connect() {
        (ModelErrorKind::Connection, "could not connect")
    } else if (e.is_decode() || e.is_body()) && !broken {
        (
            ModelErrorKind::Decode,
            "the response body could not be decoded",
        )
    } else if e.is_builder() {
        (ModelErrorKind::Other, "the request could not be built")
    } else {
        (
            ModelErrorKind::Connection,
            "the connection failed or was dropped",
        )
    };
    let message = if cause.is_empty() {
        what.to_owned()
    } else {
        format!("{what}: {cause}")
    };
    ModelError::new(kind, message).with_provider(provider)
}

/// A provider's error object, as the OpenAI and Anthropic envelopes carry it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderError {
    /// The error type (`invalid_request_error`, `overloaded_error`).
    pub error_type: Option<String>,
    /// The error code (`model_not_found`); numeric codes are kept as their decimal text.
    pub code: Option<String>,
    /// The human-readable message.
    pub message: Option<String>,
    /// The parameter the provider blamed.
    pub param: Option<String>,
    /// A request id carried in the body (Anthropic).
    pub request_id: Option<String>,
}

/// An error envelope, or (for the inner `error` object) the error itself: the same fields.
#[derive(Deserialize)]
struct RawErrorEnvelope {
    #[serde(default)]
    error: Option<Value>,
    #[serde(default, rename = "type")]
    error_type: Option<Value>,
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    param: Option<Value>,
    #[serde(default)]
    request_id: Option<Value>,
}

fn value_text(v: Option<Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

impl ProviderError {
    /// Reads an error envelope: `{"error": {...}}` (OpenAI and compatible servers),
    /// `{"type": "error", "error": {...}}` (Anthropic), `{"error": "text"}` (Ollama and others) or a
    /// bare `{"type", "code", "message"}` object (the Responses `error` event). `None` when the
    /// bytes hold none of these.
    pub fn parse(body: &[u8]) -> Option<ProviderError> {
        let envelope: RawErrorEnvelope = serde_json::from_slice(body).ok()?;
        Self::from_envelope(envelope)
    }

    /// Like [`ProviderError::parse`], from a parsed JSON value.
    pub fn from_value(value: &Value) -> Option<ProviderError> {
        let envelope = RawErrorEnvelope::deserialize(value).ok()?;
        Self::from_envelope(envelope)
    }

    fn from_envelope(envelope: RawErrorEnvelope) -> Option<ProviderError> {
        let request_id = value_text(envelope.request_id);
        match envelope.error {
            Some(Value::Object(map)) => {
                let inner = RawErrorEnvelope::deserialize(Value::Object(map)).ok()?;
                Some(ProviderError {
                    error_type: value_text(inner.error_type),
                    code: value_text(inner.code),
                    message: value_text(inner.message),
                    param: value_text(inner.param),
                    request_id,
                })
            }
            Some(Value::String(message)) => Some(ProviderError {
                message: Some(message),
                request_id,
                ..Default::default()
            }),
            _ => {
                let error_type = value_text(envelope.error_type).filter(|t| t != "error");
                let code = value_text(envelope.code);
                let message = value_text(envelope.message);
                if error_type.is_none() && code.is_none() && message.is_none() {
                    return None;
                }
                Some(ProviderError {
                    error_type,
                    code,
                    message,
                    param: value_text(envelope.param),
                    request_id,
                })
            }
        }
    }

    fn is(&self, word: &str) -> bool {
        self.code.as_deref() == Some(word) || self.error_type.as_deref() == Some(word)
    }

    fn mentions_context_length(&self) -> bool {
        if self.is("context_length_exceeded") || self.is("string_above_max_length") {
            return true;
        }
        let Some(message) = &self.message else {
            return false;
        };
        let m = message.to_ascii_lowercase();
        m.contains("context length")
            || m.contains("context_length")
            || m.contains("context window")
            || m.contains("maximum context")
            || m.contains("prompt is too long")
    }

    /// The kind of failure this error (with this HTTP status, if any) is.
    pub fn kind(&self, status: Option<u16>) -> ModelErrorKind {
        if self.is("insufficient_quota") {
            return ModelErrorKind::QuotaExceeded;
        }
        if self.mentions_context_length() {
            return ModelErrorKind::ContextLength;
        }
        if self.is("model_not_found") || (status == Some(404) && self.is("not_found_error")) {
            return ModelErrorKind::ModelNotFound;
        }
        if matches!(status, Some(401 | 403))
            || self.is("authentication_error")
            || self.is("permission_error")
        {
            return ModelErrorKind::Authentication;
        }
        if status == Some(529) || self.is("overloaded_error") {
            return ModelErrorKind::Overloaded;
        }
        if status == Some(429) || self.is("rate_limit_error") || self.is("rate_limit_exceeded") {
            return ModelErrorKind::RateLimited;
        }
        match status {
            Some(408) => ModelErrorKind::Timeout,
            Some(s) if s >= 500 => ModelErrorKind::Server,
            Some(s) if s >= 400 => ModelErrorKind::InvalidRequest,
            Some(_) => ModelErrorKind::Other,
            None if self.is("server_error") || self.is("api_error") => ModelErrorKind::Server,
            None if self.is("invalid_request_error") => ModelErrorKind::InvalidRequest,
            None => ModelErrorKind::Other,
        }
    }

    /// The [`ModelError`] this provider error means. `status` is the HTTP status, `None` for an
    /// error reported inside a successful stream.
    pub fn into_model_error(self, provider: &str, status: Option<u16>) -> ModelError {
        let kind = self.kind(status);
        let message = self.message.clone().unwrap_or_else(|| match status {
            Some(s) => format!("HTTP {s}{}", reason_suffix(s)),
            None => "the provider reported an error".to_owned(),
        });
        let mut error = ModelError::new(kind, message).with_provider(provider);
        error.status = status;
        error.error_type = self.error_type;
        error.provider_code = self.code;
        error.param = self.param;
        error.request_id = self.request_id;
        error
    }
}

fn reason_suffix(status: u16) -> String {
    reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .map(|r| format!(" {r}"))
        .unwrap_or_default()
}

/// Classifies a failed HTTP answer: status, headers and (at most the provider's message from) the
/// body. Never reads a credential: only the request id and retry headers are looked at.
pub fn classify_http_error(
    provider: &str,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
) -> ModelError {
    let parsed = ProviderError::parse(body).unwrap_or_default();
    let mut error = parsed.into_model_error(provider, Some(status));
    if let Some(id) = request_id(headers) {
        error.request_id = Some(id);
    }
    error.retry_after = retry_after(headers);
    error
}

/// The provider's request id header (`x-request-id`, `request-id`).
pub fn request_id(headers: &HeaderMap) -> Option<String> {
    ["x-request-id", "request-id"].iter().find_map(|name| {
        headers
            .get(*name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    })
}

/// How long the server asks us to wait: `retry-after-ms` (milliseconds) first, then
/// `retry-after` in seconds or as an HTTP date (a date in the past means now).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, std::time::SystemTime::now())
}

fn retry_after_at(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let positive = |v: f64| v.is_finite() && v >= 0.0;
    if let Some(ms) = header("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| positive(*v))
    {
        return Some(Duration::from_secs_f64(ms.min(1e12) / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return positive(secs).then(|| Duration::from_secs_f64(secs.min(1e9)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(Duration::from_secs(1_000_000_000)),
    )
}

/// One server-sent event: its `event:` name (`message` when absent, as the SSE standard says) and
/// its joined `data:` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The event name.
    pub event: String,
    /// The data.
    pub data: String,
}

type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, ModelError>> + Send>>;

/// Server-sent events read from a byte stream. A silence longer than the idle timeout fails with
/// [`ModelErrorKind::Timeout`]; a transport failure with its own kind; a malformed stream (bad
/// UTF-8, an over-long line) with [`ModelErrorKind::Stream`]. After an error the stream ends.
pub struct SseStream {
    bytes: ByteStream,
    framer: SseFramer,
    idle: Option<Duration>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    provider: String,
    done: bool,
}

impl fmt::Debug for SseStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseStream")
            .field("provider", &self.provider)
            .field("done", &self.done)
            .finish()
    }
}

impl SseStream {
    /// Reads events from `bytes`. `idle` needs a tokio runtime with time enabled; pass `None`
    /// to parse without one (fuzzing, benchmarks).
    pub fn new<S>(bytes: S, provider: &str, idle: Option<Duration>, max_event_bytes: usize) -> Self
    where
        S: Stream<Item = Result<Bytes, ModelError>> + Send + 'static,
    {
        SseStream {
            bytes: Box::pin(bytes),
            framer: SseFramer::new(max_event_bytes),
            idle,
            sleep: None,
            provider: provider.to_owned(),
            done: false,
        }
    }

    /// Reads events from bytes already in memory, without a runtime: the parsing path that
    /// streamed responses take, for fuzzing and benchmarks.
    pub fn from_bytes(bytes: Bytes, provider: &str) -> Self {
        Self::new(
            futures::stream::iter([Ok(bytes)]),
            provider,
            None,
            usize::MAX,
        )
    }

    fn fail(&mut self, message: &str) -> Poll<Option<Result<SseEvent, ModelError>>> {
        self.done = true;
        Poll::Ready(Some(Err(
            ModelError::new(ModelErrorKind::Stream, message).with_provider(self.provider.clone())
        )))
    }
}

impl Stream for SseStream {
    type Item = Result<SseEvent, ModelError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            // Events already received go out before the next chunk is read.
            match self.framer.next_event() {
                Ok(Some(event)) => return Poll::Ready(Some(Ok(event))),
                Ok(None) => {}
                Err(message) => return self.fail(message),
            }
            match self.bytes.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    self.sleep = None;
                    if let Err(message) = self.framer.feed(&chunk) {
                        return self.fail(message);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if self.framer.inside_character() {
                        return self.fail("the event stream ends inside a UTF-8 character");
                    }
                    // An event without its closing blank line is never dispatched.
                    self.done = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    let Some(idle) = self.idle else {
                        return Poll::Pending;
                    };
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                    return match sleep.as_mut().poll(cx) {
                        Poll::Ready(()) => {
                            self.done = true;
                            self.sleep = None;
                            Poll::Ready(Some(Err(ModelError::new(
                                ModelErrorKind::Timeout,
                                format!("the stream was idle for {} s", idle.as_secs_f64()),
                            )
                            .with_provider(self.provider.clone()))))
                        }
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    }
}

/// The event-stream format (WHATWG HTML, "interpreting an event stream") read from byte chunks,
/// without I/O: lines end in CR, LF or CRLF (also split across chunks), a leading byte-order mark
/// is dropped, `:` lines are comments, `data` lines join with LF, `event` names the event and a
/// blank line dispatches it (unless its data is empty). `id` and `retry` are not used here.
///
/// It also guards the stream: invalid UTF-8 fails as soon as its chunk arrives (rather than once
/// its line ends), and so does a line that grows past the event budget (rather than without
/// bound). Each chunk is checked once, as it is appended to the text still to read.
struct SseFramer {
    /// Checked text not yet read to its end: from `read` on, the start of the line being read.
    text: String,
    read: usize,
    /// `text[read..scanned]` holds no line end (a long line is not scanned again per chunk).
    scanned: usize,
    /// The last line ended with a CR that closed the text: an LF opening the next chunk belongs
    /// to that line end.
    after_cr: bool,
    fields: EventFields,
    max_line: usize,
    /// The length of the last, unfinished line of the chunks checked so far.
    line_len: usize,
    /// The start of a UTF-8 character that the last chunk cut.
    utf8_carry: Vec<u8>,
}

/// The buffers of the event being read.
#[derive(Default)]
struct EventFields {
    /// No line has been read yet (a byte-order mark opening the first line is dropped).
    started: bool,
    event: String,
    data: String,
}

const NOT_UTF8: &str = "the event stream is not valid UTF-8";
const EVENT_TOO_LARGE: &str = "an event of the stream is larger than the event budget";

impl SseFramer {
    fn new(max_line: usize) -> Self {
        SseFramer {
            text: String::new(),
            read: 0,
            scanned: 0,
            after_cr: false,
            fields: EventFields::default(),
            max_line,
            line_len: 0,
            utf8_carry: Vec::new(),
        }
    }

    /// Takes the next chunk, failing on invalid UTF-8 (an incomplete character at its end waits
    /// for the next chunk) and on a line longer than the event budget.
    fn feed(&mut self, chunk: &[u8]) -> Result<(), &'static str> {
        // What was read goes; the start of an unfinished line stays.
        self.text.drain(..self.read);
        self.scanned = self.scanned.saturating_sub(self.read);
        self.read = 0;
        let carried = !self.utf8_carry.is_empty();
        let joined;
        let bytes = if carried {
            let mut j = std::mem::take(&mut self.utf8_carry);
            j.extend_from_slice(chunk);
            joined = j;
            joined.as_slice()
        } else {
            chunk
        };
        match std::str::from_utf8(bytes) {
            Ok(text) => self.text.push_str(text),
            Err(e) if e.error_len().is_none() => {
                if carried && e.valid_up_to() == 0 {
                    // Still inside the carried character.
                    self.utf8_carry = bytes.to_vec();
                    return Ok(());
                }
                let (valid, cut) = bytes.split_at(e.valid_up_to());
                self.text
                    .push_str(std::str::from_utf8(valid).map_err(|_| NOT_UTF8)?);
                self.utf8_carry = cut.to_vec();
            }
            Err(_) => return Err(NOT_UTF8),
        }
        match memchr::memrchr2(b'\n', b'\r', chunk) {
            Some(p) => self.line_len = chunk.len() - p - 1,
            None => self.line_len = self.line_len.saturating_add(chunk.len()),
        }
        if self.line_len > self.max_line {
            return Err(EVENT_TOO_LARGE);
        }
        Ok(())
    }

    /// Whether the bytes so far end inside a UTF-8 character.
    fn inside_character(&self) -> bool {
        !self.utf8_carry.is_empty()
    }

    /// The next event that the chunks fed so far complete, if any; an error when the event being
    /// read grows past the budget (many lines, each under it, add up).
    fn next_event(&mut self) -> Result<Option<SseEvent>, &'static str> {
        loop {
            let rest = self.text.as_bytes().get(self.read..).unwrap_or_default();
            if self.after_cr && !rest.is_empty() {
                self.after_cr = false;
                if rest.first() == Some(&b'\n') {
                    self.read += 1;
                    continue;
                }
            }
            let from = self.scanned.max(self.read);
            let unscanned = self.text.as_bytes().get(from..).unwrap_or_default();
            let Some(p) = memchr::memchr2(b'\n', b'\r', unscanned) else {
                self.scanned = self.text.len();
                return Ok(None);
            };
            let end = from + p;
            // A line ends at an ASCII byte, so both ends are character boundaries.
            let line = self.text.get(self.read..end).unwrap_or_default();
            self.read = end + 1;
            if unscanned.get(p) == Some(&b'\r') {
                match unscanned.get(p + 1) {
                    Some(b'\n') => self.read += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if let Some(event) = self.fields.line(line) {
                return Ok(Some(event));
            }
            if self.fields.data.len() + self.fields.event.len() > self.max_line {
                return Err(EVENT_TOO_LARGE);
            }
        }
    }
}

impl EventFields {
    /// Applies one line (without its line end); a blank line dispatches the event.
    fn line(&mut self, mut line: &str) -> Option<SseEvent> {
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None; // a comment
        }
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match name {
            "data" => {
                self.data.reserve(value.len() + 1);
                self.data.push_str(value);
                self.data.push('\n');
            }
            "event" => {
                self.event.clear();
                self.event.push_str(value);
            }
            _ => {} // id, retry and unknown fields
        }
        None
    }

    /// The event read so far, unless its data is empty; the buffers start over either way.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        Some(SseEvent {
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn classify(status: u16, body: &str) -> ModelError {
        classify_http_error("p", status, &HeaderMap::new(), body.as_bytes())
    }

    #[test]
    fn errors_are_classified_by_status_type_code_and_message() {
        let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert_eq!(classify(429, quota).kind, ModelErrorKind::QuotaExceeded);
        assert!(!classify(429, quota).is_retryable());
        let ctx = r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert_eq!(classify(400, ctx).kind, ModelErrorKind::ContextLength);
        let anth_ctx = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        assert_eq!(classify(400, anth_ctx).kind, ModelErrorKind::ContextLength);
        let anth_404 = r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-x"},"request_id":"req_1"}"#;
        let e = classify(404, anth_404);
        assert_eq!(e.kind, ModelErrorKind::ModelNotFound);
        assert_eq!(e.request_id.as_deref(), Some("req_1"));
        assert_eq!(
            classify(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            )
            .kind,
            ModelErrorKind::Overloaded
        );
        assert_eq!(classify(401, r#"{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#).kind, ModelErrorKind::Authentication);
        assert_eq!(classify(403, "").kind, ModelErrorKind::Authentication);
        assert_eq!(
            classify(503, "<html>busy</html>").kind,
            ModelErrorKind::Server
        );
        assert_eq!(
            classify(422, r#"{"error":"model 'llama9' not found"}"#).kind,
            ModelErrorKind::InvalidRequest
        );
        assert_eq!(
            classify(422, r#"{"error":"model 'llama9' not found"}"#).message,
            "model 'llama9' not found"
        );
    }

    #[test]
    fn a_body_that_is_not_an_error_envelope_never_reaches_the_message() {
        let e = classify(502, "<html><body>secret proxy page</body></html>");
        assert_eq!(e.message, "HTTP 502 Bad Gateway");
        assert_eq!(e.status, Some(502));
    }

    #[test]
    fn retry_after_headers_are_read_in_milliseconds_first_then_seconds_or_an_http_date() {
        assert_eq!(
            retry_after(&headers(&[("retry-after", "3")])),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2"), ("retry-after-ms", "250")])),
            Some(Duration::from_millis(250))
        );
        // An HTTP date: the time left until then, or nothing to wait for when it has passed.
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_000);
        assert_eq!(
            retry_after_at(
                &headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]),
                now
            ),
            Some(Duration::from_secs(480))
        );
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Wed, 21 Oct 2015 07:28:00 GMT"
            )])),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "soon, maybe")])),
            None
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-1")])), None);
        let e = classify_http_error(
            "p",
            429,
            &headers(&[("x-request-id", "abc"), ("retry-after", "1.5")]),
            b"{}",
        );
        assert_eq!(e.retry_after, Some(Duration::from_millis(1500)));
        assert_eq!(e.request_id.as_deref(), Some("abc"));
    }

    #[test]
    fn the_budget_rejects_only_larger_bodies() {
        assert!(check_budget("p", 10, 10).is_ok());
        assert_eq!(
            check_budget("p", 11, 10).unwrap_err().kind,
            ModelErrorKind::RequestTooLarge
        );
    }

    #[test]
    fn api_keys_are_redacted_in_debug() {
        let mut config = HttpConfig::new("http://x/");
        config.key = KeySource::Value(ApiKey::new("sk-very-secret"));
        assert_eq!(config.base_url, "http://x");
        assert!(!format!("{config:?}").contains("sk-very-secret"));
    }

    fn events(chunks: Vec<&'static [u8]>, max_event: usize) -> Vec<Result<SseEvent, ModelError>> {
        events_of(
            chunks.into_iter().map(Bytes::from_static).collect(),
            max_event,
        )
    }

    fn events_of(chunks: Vec<Bytes>, max_event: usize) -> Vec<Result<SseEvent, ModelError>> {
        let stream = futures::stream::iter(chunks.into_iter().map(Ok));
        futures::executor::block_on(SseStream::new(stream, "p", None, max_event).collect())
    }

    #[test]
    fn a_character_split_across_chunks_is_read_whole() {
        let got = events(
            vec![b"event: x\ndata: caf\xc3", b"\xa9\n\ndata: 2\n\n"],
            1024,
        );
        let got: Vec<SseEvent> = got.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            got,
            [
                SseEvent {
                    event: "x".into(),
                    data: "café".into()
                },
                SseEvent {
                    event: "message".into(),
                    data: "2".into()
                }
            ]
        );
    }

    #[test]
    fn invalid_utf8_fails_the_stream_at_once() {
        let got = events(
            vec![b"data: 1\n\n", b"data: \xff\xfe\n\n", b"data: 3\n\n"],
            1024,
        );
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].as_ref().unwrap_err().kind, ModelErrorKind::Stream);
    }

    #[test]
    fn a_line_longer_than_the_event_budget_fails_the_stream() {
        let got = events(
            vec![b"data: 0123456789", b"0123456789", b"0123456789\n\n"],
            20,
        );
        assert_eq!(
            got.last().unwrap().as_ref().unwrap_err().kind,
            ModelErrorKind::Stream
        );
    }

    #[test]
    fn an_event_of_many_short_lines_past_the_budget_fails_the_stream() {
        // Every line is under the 64-byte budget; together the event is not, and it never ends:
        // a hostile server must not grow one event without bound.
        let line: &[u8] = b"data: 0123456789\n";
        let mut chunks: Vec<&[u8]> = vec![b"data: ok\n\n"];
        chunks.extend(std::iter::repeat_n(line, 1000));
        let got = events(chunks, 64);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap().data, "ok");
        let err = got[1].as_ref().unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
        assert!(err.message.contains("event budget"), "{err}");
        // An event just under the budget is read whole.
        let got = events(vec![b"data: 0123456789\ndata: 0123456789\n\n"], 64);
        assert_eq!(got[0].as_ref().unwrap().data, "0123456789\n0123456789");
    }

    #[test]
    fn a_stream_opening_with_a_byte_order_mark_is_read_without_it() {
        // The mark cut across chunks too; eventsource-stream, the reader before, panicked here.
        let got = events(vec![b"\xef\xbb", b"\xbfdata: 1\n\n"], 1024);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap().data, "1");
    }

    #[test]
    fn a_line_spanning_many_chunks_is_read_whole() {
        let line = format!("data: {}\n\r\n", "x".repeat(64 * 1024));
        let chunks = line.as_bytes().chunks(100).map(Bytes::copy_from_slice);
        let got = events_of(chunks.collect(), 128 * 1024);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap().data.len(), 64 * 1024);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_longer_than_the_idle_timeout_is_a_timeout_error() {
        let stream = futures::stream::iter([Ok(Bytes::from_static(b"data: 1\n\n"))])
            .chain(futures::stream::pending());
        let mut sse = SseStream::new(stream, "p", Some(Duration::from_secs(5)), 1024);
        assert_eq!(sse.next().await.unwrap().unwrap().data, "1");
        let err = sse.next().await.unwrap().unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Timeout);
        assert!(sse.next().await.is_none());
    }
}
