//! What every HTTP server of agentloop holds to (`agentloop a2a serve`, `agentloop mcp serve
//! --http`, the trace viewer):
//!
//! - **A request names the server.** Its `Host` is a loopback name or the address the server
//!   listens on ([`allowed_hosts`], [`host_checked`]). A web page the user's browser shows can send
//!   a request to 127.0.0.1, and read the answer once its own name points there (DNS rebinding);
//!   its `Host` is then that name, which no request of a client on purpose carries.
//! - **Headers come in bounded time.** A connection that has not sent a whole request head within
//!   [`Limits::header_timeout`] (30 s), whether it just opened or sat idle between requests, is
//!   closed: a client that sends a byte a minute cannot hold a connection, and with it a file
//!   descriptor, for ever.
//! - **Bodies come in bounded time.** A request's body must arrive whole within
//!   [`Limits::body_timeout`] (60 s) of its head, or reading it fails, its request is answered
//!   as an error and its connection closed: a body sent a byte at a time holds no connection
//!   for longer than that. (hyper's header timeout covers the head alone.)
//! - **Connections are bounded.** Past [`Limits::max_connections`] open connections the server
//!   accepts no more until one closes (they wait in the kernel's backlog).
//! - **A stop is bounded.** Asked to stop, the server accepts nothing more, lets each connection
//!   finish the request it is in, and returns after [`Limits::stop_grace`] at the latest, though a
//!   stream it serves (server-sent events) would go on.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let allowed = agentloop_serve::allowed_hosts(listener.local_addr()?);
//! let router = agentloop_serve::host_checked(
//!     axum::Router::new().route("/", axum::routing::get(|| async { "hello" })),
//!     allowed,
//! );
//! agentloop_serve::serve(listener, router, std::future::pending(), agentloop_serve::Limits::default()).await
//! # }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The most runs a server of agents (A2A, MCP) drives at once unless told otherwise: each run
/// costs its model's tokens, so a client that sends a thousand requests at once is told to wait
/// rather than start a thousand paid runs.
pub const DEFAULT_MAX_RUNS: usize = 16;

/// The names a request may give its server by: `localhost`, `127.0.0.1`, `::1`, and the address
/// `addr` when it is another one (a server that listens on a LAN address is reached by it).
/// `None` for a server that listens on every address (`0.0.0.0`, `[::]`): it is meant to be
/// reached from elsewhere, by names it cannot know, and anyone may reach it directly anyway (its
/// operator is warned); the check is there for a server kept on this machine.
pub fn allowed_hosts(addr: SocketAddr) -> Option<Vec<String>> {
    let ip = addr.ip();
    if ip.is_unspecified() {
        return None;
    }
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if !ip.is_loopback() {
        hosts.push(ip.to_string());
    }
    Some(hosts)
}

/// `router`, answering 403 to a request whose `Host` is none of `allowed` (a port in it aside);
/// `router` as it is when `allowed` is `None` (see [`allowed_hosts`]).
pub fn host_checked(router: Router, allowed: Option<Vec<String>>) -> Router {
    let Some(allowed) = allowed else {
        return router;
    };
    let allowed: Arc<[String]> = allowed.into();
    router.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let allowed = Arc::clone(&allowed);
            async move {
                if host_allowed(request.headers(), &allowed) {
                    next.run(request).await
                } else {
                    forbidden()
                }
            }
        },
    ))
}

fn forbidden() -> Response {
    (
        StatusCode::FORBIDDEN,
        "the request's Host is not a name of this server (a loopback name or its address)",
    )
        .into_response()
}

/// True when the request's `Host` names one of `allowed`.
fn host_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = host_name(host);
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// The name of a `Host` value without its port: `[::1]:8080` is `::1`, `localhost:80` is
/// `localhost`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The bounds a server holds to.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long a connection has to send a whole request head, from when the server starts
    /// waiting for one (the connection opened, or its last response was sent).
    pub header_timeout: Duration,
    /// How long a request's body has to arrive whole, from when its head did.
    pub body_timeout: Duration,
    /// The most connections open at once.
    pub max_connections: usize,
    /// How long a stop waits for the connections' requests in progress.
    pub stop_grace: Duration,
}

impl Default for Limits {
    /// 30 s for a request head (hyper's own default, once it has a clock), 60 s for its body
    /// (the servers' bodies are 2 MB at most: 35 KB/s), 1,024 connections (a quarter of the
    /// usual 4,096 file descriptors a process may hold), 10 s to stop.
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            max_connections: 1024,
            stop_grace: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then stops as
/// [`Limits::stop_grace`] says. A failed accept or connection is that connection's own: the
/// server goes on (the `Result` is axum's `serve`'s shape, kept for a listener error to come).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> std::io::Result<()> {
    let router = with_body_deadline(router, limits.body_timeout);
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if !is_connection_error(&e) {
                        // Out of file descriptors, most often: wait for some to close rather
                        // than spin on the error.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a connection ended in error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.stop_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("connections still open when the server stopped");
    }
    Ok(())
}

/// `router`, each request's body failing once `timeout` passes from its head before its end.
fn with_body_deadline(router: Router, timeout: Duration) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| async move {
            let request = request.map(|body| {
                Body::new(Deadline {
                    inner: body,
                    deadline: Box::pin(tokio::time::sleep(timeout)),
                    timeout,
                })
            });
            next.run(request).await
        },
    ))
}

/// A request body that fails once its deadline passes before its end.
struct Deadline {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

/// Why a request's body was not read: it did not arrive within [`Limits::body_timeout`].
#[derive(Debug, thiserror::Error)]
#[error("the request's body did not arrive within {0:?} of its head")]
struct BodyTimedOut(Duration);

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        // What has arrived is read, the deadline passed or not.
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(this.timeout)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Errors of one connection that the next accept does not share.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn with_host(host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        h
    }

    #[test]
    fn loopback_names_and_the_listening_address_pass_and_nothing_else() {
        let lan: SocketAddr = "192.168.1.5:9000".parse().unwrap();
        let allowed = allowed_hosts(lan).unwrap();
        for ok in [
            "127.0.0.1:9000",
            "localhost:9000",
            "LOCALHOST",
            "[::1]:9000",
            "192.168.1.5:9000",
        ] {
            assert!(host_allowed(&with_host(ok), &allowed), "{ok}");
        }
        for no in [
            "evil.example:9000",
            "127.0.0.1.evil.example",
            "localhost.evil.example:9000",
            "[::2]:9000",
            "",
        ] {
            assert!(!host_allowed(&with_host(no), &allowed), "{no}");
        }
        assert!(!host_allowed(&HeaderMap::new(), &allowed), "no Host at all");
        let local = allowed_hosts("127.0.0.1:9000".parse().unwrap()).unwrap();
        assert!(!host_allowed(&with_host("192.168.1.5:9000"), &local));
        assert_eq!(allowed_hosts("0.0.0.0:9000".parse().unwrap()), None);
    }
}
