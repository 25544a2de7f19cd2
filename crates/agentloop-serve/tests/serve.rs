//! The server's bounds, over real connections on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::net::SocketAddr;
use std::time::Duration;

use agentloop_serve::{Limits, allowed_hosts, host_checked, serve};
use axum::Router;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// A server of `router` within `limits`, its address and what stops it; the task ends when it
/// has stopped.
async fn start(
    router: Router,
    limits: Limits,
) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = host_checked(router, allowed_hosts(addr));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve(
            listener,
            router,
            async move {
                let _ = stopped.await;
            },
            limits,
        )
        .await
        .unwrap();
    });
    (addr, stop, task)
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

fn quick(header_timeout: Duration) -> Limits {
    Limits {
        header_timeout,
        ..Limits::default()
    }
}

/// Everything the server sends until it closes the connection (or `within` passes: then
/// `None`).
async fn until_closed(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok()
        .map(|()| String::from_utf8_lossy(&got).into_owned())
}

fn request(host: &str, close: bool) -> String {
    let connection = if close { "close" } else { "keep-alive" };
    format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: {connection}\r\n\r\n")
}

#[tokio::test]
async fn a_request_that_names_the_server_is_answered_and_one_that_does_not_is_refused() {
    let (addr, _stop, _task) = start(hello(), Limits::default()).await;
    let mut ok = TcpStream::connect(addr).await.unwrap();
    ok.write_all(request(&addr.to_string(), true).as_bytes())
        .await
        .unwrap();
    let answer = until_closed(&mut ok, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("hello"), "{answer}");

    let mut rebound = TcpStream::connect(addr).await.unwrap();
    rebound
        .write_all(request("attacker.example", true).as_bytes())
        .await
        .unwrap();
    let answer = until_closed(&mut rebound, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
}

#[tokio::test]
async fn a_request_head_sent_a_byte_at_a_time_past_the_timeout_loses_its_connection() {
    let (addr, _stop, _task) = start(hello(), quick(Duration::from_millis(300))).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    // The rest never comes; the server closes the connection rather than wait for it.
    let answer = until_closed(&mut slow, Duration::from_secs(10)).await;
    let answer = answer.expect("the server still holds a connection whose head never ended");
    assert!(!answer.contains("200 OK"), "{answer}");
}

#[tokio::test]
async fn a_connection_idle_between_requests_is_closed_after_the_timeout() {
    let (addr, _stop, _task) = start(hello(), quick(Duration::from_millis(300))).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(request("127.0.0.1", false).as_bytes())
        .await
        .unwrap();
    // The first answer, then nothing more is asked: the server closes the connection.
    let answer = until_closed(&mut idle, Duration::from_secs(10))
        .await
        .expect("an idle connection was kept open");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // A silent connection that never sent a byte goes the same way.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        until_closed(&mut silent, Duration::from_secs(10))
            .await
            .is_some(),
        "a connection that sent nothing was kept open"
    );
}

#[tokio::test]
async fn a_body_sent_a_byte_at_a_time_past_the_timeout_loses_its_connection() {
    let sized = Router::new().route(
        "/",
        post(|body: axum::body::Bytes| async move { format!("got {}", body.len()) }),
    );
    let limits = Limits {
        body_timeout: Duration::from_millis(600),
        max_connections: 1,
        ..Limits::default()
    };
    let (addr, _stop, _task) = start(sized, limits).await;
    let head = |len: usize| {
        format!(
            "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )
    };
    // A byte every 100 ms: each comes well within any wait between two, the whole never.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(head(1_000_000).as_bytes()).await.unwrap();
    let drip = async {
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(b"x").await.is_err() {
                break;
            }
        }
    };
    let dripped = tokio::time::timeout(Duration::from_secs(10), drip).await;
    assert!(
        dripped.is_ok(),
        "the server still reads a body past its timeout"
    );
    let answer = until_closed(&mut slow, Duration::from_secs(10))
        .await
        .expect("the server still holds a connection whose body never ended");
    assert!(!answer.contains("got"), "{answer}");

    // The one place is free again, and a body sent whole is read.
    let mut whole = TcpStream::connect(addr).await.unwrap();
    whole
        .write_all(format!("{}hello", head(5)).as_bytes())
        .await
        .unwrap();
    let answer = until_closed(&mut whole, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("got 5"), "{answer}");
}

#[tokio::test]
async fn past_the_most_connections_the_next_waits_until_one_closes() {
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let (addr, _stop, _task) = start(hello(), limits).await;
    let first = TcpStream::connect(addr).await.unwrap();
    let _second = TcpStream::connect(addr).await.unwrap();
    let mut third = TcpStream::connect(addr).await.unwrap();
    third
        .write_all(request("127.0.0.1", true).as_bytes())
        .await
        .unwrap();
    // The kernel took the third connection, but the server does not read it while two are open.
    assert_eq!(
        until_closed(&mut third, Duration::from_millis(500)).await,
        None,
        "a third connection was served while two were open"
    );
    drop(first);
    let answer = until_closed(&mut third, Duration::from_secs(10))
        .await
        .expect("the third connection was not served after the first closed");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_stop_returns_within_its_grace_though_a_stream_goes_on() {
    let endless = Router::new().route(
        "/",
        get(|| async {
            let chunks = endless_body();
            axum::body::Body::from_stream(chunks)
        }),
    );
    let limits = Limits {
        stop_grace: Duration::from_millis(300),
        ..Limits::default()
    };
    let (addr, stop, task) = start(endless, limits).await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(request("127.0.0.1", false).as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = client.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the server did not stop while a stream was open")
        .unwrap();
}

/// A body that sends a chunk every 50 ms, for ever.
fn endless_body() -> impl futures::Stream<Item = Result<axum::body::Bytes, std::io::Error>> + Send {
    let interval = tokio::time::interval(Duration::from_millis(50));
    futures::stream::unfold(interval, |mut interval| async move {
        interval.tick().await;
        Some((Ok(axum::body::Bytes::from_static(b"tick\n")), interval))
    })
}
