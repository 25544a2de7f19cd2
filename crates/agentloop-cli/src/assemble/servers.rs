//! The `[[mcp]]` servers of an agent file and of its subagents' files, started once
//! ([`StartedMcp`]), and their declarations as `agentloop_mcp` configs.

use std::path::PathBuf;

use crate::agent_file::AgentFile;

use crate::error::CliError;

use super::permissions::{
    create_exposed_stores, refuse_case_folded_own_files, refuse_swappable_agent_files, tree_files,
};

/// The started `[[mcp]]` servers of an agent file and of its subagents' files, by file: each
/// agent of the tree gets the tools of its own file's servers. It also holds the remote agents of
/// their `a2a` tools, each card read once at start.
#[derive(Debug, Default)]
pub struct StartedMcp {
    by_file: Vec<(PathBuf, agentloop_mcp::McpServers)>,
    /// The remote agents of `a2a` tools, their cards read: by file and tool name.
    remote: Vec<(PathBuf, String, agentloop_a2a::A2aClient)>,
}

impl StartedMcp {
    /// Reads the cards of the `a2a` tools of `file` and of every subagent's file below it (a card
    /// that cannot be read stops the start), then starts their MCP servers (a file named twice in
    /// the tree starts its servers once). The first that fails stops those already started.
    /// Before that, it refuses an agent file of the tree reached through a link its processes
    /// could replace ([`refuse_swappable_agent_files`]) or an own file they could reach under
    /// another spelling ([`refuse_case_folded_own_files`]), and creates the permission stores
    /// they could otherwise create ([`create_exposed_stores`]).
    pub async fn start(file: &AgentFile) -> Result<StartedMcp, CliError> {
        refuse_swappable_agent_files(file, AgentFile::process_roots)?;
        refuse_case_folded_own_files(file, AgentFile::process_roots)?;
        create_exposed_stores(file)?;
        Self::connect(file).await
    }

    /// [`StartedMcp::start`] without creating the stores: for a dry run, where no tool runs and
    /// nothing is written. Only its servers are processes, so only a link they could replace
    /// refuses it.
    pub async fn start_servers(file: &AgentFile) -> Result<StartedMcp, CliError> {
        refuse_swappable_agent_files(file, AgentFile::server_roots)?;
        refuse_case_folded_own_files(file, AgentFile::server_roots)?;
        Self::connect(file).await
    }

    /// Reads the cards and starts the servers of [`StartedMcp::start`], checks done.
    async fn connect(file: &AgentFile) -> Result<StartedMcp, CliError> {
        let files = tree_files(file);
        let mut started = StartedMcp::default();
        for f in &files {
            for t in f.tools() {
                let Some(url) = &t.a2a else { continue };
                match agentloop_a2a::A2aClient::connect(url.get_ref()).await {
                    Ok(client) => {
                        started
                            .remote
                            .push((f.path.clone(), t.name().to_owned(), client));
                    }
                    Err(e) => {
                        return Err(CliError::Setup {
                            message: format!("tool {}: {}: {e}", t.name(), e.code()),
                        });
                    }
                }
            }
        }
        for f in files {
            if f.mcp().is_empty() || started.by_file.iter().any(|(p, _)| *p == f.path) {
                continue;
            }
            match agentloop_mcp::McpServers::connect(mcp_configs(f)).await {
                Ok(servers) => started.by_file.push((f.path.clone(), servers)),
                Err(e) => {
                    started.shutdown().await;
                    let file = if f.path == file.path {
                        String::new()
                    } else {
                        format!("{}: ", crate::terminal::shown_path(&f.path))
                    };
                    return Err(CliError::Setup {
                        message: format!("{file}{}: {e}", e.code()),
                    });
                }
            }
        }
        Ok(started)
    }

    /// The remote agent of a file's `a2a` tool, its card read at start.
    pub fn remote(&self, file: &AgentFile, tool: &str) -> Option<&agentloop_a2a::A2aClient> {
        self.remote
            .iter()
            .find(|(p, name, _)| *p == file.path && name == tool)
            .map(|(_, _, c)| c)
    }

    /// A file's started servers, when it declares any: its agent's tool source.
    pub fn servers(&self, file: &AgentFile) -> Option<&agentloop_mcp::McpServers> {
        self.by_file
            .iter()
            .find(|(p, _)| *p == file.path)
            .map(|(_, s)| s)
    }

    /// The tools of the started servers that their agents' runs leave out, as the warnings
    /// that say which tool keeps each name; those of a subagent's file, not `top`, name it.
    pub fn collision_warnings(&self, top: &AgentFile) -> Vec<String> {
        self.by_file
            .iter()
            .flat_map(|(path, servers)| {
                let file = if *path == top.path {
                    String::new()
                } else {
                    format!("{}: ", crate::terminal::shown_path(path))
                };
                servers
                    .collisions()
                    .into_iter()
                    .map(move |c| format!("{file}{c}"))
            })
            .collect()
    }

    /// Each file with its started servers, in the order of the tree.
    pub fn files(&self) -> impl Iterator<Item = (&std::path::Path, &agentloop_mcp::McpServers)> {
        self.by_file.iter().map(|(p, s)| (p.as_path(), s))
    }

    /// Stops every server.
    pub async fn shutdown(&self) {
        for (_, servers) in &self.by_file {
            servers.shutdown().await;
        }
    }
}

/// The file's `[[mcp]]` servers' configs, in order.
pub fn mcp_configs(file: &AgentFile) -> Vec<agentloop_mcp::ServerConfig> {
    file.mcp()
        .iter()
        .map(|m| {
            let mut config = m.server_config(&file.dir, file.sandbox());
            // The server may write its folder, the agent's: never the agent's own files in it.
            if let agentloop_mcp::Transport::Stdio { read_only, .. } = &mut config.transport {
                *read_only = file.kept_from_processes();
            }
            config
        })
        .collect()
}
