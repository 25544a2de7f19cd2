//! An offer served over streamable HTTP on loopback (`serve_http`), called by this crate's own
//! client and by hand: how long a session lives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop::{Agent, CancellationToken, RunOptions, Tool, ToolContext, ToolOutput};
use agentloop_mcp::serve::{AgentServer, Offer, ServedTools, serve_http};
use agentloop_mcp::{McpServer, ServerConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A tool that sleeps `secs` (reporting progress every 100 ms with `chatty`, else silent: a quiet
/// run, as a long model turn is), then counts its naps in `done`.
fn nap(done: Arc<AtomicUsize>) -> Tool {
    Tool::dynamic(
        "nap",
        "Sleeps secs seconds.",
        json!({"type": "object", "properties": {
            "secs": {"type": "number"}, "chatty": {"type": "boolean"}}}),
        move |args: Value, ctx: ToolContext| {
            let done = Arc::clone(&done);
            async move {
                let secs = args["secs"].as_f64().unwrap_or(1.0);
                if args["chatty"].as_bool() == Some(true) {
                    for step in 0..(secs * 10.0) as u64 {
                        ctx.progress.send(json!({"progress": step}));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                } else {
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                }
                done.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::text("napped"))
            }
        },
    )
}

/// `nap` served over HTTP with sessions idle `idle`; the address, and what stops the server.
async fn serve(idle: Option<Duration>) -> (SocketAddr, CancellationToken) {
    serve_counting(idle, Arc::default()).await
}

/// [`serve`], its naps counted in `done`.
async fn serve_counting(
    idle: Option<Duration>,
    done: Arc<AtomicUsize>,
) -> (SocketAddr, CancellationToken) {
    let mut offer = Offer::new();
    offer
        .tools(ServedTools {
            specs: vec![nap(Arc::default()).spec().clone()],
            build: Arc::new(move |model, _prompter| {
                Agent::builder()
                    .model(model)
                    .tool(nap(Arc::clone(&done)))
                    .build()
                    .map_err(|e| e.to_string())
            }),
            options: Arc::new(RunOptions::default),
        })
        .unwrap();
    let server = AgentServer::new(offer).with_session_idle(idle);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    tokio::spawn(async move { serve_http(server, listener, shutdown).await.unwrap() });
    (addr, stop)
}

/// This crate's client, on a session (2025-11-25: 2026-07-28 has none).
async fn client(addr: SocketAddr) -> McpServer {
    let mut cfg = ServerConfig::http("s", format!("http://{addr}/mcp"));
    cfg.protocol_version = Some("2025-11-25".into());
    cfg.timeout = TIMEOUT;
    McpServer::connect(cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_longer_than_the_session_idle_bound_is_answered() {
    // Sessions idle 300 ms; the call runs 2 s without a word.
    let (addr, stop) = serve(Some(Duration::from_millis(300))).await;
    let mcp = client(addr).await;
    let tools = mcp.tools();
    let nap = tools.iter().find(|t| t.name() == "s__nap").unwrap();
    let out = tokio::time::timeout(
        TIMEOUT,
        nap.call(json!({"secs": 2}), ToolContext::detached("c1", "s__nap")),
    )
    .await
    .expect("the call hung")
    .expect("the call was cut");
    assert_eq!(out.content.to_text(), "napped");
    mcp.shutdown().await;
    stop.cancel();
}

/// One POST on a fresh connection: the status and the session id the answer names.
async fn post(addr: SocketAddr, session: Option<&str>, body: &Value) -> (u16, Option<String>) {
    exchange(addr, "POST", session, body).await
}

/// One HTTP exchange on a fresh connection: the status and the session id the answer names.
async fn exchange(
    addr: SocketAddr,
    method: &str,
    session: Option<&str>,
    body: &Value,
) -> (u16, Option<String>) {
    let body = body.to_string();
    let session = session.map_or_else(String::new, |s| format!("Mcp-Session-Id: {s}\r\n"));
    let request = format!(
        "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         {session}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The head is enough; an event stream may stay open after it.
    let head = tokio::time::timeout(TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer).into_owned();
            if n == 0 || text.contains("\r\n\r\n") {
                return text;
            }
        }
    })
    .await
    .expect("no answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let id = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("mcp-session-id")
            .then(|| value.trim().to_owned())
    });
    (status, id)
}

async fn initialize(addr: SocketAddr) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "1"}}});
    let (status, id) = post(addr, None, &init).await;
    assert_eq!(status, 200);
    let id = id.expect("no session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(addr, Some(&id), &initialized).await.0, 202);
    id
}

fn ping(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_client_ends_is_gone_and_the_answer_says_so_as_the_sdks_read_it() {
    let (addr, stop) = serve(None).await;
    let session = initialize(addr).await;
    assert_eq!(post(addr, Some(&session), &ping(40)).await.0, 200);
    // `DELETE` ends it: 204, as MCP's SDKs take it (rmcp answers 202 on its own).
    let (status, _) = exchange(addr, "DELETE", Some(&session), &json!(null)).await;
    assert_eq!(status, 204);
    assert_eq!(post(addr, Some(&session), &ping(41)).await.0, 404);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_idle_past_its_bound_is_closed_and_one_in_use_is_not() {
    let (addr, stop) = serve(Some(Duration::from_millis(500))).await;
    let session = initialize(addr).await;
    // In use, more often than the bound: it lives on.
    for n in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(post(addr, Some(&session), &ping(10 + n)).await.0, 200);
    }
    // Left idle past it (and the reaper's quarter of it): gone, and the client is told so.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(post(addr, Some(&session), &ping(20)).await.0, 404);
    stop.cancel();

    // Without a bound it lives on.
    let (addr, stop) = serve(None).await;
    let session = initialize(addr).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(post(addr, Some(&session), &ping(30)).await.0, 200);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_client_went_away_keeps_its_session_while_it_runs() {
    let done = Arc::new(AtomicUsize::new(0));
    let (addr, stop) = serve_counting(Some(Duration::from_millis(300)), Arc::clone(&done)).await;
    let session = initialize(addr).await;
    // The call's answer stream closes with `post`'s connection, after its head: the client has
    // gone (to resume later, or not). Its progress, written to the closed connection, ends the
    // stream: no stream of the session is open while the call runs on.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "nap", "arguments": {"secs": 2, "chatty": true}, "_meta": {"progressToken": "p"}}});
    assert_eq!(post(addr, Some(&session), &call).await.0, 200);
    // Well past the bound, the call still running: its session is there (to resume it from).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(done.load(Ordering::SeqCst), 0);
    assert_eq!(
        post(addr, Some(&session), &ping(3)).await.0,
        200,
        "the session of a running call was closed"
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        done.load(Ordering::SeqCst),
        1,
        "the call did not run to its end"
    );
    stop.cancel();
}
