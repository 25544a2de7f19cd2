//! `agentloop mcp list FILE`: starts the `[[mcp]]` servers of the agent file (and of its
//! subagents' files) and prints each one's tools as the model would see them (name, description,
//! input and output schemas), then stops them. No model and no credentials are needed; the
//! servers' own variables are.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value, json};

use crate::error::{CliError, code};

/// `agentloop mcp ...`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Starts each declared MCP server and prints its tools with their schemas (no model needed).
    List {
        /// The agent file.
        file: PathBuf,
        /// Prints one JSON object: the servers and their tools.
        #[arg(long)]
        json: bool,
    },
}

/// Runs an `mcp` command.
pub async fn mcp(command: McpCommand) -> Result<i32, CliError> {
    match command {
        McpCommand::List { file, json } => list(file, json).await,
    }
}

async fn list(path: PathBuf, as_json: bool) -> Result<i32, CliError> {
    let file = crate::args::AgentFileArg { file: path }.load()?;
    let started = crate::assemble::StartedMcp::start(&file).await?;
    if started.files().next().is_none() {
        if as_json {
            out!("{}", json!({"servers": []}));
        } else {
            out!(
                "{} and its subagents' files declare no [[mcp]] servers",
                file.path.display()
            );
        }
        return Ok(code::OK);
    }
    let listed: Vec<Value> = started
        .files()
        .flat_map(|(path, servers)| {
            servers.servers().iter().map(move |s| {
                let tools: Vec<Value> = s
                    .tools()
                    .iter()
                    .map(|t| serde_json::to_value(t.spec()).unwrap_or_default())
                    .collect();
                json!({"name": s.name(), "file": path.display().to_string(), "tools": tools})
            })
        })
        .collect();
    started.shutdown().await;
    if as_json {
        out!("{}", json!({"servers": listed}));
        return Ok(code::OK);
    }
    for server in &listed {
        let tools = server["tools"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let name = server["name"].as_str().unwrap_or_default();
        let of = server["file"].as_str().unwrap_or_default();
        let of = if of == file.path.display().to_string() {
            String::new()
        } else {
            format!(" (of {of})")
        };
        out!(
            "{name}{of} — {} tool{}",
            tools.len(),
            if tools.len() == 1 { "" } else { "s" }
        );
        for tool in tools {
            out!("");
            out!("  {}", tool["name"].as_str().unwrap_or_default());
            let description = tool["description"].as_str().unwrap_or_default();
            for line in description.lines().filter(|l| !l.trim().is_empty()) {
                out!("    {line}");
            }
            for (label, key) in [("input", "input_schema"), ("output", "output_schema")] {
                if let Some(schema) = tool.get(key) {
                    out!("    {label} schema: {schema}");
                }
            }
        }
        out!("");
    }
    Ok(code::OK)
}
