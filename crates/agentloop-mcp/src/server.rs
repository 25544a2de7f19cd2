//! One connection to one MCP server ([`McpServer`]): started (a child process or an HTTP
//! session), its tools listed, their calls made, and started again after it dies when its policy
//! says so. A child's stderr goes to `tracing` (target `agentloop_mcp::stderr`), never to this
//! process's terminal; its last lines explain a death or a failed start. On Linux a child and
//! all it starts die with this process, a SIGKILLed one too (`agentloop_sandbox`'s
//! `Confinement::dying_with_parent`).

mod spawn;
mod stdio;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentloop::tool::ProgressSender;
use agentloop::{Tool, ToolContext, ToolError, ToolOutput};
use futures::StreamExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientConfig,
    ClientRequest, Implementation, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    RequestId, ServerNotification, ServerResult, SubscriptionFilter,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, PeerRequestOptions, RoleClient,
    RunningService, ServiceError,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, Peer};
use serde_json::Value;
use tokio_util::codec::{FramedRead, LinesCodec};

use crate::config::{MAX_RESTARTS, Restart, ServerConfig, Transport, expand_template};
use crate::{McpError, tools};
use stdio::StdioChild;

/// How many of a child's last stderr lines are kept to explain its death.
const STDERR_TAIL_LINES: usize = 20;
/// The longest stderr line kept whole; a longer one is cut (a server may write anything there).
const STDERR_LINE_BYTES: usize = 4096;

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

/// What a child wrote on stderr: its last lines (to explain its death), the lines of each call
/// in flight (which go into the call's details, so that a trace with payloads keeps them), and
/// the lines written while no call was (which the runs of its agent take for their events).
#[derive(Default)]
struct Stderr {
    tail: VecDeque<String>,
    calls: HashMap<u64, Vec<String>>,
    next: u64,
    /// Lines written outside any call, not yet taken; the oldest give way past
    /// [`STDERR_OUTSIDE_LINES`].
    outside: VecDeque<String>,
    /// How many lines outside calls gave way since they were last taken.
    dropped: usize,
}

/// The most stderr lines written outside calls that wait to be taken.
const STDERR_OUTSIDE_LINES: usize = 200;

/// How long a failed HTTP request waits to see whether its session ended with it.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The most stderr lines one call's details keep.
const STDERR_CALL_LINES: usize = 100;

/// The stderr lines written while one call is in flight; dropping it stops the capture.
struct Capture {
    stderr: Arc<Mutex<Stderr>>,
    id: u64,
}

impl Capture {
    fn start(stderr: &Arc<Mutex<Stderr>>) -> Capture {
        let mut s = stderr.lock().unwrap_or_else(PoisonError::into_inner);
        let id = s.next;
        s.next = s.next.wrapping_add(1);
        s.calls.insert(id, Vec::new());
        Capture {
            stderr: Arc::clone(stderr),
            id,
        }
    }

    fn take(&self) -> Vec<String> {
        let mut s = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        s.calls
            .get_mut(&self.id)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let mut s = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        s.calls.remove(&self.id);
    }
}

#[derive(Default)]
struct Conn {
    service: Option<RunningService<RoleClient, Notified>>,
    /// At 2026-07-28, the subscription that hears the server's tool list change; it ends with
    /// the connection it listens on.
    listener: Option<Listener>,
    /// Counts starts, so that a call that saw one connection die never drops a newer one.
    generation: u64,
    /// Restarts since the server last ran healthy (see [`HEALTHY_RUN`]).
    restarts: u32,
    /// When the running connection started.
    started: Option<std::time::Instant>,
    /// Why it is down for good.
    down: Option<String>,
}

/// A connection that ran this long before it ended was a healthy one: the restarts counted
/// before it are forgiven, so that a server that fails now and then over a long-lived process
/// does not use up its [`MAX_RESTARTS`], while one that dies again soon after each start does.
const HEALTHY_RUN: Duration = Duration::from_secs(10 * 60);

impl Conn {
    /// Takes the running connection (one that ended), forgiving the restarts before it when it
    /// ran healthy long enough.
    fn take(&mut self) -> Option<RunningService<RoleClient, Notified>> {
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
    fn run(&mut self, service: RunningService<RoleClient, Notified>, listener: Option<Listener>) {
        self.listener = listener;
        self.service = Some(service);
        self.started = Some(std::time::Instant::now());
        self.generation += 1;
    }
}

/// The progress senders of one connection's calls in flight, by the progress token of their
/// request. Each connection has its own: rmcp numbers progress tokens from 0 on each, so a
/// restarted server's call would otherwise be handed what its previous connection sent.
type Progress = Arc<Mutex<ProgressRoutes>>;

/// Where progress goes. rmcp sends a request before its caller holds the token, and hands each
/// notification to the handler on a task of its own, so a fast server's first progress can come
/// before the call's route: it waits in `early` until the route takes it.
#[derive(Default)]
struct ProgressRoutes {
    routes: HashMap<ProgressToken, ProgressSender>,
    early: HashMap<ProgressToken, Early>,
}

/// Progress under a token no call holds yet, since when it waits.
struct Early {
    since: std::time::Instant,
    progress: Vec<Value>,
}

/// The most tokens whose progress waits for a route, the most notifications each keeps, and
/// how long they wait: a server may send progress under a token no call holds (a call already
/// answered, a token of its own making). Past the count the oldest waiting token gives way, so
/// that such progress never stops a call's early progress from being kept.
const EARLY_PROGRESS_TOKENS: usize = 64;
const EARLY_PROGRESS_EACH: usize = 16;
const EARLY_PROGRESS_AGE: Duration = Duration::from_secs(30);
/// The longest progress message kept whole (a server's text, read into the run's events).
const PROGRESS_MESSAGE_BYTES: usize = 1024;

impl ProgressRoutes {
    /// Keeps `progress` under `token`, which no call holds yet.
    fn keep_early(&mut self, token: ProgressToken, progress: Value) {
        let now = std::time::Instant::now();
        if !self.early.contains_key(&token) {
            self.early
                .retain(|_, e| now.duration_since(e.since) < EARLY_PROGRESS_AGE);
            if self.early.len() >= EARLY_PROGRESS_TOKENS
                && let Some(oldest) = self
                    .early
                    .iter()
                    .min_by_key(|(_, e)| e.since)
                    .map(|(t, _)| t.clone())
            {
                self.early.remove(&oldest);
            }
        }
        let early = self.early.entry(token).or_insert_with(|| Early {
            since: now,
            progress: Vec::new(),
        });
        if early.progress.len() < EARLY_PROGRESS_EACH {
            early.progress.push(progress);
        }
    }
}

/// The client side of the protocol: it hears that the tool list changed, and the progress of
/// calls, which becomes their `ToolProgress` events.
#[derive(Clone)]
struct Notified {
    changed: Arc<AtomicBool>,
    progress: Progress,
    server: Arc<str>,
    /// The version `initialize` offers (2025-11-25 unless the config pins an older one).
    offered: ProtocolVersion,
}

impl ClientHandler for Notified {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        tracing::debug!(target: "agentloop_mcp", server = %self.server, "tools/list_changed");
        self.changed.store(true, Ordering::Release);
        std::future::ready(())
    }

    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let message = params
            .message
            .map(|m| agentloop::tool::bounded_text(m, PROGRESS_MESSAGE_BYTES));
        let progress = serde_json::json!({
            "progress": params.progress,
            "total": params.total,
            "message": message,
        });
        let mut routes = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = routes.routes.get(&params.progress_token) {
            sender.send(progress);
        } else {
            routes.keep_early(params.progress_token, progress);
        }
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            Default::default(),
            Implementation::new("agentloop", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(self.offered.clone())
    }
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

    /// Calls a tool by the server's name for it: the result as the model reads it, a server's
    /// `isError` result as a recoverable error. Cancelling the call's token (or dropping the
    /// future, as a timeout does) sends the server `notifications/cancelled`.
    pub(crate) async fn call(
        &self,
        remote: &str,
        args: Value,
        ctx: ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let name = self.name().to_owned();
        let (peer, generation, progress) = self.peer().await.map_err(|e| {
            // The operator's diagnostic (a start's stderr, say) goes to the log; the model reads
            // what it can act on.
            tracing::warn!(target: "agentloop_mcp", server = %name, error = %e, "a call found the MCP server unavailable");
            let why = match &e {
                McpError::Down { reason, .. } => format!("it is not running: {reason}"),
                _ => "it exited and could not be started again".to_owned(),
            };
            ToolError::new(e.code(), format!("the MCP server {name} is not available: {why}"))
        })?;
        let mut params = CallToolRequestParams::new(remote.to_owned());
        params.arguments = match args {
            Value::Object(map) => Some(map),
            Value::Null => None,
            _ => {
                return Err(
                    ToolError::new("invalid_arguments", "the arguments must be an object")
                        .permanent(),
                );
            }
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let capture = Capture::start(&self.inner.stderr);
        let sent = peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await;
        let result = match sent {
            Ok(handle) => {
                // Until the answer: progress reaches the call's events, and a call that is
                // cancelled, or dropped (its timeout), tells the server to stop.
                let _progress = ProgressRoute::new(
                    &progress,
                    handle.progress_token.clone(),
                    ctx.progress.clone(),
                );
                let mut abandon = Abandon {
                    peer: peer.clone(),
                    id: Some(handle.id.clone()),
                };
                let result = tokio::select! {
                    r = handle.await_response() => r,
                    () = ctx.cancel.cancelled() => {
                        return Err(ToolError::new("cancelled", "the call was cancelled"));
                    }
                };
                abandon.id = None;
                result
            }
            Err(e) => Err(e),
        };
        let result = match result {
            Ok(ServerResult::CallToolResult(r)) => Ok(r),
            // A result with no field at all reads as an empty one.
            Ok(ServerResult::EmptyResult(_)) => Ok(rmcp::model::CallToolResult::default()),
            // At 2026-07-28 a tool may answer that it needs its client's input (an elicitation,
            // sampling, roots) and wait for a retry holding it: this client has nobody to ask.
            Ok(ServerResult::InputRequiredResult(_)) => {
                return Err(ToolError::new(
                    "mcp.input_required",
                    format!(
                        "the tool asked agentloop for input (a form, a model's answer or roots) \
                         before it answers; agentloop gives MCP servers none, so the MCP server \
                         {name} cannot complete this call"
                    ),
                ));
            }
            Ok(_) => Err(ServiceError::UnexpectedResponse),
            Err(e) => Err(e),
        };
        let max = self.inner.config.max_output_bytes;
        // An error's text is the client's error, which names no credential of the server's
        // declaration (a gateway may echo the token it refused); bounded like a result.
        let error_text =
            |text: &str| agentloop::tool::bounded_text(scrubbed(&self.inner.config, text), max);
        match result {
            Ok(result) => match tools::output(result, max) {
                Ok(out) => Ok(with_stderr(out, capture.take())),
                Err(ToolError::Recoverable {
                    code,
                    message,
                    permanent,
                }) => Err(ToolError::Recoverable {
                    code,
                    message: error_text(&message),
                    permanent,
                }),
                Err(e) => Err(e),
            },
            Err(ServiceError::McpError(e)) => {
                Err(ToolError::new("mcp.error", error_text(&e.message)))
            }
            Err(e) if is_too_large(&e) => Err(self.too_large(false)),
            Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_)))
                if !self.connection_ended(&peer).await =>
            {
                // One request failed (a proxy's 502, a reset connection, a response stream cut
                // short) on a connection that lives: this call's error, which its tool's retries
                // may try again; the calls beside it go on.
                Err(ToolError::new(
                    "mcp.request",
                    format!(
                        "the request to the MCP server {name} failed: {}",
                        scrubbed(&self.inner.config, &e.to_string())
                    ),
                ))
            }
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                let oversized = self.inner.oversized.load(Ordering::Acquire);
                if !oversized {
                    self.report_exit("during a call");
                }
                self.forget(generation).await;
                if oversized {
                    return Err(self.too_large(true));
                }
                Err(ToolError::new(
                    "mcp.server_exited",
                    format!(
                        "the MCP server {name} exited during the call; {}",
                        self.then()
                    ),
                ))
            }
            Err(ServiceError::Timeout { timeout }) => Err(ToolError::new(
                "timeout",
                format!(
                    "the MCP server {name} did not answer within {:.1} s",
                    timeout.as_secs_f64()
                ),
            )),
            Err(e) => Err(ToolError::new(
                "mcp.request",
                scrubbed(&self.inner.config, &e.to_string()),
            )),
        }
    }

    /// What becomes of the server's tools after its connection ended, by its policy.
    fn then(&self) -> &'static str {
        match self.inner.config.restart {
            Restart::OnFailure => "it is started again on the next call",
            Restart::Never => "its tools are no longer available",
        }
    }

    /// The error of a call that met a message past the bound: the call's own over HTTP, where
    /// the answer is refused and the session lives; over stdio the connection ended with it.
    fn too_large(&self, ended: bool) -> ToolError {
        let config = &self.inner.config;
        let bound = config.max_message_bytes();
        let name = &config.name;
        tracing::warn!(target: "agentloop_mcp", server = %name, bound, ended, "the MCP server sent a message past the bound");
        let message = if ended {
            format!(
                "the MCP server {name} wrote a message of more than {bound} bytes (this call's \
                 answer, or one beside it), so its connection was closed; {}",
                self.then()
            )
        } else {
            format!("the MCP server {name} answered with more than {bound} bytes; refused")
        };
        ToolError::new("mcp.message_too_large", message)
    }

    /// A handle on the running server (its connection's number and progress routes beside
    /// it): started again first when it died and its policy allows.
    async fn peer(&self) -> Result<(Peer<RoleClient>, u64, Progress), McpError> {
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
    async fn connection_ended(&self, peer: &Peer<RoleClient>) -> bool {
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
    async fn forget(&self, generation: u64) {
        let mut conn = self.inner.conn.lock().await;
        if conn.generation == generation
            && let Some(mut service) = conn.take()
        {
            let _ = service.close_with_timeout(Duration::from_secs(1)).await;
        }
    }

    fn report_exit(&self, when: &str) {
        let tail = self.stderr_tail();
        tracing::warn!(target: "agentloop_mcp", server = %self.name(), stderr = %tail, "the MCP server exited {when}");
    }

    fn stderr_tail(&self) -> String {
        let tail = self
            .inner
            .stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        tail.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// At 2026-07-28 a server announces a change of its tools only on a `subscriptions/listen`
    /// stream: one is kept open while the connection lives, when the server says its list can
    /// change. Before that wire the announcement comes on the connection itself.
    fn listen(&self, peer: &Peer<RoleClient>) -> Option<Listener> {
        let info = peer.peer_info()?;
        let announces = info
            .capabilities
            .tools
            .as_ref()
            .is_some_and(|t| t.list_changed == Some(true));
        if info.protocol_version.has_initialize() || !announces {
            return None;
        }
        let task = tokio::spawn(listen_for_tool_changes(
            peer.clone(),
            self.inner.changed.clone(),
            self.inner.config.clone(),
        ));
        Some(Listener(task))
    }

    /// Lists the tools. The flag is cleared first: a change announced while the list is under
    /// way is listed again next time rather than lost. A listing that fails, times out or is
    /// dropped (a run's deadline) sets it again: the change is still to be listed.
    async fn list(&self, peer: &Peer<RoleClient>) -> Result<bool, McpError> {
        self.inner.changed.store(false, Ordering::Release);
        let mut unlisted = StillChanged(Some(&self.inner.changed));
        let timeout = self.inner.config.timeout;
        let listed = tokio::time::timeout(timeout, self.list_pages(peer))
            .await
            .map_err(|_| McpError::Timeout {
                server: self.name().to_owned(),
                what: "tools/list",
                secs: timeout.as_secs_f64(),
            })?
            .map_err(|e| McpError::Request {
                server: self.name().to_owned(),
                what: "tools/list",
                reason: scrubbed(&self.inner.config, &e.to_string()),
            })?;
        let mut kept = self
            .inner
            .listed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let differs = *kept != listed;
        *kept = listed;
        unlisted.0 = None;
        Ok(differs)
    }

    /// Follows `nextCursor` page by page, within bounds: a server may page forever, repeat a
    /// cursor (which rmcp's response cache may then answer with no I/O at all) or list tools
    /// without end. Past [`MAX_LIST_PAGES`] pages or [`MAX_TOOLS`] tools, or at a cursor seen
    /// before, the listing ends there with a warning, keeping what came; a tool listed twice
    /// keeps its first entry; each tool is bounded by [`bounded_tool`].
    async fn list_pages(
        &self,
        peer: &Peer<RoleClient>,
    ) -> Result<Vec<rmcp::model::Tool>, ServiceError> {
        let server = self.name();
        let mut tools: Vec<rmcp::model::Tool> = Vec::new();
        let mut names = std::collections::HashSet::new();
        let mut cursors = std::collections::HashSet::new();
        let mut cursor = None;
        for page in 1..=MAX_LIST_PAGES {
            let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor.take());
            let listed = peer.list_tools(Some(params)).await?;
            for tool in listed.tools {
                if tools.len() == MAX_TOOLS {
                    tracing::warn!(target: "agentloop_mcp", server = %server, "the server lists more than {MAX_TOOLS} tools: the rest are left out");
                    return Ok(tools);
                }
                if !names.insert(tool.name.clone()) {
                    tracing::warn!(target: "agentloop_mcp", server = %server, tool = %tool.name, "the server lists a tool twice: its first entry is kept");
                    continue;
                }
                if let Some(tool) = bounded_tool(server, tool) {
                    tools.push(tool);
                }
            }
            match listed.next_cursor {
                None => return Ok(tools),
                Some(next) if !cursors.insert(next.clone()) => {
                    tracing::warn!(target: "agentloop_mcp", server = %server, "the server's tools/list repeats a cursor: the listing ends there");
                    return Ok(tools);
                }
                Some(_) if page == MAX_LIST_PAGES => {
                    tracing::warn!(target: "agentloop_mcp", server = %server, "the server's tools/list goes past {MAX_LIST_PAGES} pages: the rest are left out");
                }
                Some(next) => cursor = Some(next),
            }
        }
        Ok(tools)
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
    async fn start(&self) -> Result<RunningService<RoleClient, Notified>, McpError> {
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

/// True when `e` is rmcp's refusal of an HTTP answer past the bound on a message. (An event of
/// a stream past it reaches the call as the stream's end alone, a failed request.)
fn is_too_large(e: &ServiceError) -> bool {
    type HttpError = rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(HttpError::ResponseBodyTooLarge { .. }) = error.downcast_ref::<HttpError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Marks the tool list stale again when dropped armed: a listing that did not complete.
struct StillChanged<'a>(Option<&'a AtomicBool>);

impl Drop for StillChanged<'_> {
    fn drop(&mut self) {
        if let Some(changed) = self.0 {
            changed.store(true, Ordering::Release);
        }
    }
}

/// The most pages one `tools/list` follows.
const MAX_LIST_PAGES: usize = 100;
/// The most tools one server lists.
const MAX_TOOLS: usize = 1000;
/// The longest tool description kept whole (longer ones keep their head and tail): the model
/// reads every description at every turn.
const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
/// The largest input and output schemas of one tool together, as JSON: a tool past it is left
/// out (a schema cut short would not be one).
const MAX_SCHEMA_BYTES: usize = 256 * 1024;

/// `tool` with its description (and title) cut to [`MAX_DESCRIPTION_BYTES`], or `None`, with a
/// warning, when its schemas are past [`MAX_SCHEMA_BYTES`].
fn bounded_tool(server: &str, mut tool: rmcp::model::Tool) -> Option<rmcp::model::Tool> {
    let schemas = serde_json::to_string(&tool.input_schema).map_or(0, |s| s.len())
        + tool
            .output_schema
            .as_ref()
            .and_then(|s| serde_json::to_string(s).ok())
            .map_or(0, |s| s.len());
    if schemas > MAX_SCHEMA_BYTES {
        tracing::warn!(target: "agentloop_mcp", server = %server, tool = %tool.name, "the tool's schemas are {schemas} bytes, past {MAX_SCHEMA_BYTES}: it is left out");
        return None;
    }
    let cut = |text: String| agentloop::tool::bounded_text(text, MAX_DESCRIPTION_BYTES);
    tool.description = tool.description.map(|d| cut(d.into_owned()).into());
    tool.title = tool.title.map(cut);
    Some(tool)
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

/// The task that holds a connection's `subscriptions/listen` stream; dropped with the
/// connection, it ends.
struct Listener(tokio::task::JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How many times in a row a subscription may fail to open before the server's announcements
/// are given up (its tools are then listed once, as at a server that announces nothing).
const LISTEN_ATTEMPTS: u32 = 3;

/// The wait before a subscription that ended is opened again: doubled at each one that ends
/// early (before [`LISTEN_HEALTHY`]), up to [`LISTEN_REOPEN_MAX`]; a server that acknowledges
/// and ends its stream at once is asked again at most once a minute, not ten times a second
/// (each reopening marks the list stale, a listing the next turn).
const LISTEN_REOPEN_FIRST: Duration = Duration::from_millis(100);
const LISTEN_REOPEN_MAX: Duration = Duration::from_secs(60);
/// A subscription that lasted this long was a good one: the next reopening waits the least.
const LISTEN_HEALTHY: Duration = Duration::from_secs(60);

/// Keeps a `subscriptions/listen` stream for `notifications/tools/list_changed` open on `peer`,
/// marking the list stale at each. A stream that ends while the connection lives is opened
/// again, and the list is marked stale, since a change may have come between the two.
async fn listen_for_tool_changes(
    peer: Peer<RoleClient>,
    changed: Arc<AtomicBool>,
    config: ServerConfig,
) {
    let server = &config.name;
    let mut failures = 0;
    let mut reopen = LISTEN_REOPEN_FIRST;
    while !peer.is_transport_closed() && failures < LISTEN_ATTEMPTS {
        let filter = SubscriptionFilter::builder().tools_list_changed().build();
        let mut subscription = match peer.listen(filter).await {
            Ok(s) if s.acknowledged().tools_list_changed == Some(true) => s,
            Ok(_) => {
                tracing::debug!(target: "agentloop_mcp", server = %server, "the server does not announce tool changes on a subscription");
                return;
            }
            Err(e) => {
                failures += 1;
                let error = scrubbed(&config, &e.to_string());
                tracing::warn!(target: "agentloop_mcp", server = %server, error = %error, "cannot listen for tool changes");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        failures = 0;
        let opened = std::time::Instant::now();
        loop {
            match subscription.next().await {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    tracing::debug!(target: "agentloop_mcp", server = %server, "tools/list_changed");
                    changed.store(true, Ordering::Release);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        changed.store(true, Ordering::Release);
        reopen = if opened.elapsed() >= LISTEN_HEALTHY {
            LISTEN_REOPEN_FIRST
        } else {
            (reopen * 2).min(LISTEN_REOPEN_MAX)
        };
        tracing::debug!(target: "agentloop_mcp", server = %server, "the tool-change subscription ended; opened again in {:.1} s", reopen.as_secs_f64());
        tokio::time::sleep(reopen).await;
    }
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

/// Routes a request's progress to a call's sender while it lives.
struct ProgressRoute {
    routes: Progress,
    token: ProgressToken,
}

impl ProgressRoute {
    fn new(routes: &Progress, token: ProgressToken, sender: ProgressSender) -> Self {
        let mut all = routes.lock().unwrap_or_else(PoisonError::into_inner);
        for progress in all
            .early
            .remove(&token)
            .map(|e| e.progress)
            .unwrap_or_default()
        {
            sender.send(progress);
        }
        all.routes.insert(token.clone(), sender);
        drop(all);
        ProgressRoute {
            routes: routes.clone(),
            token,
        }
    }
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        let mut all = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        all.routes.remove(&self.token);
        all.early.remove(&self.token);
    }
}

/// Sends `notifications/cancelled` for a request abandoned before its answer (a cancelled or
/// timed-out call), so that the server stops working on it.
struct Abandon {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let reason = Some("the call was cancelled or timed out".to_owned());
            let _ = peer
                .notify_cancelled(CancelledNotificationParam::new(Some(id), reason))
                .await;
        });
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

/// `text` without the credentials of a server's declaration (see [`secrets`]).
fn scrubbed(config: &ServerConfig, text: &str) -> String {
    agentloop::url_secrets::scrub(text, &secrets(config))
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

/// A transport that marks the tool list stale as it reads `notifications/tools/list_changed`, in
/// the stream's order. rmcp hands a notification to the handler on a task of its own, so the
/// response that follows it could reach its caller first, and the next turn (which asks at once)
/// would miss the change the server announced before it answered.
///
/// It also turns a success answer to `server/discover` that is not a discover result (a server
/// before 2026-07-28 that answers every method it does not know with `{}`) into the "method not
/// found" error a server of the older wire is expected to give: rmcp falls back to `initialize`
/// only on an error, and would otherwise fail the start of a server that speaks the older wire.
///
/// It follows the opening ([`Opening`]), and drops an answer to `server/discover` that comes
/// after rmcp gave up waiting and sent `initialize` (a server slower than rmcp's 10 s wait, a
/// first `npx -y` download): the handshake expects the answer to `initialize` first and would
/// fail the start on it.
struct Watched<T> {
    inner: T,
    changed: Arc<AtomicBool>,
    /// The id of the `server/discover` request in flight.
    discover: Option<RequestId>,
    opening: Arc<Mutex<Opening>>,
}

/// What one start's opening saw, to tell a server that ends its session at the offer of
/// 2026-07-28 from one that failed otherwise.
#[derive(Default, Clone, Copy)]
struct Opening {
    discover_sent: bool,
    discover_answered: bool,
    /// `initialize` was sent after `server/discover` (rmcp's fallback after its wait).
    initialize_sent: bool,
    /// The server ended the session (its output closed).
    closed: bool,
}

impl Opening {
    fn ended_at_discover(&self) -> bool {
        self.discover_sent && !self.discover_answered && self.closed
    }
}

impl<T> Watched<T> {
    fn new(inner: T, changed: Arc<AtomicBool>, opening: Arc<Mutex<Opening>>) -> Self {
        Watched {
            inner,
            changed,
            discover: None,
            opening,
        }
    }
}

impl<T: rmcp::transport::Transport<RoleClient>> rmcp::transport::Transport<RoleClient>
    for Watched<T>
{
    type Error = T::Error;

    fn name() -> std::borrow::Cow<'static, str> {
        T::name()
    }

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let rmcp::model::JsonRpcMessage::Request(r) = &item {
            let mut opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
            match r.request {
                ClientRequest::DiscoverRequest(_) => {
                    self.discover = Some(r.id.clone());
                    opening.discover_sent = true;
                }
                ClientRequest::InitializeRequest(_) if opening.discover_sent => {
                    opening.initialize_sent = true;
                }
                _ => {}
            }
        }
        self.inner.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send {
        let changed = Arc::clone(&self.changed);
        let discover = self.discover.clone();
        let opening = Arc::clone(&self.opening);
        let inner = &mut self.inner;
        async move {
            let mut message = inner.receive().await;
            loop {
                let answers_discover = match &message {
                    Some(rmcp::model::JsonRpcMessage::Response(r)) => {
                        Some(&r.id) == discover.as_ref()
                    }
                    Some(rmcp::model::JsonRpcMessage::Error(e)) => {
                        e.id.is_some() && e.id.as_ref() == discover.as_ref()
                    }
                    _ => false,
                };
                let late = {
                    let mut opening = opening.lock().unwrap_or_else(PoisonError::into_inner);
                    opening.closed |= message.is_none();
                    let late = answers_discover && opening.initialize_sent;
                    opening.discover_answered |= answers_discover;
                    late
                };
                if !late {
                    break;
                }
                tracing::debug!(target: "agentloop_mcp", "an answer to server/discover came after the MCP handshake began; dropped");
                message = inner.receive().await;
            }
            match &message {
                Some(rmcp::model::JsonRpcMessage::Notification(n))
                    if matches!(
                        n.notification,
                        ServerNotification::ToolListChangedNotification(_)
                    ) =>
                {
                    changed.store(true, Ordering::Release);
                }
                Some(rmcp::model::JsonRpcMessage::Response(r))
                    if Some(&r.id) == discover.as_ref()
                        && !matches!(r.result, ServerResult::DiscoverResult(_)) =>
                {
                    return Some(rmcp::model::JsonRpcMessage::error(
                        rmcp::model::ErrorData::new(
                            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                            "server/discover was answered with something else than a discover \
                             result",
                            None,
                        ),
                        Some(r.id.clone()),
                    ));
                }
                _ => {}
            }
            message
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// A call's output with what the server wrote on stderr meanwhile in its details (never read by
/// the model; kept by a trace with payloads).
fn with_stderr(mut out: ToolOutput, lines: Vec<String>) -> ToolOutput {
    if lines.is_empty() {
        return out;
    }
    let lines = Value::from(lines);
    match &mut out.details {
        Some(Value::Object(map)) => {
            map.insert("stderr".into(), lines);
        }
        Some(other) => {
            let kept = other.take();
            out.details = Some(serde_json::json!({"details": kept, "stderr": lines}));
        }
        None => out.details = Some(serde_json::json!({ "stderr": lines })),
    }
    out
}

/// Reads a child's stderr line by line into `tracing`, the tail kept to explain its death, and
/// the lines of the calls in flight.
async fn forward_stderr(
    stderr: tokio::process::ChildStderr,
    server: String,
    secrets: Vec<String>,
    tail: Arc<Mutex<Stderr>>,
) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(STDERR_LINE_BYTES));
    while let Some(line) = lines.next().await {
        let line = match line {
            Ok(line) => line,
            Err(tokio_util::codec::LinesCodecError::MaxLineLengthExceeded) => {
                "[a line too long to keep]".to_owned()
            }
            Err(tokio_util::codec::LinesCodecError::Io(_)) => break,
        };
        // Its environment's secrets never reach a log, an error or a call's details.
        let line = agentloop::url_secrets::scrub(&line, &secrets);
        tracing::info!(target: "agentloop_mcp::stderr", server = %server, "{line}");
        let mut s = tail.lock().unwrap_or_else(PoisonError::into_inner);
        for call in s.calls.values_mut() {
            if call.len() < STDERR_CALL_LINES {
                call.push(line.clone());
            }
        }
        if s.calls.is_empty() {
            if s.outside.len() == STDERR_OUTSIDE_LINES {
                s.outside.pop_front();
                s.dropped += 1;
            }
            s.outside.push_back(line.clone());
        }
        if s.tail.len() == STDERR_TAIL_LINES {
            s.tail.pop_front();
        }
        s.tail.push_back(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_under_tokens_no_call_holds_gives_way_oldest_first() {
        let token = |n: i64| ProgressToken(rmcp::model::NumberOrString::Number(n));
        let mut routes = ProgressRoutes::default();
        for n in 0..1000 {
            routes.keep_early(token(n), Value::from(n));
        }
        assert_eq!(routes.early.len(), EARLY_PROGRESS_TOKENS);
        // The newest are kept, so a call's own early progress still is.
        assert!(routes.early.contains_key(&token(999)));
        assert!(!routes.early.contains_key(&token(0)));
        for _ in 0..100 {
            routes.keep_early(token(999), Value::Null);
        }
        assert_eq!(
            routes.early[&token(999)].progress.len(),
            EARLY_PROGRESS_EACH
        );
    }

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
