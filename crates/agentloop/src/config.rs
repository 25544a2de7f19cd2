//! What an agent is, independent of any one run, and shared by all its runs: instructions, tools,
//! limits, how invalid calls are treated, the output schema and the model settings.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::limits::Limits;
use crate::model::ModelSettings;
use crate::tool::{ToolSet, compile_schema, validate_with};

/// What to do with a call the model got wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalidCall {
    /// Send an error result to the model, which may recover (the default).
    #[default]
    FeedBack,
    /// Fail the run.
    Fail,
}

/// What a tool handler's panic does to the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnToolPanic {
    /// The model reads an error result (code `tool.panicked`) and may route around it; the panic
    /// message goes to the operator only (the default).
    #[default]
    Recover,
    /// The run fails (`tool.panicked`) once the batch is drained.
    Fail,
}

/// How invalid decisions, and tools that panic, are treated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionPolicy {
    /// A call to a tool that is not registered.
    pub unknown_tool: OnInvalidCall,
    /// Arguments that are not JSON or fail the schema.
    pub invalid_arguments: OnInvalidCall,
    /// A tool handler that panics.
    #[serde(default)]
    pub tool_panic: OnToolPanic,
}

/// The JSON Schema a final answer must match, compiled once.
#[derive(Clone)]
pub(crate) struct OutputSchema {
    value: Value,
    validator: Arc<jsonschema::Validator>,
}

impl OutputSchema {
    pub(crate) fn new(value: Value) -> Result<Self, String> {
        let validator = compile_schema(&value).map_err(|e| e.to_string())?;
        Ok(OutputSchema {
            value,
            validator: Arc::new(validator),
        })
    }

    pub(crate) fn value(&self) -> &Value {
        &self.value
    }

    /// Checks an answer; the violations joined for the model to read.
    pub(crate) fn check(&self, answer: &Value) -> Result<(), String> {
        validate_with(&self.validator, answer).map_err(|v| crate::tool::join_violations(&v))
    }
}

/// What an agent is, independent of any one run. Shared by all its runs; build one with
/// [`crate::Agent::builder`] and read it with [`crate::Agent::config`].
pub struct AgentConfig {
    pub(crate) name: String,
    pub(crate) instructions: Option<String>,
    pub(crate) tools: ToolSet,
    /// How many of `tools` are the agent's own: those after them are its tool source's.
    pub(crate) own_tools: usize,
    pub(crate) limits: Limits,
    pub(crate) policy: DecisionPolicy,
    pub(crate) output_schema: Option<OutputSchema>,
    pub(crate) settings: ModelSettings,
    pub(crate) compaction: Option<crate::compaction::Compaction>,
}

impl AgentConfig {
    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The system instructions.
    pub fn instructions(&self) -> Option<&str> {
        self.instructions.as_deref()
    }

    /// The tools.
    pub fn tools(&self) -> &ToolSet {
        &self.tools
    }

    /// The limits every run starts with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// How invalid calls are treated.
    pub fn policy(&self) -> DecisionPolicy {
        self.policy
    }

    /// The schema of the final answer, if any.
    pub fn output_schema(&self) -> Option<&Value> {
        self.output_schema.as_ref().map(OutputSchema::value)
    }

    /// Model settings sent with every call.
    pub fn settings(&self) -> &ModelSettings {
        &self.settings
    }

    /// How conversations are compacted, when they are.
    pub fn compaction(&self) -> Option<&crate::compaction::Compaction> {
        self.compaction.as_ref()
    }
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("name", &self.name)
            .field("tools", &self.tools)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}
