//! A raw HTTP server's one shared step, for the tests that must control every byte a server
//! sends (stalls, drops, drips) and so cannot use wiremock.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A loopback server that reads each request and hands its connection to `answer` with the
/// request's number (0 for the first), each on a task of its own: its address, and how many
/// requests it has read.
pub(crate) async fn serve_each<F, Fut>(answer: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(TcpStream, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("the port's address");
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (seen, answer) = (seen.clone(), answer.clone());
            tokio::spawn(async move {
                if read_request(&mut socket).await.is_some() {
                    let n = seen.fetch_add(1, Ordering::SeqCst);
                    answer(socket, n).await;
                }
            });
        }
    });
    (format!("http://{addr}"), count)
}

/// Reads one request (its head and a `content-length` body) from a raw socket and returns its
/// body; `None` when the client closed or failed before a whole head.
pub(crate) async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    read_request_with_head(socket).await.map(|(_, body)| body)
}

/// Like [`read_request`], with the request's head (its request line and headers, lowercased)
/// beside its body: for a server that answers by what the request carried.
pub(crate) async fn read_request_with_head(socket: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(chunk.get(..n)?);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(buf.get(..head_end)?).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(chunk.get(..n)?);
    }
    Some((head, buf.get(head_end..)?.to_vec()))
}
