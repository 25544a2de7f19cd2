//! What a server on this machine lets in: a request that names the server by a loopback name or
//! by the address it listens on, in its `Host`. A web page the user's browser shows can send a
//! request to 127.0.0.1, and read the answer once its own name points there (DNS rebinding); its
//! `Host` is then that name, which no request of a client on purpose carries.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The names a request may give its server by: `localhost`, `127.0.0.1`, `::1`, and the address
/// `addr` when it is another one (a server that listens on a LAN address is reached by it).
/// `None` for a server that listens on every address (`0.0.0.0`, `[::]`): it is meant to be
/// reached from elsewhere, by names it cannot know, and anyone may reach it directly anyway (its
/// operator was warned); the check is there for a server kept on this machine.
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
