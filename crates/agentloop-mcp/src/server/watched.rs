//! The transport wrapper every connection's messages pass through: it marks the tool list
//! stale in the stream's order, mends an older server's answer to `server/discover`, and
//! follows the opening. Apart because it speaks rmcp's `Transport` trait, not the server's.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{ClientRequest, RequestId, ServerNotification, ServerResult};
use rmcp::service::RoleClient;

/// A transport that marks the tool list stale as it reads `notifications/tools/list_changed`, in
/// the stream's order. rmcp hands a notification to the handler on a task of its own, so the
/// response that follows it could reach its caller first, and the next turn (which asks at once)
/// would miss the change the server announced before it answered.
///
/// It also turns a success answer to `server/discover` that is not a discover result (a server
/// before 2026-07-28 that answers every method it does not know with `{}`) into the "method not
/// found" error a server of the older wire is expected to give: rmcp falls back to `initialize`
/// only on an error, and would otherwise fail the start of a server that speaks the older wire.
///
/// It follows the opening ([`Opening`]), and drops an answer to `server/discover` that comes
/// after rmcp gave up waiting and sent `initialize` (a server slower than rmcp's 10 s wait, a
/// first `npx -y` download): the handshake expects the answer to `initialize` first and would
/// fail the start on it.
pub(super) struct Watched<T> {
    inner: T,
    changed: Arc<AtomicBool>,
    /// The id of the `server/discover` request in flight.
    discover: Option<RequestId>,
    opening: Arc<Mutex<Opening>>,
}

/// What one start's opening saw, to tell a server that ends its session at the offer of
/// 2026-07-28 from one that failed otherwise.
#[derive(Default, Clone, Copy)]
pub(super) struct Opening {
    discover_sent: bool,
    discover_answered: bool,
    /// `initialize` was sent after `server/discover` (rmcp's fallback after its wait).
    pub(super) initialize_sent: bool,
    /// The server ended the session (its output closed).
    closed: bool,
}

impl Opening {
    pub(super) fn ended_at_discover(&self) -> bool {
        self.discover_sent && !self.discover_answered && self.closed
    }
}

impl<T> Watched<T> {
    pub(super) fn new(inner: T, changed: Arc<AtomicBool>, opening: Arc<Mutex<Opening>>) -> Self {
        Watched {
            inner,
            changed,
            discover: None,
            opening,
        }
    }
}

impl<T: rmcp::transport::Transport<RoleClient>> rmcp::transport::Transport<RoleClient>
    for Watched<T>
{
    type Error = T::Error;

    fn name() -> std::borrow::Cow<'static, str> {
        T::name()
    }

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let rmcp::model::JsonRpcMessage::Request(r) = &item {
            let mut opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
            match r.request {
                ClientRequest::DiscoverRequest(_) => {
                    self.discover = Some(r.id.clone());
                    opening.discover_sent = true;
                }
                ClientRequest::InitializeRequest(_) if opening.discover_sent => {
                    opening.initialize_sent = true;
                }
                _ => {}
            }
        }
        self.inner.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send {
        let changed = Arc::clone(&self.changed);
        let discover = self.discover.clone();
        let opening = Arc::clone(&self.opening);
        let inner = &mut self.inner;
        async move {
            let mut message = inner.receive().await;
            loop {
                let answers_discover = match &message {
                    Some(rmcp::model::JsonRpcMessage::Response(r)) => {
                        Some(&r.id) == discover.as_ref()
                    }
                    Some(rmcp::model::JsonRpcMessage::Error(e)) => {
                        e.id.is_some() && e.id.as_ref() == discover.as_ref()
                    }
                    _ => false,
                };
                let late = {
                    let mut opening = opening.lock().unwrap_or_else(PoisonError::into_inner);
                    opening.closed |= message.is_none();
                    let late = answers_discover && opening.initialize_sent;
                    opening.discover_answered |= answers_discover;
                    late
                };
                if !late {
                    break;
                }
                tracing::debug!(target: "agentloop_mcp", "an answer to server/discover came after the MCP handshake began; dropped");
                message = inner.receive().await;
            }
            match &message {
                Some(rmcp::model::JsonRpcMessage::Notification(n))
                    if matches!(
                        n.notification,
                        ServerNotification::ToolListChangedNotification(_)
                    ) =>
                {
                    changed.store(true, Ordering::Release);
                }
                Some(rmcp::model::JsonRpcMessage::Response(r))
                    if Some(&r.id) == discover.as_ref()
                        && !matches!(r.result, ServerResult::DiscoverResult(_)) =>
                {
                    return Some(rmcp::model::JsonRpcMessage::error(
                        rmcp::model::ErrorData::new(
                            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                            "server/discover was answered with something else than a discover \
                             result",
                            None,
                        ),
                        Some(r.id.clone()),
                    ));
                }
                _ => {}
            }
            message
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
