//! Starting a server and keeping its connection: the handshake (negotiated or pinned), a stdio
//! child or an HTTP session, the restart policy when the connection dies, and the healthy run
//! that forgives restarts. Apart from calls and listings, which only ask it for a peer.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::Peer;
use rmcp::model::ProtocolVersion;
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::McpError;
use crate::config::{MAX_RESTARTS, Restart, ServerConfig, Transport, expand_template};

use super::listing::Listener;
use super::progress::{Notified, Progress};
use super::stderr::forward_stderr;
use super::watched::{Opening, Watched};
use super::{McpServer, config_error, scrubbed, secrets};

/// How long a failed HTTP request waits to see whether its session ended with it.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct Conn {
    pub(super) service: Option<RunningService<RoleClient, Notified>>,
    /// At 2026-07-28, the subscription that hears the server's tool list change; it ends with
    /// the connection it listens on.
    pub(super) listener: Option<Listener>,
    /// Counts starts, so that a call that saw one connection die never drops a newer one.
    generation: u64,
    /// Restarts since the server last ran healthy (see [`HEALTHY_RUN`]).
    restarts: u32,
    /// When the running connection started.
    started: Option<std::time::Instant>,
    /// Why it is down for good.
    pub(super) down: Option<String>,
}

/// A connection that ran this long before it ended was a healthy one: the restarts counted
/// before it are forgiven, so that a server that fails now and then over a long-lived process
/// does not use up its [`MAX_RESTARTS`], while one that dies again soon after each start does.
const HEALTHY_RUN: Duration = Duration::from_secs(10 * 60);

impl Conn {
    /// Takes the running connection (one that ended), forgiving the restarts before it when it
    /// ran healthy long enough.
    pub(super) fn take(&mut self) -> Option<RunningService<RoleClient, Notified>> {
        if self
            .started
            .take()
            .is_some_and(|started| started.elapsed() >= HEALTHY_RUN)
        {
            self.restarts = 0;
        }
        self.listener = None;
        self.service.take()
    }

    /// Makes `service` the running connection.
    pub(super) fn run(
        &mut self,
        service: RunningService<RoleClient, Notified>,
        listener: Option<Listener>,
    ) {
        self.listener = listener;
        self.service = Some(service);
        self.started = Some(std::time::Instant::now());
        self.generation += 1;
    }
}

impl McpServer {
    /// A handle on the running server (its connection's number and progress routes beside
    /// it): started again first when it died and its policy allows.
    pub(super) async fn peer(&self) -> Result<(Peer<RoleClient>, u64, Progress), McpError> {
        let mut conn = self.inner.conn.lock().await;
        if let Some(service) = &conn.service
            && !service.is_closed()
            && !service.peer().is_transport_closed()
        {
            let progress = service.service().progress.clone();
            return Ok((service.peer().clone(), conn.generation, progress));
        }
        let server = self.name().to_owned();
        if let Some(reason) = &conn.down {
            return Err(McpError::Down {
                server,
                reason: reason.clone(),
            });
        }
        if conn.take().is_some() {
            self.report_exit("between calls");
        }
        let reason = match self.inner.config.restart {
            Restart::Never => Some("it exited, and its restart policy is \"never\"".to_owned()),
            Restart::OnFailure if conn.restarts >= MAX_RESTARTS => Some(format!(
                "it exited, and was started again {MAX_RESTARTS} times already"
            )),
            Restart::OnFailure => None,
        };
        if let Some(reason) = reason {
            conn.down = Some(reason.clone());
            return Err(McpError::Down { server, reason });
        }
        conn.restarts += 1;
        tracing::warn!(target: "agentloop_mcp", server = %server, restart = conn.restarts, "starting the MCP server again");
        let service = self.start().await?;
        let peer = service.peer().clone();
        let progress = service.service().progress.clone();
        let listener = self.listen(&peer);
        conn.run(service, listener);
        // Its tools may differ now: the next refresh lists them.
        self.inner.changed.store(true, Ordering::Release);
        Ok((peer, conn.generation, progress))
    }

    /// Whether the connection a request failed on has ended (the server exited, the HTTP
    /// session ended), rather than that request alone. A child's pipes fail only when it goes
    /// away. Over HTTP each request is a request of its own: rmcp hands a failed POST, or a
    /// response stream cut short, to that request alone and the session lives on; when the
    /// session itself ends its transport closes, which is awaited a little, the failure of the
    /// request coming a moment before it.
    pub(super) async fn connection_ended(&self, peer: &Peer<RoleClient>) -> bool {
        if matches!(self.inner.config.transport, Transport::Stdio { .. }) {
            return true;
        }
        let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
        while !peer.is_transport_closed() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Drops a connection whose transport failed (the server died), unless a newer one already
    /// replaced it: the next call starts the server again or reports it down.
    pub(super) async fn forget(&self, generation: u64) {
        let mut conn = self.inner.conn.lock().await;
        if conn.generation == generation
            && let Some(mut service) = conn.take()
        {
            let _ = service.close_with_timeout(Duration::from_secs(1)).await;
        }
    }

    /// Starts the server and completes the handshake within the timeout.
    ///
    /// Negotiating, a stdio server whose session ended while `server/discover` went unanswered
    /// is started again and spoken to with the `initialize` handshake alone: servers of the
    /// older wire should answer an unknown request with an error (and then get the handshake on
    /// the same connection), but some end instead. The Python SDK before 1.10 does: it answers
    /// nothing to the offer and ends its session at the handshake rmcp sends after its 10 s
    /// wait. That signature is kept for the server's restarts, which go straight to the
    /// handshake (a server that never answered the offer will not at its next start). A
    /// session that ended at the offer itself (a crash at the first start, a server that exits
    /// at an unknown request) gets the handshake for this start only: its restarts negotiate.
    /// Any other failure (an error answer, a late answer, a timeout) is the start's failure: a
    /// server slower than the 10 s wait has its late discover answer dropped (see [`Watched`])
    /// and speaks the handshake on the same connection, this time.
    pub(super) async fn start(&self) -> Result<RunningService<RoleClient, Notified>, McpError> {
        let config = &self.inner.config;
        let handshake = ProtocolVersion::LATEST_WITH_INITIALIZE;
        if config.protocol_version.is_some() || self.inner.handshake_only.load(Ordering::Relaxed) {
            let pinned = config.protocol_version.as_deref();
            return self
                .start_as(pinned.or(Some(handshake.as_str())), None)
                .await;
        }
        let opening = Arc::new(Mutex::new(Opening::default()));
        match self.start_as(None, Some(&opening)).await {
            Err(first @ McpError::Start { .. })
                if matches!(config.transport, Transport::Stdio { .. }) =>
            {
                let seen = *opening.lock().unwrap_or_else(PoisonError::into_inner);
                if !seen.ended_at_discover() {
                    return Err(first);
                }
                tracing::warn!(
                    server = %config.name,
                    "the server ended its session at server/discover; starting it again with \
                     the MCP handshake alone"
                );
                match self.start_as(Some(handshake.as_str()), None).await {
                    Ok(service) => {
                        if seen.initialize_sent {
                            self.inner.handshake_only.store(true, Ordering::Relaxed);
                        }
                        Ok(service)
                    }
                    // Not a server of the older wire either: the first failure says more.
                    Err(_) => Err(first),
                }
            }
            other => other,
        }
    }

    /// Starts the server speaking `version` (negotiating when `None`) and completes the
    /// handshake within the timeout.
    async fn start_as(
        &self,
        version: Option<&str>,
        opening: Option<&Arc<Mutex<Opening>>>,
    ) -> Result<RunningService<RoleClient, Notified>, McpError> {
        let opening = opening.cloned().unwrap_or_default();
        let config = &self.inner.config;
        let lifecycle = lifecycle(version);
        let handler = Notified {
            changed: self.inner.changed.clone(),
            progress: Progress::default(),
            server: Arc::from(config.name.as_str()),
            offered: match &lifecycle {
                ClientLifecycleMode::Initialize => {
                    version.map_or(ProtocolVersion::LATEST_WITH_INITIALIZE, known_version)
                }
                _ => ProtocolVersion::LATEST_WITH_INITIALIZE,
            },
        };
        let start_error = |reason: String| McpError::Start {
            server: config.name.clone(),
            reason,
        };
        let mut stderr_task = None;
        let mut child = None;
        let served = match &config.transport {
            Transport::Stdio { command, .. } => {
                let Some((program, _)) = command.split_first() else {
                    return Err(start_error("the command is empty".into()));
                };
                // Inside another agentloop's sandbox (this agentloop served as a sandboxed MCP
                // server, or run by a sandboxed tool) seccomp refuses a new process group
                // (`EPERM`), and no server could start: it then starts in the group this process
                // is in, as a tool does there. Its supervisor still kills it and all it started
                // when this process dies, and what it left when it exits (without a group, what
                // came to the supervisor as an orphan); a stop's SIGTERM reaches the server
                // through the supervisor. Only a SIGKILL of the supervisor (a server deaf to
                // both) leaves what it started to the outer call's group. A program that cannot
                // be executed fails with `EACCES`, not this.
                let spawned = match self.spawn_stdio(true)? {
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                        tracing::debug!(server = %config.name, "no process group of its own (EPERM): the server starts in this process's group");
                        self.spawn_stdio(false)?
                    }
                    spawned => spawned,
                };
                let (process, stderr) =
                    spawned.map_err(|e| start_error(format!("cannot run {program}: {e}")))?;
                child = process.id();
                if let Some(stderr) = stderr {
                    stderr_task = Some(tokio::spawn(forward_stderr(
                        stderr,
                        config.name.clone(),
                        secrets(config),
                        self.inner.stderr.clone(),
                    )));
                }
                let process = Watched::new(process, self.inner.changed.clone(), opening);
                tokio::time::timeout(
                    config.timeout,
                    handler.serve_with_lifecycle(process, lifecycle),
                )
                .await
            }
            Transport::Http { url, headers } => {
                // reqwest 0.13 is built without a TLS provider of its own: the process's
                // default, or the ring one the workspace's rustls has.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let custom = http_headers(config, headers)?;
                let transport = Watched::new(
                    StreamableHttpClientTransport::from_config(
                        StreamableHttpClientTransportConfig::with_uri(url.as_str())
                            .custom_headers(custom)
                            .max_json_response_size(config.max_message_bytes())
                            .max_sse_event_size(config.max_message_bytes()),
                    ),
                    self.inner.changed.clone(),
                    opening,
                );
                tokio::time::timeout(
                    config.timeout,
                    handler.serve_with_lifecycle(transport, lifecycle),
                )
                .await
            }
        };
        if !matches!(served, Ok(Ok(_)))
            && let Some(task) = stderr_task
        {
            // A child that failed has closed its stderr, or is killed with the transport just
            // dropped: its last lines, read to the end, say why.
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        if !matches!(served, Ok(Ok(_)))
            && let Some(pid) = child
        {
            // rmcp kills a child whose start failed on a task of its own: it is gone before
            // the next start replaces its confinement (and deletes its temporary folder).
            reaped(pid, Duration::from_secs(10)).await;
        }
        match served {
            Ok(Ok(service)) => Ok(service),
            Ok(Err(e)) => {
                let tail = self.stderr_tail();
                let mut reason = scrubbed(config, &e.to_string());
                if !tail.is_empty() {
                    reason = format!("{reason}; its stderr ends:\n{tail}");
                }
                Err(start_error(reason))
            }
            Err(_) => Err(McpError::Timeout {
                server: config.name.clone(),
                // Negotiating waits up to 10 s for the answer to `server/discover` before the
                // handshake: a server that ignores it needs a pinned version or a longer timeout.
                what: if version.is_none() {
                    "server/discover and the MCP handshake (a server that ignores server/discover \
                     starts without the wait with protocol_version = \"2025-11-25\")"
                } else {
                    "the MCP handshake"
                },
                secs: config.timeout.as_secs_f64(),
            }),
        }
    }
}

/// How a connection starts, by the config's `protocol_version`: negotiated (2026-07-28 offered
/// by `server/discover`, then the `initialize` handshake at 2025-11-25 for a server that refuses
/// it), or pinned to one version, with or without the handshake.
fn lifecycle(pinned: Option<&str>) -> ClientLifecycleMode {
    match pinned.map(known_version) {
        None => ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
        },
        Some(version) if version.has_initialize() => ClientLifecycleMode::Initialize,
        Some(version) => ClientLifecycleMode::Discover {
            preferred_versions: vec![version],
        },
    }
}

/// The rmcp version named `name` (checked against [`crate::PROTOCOL_VERSIONS`] before a
/// server starts; the newest with a handshake otherwise).
fn known_version(name: &str) -> ProtocolVersion {
    ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .find(|v| v.as_str() == name)
        .cloned()
        .unwrap_or(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// Waits, up to `within`, until the child `pid` has exited and been reaped (by rmcp's task that
/// kills a child whose transport was dropped).
async fn reaped(pid: u32, within: Duration) {
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    let pid = nix::unistd::Pid::from_raw(pid);
    let deadline = tokio::time::Instant::now() + within;
    // No signal: whether the process still exists (a zombie not yet reaped does).
    while nix::sys::signal::kill(pid, None).is_ok() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The headers an HTTP server is sent: each template expanded from the environment, each name
/// and value checked.
fn http_headers(
    config: &ServerConfig,
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<http::HeaderName, http::HeaderValue>, McpError> {
    let mut custom = HashMap::new();
    for (key, template) in headers {
        let value = expand_template(&config.name, key, template, |v| std::env::var(v).ok())?;
        let name = http::HeaderName::try_from(key.as_str())
            .map_err(|_| config_error(config, format!("bad header name {key:?}")))?;
        let value = http::HeaderValue::try_from(value)
            .map_err(|_| config_error(config, format!("the value of header {key} is not valid")))?;
        custom.insert(name, value);
    }
    Ok(custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_that_ran_healthy_forgives_the_restarts_before_it() {
        let mut conn = Conn {
            restarts: MAX_RESTARTS,
            started: std::time::Instant::now().checked_sub(HEALTHY_RUN),
            ..Conn::default()
        };
        conn.take();
        assert_eq!(conn.restarts, 0);
        // One that died soon after its start does not.
        conn.restarts = 3;
        conn.started = Some(std::time::Instant::now());
        conn.take();
        assert_eq!(conn.restarts, 3);
    }
}
