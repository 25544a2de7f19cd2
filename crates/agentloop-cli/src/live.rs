//! Live providers: OpenAI Chat Completions (and compatible servers), the OpenAI Responses API and
//! Anthropic Messages, from `agentloop-providers`. A live model is wrapped in the providers'
//! [`Retry`] layer and priced with their default table.
//!
//! The API key: when the file names `api_key_env`, that variable must be set. When it names none,
//! the provider's usual variable (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`) must be set, except for
//! an OpenAI-compatible `base_url` (a local or third-party server): then no key is sent at all, so
//! an OpenAI key in the environment never reaches another server; a server that wants a key gets
//! the one `api_key_env` names. A missing key is an error naming the variable; a key is never
//! printed. Such a server also gets `max_tokens` rather than OpenAI's `max_completion_tokens`.

use std::sync::Arc;

use agentloop::model::cache::WireKey;
use agentloop::{Model, limits::Pricing, model::ModelRequest};
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::openai_chat::{MaxTokensField, PromptCacheKey, ToolDialect};
use agentloop_providers::openai_responses::OpenAiResponses;
use agentloop_providers::{OpenAiChat, Retry, default_prices};
use serde_json::{Value, json};

use crate::agent_file::{AgentFile, Provider};
use crate::error::CliError;

/// A live provider's model, before the retry layer.
enum Live {
    Chat(OpenAiChat),
    Responses(OpenAiResponses),
    Anthropic(Anthropic),
}

/// Whether building needs the key to be present.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    /// A run: the key must be set.
    Required,
    /// `plan` and `--dry-run`: nothing is sent, so no key is read.
    NotNeeded,
}

fn provider_error(e: &agentloop::ModelError) -> CliError {
    CliError::Provider {
        message: format!("{}: {}", e.code(), e.message),
    }
}

fn key_var(file: &AgentFile, provider: Provider) -> Option<String> {
    if key_optional(file, provider) {
        return None;
    }
    file.api_key_env()
        .or_else(|| provider.default_key_env().map(str::to_owned))
}

fn key_is_set(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty())
}

/// True for OpenAI's own API (which wants `max_completion_tokens`).
fn is_openai_host(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', ':']).next().unwrap_or_default();
    host == "api.openai.com" || host.ends_with(".openai.azure.com")
}

/// True when the key may be left out: an OpenAI-compatible server at the file's own base URL,
/// with no `api_key_env` named.
fn key_optional(file: &AgentFile, provider: Provider) -> bool {
    let m = file.model();
    provider == Provider::OpenAi
        && m.api_key_env.is_none()
        && m.base_url
            .as_ref()
            .is_some_and(|u| !is_openai_host(u.get_ref()))
}

fn build(file: &AgentFile, provider: Provider, key: Key) -> Result<Live, CliError> {
    let m = file.model();
    let name = m
        .name
        .as_ref()
        .map(|n| n.get_ref().clone())
        .unwrap_or_default();
    let base_url = m.base_url.as_ref().map(|u| u.get_ref().clone());
    let stream = m.stream.unwrap_or(true);
    let idle = m
        .idle_timeout_secs
        .as_ref()
        .map(|t| std::time::Duration::from_secs_f64(*t.get_ref()))
        .unwrap_or(agentloop_providers::http::DEFAULT_IDLE_TIMEOUT);
    let keepalive = m
        .keepalive_timeout_secs
        .as_ref()
        .map(|t| std::time::Duration::from_secs_f64(*t.get_ref()))
        .unwrap_or(agentloop_providers::http::DEFAULT_KEEPALIVE_TIMEOUT);
    let var = key_var(file, provider);
    let send_key = match (&var, key) {
        (Some(v), Key::Required) if !key_is_set(v) => {
            if key_optional(file, provider) {
                false
            } else {
                return Err(CliError::MissingApiKey {
                    provider: provider.as_str().to_owned(),
                    var: v.clone(),
                });
            }
        }
        (Some(v), Key::NotNeeded) => key_is_set(v) || !key_optional(file, provider),
        (Some(_), Key::Required) => true,
        (None, _) => false,
    };
    match provider {
        Provider::OpenAi => {
            let mut b = OpenAiChat::builder(name)
                .stream(stream)
                .idle_timeout(idle)
                .keepalive_timeout(keepalive);
            if let Some(url) = base_url {
                if !is_openai_host(&url) {
                    b = b.max_tokens_field(MaxTokensField::MaxTokens);
                }
                b = b.base_url(url);
            }
            if let Some(send) = &m.reasoning_content {
                b = b.reasoning_in_history(*send.get_ref());
            }
            if let Some(send) = &m.tool_call_extra {
                b = b.tool_call_extra(*send.get_ref());
            }
            if let Some(dialect) = m
                .tool_dialect
                .as_ref()
                .and_then(|d| ToolDialect::from_name(d.get_ref()))
            {
                b = b.tool_dialect(dialect);
            }
            if let Some(key) = &m.prompt_cache_key {
                b = b.prompt_cache_key(match key.get_ref().as_str() {
                    "auto" => PromptCacheKey::Derived,
                    "off" => PromptCacheKey::Off,
                    other => PromptCacheKey::Fixed(other.to_owned()),
                });
            }
            b = match (&var, send_key) {
                (Some(v), true) => b.api_key_env(v.clone()),
                _ => b.no_api_key(),
            };
            b.build().map(Live::Chat).map_err(|e| provider_error(&e))
        }
        Provider::OpenAiResponses => {
            let mut b = OpenAiResponses::builder(name)
                .stream(stream)
                .idle_timeout(idle)
                .keepalive_timeout(keepalive);
            if let Some(url) = base_url {
                b = b.base_url(url);
            }
            b = match (&var, send_key) {
                (Some(v), true) => b.api_key_env(v.clone()),
                _ => b.no_api_key(),
            };
            b.build()
                .map(Live::Responses)
                .map_err(|e| provider_error(&e))
        }
        Provider::Anthropic => {
            let mut b = Anthropic::builder(name)
                .stream(stream)
                .idle_timeout(idle)
                .keepalive_timeout(keepalive)
                .prompt_caching(m.prompt_caching.as_ref().is_none_or(|on| *on.get_ref()));
            if let Some(url) = base_url {
                b = b.base_url(url);
            }
            if let Some(v) = &var {
                b = b.api_key_env(v.clone());
            }
            b.build()
                .map(Live::Anthropic)
                .map_err(|e| provider_error(&e))
        }
        Provider::Scripted => Err(CliError::Setup {
            message: "the scripted provider is not a live provider".into(),
        }),
    }
}

/// The live model the file names, wrapped in retries.
pub fn model(file: &AgentFile, provider: Provider) -> Result<Arc<dyn Model>, CliError> {
    Ok(match build(file, provider, Key::Required)? {
        Live::Chat(m) => Arc::new(Retry::new(m)),
        Live::Responses(m) => Arc::new(Retry::new(m)),
        Live::Anthropic(m) => Arc::new(Retry::new(m)),
    })
}

/// Prices for a provider's models (none for the scripted provider).
pub fn pricing(provider: Provider) -> Option<Arc<dyn Pricing>> {
    match provider {
        Provider::Scripted => None,
        _ => Some(Arc::new(default_prices())),
    }
}

impl Live {
    /// The URL a request goes to (the file's `base_url`, else the provider's own), and the
    /// header that carries the key.
    fn endpoint(&self, file: &AgentFile) -> (String, &'static str) {
        let (base, path, auth_header) = match self {
            Live::Chat(_) => (
                "https://api.openai.com/v1",
                "/chat/completions",
                "authorization",
            ),
            Live::Responses(_) => ("https://api.openai.com/v1", "/responses", "authorization"),
            Live::Anthropic(_) => ("https://api.anthropic.com", "/v1/messages", "x-api-key"),
        };
        let base = file
            .model()
            .base_url
            .as_ref()
            .map_or(base, |u| u.get_ref().as_str())
            .trim_end_matches('/');
        (format!("{base}{path}"), auth_header)
    }

    /// The provider's own encoded body of `request`.
    fn encode(&self, request: &ModelRequest<'_>) -> Result<Vec<u8>, agentloop::ModelError> {
        match self {
            Live::Chat(model) => model.encode_request(request),
            Live::Responses(model) => model.encode_request(request),
            Live::Anthropic(model) => model.encode_request(request),
        }
    }
}

/// What a request of the file's live model is on the wire, for the response cache's key: the
/// URL it goes to and the body it encodes to. Every `[model]` option that changes what is sent
/// (the base URL, the tool dialect, reasoning sent back, the prompt cache key, the output-limit
/// field) changes one of them, so answers of another server or another encoding are never
/// reused. `None` for the scripted provider, which sends nothing.
pub fn wire_key(file: &AgentFile, provider: Provider) -> Result<Option<WireKey>, CliError> {
    if provider == Provider::Scripted {
        return Ok(None);
    }
    let live = build(file, provider, Key::NotNeeded)?;
    let (url, _) = live.endpoint(file);
    Ok(Some(Arc::new(move |request: &ModelRequest<'_>| {
        let body = live.encode(request).ok()?;
        Some(json!({"url": url, "body": String::from_utf8_lossy(&body)}))
    })))
}

/// The first request a live agent would send: method, URL, headers (the key redacted) and the
/// provider's own encoded body. Reads no key and sends nothing.
pub fn first_request(
    file: &AgentFile,
    provider: Provider,
    request: &ModelRequest<'_>,
) -> Result<Value, CliError> {
    let live = build(file, provider, Key::NotNeeded)?;
    let body = live.encode(request).map_err(|e| provider_error(&e))?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (url, auth_header) = live.endpoint(file);
    let var = key_var(file, provider);
    let mut headers = serde_json::Map::new();
    headers.insert("content-type".into(), json!("application/json"));
    match &var {
        Some(v) if key_is_set(v) || !key_optional(file, provider) => {
            let shown = if auth_header == "authorization" {
                "Bearer [redacted]"
            } else {
                "[redacted]"
            };
            headers.insert(auth_header.into(), json!(format!("{shown} (from ${v})")));
        }
        _ => {}
    }
    if provider == Provider::Anthropic {
        headers.insert(
            "anthropic-version".into(),
            json!(agentloop_providers::anthropic::ANTHROPIC_VERSION),
        );
        if request.tools.iter().any(|t| t.deferred) {
            headers.insert(
                "anthropic-beta".into(),
                json!(agentloop_providers::anthropic::TOOL_SEARCH_BETA),
            );
        }
    }
    Ok(json!({
        "method": "POST",
        // Shown like the key: a credential in the URL (`?key=`, `user:pass@`) is redacted.
        "url": agentloop::url_secrets::shown(&url),
        "headers": headers,
        "body": body,
    }))
}

#[cfg(test)]
mod tests {
    use super::is_openai_host;

    #[test]
    fn only_openai_hosts_count_as_openai() {
        assert!(is_openai_host("https://api.openai.com/v1"));
        assert!(is_openai_host("https://me.openai.azure.com/openai"));
        assert!(!is_openai_host("http://127.0.0.1:8080/v1"));
        assert!(!is_openai_host("https://api.openai.com.evil.example/v1"));
        assert!(!is_openai_host("https://openrouter.ai/api/v1"));
    }
}
