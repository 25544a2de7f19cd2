//! A run's news (its events, and the approvals it waits on), sent from the worker that runs it
//! to the run's object through the ingress, in order and in batches, from a task of its own so
//! that a slow ingress never holds the run up. News is for watching: a worker that dies loses
//! what it had not sent yet, and nothing of it is replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentloop::{Event, EventKind, EventSink};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::ingress::{Ingress, NewsBatch, PendingApproval};

/// Events waiting to be sent, at most: past it an event is dropped (and counted).
const QUEUE: usize = 8192;
/// Events sent in one batch, at most.
const BATCH: usize = 512;
/// How long the end of a run waits for its news to be sent.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

enum Msg {
    Event(Value),
    Approvals(Vec<PendingApproval>),
    Flush(oneshot::Sender<()>),
}

/// The sink of a run's events, and the way to publish its approvals.
#[derive(Clone)]
pub(crate) struct News {
    tx: mpsc::Sender<Msg>,
    dropped: Arc<AtomicU64>,
}

impl News {
    /// Starts the sender of run `run`'s news.
    pub(crate) fn start(ingress: Ingress, run: String) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(send(ingress, run, rx));
        News {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The approvals the run waits on now.
    pub(crate) async fn approvals(&self, pending: Vec<PendingApproval>) {
        let _ = self.tx.send(Msg::Approvals(pending)).await;
    }

    /// Waits (a while) until what was given so far is sent.
    pub(crate) async fn flush(&self) {
        let (done, sent) = oneshot::channel();
        if self.tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = tokio::time::timeout(FLUSH_WAIT, sent).await;
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(target: "agentloop_restate", dropped, "events of a run were not sent to its news (the queue was full)");
        }
    }
}

impl EventSink for News {
    fn emit(&self, event: &Event) {
        // The arguments of a call in pieces are for a terminal in the same process; the call's
        // start carries them whole.
        if matches!(event.kind, EventKind::ToolCallDelta { .. }) {
            return;
        }
        let Ok(value) = serde_json::to_value(event) else {
            return;
        };
        if self.tx.try_send(Msg::Event(value)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn send(ingress: Ingress, run: String, mut rx: mpsc::Receiver<Msg>) {
    while let Some(first) = rx.recv().await {
        let mut batch = NewsBatch::default();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Event(v) => batch.events.push(v),
                Msg::Approvals(p) => batch.approvals = Some(p),
                Msg::Flush(done) => flushes.push(done),
            }
            if batch.events.len() >= BATCH {
                break;
            }
            next = rx.try_recv().ok();
        }
        if (!batch.events.is_empty() || batch.approvals.is_some())
            && let Err(e) = ingress.publish(&run, &batch).await
        {
            tracing::warn!(target: "agentloop_restate", run = %run, error = %e, "a run's news could not be sent");
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}
