//! A task streamed to a caller that does not read: over a real loopback connection whose
//! receive buffer is small, the task's run waits for the caller (its tool calls stop well
//! before the run's end) instead of queueing every update in memory, and once the caller reads
//! it gets every update and the task's end.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop::RunOptions;
use agentloop_a2a::{A2aServer, ServedAgent};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../../agentloop-mcp/tests/chatty/mod.rs"]
mod chatty;
use chatty::chatty;

/// The turns of the run, each one tool call: far more updates than the backlog and the
/// connection's buffers hold.
const TURNS: usize = 8000;

/// The body of a chunked HTTP answer.
fn unchunked(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..line]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&raw[line + 2..line + 2 + size]);
        raw = &raw[line + 2 + size + 2..];
    }
}

/// The server of the chatty agent on loopback, its calls counted in `done`.
async fn start(done: &Arc<AtomicUsize>) -> std::net::SocketAddr {
    let counted = Arc::clone(done);
    let server = A2aServer::new(vec![ServedAgent {
        name: "worker".into(),
        description: "Counts a lot.".into(),
        version: "1".into(),
        build: Arc::new(move |_approver| chatty(TURNS, Arc::clone(&counted))),
        options: Arc::new(RunOptions::default),
        claim: None,
        release: None,
    }]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        async move { agentloop_a2a::serve(&server, listener, std::future::pending()).await },
    );
    addr
}

/// A connection with a small receive buffer that has sent a streamed message and reads nothing
/// yet.
async fn streaming(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {
        "message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "go"}]}}})
    .to_string();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    conn
}

/// Waits until `done` stops moving, and answers where it stopped.
async fn held(done: &AtomicUsize) -> usize {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = done.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(done.load(Ordering::SeqCst), held, "the run went on");
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest5_a_caller_that_does_not_read_holds_the_task_and_loses_no_update() {
    let done = Arc::new(AtomicUsize::new(0));
    let mut conn = streaming(start(&done).await).await;

    // The caller reads nothing: the run goes on until the task's backlog is full, then waits.
    let held = held(&done).await;
    assert!(
        held < TURNS / 2,
        "{held} of {TURNS} calls ran while nobody read their updates"
    );

    // It reads: every update, then the task's end.
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), conn.read_to_end(&mut raw))
        .await
        .expect("the stream did not end")
        .unwrap();
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let text = String::from_utf8(unchunked(&raw[head_end + 4..])).unwrap();
    let updates: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect();
    let calling = updates
        .iter()
        .filter(|u| {
            u["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"] == "calling count"
        })
        .count();
    assert_eq!(calling, TURNS, "an update was lost");
    assert_eq!(done.load(Ordering::SeqCst), TURNS);
    let last = updates.last().unwrap();
    assert_eq!(
        last["result"]["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest5_a_caller_that_goes_away_unread_leaves_the_task_to_finish() {
    let done = Arc::new(AtomicUsize::new(0));
    let conn = streaming(start(&done).await).await;
    assert!(held(&done).await < TURNS / 2);
    // Gone with its updates unread: they leave the backlog with it, and the run goes on.
    drop(conn);
    tokio::time::timeout(Duration::from_secs(120), async {
        while done.load(Ordering::SeqCst) < TURNS {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the run stayed held for a caller that is gone");
}
