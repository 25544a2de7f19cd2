//! A stdio server's process as rmcp's transport, its stdout read within a bound on one message:
//! a server that writes a line without end (or a result of gigabytes) would otherwise be held in
//! this process's memory, whole, before any bound on a result applies. A message past the bound
//! ends the connection (the framing of what follows cannot be trusted), and the calls in flight
//! fail `mcp.message_too_large`. The process's shutdown is rmcp's `TokioChildProcess`'s: stdin
//! closed, then SIGTERM, then SIGKILL.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use process_wrap::tokio::ChildWrapper;
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{ChildStdin, ChildStdout};

/// How long a stop waits for the server to exit after each step (stdin closed, SIGTERM).
const EXIT_WAIT: Duration = Duration::from_secs(3);

/// A running stdio server: its process and the transport over its stdin and stdout.
pub(super) struct StdioChild {
    child: Option<Box<dyn ChildWrapper>>,
    transport: AsyncRwTransport<RoleClient, Bounded<ChildStdout>, ChildStdin>,
}

impl StdioChild {
    /// The server `child` (spawned with piped stdin and stdout), read within `max_message`
    /// bytes a message; `over` is set when it wrote a longer one.
    pub(super) fn new(
        mut child: Box<dyn ChildWrapper>,
        max_message: usize,
        over: Arc<AtomicBool>,
    ) -> std::io::Result<Self> {
        let missing =
            |what: &str| std::io::Error::other(format!("the server's {what} is not piped"));
        let stdin = child
            .inner_mut()
            .stdin()
            .take()
            .ok_or_else(|| missing("stdin"))?;
        let stdout = child
            .inner_mut()
            .stdout()
            .take()
            .ok_or_else(|| missing("stdout"))?;
        let stdout = Bounded {
            inner: stdout,
            line: 0,
            max: max_message,
            over,
        };
        // rmcp's own bound drops a longer line and waits for the next, leaving its call to its
        // timeout: `Bounded` fails first, and ends the connection instead.
        let transport = AsyncRwTransport::new_client(stdout, stdin)
            .with_max_line_length(max_message.saturating_add(1));
        Ok(StdioChild {
            child: Some(child),
            transport,
        })
    }

    /// The process's id (its supervisor's, when confined).
    pub(super) fn id(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Closes its stdin and waits for it to exit, then SIGTERMs it, then kills it.
    async fn stop(&mut self) -> std::io::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        rmcp::transport::Transport::<RoleClient>::close(&mut self.transport).await?;
        if exited(child).await {
            self.child = None;
            return Ok(());
        }
        if child.signal(libc::SIGTERM).is_ok() && exited(child).await {
            self.child = None;
            return Ok(());
        }
        let killed = Box::into_pin(child.kill()).await;
        self.child = None;
        killed
    }
}

/// True when `child` exited within [`EXIT_WAIT`].
async fn exited(child: &mut Box<dyn ChildWrapper>) -> bool {
    matches!(
        tokio::time::timeout(EXIT_WAIT, child.wait()).await,
        Ok(Ok(_))
    )
}

impl Drop for StdioChild {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Killed and waited for (no zombie) on the runtime when there is one.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = Box::into_pin(child.kill()).await;
                });
            }
            Err(_) => {
                let _ = child.start_kill();
            }
        }
    }
}

impl rmcp::transport::Transport<RoleClient> for StdioChild {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.transport.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.transport.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.stop()
    }
}

/// A reader that fails once a line (one message) runs past `max` bytes, its newline counted.
struct Bounded<R> {
    inner: R,
    /// The bytes of the line read so far.
    line: usize,
    max: usize,
    over: Arc<AtomicBool>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = buf.filled().get(before..).unwrap_or_default();
        let mut line = this.line;
        let mut too_long = false;
        for piece in read.split_inclusive(|b| *b == b'\n') {
            line = line.saturating_add(piece.len());
            too_long |= line > this.max;
            if piece.ends_with(b"\n") {
                line = 0;
            }
        }
        this.line = line;
        if too_long {
            // The bytes of this read are not handed on: a failed read reads nothing.
            buf.set_filled(before);
            this.over.store(true, Ordering::Release);
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the server wrote a message of more than {} bytes", this.max),
            )));
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn read_all(input: &[u8], max: usize) -> (std::io::Result<Vec<u8>>, bool) {
        let over = Arc::new(AtomicBool::new(false));
        let mut reader = Bounded {
            inner: input,
            line: 0,
            max,
            over: Arc::clone(&over),
        };
        let mut out = Vec::new();
        let read = reader.read_to_end(&mut out).await.map(|_| out);
        (read, over.load(Ordering::Acquire))
    }

    #[tokio::test]
    async fn lines_within_the_bound_pass_and_one_past_it_fails() {
        let (read, over) = read_all(b"abcd\nefgh\n", 5).await;
        assert_eq!(read.unwrap(), b"abcd\nefgh\n");
        assert!(!over);
        // Many short lines in one read, then a long one that ends after the read.
        let (read, over) = read_all(b"ab\ncd\nefghij", 5).await;
        assert_eq!(read.unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        assert!(over);
    }
}
