//! What the model and the gate know of a tool: its [`ToolSpec`] and [`ExecutionMode`], and the
//! JSON Schema a typed argument gives it ([`schema_for`]). How its calls run is its
//! [`ToolPolicy`](super::ToolPolicy), which its layers own.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a tool runs beside the other calls of its batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// May run at the same time as other calls (the default).
    #[default]
    Parallel,
    /// Forces its whole batch to run one call at a time.
    Sequential,
}

/// What the model and the gate know of a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema (2020-12) its arguments must match.
    pub input_schema: Value,
    /// The JSON Schema of its output, when it declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Parallel or sequential.
    #[serde(default)]
    pub mode: ExecutionMode,
    /// It changes the world (files, services): permission gates may treat it with care.
    #[serde(default)]
    pub mutating: bool,
    /// Running it twice with the same arguments does no more harm than once: a call in flight at a
    /// crash may be re-run on resume.
    #[serde(default)]
    pub idempotent: bool,
    /// It polls something that changes on its own (a job's status, a CI run): the stuck-loop
    /// rule judges its repeated calls by their results alone, whatever their arguments.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub poller: bool,
    /// It runs another agent ([`crate::Agent::as_tool`]): its calls draw on the run's budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subagent: bool,
    /// It hands the conversation to another agent ([`crate::handoff::Handoff`]): its call must
    /// be the only one of its turn, and the other agent's answer is the run's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handoff: bool,
    /// The model finds it by a search before it may call it (a provider's native tool search:
    /// sent every turn, marked `defer_loading`, so the request's prefix never changes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deferred: bool,
}

/// The JSON Schema (2020-12) of a type, as tools use it: no `$schema` or `title` at the top.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let schema = generator.into_root_schema_for::<T>();
    let mut value = schema.to_value();
    if let Value::Object(map) = &mut value {
        map.remove("$schema");
        map.remove("title");
        if !map.contains_key("properties")
            && map.get("type").and_then(Value::as_str) == Some("object")
        {
            map.insert("properties".into(), Value::Object(Default::default()));
        }
    }
    value
}
