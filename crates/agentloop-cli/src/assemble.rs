//! From a checked agent file to a runnable [`Agent`]: the model (scripted or a live provider
//! wrapped in retries), the command tools, the limits and the model settings.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{Agent, Limits, Model, ModelSettings, ScriptedModel, Tool};
use agentloop_tools::CommandTool;
use serde_json::json;

use crate::agent_file::{AgentFile, Provider};
use crate::error::CliError;

/// The limits the file asks for, over the core's defaults.
pub fn limits(file: &AgentFile) -> Limits {
    let mut limits = Limits::default();
    let Some(l) = &file.spec.limits else {
        return limits;
    };
    limits.max_turns = l.max_turns.as_ref().map(|v| *v.get_ref());
    limits.max_tool_calls = l.max_tool_calls;
    limits.max_model_calls = l.max_model_calls;
    limits.max_tokens = l.max_tokens;
    limits.max_cost_usd = l.max_cost_usd.as_ref().map(|v| *v.get_ref());
    limits.timeout = l
        .timeout_secs
        .as_ref()
        .map(|v| Duration::from_secs_f64(*v.get_ref()));
    if let Some(c) = &l.max_concurrency {
        limits.max_concurrency = *c.get_ref();
    }
    if let Some(s) = l.stuck_loop_threshold {
        limits.stuck_loop_threshold = s;
    }
    limits
}

/// The model settings the file asks for.
pub fn settings(file: &AgentFile) -> ModelSettings {
    let m = file.model();
    ModelSettings {
        temperature: m.temperature.as_ref().map(|t| *t.get_ref()),
        seed: m.seed,
        max_tokens: m.max_tokens.as_ref().map(|t| *t.get_ref()),
        ..ModelSettings::default()
    }
}

/// The command tools. Their children never see the agent's API key variable, nor any
/// `*_API_KEY`.
pub fn tools(file: &AgentFile) -> Result<Vec<Tool>, CliError> {
    let hidden = file.api_key_env();
    file.tools()
        .iter()
        .map(|t| {
            let mut tool = CommandTool::new(t.name.get_ref().clone(), t.command.get_ref().clone())
                .description(t.description.clone().unwrap_or_default())
                .input_schema(t.input_schema.as_ref().map_or_else(
                    || json!({"type": "object", "properties": {}}),
                    |s| s.get_ref().clone(),
                ))
                .mode(t.mode.unwrap_or_default())
                .working_dir(&file.dir);
            if let Some(secs) = &t.timeout_secs {
                tool = tool.timeout(Duration::from_secs_f64(*secs.get_ref()));
            }
            if let Some(var) = &hidden {
                tool = tool.hide_env(var.clone());
            }
            tool.into_tool().map_err(|e| CliError::Setup {
                message: e.to_string(),
            })
        })
        .collect()
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
    let model = ScriptedModel::from_file(&script).map_err(|e| CliError::Setup {
        message: e.to_string(),
    })?;
    Ok(model.streaming(m.stream.unwrap_or(true)))
}

/// The model the file names. Live providers need their API key; their calls are retried.
pub fn model(file: &AgentFile) -> Result<Arc<dyn Model>, CliError> {
    match *file.model().provider.get_ref() {
        Provider::Scripted => Ok(Arc::new(scripted_model(file)?)),
        live => crate::live::model(file, live),
    }
}

/// The agent, over a given model.
pub fn agent(file: &AgentFile, model: Arc<dyn Model>) -> Result<Agent, CliError> {
    let mut builder = Agent::builder()
        .name(file.spec.name.get_ref().clone())
        .model_arc(model)
        .tools(tools(file)?)
        .limits(limits(file))
        .settings(settings(file));
    if let Some(i) = &file.instructions {
        builder = builder.instructions(i.clone());
    }
    if let Some(schema) = &file.spec.output_schema {
        builder = builder.output_schema(schema.get_ref().clone());
    }
    if let Some(pricing) = crate::live::pricing(*file.model().provider.get_ref()) {
        builder = builder.pricing_arc(pricing);
    }
    builder.build().map_err(|e| CliError::Setup {
        message: format!("{}: {e}", e.code()),
    })
}
