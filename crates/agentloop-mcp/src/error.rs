//! Why a server could not be started, listed or reached ([`McpError`]), each with a stable
//! `mcp.*` code. Messages are the operator's: they name servers, keys and variables, never a
//! header's or an environment variable's value.

/// Why a server could not be started, listed or reached.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The declaration is not usable (an empty command, a bad URL or header name).
    #[error("MCP server {server:?}: {reason}")]
    Config {
        /// The server.
        server: String,
        /// What is wrong.
        reason: String,
    },
    /// A template names a variable that is not set.
    #[error("MCP server {server:?}: {key} reads ${{{var}}}, which is not set")]
    MissingEnv {
        /// The server.
        server: String,
        /// The environment variable or header the template is for.
        key: String,
        /// The variable it reads.
        var: String,
    },
    /// A template is malformed.
    #[error("MCP server {server:?}: the template of {key} is malformed: {reason}")]
    Template {
        /// The server.
        server: String,
        /// The environment variable or header the template is for.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The server could not be started, or did not complete the MCP handshake.
    #[error("MCP server {server:?} did not start: {reason}")]
    Start {
        /// The server.
        server: String,
        /// Why (its last lines of stderr, for a child).
        reason: String,
    },
    /// The server did not answer in time.
    #[error("MCP server {server:?} did not answer {what} within {secs:.1} s")]
    Timeout {
        /// The server.
        server: String,
        /// The request.
        what: &'static str,
        /// The time it had.
        secs: f64,
    },
    /// The server answered a request with an error, or went away while answering.
    #[error("MCP server {server:?}: {what} failed: {reason}")]
    Request {
        /// The server.
        server: String,
        /// The request.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The server died and is not started again (its policy, or too many restarts).
    #[error("MCP server {server:?} is not running: {reason}")]
    Down {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// A stdio server's sandbox could not be prepared: this system cannot enforce its mode
    /// (`sandbox.unsupported`), or a folder is missing (`sandbox.setup`).
    #[error("MCP server {server:?}: {reason}")]
    Sandbox {
        /// The server.
        server: String,
        /// The sandbox's own stable code.
        code: &'static str,
        /// Why.
        reason: String,
    },
    /// Two declared servers share a name.
    #[error("two MCP servers are named {server:?}")]
    DuplicateServer {
        /// The name.
        server: String,
    },
}

impl McpError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            McpError::Config { .. } => "mcp.config",
            McpError::MissingEnv { .. } => "mcp.missing_env",
            McpError::Template { .. } => "mcp.template",
            McpError::Start { .. } => "mcp.start",
            McpError::Timeout { .. } => "mcp.timeout",
            McpError::Request { .. } => "mcp.request",
            McpError::Down { .. } => "mcp.server_down",
            McpError::DuplicateServer { .. } => "mcp.duplicate_server",
            McpError::Sandbox { code, .. } => code,
        }
    }
}
