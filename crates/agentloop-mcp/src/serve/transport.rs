//! The transports a served offer speaks: stdio (the client started this process; stdout carries
//! only protocol messages) and streamable HTTP at `/mcp` (sessions kept in memory; the `Host`
//! header checked against loopback and the bound address, against DNS rebinding; none on every
//! address), within `agentloop-serve`'s bounds.

use std::sync::Arc;

use agentloop::CancellationToken;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::{AgentServer, ServeError};

fn transport_error(e: impl std::fmt::Display) -> ServeError {
    ServeError::Transport {
        reason: e.to_string(),
    }
}

/// Serves on this process's stdin and stdout until the client closes them or `shutdown` fires.
pub async fn serve_stdio(
    server: AgentServer,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let running = rmcp::service::serve_server_with_ct(server, rmcp::transport::stdio(), shutdown)
        .await
        .map_err(transport_error)?;
    running.waiting().await.map_err(transport_error)?;
    Ok(())
}

/// Serves streamable HTTP at `/mcp` on `listener` until `shutdown` fires.
pub async fn serve_http(
    server: AgentServer,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let addr = listener.local_addr().map_err(transport_error)?;
    // One list of names for every agentloop server (`agentloop-serve`); rmcp checks it here, as
    // it answers a wrong `Host` in MCP's own terms. A server on every address checks none.
    let config =
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
    let config = match agentloop_serve::allowed_hosts(addr) {
        Some(hosts) => config.with_allowed_hosts(hosts),
        None => config.disable_allowed_hosts(),
    };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    agentloop_serve::serve(
        listener,
        router,
        async move { shutdown.cancelled().await },
        agentloop_serve::Limits::default(),
    )
    .await
    .map_err(transport_error)
}
