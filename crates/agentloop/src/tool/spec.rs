//! What a model and an operator know of a tool: its [`ToolSpec`] and [`ExecutionMode`], and the
//! JSON Schema a typed argument gives it ([`schema_for`]).

use std::time::Duration;

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

/// What a model and an operator know of a tool.
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
    /// Per-attempt timeout: a slower attempt becomes a tool error (code `timeout`), retried under
    /// `retries`, then read by the model.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::serde_duration::option"
    )]
    pub timeout: Option<Duration>,
    /// How many times a failed call is run again before the model sees the failure: a recoverable
    /// error or a timeout (not one marked [`ToolError::permanent`](super::ToolError::permanent), as unreadable arguments are;
    /// not a fatal error or a panic). The model reads
    /// only the last attempt's result. For tools whose failures are transient and which are safe
    /// to run again with the same arguments: a timed-out attempt may have done part of its work.
    /// Hooks and the permission gate see one call, whatever its attempts; the attempts count as
    /// one call for `max_tool_calls`. No retry starts once the run is interrupted or its batch
    /// stops on a fatal failure.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
    /// Each call runs as a tokio task of its own instead of inside the run's task: on a
    /// multi-thread runtime another worker can run it, so a CPU-heavy or blocking handler runs in
    /// parallel with the run (its deadline, its timeouts) and its siblings, as far as there are
    /// workers; on a current-thread runtime it changes nothing. A blocking handler cannot be
    /// stopped: when its call is abandoned it runs on until it returns. Costs one task per call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_task: bool,
}

/// For serde: a zero count is left out.
fn is_zero(n: &u32) -> bool {
    *n == 0
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
