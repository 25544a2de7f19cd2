//! `[model]`: what its provider needs and allows (keys, a script, a live model's name), the
//! sampling settings, and the price.

use std::ops::Range;
use std::path::Path;

use super::{check_seconds, span_of};
use crate::agent_file::check::{Problems, join};
use crate::agent_file::spec::{ModelSpec, PriceSpec, Provider, ToolSearchSpec};

/// `[model]`: what its provider needs and allows, then the sampling settings and the price.
pub(super) fn check_model(model: &ModelSpec, dir: &Path, problems: &mut Problems) {
    if let Some(t) = &model.context_tokens {
        let reserve = model
            .max_tokens
            .as_ref()
            .map_or(0, |m| u64::from(*m.get_ref()));
        if *t.get_ref() < 256 || *t.get_ref() <= reserve {
            problems.at(
                "model.context_tokens",
                span_of(t),
                "context_tokens must be at least 256 and more than max_tokens (the room kept \
                 for the answer)",
            );
        }
    }
    if let Some(k) = &model.compaction_keep_turns
        && *k.get_ref() == 0
    {
        problems.at(
            "model.compaction_keep_turns",
            span_of(k),
            "compaction_keep_turns must be at least 1: the latest turn always stays whole",
        );
    }
    for (key, t) in [
        ("cache_ttl_secs", &model.cache_ttl_secs),
        ("idle_timeout_secs", &model.idle_timeout_secs),
        ("keepalive_timeout_secs", &model.keepalive_timeout_secs),
    ] {
        check_seconds("model", key, t.as_ref(), problems);
    }
    if let (Some(choice), Some(_)) = (&model.tool_choice, &model.tool_dialect)
        && choice.get_ref() != "auto"
    {
        problems.at(
            "model.tool_choice",
            span_of(choice),
            "a forced tool_choice needs the server's own tool calling, and with tool_dialect \
             the server gets no tools to choose from: drop one of the two",
        );
    }
    check_provider_keys(model, problems);
    if *model.provider.get_ref() == Provider::Scripted {
        check_scripted_model(model, dir, problems);
    } else {
        check_live_model(model, problems);
    }
    if let Some(t) = &model.temperature
        && !(0.0..=2.0).contains(t.get_ref())
    {
        problems.at(
            "model.temperature",
            span_of(t),
            "the temperature must be between 0 and 2",
        );
    }
    if let Some(price) = &model.price {
        check_price(price.get_ref(), problems);
    }
    if let Some(m) = &model.max_tokens
        && *m.get_ref() == 0
    {
        problems.at(
            "model.max_tokens",
            span_of(m),
            "max_tokens must be at least 1",
        );
    }
}

/// The `[model]` keys of one provider's options, used with another provider.
fn check_provider_keys(model: &ModelSpec, problems: &mut Problems) {
    let provider = *model.provider.get_ref();
    let keys = [
        (
            "reasoning_content",
            Provider::OpenAi,
            model.reasoning_content.as_ref().map(span_of),
        ),
        (
            "tool_call_extra",
            Provider::OpenAi,
            model.tool_call_extra.as_ref().map(span_of),
        ),
        (
            "prompt_cache_key",
            Provider::OpenAi,
            model.prompt_cache_key.as_ref().map(span_of),
        ),
        (
            "prompt_caching",
            Provider::Anthropic,
            model.prompt_caching.as_ref().map(span_of),
        ),
        (
            "tool_dialect",
            Provider::OpenAi,
            model.tool_dialect.as_ref().map(span_of),
        ),
    ];
    for (key, owner, span) in keys {
        if let Some(span) = span
            && provider != owner
        {
            problems.at(
                &join("model", key),
                span,
                format!(
                    "`{key}` applies to the {} provider only, not {}",
                    owner.as_str(),
                    provider.as_str()
                ),
            );
        }
    }
    if let Some(ts) = &model.tool_search
        && *ts.get_ref() == ToolSearchSpec::Native
        && !ToolSearchSpec::Native.native_for(provider)
    {
        problems.at(
            "model.tool_search",
            span_of(ts),
            format!(
                "the {} provider has no native tool search: use \"local\" or \"auto\"",
                provider.as_str()
            ),
        );
    }
    if let Some(d) = &model.tool_dialect
        && agentloop_providers::openai_chat::ToolDialect::from_name(d.get_ref()).is_none()
    {
        problems.at(
            "model.tool_dialect",
            span_of(d),
            format!(
                "unknown tool_dialect {:?}: one of {}",
                d.get_ref(),
                agentloop_providers::openai_chat::ToolDialect::NAMES
                    .map(|n| format!("{n:?}"))
                    .join(", ")
            ),
        );
    }
    if let Some(key) = &model.prompt_cache_key
        && key.get_ref().trim().is_empty()
    {
        problems.at(
            "model.prompt_cache_key",
            span_of(key),
            "prompt_cache_key is empty: give \"auto\", \"off\" or a key",
        );
    }
}

/// A scripted model: a script that reads, and none of a live provider's keys.
fn check_scripted_model(model: &ModelSpec, dir: &Path, problems: &mut Problems) {
    let live_only = |problems: &mut Problems, key: &str, span: Option<Range<usize>>| {
        problems.at(
            &join("model", key),
            span,
            format!("`{key}` does not apply to the scripted provider"),
        );
    };
    match &model.script {
        None => problems.at(
            "model.script",
            span_of(&model.provider),
            "the scripted provider needs `script`: a JSON file of responses, in order",
        ),
        Some(script) => {
            let path = dir.join(script.get_ref());
            if let Err(e) = crate::agent_file::model::read_script(&path) {
                problems.at("model.script", span_of(script), e.to_string());
            }
        }
    }
    if let Some(v) = &model.base_url {
        live_only(problems, "base_url", span_of(v));
    }
    if let Some(v) = &model.api_key_env {
        live_only(problems, "api_key_env", span_of(v));
    }
    if let Some(v) = &model.idle_timeout_secs {
        live_only(problems, "idle_timeout_secs", span_of(v));
    }
    if let Some(v) = &model.keepalive_timeout_secs {
        live_only(problems, "keepalive_timeout_secs", span_of(v));
    }
}

/// A live model: a name, an http(s) URL, an environment variable name, and no script.
fn check_live_model(model: &ModelSpec, problems: &mut Problems) {
    let provider = *model.provider.get_ref();
    if let Some(script) = &model.script {
        problems.at(
            "model.script",
            span_of(script),
            format!(
                "`script` is for the scripted provider only, not {}",
                provider.as_str()
            ),
        );
    }
    match &model.name {
        None => problems.at(
            "model.name",
            span_of(&model.provider),
            format!("the {} provider needs a model `name`", provider.as_str()),
        ),
        Some(n) if n.get_ref().trim().is_empty() => {
            problems.at("model.name", span_of(n), "the model name is empty")
        }
        Some(_) => {}
    }
    if let Some(url) = &model.base_url {
        let u = url.get_ref();
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            problems.at(
                "model.base_url",
                span_of(url),
                format!("{u:?} is not an http:// or https:// URL"),
            );
        }
    }
    if let Some(env) = &model.api_key_env {
        let e = env.get_ref();
        if e.is_empty() || !e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            problems.at(
                "model.api_key_env",
                span_of(env),
                format!("{e:?} is not an environment variable name"),
            );
        }
    }
}

/// The most a price may be, in USD per million tokens: a dollar a token, thousands of times the
/// dearest model's. Bounded so that a run's cost stays a number: `1e308` a token times a
/// million tokens is infinite, which `--json` could only show as `null` and a budget could
/// not compare.
pub(crate) const MAX_PRICE: f64 = 1_000_000.0;

/// `[model] price`: every part a number of USD per million tokens, from zero to [`MAX_PRICE`].
fn check_price(p: &PriceSpec, problems: &mut Problems) {
    let parts = [
        ("input", Some(&p.input)),
        ("output", Some(&p.output)),
        ("cached_input", p.cached_input.as_ref()),
        ("cache_write", p.cache_write.as_ref()),
    ];
    for (key, value) in parts {
        if let Some(v) = value
            && !(v.get_ref().is_finite() && (0.0..=MAX_PRICE).contains(v.get_ref()))
        {
            problems.at(
                &format!("model.price.{key}"),
                span_of(v),
                format!(
                    "a price must be a number of USD per million tokens, zero or more and at \
                     most {MAX_PRICE}"
                ),
            );
        }
    }
}
