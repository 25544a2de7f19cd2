//! The model of an agent file: scripted, or a live provider behind its response cache, and what
//! the file's `[model]` says beside it (sampling settings, tool choice, compaction, a price).

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    Model,
    model::{ModelSettings, ToolChoice},
    testing::ScriptedModel,
};

use crate::agent_file::{AgentFile, ModelSpec, Provider};

use crate::error::CliError;

/// The model settings the file asks for.
pub fn settings(file: &AgentFile) -> ModelSettings {
    let m = file.model();
    ModelSettings {
        temperature: m.temperature.as_ref().map(|t| *t.get_ref()),
        seed: m.seed,
        max_tokens: m.max_tokens.as_ref().map(|t| *t.get_ref()),
        tool_choice: m.tool_choice.as_ref().map(|c| match c.get_ref().as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            name => ToolChoice::Tool(name.to_owned()),
        }),
        ..ModelSettings::default()
    }
}

/// How the file's conversations are compacted: at `context_tokens`, else at its model's known
/// window; `None` when `compaction = "off"` or the window is unknown.
pub fn compaction(file: &AgentFile) -> Option<agentloop::compaction::Compaction> {
    use crate::agent_file::CompactionSpec;
    use agentloop::compaction::{Compaction, CompactionPolicy, known_context_tokens};
    let m = file.model();
    let policy = match m.compaction {
        Some(CompactionSpec::Off) => return None,
        Some(CompactionSpec::DropToolResults) => CompactionPolicy::DropToolResults,
        Some(CompactionSpec::Summarize) | None => CompactionPolicy::Summarize,
    };
    let window = m
        .context_tokens
        .as_ref()
        .map(|t| *t.get_ref())
        .or_else(|| {
            m.name
                .as_ref()
                .and_then(|n| known_context_tokens(n.get_ref()))
        })?;
    let mut c = Compaction::new(window).policy(policy);
    if let Some(k) = &m.compaction_keep_turns {
        c = c.keep_turns(*k.get_ref());
    }
    Some(c)
}

/// The scripted model of a scripted agent file.
pub fn scripted_model(file: &AgentFile) -> Result<ScriptedModel, CliError> {
    let m = file.model();
    let script = m
        .script
        .as_ref()
        .map(|s| file.resolve(s.get_ref()))
        .ok_or_else(|| CliError::Setup {
            message: "the scripted provider needs `script`".into(),
        })?;
    let model = crate::agent_file::model::read_script(&script)
        .map_err(|message| CliError::Setup { message })?;
    Ok(model.streaming(m.stream.unwrap_or(true)))
}

/// The model the file names. Live providers need their API key; their calls are retried.
pub fn model(file: &AgentFile) -> Result<Arc<dyn Model>, CliError> {
    let model: Arc<dyn Model> = match *file.model().provider.get_ref() {
        Provider::Scripted => Arc::new(scripted_model(file)?),
        live => crate::live::model(file, live)?,
    };
    cached(file, model)
}

/// The default time a cached answer is kept: a day.
const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The model behind a response cache, when the file asks for one (`[model] cache = true`).
fn cached(file: &AgentFile, model: Arc<dyn Model>) -> Result<Arc<dyn Model>, CliError> {
    let m = file.model();
    if m.cache != Some(true) {
        return Ok(model);
    }
    let path = std::env::var_os("AGENTLOOP_RESPONSE_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| file.resolve("responses.db"));
    let store =
        agentloop_store::SqliteResponseCache::open(&path).map_err(|message| CliError::Setup {
            message: format!("the response cache: {message}"),
        })?;
    let ttl = m
        .cache_ttl_secs
        .as_ref()
        .and_then(|s| Duration::try_from_secs_f64(*s.get_ref()).ok())
        .unwrap_or(DEFAULT_CACHE_TTL);
    let mut cached = agentloop::model::cache::CachedModel::new(model, Arc::new(store), ttl);
    // Keyed by the server and the encoded body too: never another server's answer.
    if let Some(wire) = crate::live::wire_key(file, *m.provider.get_ref())? {
        cached = cached.keyed_by_wire(wire);
    }
    Ok(Arc::new(cached))
}

/// True when the agent's answers are priced at all (the file's price, or the built-in table a
/// live provider is priced with): then an answer the pricing does not know has an unknown
/// cost, not a cost that is simply not counted.
pub fn has_pricing(model: &ModelSpec) -> bool {
    model.price.is_some() || *model.provider.get_ref() != Provider::Scripted
}

/// What the file's `[model]` says of the run beside the model itself: its sampling settings and
/// tool choice, its compaction and its price. Every agent built from a `[model]` table goes
/// through here (the CLI's, and the Python package's `Provider`), so a key means the same in
/// each.
pub fn with_model_keys(
    mut builder: agentloop::AgentBuilder,
    file: &AgentFile,
) -> agentloop::AgentBuilder {
    builder = builder.settings(settings(file));
    builder = match compaction(file) {
        Some(c) => builder.compaction(c),
        None => builder.without_compaction(),
    };
    if let Some(price) = file.model().price.as_ref().map(|p| p.get_ref().price()) {
        // The file prices its own model, whatever name the server answers with.
        builder = builder.pricing(move |_: &str, _: &str, usage: &agentloop::model::Usage| {
            Some(price.cost(usage))
        });
    } else if let Some(pricing) = crate::live::pricing(*file.model().provider.get_ref()) {
        builder = builder.pricing(
            move |provider: &str, model: &str, usage: &agentloop::model::Usage| {
                pricing.cost(provider, model, usage)
            },
        );
    }
    builder
}
