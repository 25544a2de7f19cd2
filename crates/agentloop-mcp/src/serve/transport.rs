//! The transports a served offer speaks: stdio (the client started this process; stdout carries
//! only protocol messages) and streamable HTTP at `/mcp` (sessions kept in memory; the `Host`
//! header checked against loopback and the bound address, against DNS rebinding; none on every
//! address; an idle session closed as `sessions` says), within `agentloop-serve`'s bounds. At a
//! stop the HTTP sessions end only once the requests in progress have been answered.

use std::sync::Arc;

use futures::StreamExt;

use agentloop::CancellationToken;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::sessions::{Activity, Sessions};
use super::{AgentServer, ServeError};

fn transport_error(e: impl std::fmt::Display) -> ServeError {
    ServeError::Transport {
        reason: e.to_string(),
    }
}

/// Serves on this process's stdin and stdout until the client closes them or `shutdown` fires.
pub async fn serve_stdio(
    mut server: AgentServer,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    server.stopping = shutdown.clone();
    let running = rmcp::service::serve_server_with_ct(server, rmcp::transport::stdio(), shutdown)
        .await
        .map_err(transport_error)?;
    running.waiting().await.map_err(transport_error)?;
    Ok(())
}

/// Serves streamable HTTP at `/mcp` on `listener` until `shutdown` fires; an idle session is
/// closed as [`AgentServer::with_session_idle`] says.
pub async fn serve_http(
    mut server: AgentServer,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let addr = listener.local_addr().map_err(transport_error)?;
    server.stopping = shutdown.clone();
    // One list of names for every agentloop server (`agentloop-serve`); rmcp checks it here, as
    // it answers a wrong `Host` in MCP's own terms. A server on every address checks none.
    // rmcp ends every session, and the streams of the requests in them, when its token is
    // cancelled: at once at the stop, a call's answer to it (its run left to resume, or
    // cancelled) never reached its client. Its token is cancelled once the requests in progress
    // have been answered, within the stop's grace.
    let sessions_end = CancellationToken::new();
    let _sessions_end = sessions_end.clone().drop_guard();
    let answering = Answering::default();
    tokio::spawn(
        answering
            .clone()
            .then_end(shutdown.clone(), sessions_end.clone()),
    );
    let config =
        StreamableHttpServerConfig::default().with_cancellation_token(sessions_end.child_token());
    let config = match agentloop_serve::allowed_hosts(addr) {
        Some(hosts) => config.with_allowed_hosts(hosts),
        None => config.disable_allowed_hosts(),
    };
    let activity = Activity::new(server.session_idle);
    server.sessions = Some(Arc::clone(&activity));
    let sessions = Arc::new(Sessions::new(activity));
    let reaping = shutdown.child_token();
    tokio::spawn(Arc::clone(&sessions).reap(reaping.clone()));
    // The reaper ends with the server, however it returns.
    let _reaping = reaping.drop_guard();
    let service = StreamableHttpService::new(move || Ok(server.clone()), sessions, config);
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(ended_session_answer))
        .layer(axum::middleware::from_fn_with_state(
            answering,
            Answering::watch,
        ));
    agentloop_serve::serve(
        listener,
        router,
        async move { shutdown.cancelled().await },
        agentloop_serve::Limits::default(),
    )
    .await
    .map_err(transport_error)
}

/// The requests being answered: a `POST`'s answer, which carries a call's result, until its
/// body has been sent (or its client went away). A `GET`'s stream, which lasts as long as its
/// session, is not counted.
#[derive(Clone, Default)]
struct Answering(Arc<tokio::sync::watch::Sender<usize>>);

/// One request counted in [`Answering`] until dropped.
struct Counted(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Answering {
    /// Counts a `POST` until its answer's body is over.
    async fn watch(
        axum::extract::State(this): axum::extract::State<Answering>,
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        if request.method() != axum::http::Method::POST {
            return next.run(request).await;
        }
        this.0.send_modify(|n| *n += 1);
        let counted = Counted(Arc::clone(&this.0));
        let (parts, body) = next.run(request).await.into_parts();
        let body = body.into_data_stream().map(move |chunk| {
            let _held = &counted;
            chunk
        });
        axum::response::Response::from_parts(parts, axum::body::Body::from_stream(body))
    }

    /// After `shutdown`, cancels `end` once no request is being answered, or the stop's grace
    /// is over.
    async fn then_end(self, shutdown: CancellationToken, end: CancellationToken) {
        shutdown.cancelled().await;
        let mut count = self.0.subscribe();
        let grace = agentloop_serve::Limits::default().stop_grace;
        let _ = tokio::time::timeout(grace, count.wait_for(|n| *n == 0)).await;
        end.cancel();
    }
}

/// A session a client ends (`DELETE /mcp`) is answered `204 No Content`, not rmcp's `202
/// Accepted`: the session is gone when the answer leaves, and MCP's own SDKs take only 200 and
/// 204 for a session ended (the Python SDK logs "Session termination failed: 202" otherwise);
/// the specification names no status for it.
async fn ended_session_answer(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let ending = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    if ending && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}
