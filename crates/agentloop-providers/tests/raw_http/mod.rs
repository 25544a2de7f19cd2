//! A raw HTTP server's one shared step, for the tests that must control every byte a server
//! sends (stalls, drops, drips) and so cannot use wiremock.

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Reads one request (its head and a `content-length` body) from a raw socket and returns its
/// body; `None` when the client closed or failed before a whole head.
pub async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    read_request_with_head(socket).await.map(|(_, body)| body)
}

/// Like [`read_request`], with the request's head (its request line and headers, lowercased)
/// beside its body: for a server that answers by what the request carried.
pub async fn read_request_with_head(socket: &mut TcpStream) -> Option<(String, Vec<u8>)> {
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
