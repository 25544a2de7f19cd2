//! The tools of an agent file: its command tools in their sandbox, the built-in tools with
//! their options, `a2a` tools and `agent` tools (subagents built like any agent of the tree).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentloop::{Limits, Model, Tool, subagent::SubagentTool, testing::ScriptedModel};
use agentloop_tools::{Builtin, CommandTool};
use serde_json::json;

use crate::agent_file::{AgentFile, ToolFileSpec};

use crate::error::CliError;

use super::models::model;
use super::permissions::{gate, permission_store};
use super::{Kids, builder, builtin_options, limits};

/// The tools of a file, in its order, as `plan` shows them: its command tools, and its `agent`
/// tools over stand-in subagents (no credentials needed).
pub fn tools(file: &AgentFile) -> Result<Vec<Tool>, CliError> {
    all_tools(file, Kids::StandIn)
}

pub(super) fn all_tools(file: &AgentFile, kids: Kids<'_>) -> Result<Vec<Tool>, CliError> {
    let mut out = Vec::new();
    for t in file.tools() {
        out.push(match (&t.command, &t.builtin, &t.a2a) {
            (Some(command), _, _) => command_tool(file, t, command)?,
            (None, Some(builtin), _) => builtin_tool(file, t, builtin.get_ref())?,
            (None, None, Some(url)) => a2a_tool(file, t, url.get_ref(), kids),
            (None, None, None) => subagent_tool(file, t, kids)?,
        });
    }
    Ok(out)
}

/// An `a2a` tool: the remote agent whose card was read at start, or (in a plan, where nothing
/// is reached) one that reads it at its first call. Its timeout (ten minutes unless given), mode
/// and output bound (`max_bytes`, 64 KiB unless given) are the entry's.
fn a2a_tool(file: &AgentFile, t: &ToolFileSpec, url: &str, kids: Kids<'_>) -> Tool {
    let timeout = t
        .timeout_secs
        .as_ref()
        .and_then(|v| Duration::try_from_secs_f64(*v.get_ref()).ok())
        .unwrap_or(agentloop_a2a::DEFAULT_CALL_TIMEOUT);
    let builder = Tool::builder(t.name())
        .mode(t.mode.unwrap_or_default())
        .timeout(timeout);
    let max = t
        .max_bytes
        .as_ref()
        .map_or(agentloop_a2a::DEFAULT_MAX_OUTPUT_BYTES, |b| *b.get_ref());
    let description = t.description.clone();
    match kids {
        Kids::Real(_, started, _) => match started.remote(file, t.name()) {
            Some(client) => client
                .clone()
                .with_max_output_bytes(max)
                .tool(builder, description),
            None => agentloop_a2a::A2aClient::tool_at(url, builder, description, max),
        },
        Kids::StandIn => agentloop_a2a::A2aClient::tool_at(url, builder, description, max),
    }
}

/// The folder a command tool's processes may write under `workspace-write`: its `root`, else the
/// agent file's folder (where it runs).
pub fn command_root(file: &AgentFile, t: &ToolFileSpec) -> PathBuf {
    t.root
        .as_ref()
        .map_or_else(|| file.dir.clone(), |r| file.resolve(r.get_ref()))
}

/// A built-in tool ([`Builtin`]).
fn builtin_tool(file: &AgentFile, t: &ToolFileSpec, builtin: &str) -> Result<Tool, CliError> {
    let kind = Builtin::from_name(builtin).ok_or_else(|| CliError::Setup {
        message: format!("no built-in tool {builtin:?}"),
    })?;
    let mut options = builtin_options(file, t);
    // A walk meets files no call named: it leaves out those the gate would deny or ask about.
    // A file tool judges its path again as it runs: a call of its batch may have made it a link
    // to a denied file after the gate allowed it; the shell judges its command again (a call
    // of its batch may have made `./tidy` a link to a denied program).
    if (kind.judges_paths() || kind.judges_commands()) && file.permissions().is_some() {
        options.withhold = Some(permission_store(file)?);
    }
    kind.tool_named(t.name(), &options)
        .map_err(|e| CliError::Setup {
            message: format!("tool {}: {}: {e}", t.name(), e.code()),
        })
}

/// A command tool, in its sandbox. Its children see the shell's allow list of variables and those
/// its `env` names, never a secret nor the agent's API key variable.
fn command_tool(
    file: &AgentFile,
    t: &ToolFileSpec,
    command: &toml::Spanned<Vec<String>>,
) -> Result<Tool, CliError> {
    let mut tool = CommandTool::new(t.name(), command.get_ref().clone())
        .description(t.description.clone().unwrap_or_default())
        .input_schema(t.input_schema.as_ref().map_or_else(
            || json!({"type": "object", "properties": {}}),
            |s| s.get_ref().clone(),
        ))
        .mode(t.mode.unwrap_or_default())
        .poller(t.poller.unwrap_or(false))
        .idempotent(t.idempotent.unwrap_or(false))
        .retries(t.retries.as_ref().map_or(0, |r| *r.get_ref()))
        .working_dir(&file.dir)
        .root(command_root(file, t))
        .read_only(file.kept_from_processes())
        .sandbox(t.sandbox(file.sandbox()));
    for var in t.env.as_deref().unwrap_or_default() {
        tool = tool.allow_env(var.get_ref().clone());
    }
    if let Some(timeout) = t
        .timeout_secs
        .as_ref()
        .and_then(|secs| Duration::try_from_secs_f64(*secs.get_ref()).ok())
    {
        tool = tool.timeout(timeout);
    }
    if let Some(var) = file.api_key_env() {
        tool = tool.hide_env(var);
    }
    tool.into_tool().map_err(|e| CliError::Setup {
        message: e.to_string(),
    })
}

/// An `agent` tool: it runs the agent its file describes.
fn subagent_tool(file: &AgentFile, t: &ToolFileSpec, kids: Kids<'_>) -> Result<Tool, CliError> {
    let name = t.name();
    let Some(child) = file.subagent(name) else {
        return Err(CliError::Setup {
            message: format!("the agent file of tool {name} was not loaded"),
        });
    };
    let (model, gate): (Arc<dyn Model>, _) = match kids {
        Kids::Real(approval, _, _) => (model(child)?, gate(child, approval)?),
        Kids::StandIn => (Arc::new(ScriptedModel::new([])), None),
    };
    let mut sub = builder(child, model, gate, kids)?;
    if matches!(kids, Kids::StandIn) {
        // A stand-in runs nothing: its budget needs no price.
        sub = sub.limits(Limits {
            max_cost_usd: None,
            ..limits(child)
        });
    }
    let sub = sub.build().map_err(|e| CliError::Setup {
        message: format!(
            "{}: {}: {e}",
            crate::terminal::shown_path(&child.path),
            e.code()
        ),
    })?;
    let description =
        t.description.clone().unwrap_or_else(|| {
            child.spec.description.clone().unwrap_or_else(|| {
                format!("Hands a task to the agent {}.", child.spec.name.get_ref())
            })
        });
    Ok(SubagentTool::new(sub, name.to_owned(), description)
        .cap(t.cap())
        .fatal(t.fatal.unwrap_or(false))
        .into_tool())
}
