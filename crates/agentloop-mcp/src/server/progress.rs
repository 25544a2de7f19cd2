//! Progress notifications of calls in flight, routed to each call's sender by its progress
//! token (held early when it comes before the call's route), and the client handler that hears
//! them and the tool list's changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentloop::tool::ProgressSender;
use rmcp::ClientHandler;
use rmcp::model::{
    ClientConfig, Implementation, ProgressNotificationParam, ProgressToken, ProtocolVersion,
};
use rmcp::service::{NotificationContext, RoleClient};
use serde_json::Value;

/// The progress senders of one connection's calls in flight, by the progress token of their
/// request. Each connection has its own: rmcp numbers progress tokens from 0 on each, so a
/// restarted server's call would otherwise be handed what its previous connection sent.
pub(super) type Progress = Arc<Mutex<ProgressRoutes>>;

/// Where progress goes. rmcp sends a request before its caller holds the token, and hands each
/// notification to the handler on a task of its own, so a fast server's first progress can come
/// before the call's route: it waits in `early` until the route takes it.
#[derive(Default)]
pub(super) struct ProgressRoutes {
    routes: HashMap<ProgressToken, ProgressSender>,
    early: HashMap<ProgressToken, Early>,
}

/// Progress under a token no call holds yet, since when it waits.
struct Early {
    since: std::time::Instant,
    progress: Vec<Value>,
}

/// The most tokens whose progress waits for a route, the most notifications each keeps, and
/// how long they wait: a server may send progress under a token no call holds (a call already
/// answered, a token of its own making). Past the count the oldest waiting token gives way, so
/// that such progress never stops a call's early progress from being kept.
const EARLY_PROGRESS_TOKENS: usize = 64;
const EARLY_PROGRESS_EACH: usize = 16;
const EARLY_PROGRESS_AGE: Duration = Duration::from_secs(30);
/// The longest progress message kept whole (a server's text, read into the run's events).
const PROGRESS_MESSAGE_BYTES: usize = 1024;

impl ProgressRoutes {
    /// Keeps `progress` under `token`, which no call holds yet.
    fn keep_early(&mut self, token: ProgressToken, progress: Value) {
        let now = std::time::Instant::now();
        if !self.early.contains_key(&token) {
            self.early
                .retain(|_, e| now.duration_since(e.since) < EARLY_PROGRESS_AGE);
            if self.early.len() >= EARLY_PROGRESS_TOKENS
                && let Some(oldest) = self
                    .early
                    .iter()
                    .min_by_key(|(_, e)| e.since)
                    .map(|(t, _)| t.clone())
            {
                self.early.remove(&oldest);
            }
        }
        let early = self.early.entry(token).or_insert_with(|| Early {
            since: now,
            progress: Vec::new(),
        });
        if early.progress.len() < EARLY_PROGRESS_EACH {
            early.progress.push(progress);
        }
    }
}

/// The client side of the protocol: it hears that the tool list changed, and the progress of
/// calls, which becomes their `ToolProgress` events.
#[derive(Clone)]
pub(super) struct Notified {
    pub(super) changed: Arc<AtomicBool>,
    pub(super) progress: Progress,
    pub(super) server: Arc<str>,
    /// The version `initialize` offers (2025-11-25 unless the config pins an older one).
    pub(super) offered: ProtocolVersion,
}

impl ClientHandler for Notified {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        tracing::debug!(target: "agentloop_mcp", server = %self.server, "tools/list_changed");
        self.changed.store(true, Ordering::Release);
        std::future::ready(())
    }

    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let message = params
            .message
            .map(|m| agentloop::tool::bounded_text(m, PROGRESS_MESSAGE_BYTES));
        let progress = serde_json::json!({
            "progress": params.progress,
            "total": params.total,
            "message": message,
        });
        let mut routes = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = routes.routes.get(&params.progress_token) {
            sender.send(progress);
        } else {
            routes.keep_early(params.progress_token, progress);
        }
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            Default::default(),
            Implementation::new("agentloop", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(self.offered.clone())
    }
}

/// Routes a request's progress to a call's sender while it lives.
pub(super) struct ProgressRoute {
    routes: Progress,
    token: ProgressToken,
}

impl ProgressRoute {
    pub(super) fn new(routes: &Progress, token: ProgressToken, sender: ProgressSender) -> Self {
        let mut all = routes.lock().unwrap_or_else(PoisonError::into_inner);
        for progress in all
            .early
            .remove(&token)
            .map(|e| e.progress)
            .unwrap_or_default()
        {
            sender.send(progress);
        }
        all.routes.insert(token.clone(), sender);
        drop(all);
        ProgressRoute {
            routes: routes.clone(),
            token,
        }
    }
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        let mut all = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        all.routes.remove(&self.token);
        all.early.remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_under_tokens_no_call_holds_gives_way_oldest_first() {
        let token = |n: i64| ProgressToken(rmcp::model::NumberOrString::Number(n));
        let mut routes = ProgressRoutes::default();
        for n in 0..1000 {
            routes.keep_early(token(n), Value::from(n));
        }
        assert_eq!(routes.early.len(), EARLY_PROGRESS_TOKENS);
        // The newest are kept, so a call's own early progress still is.
        assert!(routes.early.contains_key(&token(999)));
        assert!(!routes.early.contains_key(&token(0)));
        for _ in 0..100 {
            routes.keep_early(token(999), Value::Null);
        }
        assert_eq!(
            routes.early[&token(999)].progress.len(),
            EARLY_PROGRESS_EACH
        );
    }
}
