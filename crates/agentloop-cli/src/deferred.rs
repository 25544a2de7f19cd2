//! Deferred tools in agent files (`defer = true` on a `[[tools]]` entry or an `[[mcp]]` server):
//! which of the agent's tools and servers' tools stay out of the request until the model finds
//! them, with the built-in `search_tools` ([`agentloop_tools::ToolSearch`]) or the provider's
//! own tool search (`[model] tool_search`), and what `plan`, `run --dry-run` and
//! `mcp serve --tools` show of them.

use std::sync::Arc;

use agentloop::{Tool, ToolSource, tool::RefreshFuture};

use crate::agent_file::{AgentFile, ToolSearchSpec};

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
    if native(file) {
        return with_native_search(builder, file, shown, deferred, servers);
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

/// The provider's own tool search: every tool goes in every request, in the same order, the
/// deferred ones marked ([`Tool::deferred`]) for the provider to keep out of the model's context
/// until its search finds them. No `search_tools`.
fn with_native_search(
    builder: agentloop::AgentBuilder,
    file: &AgentFile,
    mut shown: Vec<Tool>,
    deferred: Vec<Tool>,
    servers: Option<&agentloop_mcp::McpServers>,
) -> agentloop::AgentBuilder {
    shown.extend(deferred.into_iter().map(Tool::deferred));
    let builder = builder.tools(shown);
    match servers {
        Some(servers) => {
            let (hidden, shown) = split_servers(file, servers);
            builder.tool_source(Arc::new(NativeDeferred { shown, hidden }))
        }
        None => builder,
    }
}

/// The servers of an agent whose provider searches its tools itself: the deferred servers'
/// tools come after the others', marked deferred.
struct NativeDeferred {
    shown: agentloop_mcp::McpServers,
    hidden: agentloop_mcp::McpServers,
}

impl ToolSource for NativeDeferred {
    fn tools(&self) -> Vec<Tool> {
        let mut out = self.shown.tools();
        out.extend(self.hidden.tools().into_iter().map(Tool::deferred));
        out
    }

    fn refresh(&self) -> RefreshFuture<'_> {
        Box::pin(async move {
            let shown = self.shown.refresh().await;
            let hidden = self.hidden.refresh().await;
            shown || hidden
        })
    }

    fn take_output(&self) -> Vec<(String, Vec<String>)> {
        let mut out = ToolSource::take_output(&self.shown);
        out.extend(ToolSource::take_output(&self.hidden));
        out
    }
}

/// True when the file defers a tool or a server's tools: its agent has `search_tools`, or its
/// provider's own search ([`native`]).
pub fn defers(file: &AgentFile) -> bool {
    file.tools().iter().any(|t| t.defer == Some(true))
        || file.mcp().iter().any(|m| m.defer == Some(true))
}

/// True when the file's deferred tools are found by its provider's own tool search
/// (`[model] tool_search`, `"auto"` by default: Anthropic's and OpenAI Responses'), not by
/// `search_tools`.
pub fn native(file: &AgentFile) -> bool {
    let model = file.model();
    defers(file)
        && model
            .tool_search
            .as_ref()
            .map_or(ToolSearchSpec::Auto, |t| *t.get_ref())
            .native_for(*model.provider.get_ref())
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

/// The started servers' tools in the file's first request: those of the servers not deferred,
/// then, where the provider searches tools itself, the deferred servers' marked
/// ([`Tool::deferred`]), as a run sends them.
pub fn server_tools(file: &AgentFile, servers: &agentloop_mcp::McpServers) -> Vec<Tool> {
    let (hidden, shown) = split_servers(file, servers);
    if native(file) {
        NativeDeferred { shown, hidden }.tools()
    } else {
        shown.tools()
    }
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
/// (`own`, the file's `[[tools]]` in order) but the deferred ones, `search_tools` when it defers
/// any, its hand-offs, then `mcp`, the tools of its servers that are not deferred. With the
/// provider's own search, its own tools all, the deferred ones marked.
pub fn request_tools(file: &AgentFile, own: Vec<Tool>, mcp: Vec<Tool>) -> Vec<Tool> {
    if native(file) {
        let mut out: Vec<Tool> = own
            .into_iter()
            .zip(file.tools())
            .map(|(tool, t)| {
                if t.defer == Some(true) {
                    tool.deferred()
                } else {
                    tool
                }
            })
            .collect();
        out.extend(mcp);
        return out;
    }
    let mut out: Vec<Tool> = own
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
    out
}
