//! The streamable HTTP sessions of a served offer, and how long one lives idle. Only a client of
//! MCP before 2026-07-28 has one (2026-07-28 is stateless). rmcp's own timer ends a session after
//! 5 minutes without a message, with a call in progress too, and an agent's run is often quiet
//! that long: its run was cancelled and its result lost. Here rmcp's timer is off, and a session
//! is idle only while no call of it runs and no stream of it is open; it is closed after
//! [`super::AgentServer::with_session_idle`] of that ([`DEFAULT_SESSION_IDLE`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agentloop::CancellationToken;
use futures::{Stream, StreamExt};
use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

/// How long a session lives with no call running and no stream open, unless told otherwise: an
/// hour, as a person may leave a client open between two questions, and a client that finds
/// its session gone must start one again (most do, on the 404; some do not).
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(60 * 60);

/// What each session is doing, shared by the session manager (its streams) and the handlers
/// (their calls).
#[derive(Debug)]
pub(crate) struct Activity {
    idle: Option<Duration>,
    sessions: Mutex<HashMap<SessionId, Use>>,
}

#[derive(Debug)]
struct Use {
    /// Its calls running and its streams open.
    busy: usize,
    /// When it last had something going on.
    since: Instant,
}

impl Activity {
    pub(super) fn new(idle: Option<Duration>) -> Arc<Self> {
        Arc::new(Activity {
            idle,
            sessions: Mutex::new(HashMap::new()),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<SessionId, Use>) -> T) -> T {
        f(&mut self.sessions.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn opened(&self, id: &SessionId) {
        self.with(|s| {
            s.insert(
                id.clone(),
                Use {
                    busy: 0,
                    since: Instant::now(),
                },
            )
        });
    }

    fn touch(&self, id: &SessionId) {
        self.with(|s| s.get_mut(id).map(|u| u.since = Instant::now()));
    }

    fn forget(&self, id: &SessionId) {
        self.with(|s| s.remove(id));
    }

    /// The session held busy until the guard drops; `None` for a session it does not know.
    fn busy(self: &Arc<Self>, id: &SessionId) -> Option<Busy> {
        self.with(|s| s.get_mut(id).map(|u| u.busy += 1))?;
        Some(Busy {
            activity: Arc::clone(self),
            id: id.clone(),
        })
    }

    /// The session of a call served over HTTP, held busy while the call runs: its stream may
    /// be gone (the client went away, to resume later) while its run goes on.
    pub(super) fn call(self: &Arc<Self>, context: &RequestContext<RoleServer>) -> Option<Busy> {
        let parts = context.extensions.get::<http::request::Parts>()?;
        let id = parts.headers.get("mcp-session-id")?.to_str().ok()?;
        self.busy(&SessionId::from(id))
    }

    /// The sessions idle past the bound, forgotten here; the caller closes them.
    fn take_idle(&self) -> Vec<SessionId> {
        let Some(idle) = self.idle else {
            return Vec::new();
        };
        self.with(|s| {
            let gone: Vec<SessionId> = s
                .iter()
                .filter(|(_, u)| u.busy == 0 && u.since.elapsed() >= idle)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &gone {
                s.remove(id);
            }
            gone
        })
    }
}

/// A session kept busy: a call running, or a stream open.
pub(crate) struct Busy {
    activity: Arc<Activity>,
    id: SessionId,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.activity.with(|s| {
            if let Some(u) = s.get_mut(&self.id) {
                u.busy = u.busy.saturating_sub(1);
                u.since = Instant::now();
            }
        });
    }
}

/// rmcp's sessions in memory, with no timer of their own, watched by [`Activity`].
pub(super) struct Sessions {
    inner: LocalSessionManager,
    activity: Arc<Activity>,
}

impl Sessions {
    pub(super) fn new(activity: Arc<Activity>) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = None;
        Sessions { inner, activity }
    }

    /// Closes the sessions idle past the bound, as they become so, until `stop` fires.
    pub(super) async fn reap(self: Arc<Self>, stop: CancellationToken) {
        let Some(idle) = self.activity.idle else {
            return;
        };
        // Often enough that a session outlives its bound by a quarter of it at most.
        let tick = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(60));
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = stop.cancelled() => return,
            }
            for id in self.activity.take_idle() {
                tracing::debug!(target: "agentloop_mcp", session = %id, "an idle session is closed");
                if let Err(e) = self.inner.close_session(&id).await {
                    tracing::debug!(target: "agentloop_mcp", session = %id, error = %e, "closing an idle session failed");
                }
            }
        }
    }

    /// `stream`, keeping its session busy while it is open.
    fn held(
        busy: Option<Busy>,
        stream: impl Stream<Item = ServerSseMessage> + Send + Sync + 'static,
    ) -> impl Stream<Item = ServerSseMessage> + Send + Sync + 'static {
        stream.map(move |message| {
            let _open = &busy;
            message
        })
    }
}

impl SessionManager for Sessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        self.activity.opened(&id);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.activity.touch(id);
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.activity.forget(id);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let busy = self.activity.busy(id);
        let stream = self.inner.create_stream(id, message).await?;
        Ok(Self::held(busy, stream))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.activity.touch(id);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let busy = self.activity.busy(id);
        let stream = self.inner.create_standalone_stream(id).await?;
        Ok(Self::held(busy, stream))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let busy = self.activity.busy(id);
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(Self::held(busy, stream))
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        let outcome = self.inner.restore_session(id.clone()).await?;
        if matches!(outcome, RestoreOutcome::Restored(_)) {
            self.activity.opened(&id);
        }
        Ok(outcome)
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}
