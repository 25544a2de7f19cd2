#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
mod error;
pub mod serve;
mod server;
mod tools;

pub use config::{
    DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_TIMEOUT, MAX_RESTARTS, MIN_MESSAGE_BYTES, NameCollision,
    PROTOCOL_VERSIONS, Restart, ServerConfig, Transport, expand_template, template_vars,
};
pub use error::McpError;
pub use server::McpServer;

/// The declared servers of an agent, started together.
#[derive(Debug, Clone, Default)]
pub struct McpServers {
    servers: Vec<McpServer>,
}

impl McpServers {
    /// Starts every server, in order; the first that fails stops the others already started.
    pub async fn connect(
        configs: impl IntoIterator<Item = ServerConfig>,
    ) -> Result<Self, McpError> {
        let mut out = McpServers::default();
        for config in configs {
            if out.servers.iter().any(|s| s.name() == config.name) {
                out.shutdown().await;
                return Err(McpError::DuplicateServer {
                    server: config.name,
                });
            }
            match McpServer::connect(config).await {
                Ok(server) => out.servers.push(server),
                Err(e) => {
                    out.shutdown().await;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// The servers.
    pub fn servers(&self) -> &[McpServer] {
        &self.servers
    }

    /// The servers `pick` chooses, and the others, in declaration order: two sets over the same
    /// started servers (an agent's deferred servers apart from the rest).
    pub fn split(&self, pick: impl Fn(&McpServer) -> bool) -> (McpServers, McpServers) {
        let (picked, rest): (Vec<McpServer>, Vec<McpServer>) =
            self.servers.iter().cloned().partition(pick);
        (McpServers { servers: picked }, McpServers { servers: rest })
    }

    /// Every server's tools, in declaration order.
    pub fn tools(&self) -> Vec<agentloop::Tool> {
        self.servers.iter().flat_map(McpServer::tools).collect()
    }

    /// The tools of the servers as last listed that a run leaves out, each as a collision
    /// with the tool that keeps the name: a later tool of one server that its naming gave an
    /// earlier one's name (left out of [`McpServer::tools`]), and a later server's tool with an
    /// earlier server's tool's name (left out by the run, which keeps the first listed of a
    /// name and reports the rest refused).
    pub fn collisions(&self) -> Vec<NameCollision> {
        let mut out = Vec::new();
        let mut first: std::collections::BTreeMap<String, (String, String)> =
            std::collections::BTreeMap::new();
        for server in &self.servers {
            let remotes = server.remote_names();
            let (names, within) = server
                .config()
                .tool_names(remotes.iter().map(String::as_str));
            out.extend(within);
            for (name, remote) in names.into_iter().zip(&remotes) {
                let Some(name) = name else { continue };
                match first.get(&name) {
                    Some((kept_server, kept_tool)) => out.push(NameCollision {
                        name,
                        kept_server: kept_server.clone(),
                        kept_tool: kept_tool.clone(),
                        dropped_server: server.name().to_owned(),
                        dropped_tool: remote.clone(),
                    }),
                    None => {
                        first.insert(name, (server.name().to_owned(), remote.clone()));
                    }
                }
            }
        }
        out
    }

    /// Lists again the tools of every server that said they changed; true when any did. A
    /// server that cannot be reached keeps its last list (its calls report why).
    pub async fn refresh(&self) -> bool {
        let mut any = false;
        for server in &self.servers {
            match server.refresh().await {
                Ok(changed) => any |= changed,
                Err(e) => {
                    tracing::warn!(target: "agentloop_mcp", server = %server.name(), error = %e, "cannot list the tools again");
                }
            }
        }
        any
    }

    /// Ends every server.
    pub async fn shutdown(&self) {
        for server in &self.servers {
            server.shutdown().await;
        }
    }
}

/// The servers as an agent's tool source: a run lists their tools again at the turn after one
/// said `tools/list_changed`, and takes what they wrote on stderr outside calls for its events.
impl agentloop::ToolSource for McpServers {
    fn tools(&self) -> Vec<agentloop::Tool> {
        McpServers::tools(self)
    }

    fn refresh(&self) -> agentloop::tool::RefreshFuture<'_> {
        Box::pin(McpServers::refresh(self))
    }

    fn take_output(&self) -> Vec<(String, Vec<String>)> {
        self.servers
            .iter()
            .map(|s| (s.name().to_owned(), s.take_stderr()))
            .filter(|(_, lines)| !lines.is_empty())
            .collect()
    }
}
