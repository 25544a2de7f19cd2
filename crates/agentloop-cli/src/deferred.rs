//! Deferred tools in agent files (`defer = true` on a `[[tools]]` entry or an `[[mcp]]` server):
//! which of the agent's tools and servers' tools stay out of the request until the model finds
//! them with `search_tools` ([`agentloop_tools::ToolSearch`]), and what `plan`, `run --dry-run`
//! and `mcp serve --tools` show of them.

use std::sync::Arc;

use agentloop::Tool;

use crate::agent_file::AgentFile;
use crate::error::CliError;

/// The agent's tools and its servers': the servers' tools join the agent's, and each turn of a
/// run lists them again where a server said they changed. Deferred tools and servers' tools
/// (`defer = true`) stay out of the request until `search_tools` finds them
/// ([`agentloop_tools::ToolSearch`]), so `search_tools` joins the agent's own tools then.
pub(crate) fn with_tools(
    builder: agentloop::AgentBuilder,
    file: &AgentFile,
    tools: Vec<Tool>,
    servers: Option<&agentloop_mcp::McpServers>,
) -> agentloop::AgentBuilder {
    let mut deferred: Vec<Tool> = Vec::new();
    let mut shown: Vec<Tool> = Vec::new();
    for (tool, spec) in tools.into_iter().zip(file.tools()) {
        if spec.defer == Some(true) {
            deferred.push(tool);
        } else {
            shown.push(tool);
        }
    }
    if !defers(file) {
        let builder = builder.tools(shown);
        return match servers {
            Some(servers) => builder.tool_source(Arc::new(servers.clone())),
            None => builder,
        };
    }
    let mut search = agentloop_tools::ToolSearch::new().deferred(deferred);
    if let Some(servers) = servers {
        let (hidden, shown) = split_servers(file, servers);
        search = search.shown(Arc::new(shown)).hidden(Arc::new(hidden));
    }
    let search = Arc::new(search);
    shown.push(search.search_tool());
    builder.tools(shown).tool_source(search)
}

/// True when the file defers a tool or a server's tools: its agent has `search_tools`.
pub fn defers(file: &AgentFile) -> bool {
    file.tools().iter().any(|t| t.defer == Some(true))
        || file.mcp().iter().any(|m| m.defer == Some(true))
}

/// The file with nothing deferred: what `mcp serve --tools` runs, whose client names the tool
/// it calls (no model searches there).
pub fn undeferred(file: &AgentFile) -> AgentFile {
    let mut file = file.clone();
    for t in file.spec.tools.iter_mut().flatten() {
        t.defer = None;
    }
    for m in file.spec.mcp.iter_mut().flatten() {
        m.defer = None;
    }
    file
}

/// The file's started servers as two sets: those whose tools are deferred, and the others.
pub fn split_servers(
    file: &AgentFile,
    servers: &agentloop_mcp::McpServers,
) -> (agentloop_mcp::McpServers, agentloop_mcp::McpServers) {
    servers.split(|s| {
        file.mcp()
            .iter()
            .any(|m| m.defer == Some(true) && m.name.get_ref() == s.name())
    })
}

/// The tools of the file's first request, as `plan` and `run --dry-run` show it: its own tools
/// but the deferred ones, `search_tools` when it defers any, its hand-offs, then `mcp`, the
/// tools of its servers that are not deferred.
pub fn request_tools(file: &AgentFile, mcp: Vec<Tool>) -> Result<Vec<Tool>, CliError> {
    let mut out: Vec<Tool> = crate::assemble::tools(file)?
        .into_iter()
        .zip(file.tools())
        .filter(|(_, t)| t.defer != Some(true))
        .map(|(tool, _)| tool)
        .collect();
    if defers(file) {
        out.push(Arc::new(agentloop_tools::ToolSearch::new()).search_tool());
    }
    out.extend(crate::handoff::tools(file, None));
    out.extend(mcp);
    Ok(out)
}
