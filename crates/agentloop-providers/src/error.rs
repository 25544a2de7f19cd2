//! How a failed call becomes a [`ModelError`]: an HTTP status with the provider's error envelope
//! ([`classify_http_error`], [`ProviderError`]), a transport failure ([`transport_error`]) and the
//! server's `Retry-After` advice ([`retry_after`]).
//!
//! Nothing here reads a credential or keeps a raw body: only the provider's own error type, code,
//! message and parameter, the status, the request id and the retry headers (and, of a body that
//! is an HTML page, its title).

use std::time::Duration;

use agentloop::{ModelError, model::ModelErrorKind};
use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::Value;

use crate::gist::{Gist, gist};

/// Turns a transport failure into a [`ModelError`] (timeout or connection), without the URL.
/// A body that broke off mid-way (reqwest reports it as a body or decode error) is a connection
/// failure; a body that arrived whole but could not be decoded, and a response head that is not
/// HTTP this client reads (hyper's parse errors), are [`ModelErrorKind::Decode`].
pub fn transport_error(provider: &str, e: &reqwest::Error) -> ModelError {
    // The source chain names the cause (reset, closed before complete...) and holds no secret.
    let mut causes = Vec::new();
    let mut unparsed = false;
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        causes.push(s.to_string());
        unparsed |= s
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse);
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
        (
            ModelErrorKind::Timeout,
            "the request timed out (the server was silent past the idle timeout, or the request \
             outlasted its own timeout)",
        )
    } else if e.is_connect() {
        (ModelErrorKind::Connection, "could not connect")
    } else if unparsed {
        // What the server put on the wire is not an HTTP head this client reads: another kind of
        // server at base_url, a status that is no number, more headers than a head may hold. It
        // answers every attempt alike, so it is not worth a retry as a dropped connection is.
        (
            ModelErrorKind::Decode,
            "the server's answer is not an HTTP response head this client can read (is base_url \
             a model server's?)",
        )
    } else if (e.is_decode() || e.is_body()) && !broken {
        (
            ModelErrorKind::Decode,
            "the response body could not be decoded",
        )
    } else if e.is_builder() {
        (ModelErrorKind::Other, "the request could not be built")
    } else if e.is_redirect() {
        // A loop of redirects (or a chain past the most followed) answers the same to every
        // attempt: a retry only walks it again. It is the base URL's fault, not the network's.
        (
            ModelErrorKind::Other,
            "the server's redirects went round in a loop or past the most followed (is base_url \
             right?)",
        )
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

/// A malformed or incomplete event stream ([`ModelErrorKind::Stream`]).
pub(crate) fn stream_error(provider: &str, message: impl Into<String>) -> ModelError {
    ModelError::new(ModelErrorKind::Stream, message).with_provider(provider)
}

/// An event stream that ended before the response was complete ([`ModelErrorKind::Stream`]):
/// the connection closed in the middle of an answer (a proxy's or the server's timeout, a
/// restart), which a new attempt can outlast, so it is transient (`should_retry`), unlike a
/// malformed stream.
pub(crate) fn stream_cut(provider: &str, message: impl Into<String>) -> ModelError {
    let mut error = stream_error(provider, message);
    error.should_retry = Some(true);
    error
}

/// A body or event that is not the JSON the API documents ([`ModelErrorKind::Decode`]); `what`
/// names it (`response body`, `stream event`).
pub(crate) fn decode_error(provider: &str, what: &str, e: &serde_json::Error) -> ModelError {
    ModelError::new(ModelErrorKind::Decode, format!("malformed {what}: {e}"))
        .with_provider(provider)
}

/// The error a provider reported inside a successful answer (an `error` event, an error body
/// with status 200), classified without an HTTP status.
#[cfg(any(feature = "anthropic", feature = "openai-responses"))]
pub(crate) fn reported_error(provider: &str, body: &[u8]) -> ModelError {
    ProviderError::parse(body)
        .unwrap_or_default()
        .into_model_error(provider, None)
}

/// An error object inside a successful answer (`{"error": {...}}` in a 200 stream chunk or
/// body), classified without an HTTP status (a numeric code stands for one).
#[cfg(any(
    feature = "openai",
    feature = "openai-responses",
    feature = "anthropic"
))]
pub(crate) fn in_body_error(provider: &str, error: &Value) -> ModelError {
    let wrapped = serde_json::json!({ "error": error });
    ProviderError::from_value(&wrapped)
        .unwrap_or_default()
        .into_model_error(provider, None)
}

/// The error object of an event or body that is a bare error envelope (`{"error": {...}}`, no
/// `type`): what gateways relaying an API send, under a 200, when their upstream fails.
#[cfg(any(feature = "anthropic", feature = "openai-responses"))]
pub(crate) fn error_envelope(data: &[u8]) -> Option<Value> {
    #[derive(Deserialize)]
    struct Envelope {
        error: Value,
    }
    let mut repaired = None;
    crate::surrogates::from_slice::<Envelope>(data, &mut repaired)
        .ok()
        .map(|e| e.error)
        .filter(|e| !e.is_null())
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
    /// FastAPI's error body (`{"detail": "..."}`, or a list of `{"loc", "msg"}` for a request
    /// that failed validation), which servers built on it answer (Xinference among them).
    #[serde(default)]
    detail: Option<Value>,
}

/// An error body: one envelope, or a list of them (the first is read). The list is tried first:
/// a struct also reads from a list, field by field, which would take the envelope for its
/// `error`.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrList {
    List(Vec<RawErrorEnvelope>),
    One(RawErrorEnvelope),
}

fn value_text(v: Option<Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The message of FastAPI's `detail`: its text, or a validation error's first complaint with
/// where it was (`body.messages: Field required`); never the `input` it quotes.
fn detail_text(detail: Option<Value>) -> Option<String> {
    let first = match detail? {
        Value::String(s) => return Some(s).filter(|s| !s.is_empty()),
        Value::Array(items) => items.into_iter().next()?,
        other => other,
    };
    let msg = first
        .get("msg")
        .or_else(|| first.get("message"))?
        .as_str()?;
    let at: Vec<String> = first
        .get("loc")
        .and_then(Value::as_array)
        .map(|loc| {
            loc.iter()
                .filter_map(|l| value_text(Some(l.clone())))
                .collect()
        })
        .unwrap_or_default();
    Some(if at.is_empty() {
        msg.to_owned()
    } else {
        format!("{}: {msg}", at.join("."))
    })
}

impl ProviderError {
    /// Reads an error envelope: `{"error": {...}}` (OpenAI and compatible servers),
    /// `{"type": "error", "error": {...}}` (Anthropic), `{"error": "text"}` (Ollama and others), a
    /// bare `{"type", "code", "message"}` object (the Responses `error` event) or FastAPI's
    /// `{"detail": ...}`. `None` when the
    /// bytes hold none of these.
    pub fn parse(body: &[u8]) -> Option<ProviderError> {
        // A lone half of a character in the message costs that character, not the error's kind.
        let mut repaired = None;
        let envelope = match crate::surrogates::from_slice::<OneOrList>(body, &mut repaired).ok()? {
            OneOrList::One(envelope) => envelope,
            // Google's APIs (Gemini's OpenAI-compatible endpoint among them) send the envelope
            // in a list of one: `[{"error": {...}}]`.
            OneOrList::List(mut list) => {
                if list.is_empty() {
                    return None;
                }
                list.swap_remove(0)
            }
        };
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
                let message = value_text(envelope.message).or_else(|| detail_text(envelope.detail));
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
        if self.is("exceed_context_size_error") {
            return true;
        }
        let m = message.to_ascii_lowercase();
        m.contains("context length")
            || m.contains("context size")
            || m.contains("context_length")
            || m.contains("context window")
            || m.contains("maximum context")
            || m.contains("prompt is too long")
            // Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
            || m.contains("exceeds the maximum number of tokens")
    }

    /// The error code, when it is an HTTP status (`"code": 502`): gateways such as OpenRouter
    /// put the status their upstream failed with there when they answer HTTP 200.
    fn code_as_status(&self) -> Option<u16> {
        self.code
            .as_deref()
            .and_then(|c| c.parse::<u16>().ok())
            .filter(|s| (400..600).contains(s))
    }

    /// The kind of failure this error (with this HTTP status, if any) is. Without a status (an
    /// error reported inside a successful answer), a code that is an HTTP status stands for it.
    pub fn kind(&self, status: Option<u16>) -> ModelErrorKind {
        let status = status.or_else(|| self.code_as_status());
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
        // OpenAI's Responses API says a model is at capacity with these codes, inside a 200
        // stream (a failed response, an `error` event): transient, as Anthropic's overload is.
        if status == Some(529)
            || self.is("overloaded_error")
            || self.is("server_is_overloaded")
            || self.is("slow_down")
        {
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
        let unparsed = is_unparsed_tool_output(&message);
        let message = if unparsed {
            format!("{message}{UNPARSED_HINT}")
        } else {
            message
        };
        let mut error = ModelError::new(kind, message).with_provider(provider);
        if unparsed {
            // The same prompt gives the same unparseable output (at temperature 0, always): a
            // retry spends a model call to fail again. The way out is the hint's. A provider
            // whose request samples makes it retryable again ([`redraw_unparsed`]).
            error.should_retry = Some(false);
        }
        error.status = status;
        error.error_type = self.error_type;
        error.provider_code = self.code;
        error.param = self.param;
        error.request_id = self.request_id;
        error
    }
}

/// What a local server's own error says when the model's output did not parse as the tool-call
/// format it expects (llama-server: "The model produced output that does not match the expected
/// peg-native format", older builds "Failed to parse input"; Ollama: "error parsing tool call").
/// Not a server fault: the model wrote its calls in a shape the server does not read.
pub fn is_unparsed_tool_output(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    (m.contains("does not match the expected") && m.contains("format"))
        || m.contains("failed to parse input at pos")
        || m.contains("error parsing tool call")
}

/// Groq's code for a model's tool call its server could not parse or check against the tool's
/// schema (a 400 to a whole-body request, an `error` event in a stream), whatever its message
/// says ("Failed to call a function...", "Tool call validation failed..."): a refusal of the
/// model's output, as [`is_unparsed_tool_output`] reads from a local server's message, and as
/// intermittent (pydantic/pydantic-ai#2774, pipecat-ai/pipecat#1168), so a sampled request
/// draws again. Its message stays as sent: the call may have parsed and failed the schema,
/// which no tool dialect mends.
const TOOL_USE_FAILED: &str = "tool_use_failed";

/// Whether a request with this temperature and seed (as sent: `None` when the request carries
/// none) samples: no seed and a temperature other than 0. No temperature leaves the server's
/// default, which samples (llama-server's is 0.8, OpenAI's 1).
pub(crate) fn samples(temperature: Option<f64>, seed: Option<i64>) -> bool {
    seed.is_none() && temperature != Some(0.0)
}

/// Makes a local server's refusal of the model's tool call ([`is_unparsed_tool_output`])
/// retryable, for a request that [`samples`]: its retry is a new draw, which may well parse,
/// where a greedy or seeded request would get the same output again. The server's own word
/// (`x-should-retry`) is applied after this, so it still wins.
pub(crate) fn redraw_unparsed(error: &mut ModelError) {
    let unparsed = error.should_retry == Some(false) && is_unparsed_tool_output(&error.message);
    if unparsed || error.provider_code.as_deref() == Some(TOOL_USE_FAILED) {
        error.should_retry = Some(true);
    }
}

/// Appended to such an error: what the user can change.
const UNPARSED_HINT: &str = ": the server could not parse the model's tool call. Set [model] \
    tool_dialect = \"auto\" (or the model's own: \"hermes\", \"mistral\", \"llama3-json\") so that \
    the tools go in the prompt and agentloop reads the calls from the model's text";

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
    classify_http_error_of(provider, status, headers, body, false)
}

/// [`classify_http_error`] for a request that [`samples`] or not: a sampled request's refused
/// tool call is worth a new draw ([`redraw_unparsed`]).
pub(crate) fn classify_http_error_of(
    provider: &str,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    sampled: bool,
) -> ModelError {
    let parsed = ProviderError::parse(body);
    // A page that is no error envelope is named by its title, its public label (a WAF's "Access
    // Denied" under a 403 is no bad key; a CDN's "522: Connection timed out"); the rest of the
    // body, which may hold anything, never reaches the message. The kind stays the status's.
    let title = match parsed.is_none().then(|| gist(body)).flatten() {
        Some(Gist::Html { title, .. }) => title,
        _ => None,
    };
    let mut error = parsed
        .unwrap_or_default()
        .into_model_error(provider, Some(status));
    if let Some(title) = title {
        error.message = format!("{}: an HTML page titled {title:?}", error.message);
    }
    if sampled {
        redraw_unparsed(&mut error);
    }
    if let Some(id) = request_id(headers) {
        error.request_id = Some(id);
    }
    error.retry_after = retry_after(headers);
    // The official SDKs retry a 409 (a lock or conflict on the server's side that clears).
    if status == 409 {
        error.should_retry = Some(true);
    }
    if let Some(said) = should_retry(headers) {
        error.should_retry = Some(said);
    }
    error
}

/// The server's `x-should-retry: true|false`, which the official OpenAI and Anthropic clients
/// obey over their own rules; any other value is no advice.
pub fn should_retry(headers: &HeaderMap) -> Option<bool> {
    match headers.get("x-should-retry")?.to_str().ok()?.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use reqwest::header::HeaderValue;

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
    fn a_local_servers_tool_parse_failure_is_not_retried_and_names_the_way_out() {
        let llama = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected peg-native format","type":"server_error"}}"#;
        let e = classify(500, llama);
        assert_eq!(e.kind, ModelErrorKind::Server);
        assert!(!e.is_retryable());
        assert!(
            e.message.starts_with("The model produced output"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("tool_dialect = \"auto\""),
            "{}",
            e.message
        );
        let ollama = r#"{"error":{"message":"error parsing tool call: raw='{\"x\"', err=unexpected end of JSON input"}}"#;
        assert!(!classify(500, ollama).is_retryable());
        // Any other server error is still a server fault, worth a retry.
        let other = r#"{"error":{"code":500,"message":"slot unavailable","type":"server_error"}}"#;
        assert!(classify(500, other).is_retryable());
        assert!(!classify(500, other).message.contains("tool_dialect"));
    }

    #[test]
    fn a_sampled_requests_tool_parse_failure_is_retried_unless_the_server_says_not() {
        let llama = br#"{"error":{"code":500,"message":"The model produced output that does not match the expected peg-native format","type":"server_error"}}"#;
        let sampled = |headers: &HeaderMap| classify_http_error_of("p", 500, headers, llama, true);
        let e = sampled(&HeaderMap::new());
        assert!(e.is_retryable());
        assert!(
            e.message.contains("tool_dialect = \"auto\""),
            "{}",
            e.message
        );
        assert!(!sampled(&headers(&[("x-should-retry", "false")])).is_retryable());
        // Only the refused tool call is lifted: a bad request stays one.
        let bad = br#"{"error":{"message":"bad","type":"invalid_request_error"}}"#;
        assert!(!classify_http_error_of("p", 400, &HeaderMap::new(), bad, true).is_retryable());
        assert!(samples(None, None));
        assert!(samples(Some(0.7), None));
        assert!(!samples(Some(0.0), None));
        assert!(!samples(Some(-0.0), None));
        assert!(!samples(Some(0.7), Some(42)));
        assert!(!samples(None, Some(0)));
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
    fn an_error_body_whose_message_holds_a_lone_surrogate_keeps_its_kind() {
        // A 400 whose message quotes the prompt cut in the middle of a character.
        let ctx = r#"{"error":{"message":"prompt is too long: \ud83d","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        let e = classify(400, ctx);
        assert_eq!(e.kind, ModelErrorKind::ContextLength);
        assert_eq!(e.message, "prompt is too long: \u{fffd}");
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
}
