#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
mod error;
pub mod serve;
mod server;
mod tools;

pub use config::{
    DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_TIMEOUT, MAX_RESTARTS, PROTOCOL_VERSIONS, Restart,
    ServerConfig, Transport, expand_template, template_vars,
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
