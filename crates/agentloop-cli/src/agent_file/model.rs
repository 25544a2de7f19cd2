//! What the file's `[model]` says without building anything: its price and where the price comes
//! from, and a scripted model's script. The checker reads them to judge the file, the assembler to
//! build the agent, `plan` to show them.

use agentloop::Price;
use agentloop::testing::ScriptedModel;

use super::{ModelSpec, Provider};

/// Where the price of an agent's model comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PriceSource {
    /// The agent file's `[model] price`.
    AgentFile,
    /// The providers' built-in table, for a live model it knows.
    BuiltIn,
}

/// The price of the file's model: its `[model] price`, or the built-in table's entry for a live
/// model; `None` when the model is unpriced (a scripted model without a price, a local server's
/// model name).
pub fn price(model: &ModelSpec) -> Option<(Price, PriceSource)> {
    if let Some(p) = &model.price {
        return Some((p.get_ref().price(), PriceSource::AgentFile));
    }
    if *model.provider.get_ref() == Provider::Scripted {
        return None;
    }
    let name = model.name.as_ref()?;
    agentloop_providers::default_prices()
        .get(name.get_ref())
        .map(|p| (*p, PriceSource::BuiltIn))
}

/// A scripted model's script file: the core reads JSON, the CLI reads the file.
pub fn read_script(path: &std::path::Path) -> Result<ScriptedModel, String> {
    let text = crate::text_file::read_text(path, crate::text_file::MAX_AGENT_TEXT_BYTES)
        .map_err(|e| format!("script {}: {e}", crate::terminal::shown_path(path)))?;
    ScriptedModel::from_json(&text)
        .map_err(|e| format!("script {}: {e}", crate::terminal::shown_path(path)))
}
