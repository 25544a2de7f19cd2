//! A loopback HTTP server that answers like the servers in the quirks corpus: each request gets
//! the next recorded reply (status, headers, body bytes as written), optionally with a silent
//! pause part-way through the body, and every request body is kept for the test to read.
//!
//! A raw `TcpListener` rather than a mock framework, because the corpus needs what a framework
//! smooths over: a pause between two chunks of one body, and headers exactly as a server sent them.
//! Shared by the providers' corpus test and the CLI's.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

// Every test crate that includes this file gets the reader with it.
#[path = "../support/raw_http.rs"]
mod raw_http;
use raw_http::read_request;

/// One reply of a case, as `case.json` describes it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// Headers, in order (a `content-type` among them, or none at all).
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The file in the case's directory holding the body's bytes.
    #[serde(default)]
    pub body: Option<String>,
    /// A silence in the middle of the body: after this many bytes, this long.
    #[serde(default)]
    pub pause: Option<Pause>,
    /// The body's bytes, read from `body`.
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// A silent gap inside a body.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct Pause {
    /// Bytes sent before the gap.
    pub after_bytes: usize,
    /// The gap.
    pub ms: u64,
}

impl Reply {
    /// Reads the body file from `dir`.
    pub(crate) fn load(mut self, dir: &Path) -> Reply {
        if let Some(file) = &self.body {
            self.bytes = std::fs::read(dir.join(file))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()));
        }
        self
    }
}

impl Reply {
    /// A Chat Completions event stream whose content is `text`, cut into pieces of `size` chars,
    /// finished with `stop`: a model's answer as a server without a tool-call parser streams it.
    pub(crate) fn content_stream(text: &str, size: usize) -> Reply {
        let chars: Vec<char> = text.chars().collect();
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                serde_json::json!({"id": "c", "object": "chat.completion.chunk", "model": "local",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        let mut body = chunk(
            serde_json::json!({"role": "assistant", "content": ""}),
            Value::Null,
        );
        for piece in chars.chunks(size.max(1)) {
            let piece: String = piece.iter().collect();
            body.push_str(&chunk(serde_json::json!({"content": piece}), Value::Null));
        }
        body.push_str(&chunk(serde_json::json!({}), serde_json::json!("stop")));
        body.push_str("data: [DONE]\n\n");
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: None,
            pause: None,
            bytes: body.into_bytes(),
        }
    }
}

/// A running server.
pub(crate) struct QuirkServer {
    /// `http://127.0.0.1:port`.
    pub uri: String,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl QuirkServer {
    /// Serves `replies` in order (the last one again for any further request).
    pub(crate) async fn start(replies: Vec<Reply>) -> QuirkServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = bodies.clone();
        tokio::spawn(async move {
            let mut n = 0usize;
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let reply = replies
                    .get(n)
                    .or_else(|| replies.last())
                    .cloned()
                    .expect("a case has at least one reply");
                n += 1;
                let seen = seen.clone();
                tokio::spawn(async move { answer(socket, reply, seen).await });
            }
        });
        QuirkServer { uri, bodies }
    }

    /// The request bodies received so far, as JSON.
    pub(crate) fn requests(&self) -> Vec<Value> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| serde_json::from_slice(b).unwrap_or(Value::Null))
            .collect()
    }
}

async fn answer(mut socket: TcpStream, reply: Reply, seen: Arc<Mutex<Vec<Vec<u8>>>>) {
    let Some(body) = read_request(&mut socket).await else {
        return;
    };
    seen.lock().unwrap().push(body);
    let reason = match reply.status {
        200 => "OK",
        409 => "Conflict",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("transfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    // A client that gave up (an idle timeout) closes the socket: writes then fail, which is fine.
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let (first, rest) = match reply.pause {
        Some(p) => reply.bytes.split_at(p.after_bytes.min(reply.bytes.len())),
        None => (reply.bytes.as_slice(), &[][..]),
    };
    let _ = write_chunk(&mut socket, first).await;
    if let Some(p) = reply.pause {
        let _ = socket.flush().await;
        tokio::time::sleep(Duration::from_millis(p.ms)).await;
    }
    let _ = write_chunk(&mut socket, rest).await;
    let _ = socket.write_all(b"0\r\n\r\n").await;
    let _ = socket.flush().await;
}

async fn write_chunk(socket: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    socket
        .write_all(format!("{:x}\r\n", bytes.len()).as_bytes())
        .await?;
    socket.write_all(bytes).await?;
    socket.write_all(b"\r\n").await
}
