#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Hostile model servers, raw bytes on loopback TCP, met through the `agentloop` binary: the
//! run ends within its limits with the exit code, stop reason and error code the README
//! documents, whatever the server sends.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads one request's head and its `content-length` body; false when the client left first.
async fn read_request(socket: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let Ok(n) = socket.read(&mut chunk).await else {
            return false;
        };
        if n == 0 {
            return false;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < end + 4 + length {
                let Ok(n) = socket.read(&mut chunk).await else {
                    return false;
                };
                if n == 0 {
                    return false;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return true;
        }
    }
}

/// A loopback server that answers every request by `answer(socket, its own address)`: its base
/// URL and how many requests it read.
async fn serve<F, Fut>(answer: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(TcpStream, String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let (seen, answer, base) = (count.clone(), Arc::new(answer), addr.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (seen, answer, base) = (seen.clone(), answer.clone(), base.clone());
            tokio::spawn(async move {
                if read_request(&mut socket).await {
                    seen.fetch_add(1, Ordering::SeqCst);
                    answer(socket, base).await;
                }
            });
        }
    });
    (addr, count)
}

/// An OpenAI-compatible agent at `uri` (no tool), with `extra` lines after `[model]`'s.
fn agent(uri: &str, extra: &str) -> AgentDir {
    AgentDir::new(&format!(
        r#"name = "hostile"
[model]
provider = "openai"
name = "gpt-4o"
base_url = "{uri}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
{extra}
"#
    ))
}

async fn run_json(dir: &AgentDir) -> (Option<i32>, serde_json::Value, Duration) {
    let started = Instant::now();
    let out = run_agent_json(&dir.agent(), "hi").await;
    let v = stdout_json(&out);
    (out.status.code(), v, started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile7_keep_alives_for_ever_end_the_run_at_its_deadline() {
    // A relay that answers with an event stream of comments only, for ever, each well inside
    // the idle timeout: the run stops at `timeout_secs`, not when the server tires.
    let (uri, _) = serve(|mut socket, _| async move {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        if socket.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        while socket.write_all(b": keepalive\n\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let dir = agent(&uri, "\n[limits]\ntimeout_secs = 2\n");
    let (code, v, took) = run_json(&dir).await;
    assert_eq!(v["stop_reason"], "deadline", "{v}");
    assert_eq!(code, Some(5), "{v}");
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile7_a_redirect_loop_fails_the_run_at_once_without_a_retry() {
    // A server that sends every request back to itself: the run fails with the redirect named,
    // as `model.other`, its requests those of one attempt (a retry would only walk the loop
    // again), rather than as a dropped connection retried.
    let (uri, count) = serve(|mut socket, base| async move {
        let answer = format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: {base}/v1/chat/completions\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        let _ = socket.write_all(answer.as_bytes()).await;
        let _ = socket.flush().await;
    })
    .await;
    let dir = agent(&uri, "");
    let (code, v, _) = run_json(&dir).await;
    assert_eq!(v["stop_reason"], "failed", "{v}");
    assert_eq!(code, Some(4), "{v}");
    assert_eq!(v["error"]["code"], "model.other", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("redirects"),
        "{v}"
    );
    // One attempt: the first request and the redirects it follows.
    assert!(
        count.load(Ordering::SeqCst) <= 7,
        "{}",
        count.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile7_a_token_count_past_any_number_keeps_the_answer() {
    // A server whose usage holds a count past f64's range (`1e400`): read as a number, the
    // chunk that ends the answer failed to parse and the run failed `model.stream`. The answer
    // is whole and kept, the count saturated, and its cost (priced by the table) finite.
    let (uri, _) = serve(|mut socket, _| async move {
        let body = concat!(
            "data: {\"id\":\"c\",\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"the answer\"},\"finish_reason\":\"stop\"}],",
            "\"usage\":{\"prompt_tokens\":1e400,\"completion_tokens\":3,\"completion_tokens_details\":{\"reasoning_tokens\":1e400}}}\n\n",
            "data: [DONE]\n\n"
        );
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = socket.write_all(answer.as_bytes()).await;
        let _ = socket.flush().await;
    })
    .await;
    let dir = agent(&uri, "");
    let (code, v, _) = run_json(&dir).await;
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["output"], "the answer", "{v}");
    assert_eq!(v["usage"]["input_tokens"], u64::MAX, "{v}");
    let cost = v["cost_usd"].as_f64().unwrap();
    assert!(cost.is_finite() && cost >= 0.0, "{v}");
}
