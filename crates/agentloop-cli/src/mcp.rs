//! `agentloop mcp list FILE`: starts the agent file's `[[mcp]]` servers and prints each one's
//! tools as the model would see them (name, description, input and output schemas), then stops
//! them. No model and no credentials are needed; the servers' own variables are.

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
    let file = crate::AgentFileArg { file: path }.load()?;
    if file.mcp().is_empty() {
        if as_json {
            out!("{}", json!({"servers": []}));
        } else {
            out!("{} declares no [[mcp]] servers", file.path.display());
        }
        return Ok(code::OK);
    }
    let servers = crate::assemble::mcp_servers(&file).await?;
    let listed: Vec<Value> = servers
        .servers()
        .iter()
        .map(|s| {
            let tools: Vec<Value> = s
                .tools()
                .iter()
                .map(|t| serde_json::to_value(t.spec()).unwrap_or_default())
                .collect();
            json!({"name": s.name(), "tools": tools})
        })
        .collect();
    servers.shutdown().await;
    if as_json {
        out!("{}", json!({"servers": listed}));
        return Ok(code::OK);
    }
    for server in &listed {
        let tools = server["tools"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        out!(
            "{} — {} tool{}",
            server["name"].as_str().unwrap_or_default(),
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
