//! The transports a served offer speaks: stdio (the client started this process; stdout carries
//! only protocol messages) and streamable HTTP at `/mcp` (sessions kept in memory; the `Host`
//! header checked against loopback and the bound address, against DNS rebinding).

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
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if let Ok(addr) = listener.local_addr()
        && !addr.ip().is_unspecified()
        && !addr.ip().is_loopback()
    {
        hosts.push(addr.ip().to_string());
    }
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        .with_allowed_hosts(hosts);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(transport_error)
}
