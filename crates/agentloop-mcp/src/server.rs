//! One connection to one MCP server ([`McpServer`]): started (a child process or an HTTP
//! session), its tools listed, their calls made, and started again after it dies when its policy
//! says so. A child's stderr goes to `tracing` (target `agentloop_mcp::stderr`), never to this
//! process's terminal; its last lines explain a death or a failed start. On Linux a child and
//! all it starts die with this process, a SIGKILLed one too (`agentloop_sandbox`'s
//! `Confinement::dying_with_parent`).
//!
//! The module's files: this one holds [`McpServer`], its public methods and the checks and
//! secrets of its declaration; `connect` starting the server and keeping its connection (the
//! restart policy); `call` one tool call; `listing` its tool list and the changes announced to
//! it; `progress` calls' progress and the client handler; `stderr` what a child writes there;
//! `watched`, `spawn` and `stdio` the transport and the child process under it.

mod call;
mod connect;
mod listing;
mod progress;
mod spawn;
mod stderr;
mod stdio;
mod watched;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentloop::Tool;
use serde_json::Value;

use crate::McpError;
use crate::config::{ServerConfig, Transport, expand_template};
use stdio::StdioChild;

use connect::Conn;
use stderr::Stderr;

/// A running MCP server and the tools it lists. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.inner.config.name)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: ServerConfig,
    conn: tokio::sync::Mutex<Conn>,
    /// The tools as last listed.
    listed: Mutex<Vec<rmcp::model::Tool>>,
    /// Set by the server's `tools/list_changed` (and by a restart): the next refresh lists again.
    changed: Arc<AtomicBool>,
    stderr: Arc<Mutex<Stderr>>,
    /// A stdio server's sandbox, kept while it runs (its private temporary folder goes with it).
    confinement: Mutex<Option<agentloop_sandbox::Confinement>>,
    /// Set when a negotiating start found a stdio server that ends its session at
    /// `server/discover`: its restarts go straight to the `initialize` handshake.
    handshake_only: AtomicBool,
    /// Set when the stdio server's connection ended at a message past
    /// [`ServerConfig::max_message_bytes`] (cleared at each start).
    oversized: Arc<AtomicBool>,
}

impl McpServer {
    /// Starts a server, completes the MCP handshake and lists its tools, all within its timeout.
    pub async fn connect(config: ServerConfig) -> Result<McpServer, McpError> {
        check(&config)?;
        let inner = Arc::new(Inner {
            changed: Arc::new(AtomicBool::new(false)),
            listed: Mutex::new(Vec::new()),
            conn: tokio::sync::Mutex::new(Conn::default()),
            stderr: Arc::new(Mutex::new(Stderr::default())),
            confinement: Mutex::new(None),
            handshake_only: AtomicBool::new(false),
            oversized: Arc::new(AtomicBool::new(false)),
            config,
        });
        let server = McpServer { inner };
        let service = server.start().await?;
        let peer = service.peer().clone();
        {
            let mut conn = server.inner.conn.lock().await;
            let listener = server.listen(&peer);
            conn.run(service, listener);
        }
        server.list(&peer).await?;
        Ok(server)
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// Its declaration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// The MCP version the running connection speaks (`"2026-07-28"`, `"2025-11-25"`, ...), as
    /// negotiated when it started; `None` when it is not running.
    pub async fn protocol_version(&self) -> Option<String> {
        let conn = self.inner.conn.lock().await;
        let info = conn.service.as_ref()?.peer().peer_info()?;
        Some(info.protocol_version.to_string())
    }

    /// Its tools as last listed, as agentloop tools (named per its config, with its timeout).
    /// Of two that its naming gives one name, the later listed is left out, with a warning
    /// ([`ServerConfig::tool_names`]; [`crate::McpServers::collisions`] has them).
    pub fn tools(&self) -> Vec<Tool> {
        let listed = self
            .inner
            .listed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (names, collisions) = self
            .inner
            .config
            .tool_names(listed.iter().map(|t| t.name.as_ref()));
        for c in &collisions {
            tracing::warn!(target: "agentloop_mcp", server = %self.name(), "{c}");
        }
        listed
            .iter()
            .zip(names)
            .filter(|(_, name)| name.is_some())
            .map(|(t, _)| self.tool(t))
            .collect()
    }

    /// The server's own names of its tools as last listed, in its order.
    pub(crate) fn remote_names(&self) -> Vec<String> {
        self.inner
            .listed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    /// The agentloop tool for one listed tool of this server.
    fn tool(&self, listed: &rmcp::model::Tool) -> Tool {
        let config = &self.inner.config;
        let remote: Arc<str> = Arc::from(listed.name.as_ref());
        let description = listed
            .description
            .as_deref()
            .or(listed.title.as_deref())
            .unwrap_or_default()
            .to_owned();
        // A tool that says nothing, or whose server is not trusted, is taken as changing the world
        // and as unsafe to repeat (the protocol's default): hints are the server's claims.
        let hints = listed
            .annotations
            .clone()
            .filter(|_| config.trust_hints)
            .unwrap_or_default();
        let mut builder = Tool::builder(config.tool_name(&remote))
            .description(description)
            .timeout(config.timeout)
            .mutating(hints.read_only_hint != Some(true))
            .idempotent(hints.idempotent_hint == Some(true) || hints.read_only_hint == Some(true));
        if let Some(schema) = &listed.output_schema {
            builder = builder.output_schema(Value::Object((**schema).clone()));
        }
        let server = self.clone();
        builder.dynamic(
            Value::Object((*listed.input_schema).clone()),
            move |args, ctx| {
                let server = server.clone();
                let remote = remote.clone();
                async move { server.call(&remote, args, ctx).await }
            },
        )
    }

    /// What the server wrote on stderr outside any call since this was last asked (a line says
    /// how many gave way when more than a few hundred waited). Lines written during a call are
    /// in that call's details instead.
    pub fn take_stderr(&self) -> Vec<String> {
        let mut s = self
            .inner
            .stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut lines: Vec<String> = s.outside.drain(..).collect();
        let dropped = std::mem::take(&mut s.dropped);
        if dropped > 0 {
            lines.insert(0, format!("[{dropped} earlier lines were not kept]"));
        }
        lines
    }

    /// True when the server said its tools changed (or it was started again) since they were
    /// last listed.
    pub fn tools_changed(&self) -> bool {
        self.inner.changed.load(Ordering::Acquire)
    }

    /// Lists the tools again if they changed; true when the list it got differs from the last
    /// (a server that said its tools changed, or a subscription opened again, may list the same
    /// tools: that is no change, and a run does not take, nor journal, its tools again). Between
    /// runs or turns (an agent's tool source asks at each turn boundary): a turn's tools never
    /// change under it.
    pub async fn refresh(&self) -> Result<bool, McpError> {
        if !self.tools_changed() {
            return Ok(false);
        }
        let (peer, ..) = self.peer().await?;
        self.list(&peer).await
    }

    /// Ends the server: the child is stopped, the HTTP session closed.
    pub async fn shutdown(&self) {
        let service = {
            let mut conn = self.inner.conn.lock().await;
            conn.down = Some("it was shut down".into());
            conn.listener = None;
            conn.service.take()
        };
        if let Some(mut service) = service {
            let _ = service.close_with_timeout(Duration::from_secs(5)).await;
        }
    }
}

/// `text` without the credentials of a server's declaration (see [`secrets`]).
fn scrubbed(config: &ServerConfig, text: &str) -> String {
    agentloop::url_secrets::scrub(text, &secrets(config))
}

/// A tool's result without the credentials of a server's declaration (see [`secrets`]) in any
/// of its text: a gateway that answers with the request it was sent, or a server that prints
/// its environment (`env`), would otherwise hand the model, the journal and the trace the token
/// the declaration gave it. An error result's text is scrubbed as the error is.
fn scrubbed_result(
    config: &ServerConfig,
    result: rmcp::model::CallToolResult,
) -> rmcp::model::CallToolResult {
    let secrets = secrets(config);
    if secrets.is_empty() {
        return result;
    }
    let Ok(mut value) = serde_json::to_value(&result) else {
        return result;
    };
    if !agentloop::url_secrets::scrub_json(&mut value, &secrets) {
        return result;
    }
    serde_json::from_value(value).unwrap_or_else(|_| {
        rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(
            "the result held a credential of the server's declaration and could not be shown \
             without it",
        )])
    })
}

/// The credentials of a server's declaration, longest first (so that a secret holding another
/// is replaced whole): for HTTP its URL's user info and query values (the transport's reqwest
/// errors print the URL whole: `error sending request for url (https://host/mcp?token=...)`)
/// and the values its header templates read; for stdio the values its `env` templates read (a
/// server may print its environment on stderr, which goes into errors, logs and call details).
fn secrets(config: &ServerConfig) -> Vec<String> {
    let (mut secrets, templates) = match &config.transport {
        Transport::Http { url, headers } => (agentloop::url_secrets::secrets(url), headers),
        Transport::Stdio { env, .. } => (Vec::new(), env),
    };
    secrets.extend(
        templates
            .values()
            .flat_map(|t| crate::config::template_vars(t))
            .filter_map(|var| std::env::var(var).ok()),
    );
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

fn config_error(config: &ServerConfig, reason: String) -> McpError {
    McpError::Config {
        server: config.name.clone(),
        reason,
    }
}

/// Checks what can be checked before anything starts.
fn check(config: &ServerConfig) -> Result<(), McpError> {
    if let Err(reason) = agentloop::tool::check_tool_name(&config.name) {
        return Err(config_error(config, format!("bad name: {reason}")));
    }
    match &config.transport {
        Transport::Stdio { command, .. } if command.is_empty() => {
            Err(config_error(config, "the command is empty".into()))
        }
        Transport::Http { url, .. }
            if !(url.starts_with("http://") || url.starts_with("https://")) =>
        {
            Err(config_error(
                config,
                format!(
                    "the url {:?} is not http or https",
                    agentloop::url_secrets::shown(url)
                ),
            ))
        }
        _ if config.timeout.is_zero() => Err(config_error(config, "the timeout is zero".into())),
        _ if config.max_output_bytes == 0 => Err(config_error(
            config,
            "max_output_bytes is zero: no result could be read".into(),
        )),
        _ if config
            .protocol_version
            .as_deref()
            .is_some_and(|v| !crate::PROTOCOL_VERSIONS.contains(&v)) =>
        {
            Err(config_error(
                config,
                format!(
                    "protocol_version {:?} is not one of {}",
                    config.protocol_version.as_deref().unwrap_or_default(),
                    crate::PROTOCOL_VERSIONS.join(", ")
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// What a stdio server sees of this process's environment: the shell tool's allow list, never an
/// API key.
fn inherited_env() -> Vec<(String, String)> {
    agentloop_tools::shell::DEFAULT_SHELL_ENV
        .iter()
        .filter(|name| !agentloop_tools::is_secret_env(name))
        .filter_map(|name| std::env::var(name).ok().map(|v| ((*name).to_owned(), v)))
        .collect()
}
