//! What a served call tells its client while it runs, and what it cannot ask it. A run's events
//! become MCP progress notifications (one per turn, tool start and end, and the run's end, never
//! a model's deltas), sent in order from a task of their own so that the loop never waits on
//! the client. A call the agent's permissions `ask` about has nobody to answer it at the server:
//! the run is stopped and the client reads an error result naming the tool.

use std::sync::{Arc, Mutex};

use agentloop::gate::ApprovalRequest;
use agentloop::permissions::{Answer, ApprovalPrompter};
use agentloop::{CancellationToken, Event, EventKind, EventSink};
use futures::future::BoxFuture;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

/// What a call reports: its run's turns and end too, or its tool calls alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Detail {
    Run,
    Calls,
}

/// The progress notifications of one call, when its client asked for them (a progress token).
pub(super) struct CallProgress {
    sender: Arc<Mutex<Option<UnboundedSender<String>>>>,
    forwarder: Option<JoinHandle<()>>,
    detail: Detail,
}

impl CallProgress {
    /// Starts forwarding to `peer` under `token`; without a token nothing is sent.
    pub(super) fn start(
        peer: Peer<RoleServer>,
        token: Option<ProgressToken>,
        detail: Detail,
    ) -> Self {
        let Some(token) = token else {
            return CallProgress {
                sender: Arc::default(),
                forwarder: None,
                detail,
            };
        };
        let (tx, mut rx) = unbounded_channel::<String>();
        let forwarder = tokio::spawn(async move {
            let mut step = 0.0;
            while let Some(message) = rx.recv().await {
                step += 1.0;
                let note =
                    ProgressNotificationParam::new(token.clone(), step).with_message(message);
                if peer.notify_progress(note).await.is_err() {
                    // The client went away: the call's cancellation ends the run.
                    break;
                }
            }
        });
        CallProgress {
            sender: Arc::new(Mutex::new(Some(tx))),
            forwarder: Some(forwarder),
            detail,
        }
    }

    /// The sink the call's run reports to.
    pub(super) fn sink(&self) -> Arc<dyn EventSink> {
        Arc::new(ProgressSink {
            sender: self.sender.clone(),
            detail: self.detail,
        })
    }

    /// Stops taking events and waits until those taken were sent: the client reads every
    /// notification before the call's result.
    pub(super) async fn finish(mut self) {
        self.sender.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = self.forwarder.take() {
            let _ = f.await;
        }
    }
}

struct ProgressSink {
    sender: Arc<Mutex<Option<UnboundedSender<String>>>>,
    detail: Detail,
}

impl EventSink for ProgressSink {
    fn emit(&self, event: &Event) {
        let Some(message) = describe(event, self.detail) else {
            return;
        };
        if let Some(tx) = self
            .sender
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = tx.send(message);
        }
    }
}

/// The line a client reads for an event, for the events worth a line.
fn describe(event: &Event, detail: Detail) -> Option<String> {
    Some(match &event.kind {
        EventKind::TurnStarted if detail == Detail::Run => format!("turn {}", event.turn),
        EventKind::ToolStarted { tool, .. } => format!("calling {tool}"),
        EventKind::ToolFinished { tool, outcome, .. } => {
            let status = serde_json::to_value(outcome.status).unwrap_or_default();
            format!("{tool}: {}", status.as_str().unwrap_or("ended"))
        }
        EventKind::ToolRejected { tool, code, .. } => format!("{tool}: {code}"),
        EventKind::RunFinished { stop_reason, .. } if detail == Detail::Run => {
            format!("run {}", stop_reason.as_str())
        }
        _ => return None,
    })
}

/// The approver of a served call: nobody. The first call its agent asks about stops the run,
/// and is what the client reads.
pub(super) struct Unattended {
    cancel: CancellationToken,
    asked: Mutex<Vec<ApprovalRequest>>,
}

impl Unattended {
    pub(super) fn new(cancel: CancellationToken) -> Self {
        Unattended {
            cancel,
            asked: Mutex::default(),
        }
    }

    /// What the client reads when the run asked about a call, else `None`.
    pub(super) fn report(&self) -> Option<String> {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let first = asked.first()?;
        let agent = if first.agent.is_empty() {
            String::new()
        } else {
            format!(" (agent {})", first.agent)
        };
        Some(format!(
            "approval required: the call of the tool {}{agent} needs a person's approval (the \
             agent file's [permissions] ask about it), and nobody can be asked at this MCP \
             server; the run was stopped. Allow the tool in the agent file, or run the agent \
             where a person can answer",
            first.tool
        ))
    }
}

impl ApprovalPrompter for Unattended {
    fn ask<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        self.asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(requests);
        // Denied, and the run stops: the model does not go on without what it asked for.
        self.cancel.cancel();
        Box::pin(async { Err("nobody can be asked at this MCP server".to_owned()) })
    }
}
