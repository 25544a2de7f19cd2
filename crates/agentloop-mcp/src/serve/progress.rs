//! What a served call tells its client while it runs, and what it cannot ask it. A run's events
//! become MCP progress notifications (one per turn, tool start, progress and end, and the run's
//! end, never a model's deltas), sent in order from a task of their own so that the loop never
//! waits on one write to the client. The notifications not yet sent are a [`Backlog`] of at
//! most [`STREAM_BACKLOG`]: a client that does not read holds the run between its steps rather
//! than letting them pile up in memory, and loses none. A call the agent's permissions `ask` about has nobody to answer it at the server:
//! a client that declared elicitation (form mode) is asked (approve, or not; a declined question
//! denies the call, a cancelled one stops the run), and with any other client the run is stopped
//! and the client reads an error result naming the tool.

use std::sync::{Arc, Mutex};

use agentloop::gate::ApprovalRequest;
use agentloop::permissions::{Answer, ApprovalPrompter};
use agentloop::{Backlog, CancellationToken, Event, EventKind, EventSink, STREAM_BACKLOG};
use futures::future::BoxFuture;
use rmcp::model::{
    ElicitRequestParams, ElicitationAction, ElicitationSchema, ProgressNotificationParam,
    ProgressToken,
};
use rmcp::service::ElicitationMode;
use rmcp::{Peer, RoleServer};
use serde_json::Value;
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
    /// The notifications taken and not yet sent.
    backlog: Arc<Backlog>,
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
                backlog: Arc::new(Backlog::new(STREAM_BACKLOG)),
            };
        };
        let (tx, mut rx) = unbounded_channel::<String>();
        let backlog = Arc::new(Backlog::new(STREAM_BACKLOG));
        let sent = Arc::clone(&backlog);
        let forwarder = tokio::spawn(async move {
            let mut step = 0.0;
            while let Some(message) = rx.recv().await {
                step += 1.0;
                let note =
                    ProgressNotificationParam::new(token.clone(), step).with_message(message);
                let written = peer.notify_progress(note).await;
                sent.taken();
                if written.is_err() {
                    // The client went away: the call's cancellation ends the run.
                    break;
                }
            }
            // Nobody sends what is left: the run waits for room no more.
            sent.close();
        });
        CallProgress {
            sender: Arc::new(Mutex::new(Some(tx))),
            forwarder: Some(forwarder),
            detail,
            backlog,
        }
    }

    /// The sink the call's run reports to.
    pub(super) fn sink(&self) -> Arc<dyn EventSink> {
        Arc::new(ProgressSink {
            sender: self.sender.clone(),
            detail: self.detail,
            backlog: Arc::clone(&self.backlog),
        })
    }

    /// Stops taking events and waits until those taken were sent: the client reads every
    /// notification before the call's result.
    pub(super) async fn finish(mut self) {
        self.sender.lock().unwrap_or_else(|p| p.into_inner()).take();
        // A run still going (its call cut short) never waits on a reader that is done.
        self.backlog.close();
        if let Some(f) = self.forwarder.take() {
            let _ = f.await;
        }
    }
}

struct ProgressSink {
    sender: Arc<Mutex<Option<UnboundedSender<String>>>>,
    detail: Detail,
    backlog: Arc<Backlog>,
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
            // Counted before it is sent, so that the forwarder's `taken` never comes first.
            self.backlog.pushed();
            if tx.send(message).is_err() {
                self.backlog.taken();
            }
        }
    }

    fn backlog(&self) -> Option<&Backlog> {
        Some(&self.backlog)
    }
}

/// The line a client reads for an event, for the events worth a line.
fn describe(event: &Event, detail: Detail) -> Option<String> {
    Some(match &event.kind {
        EventKind::TurnStarted if detail == Detail::Run => format!("turn {}", event.turn),
        EventKind::ToolStarted { tool, .. } => format!("calling {tool}"),
        // What a running tool reports (an MCP server's tool's own progress among it) goes on to
        // the client: a long call otherwise says nothing between its start and its end.
        EventKind::ToolProgress { tool, progress, .. } => {
            format!("{tool}: {}", progress_text(progress))
        }
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

/// A tool's progress report as a line: its message, else how far it is (`50/100`), else its
/// JSON.
fn progress_text(progress: &Value) -> String {
    if let Some(text) = progress.as_str() {
        return text.to_owned();
    }
    if let Some(message) = progress.get("message").and_then(Value::as_str) {
        return message.to_owned();
    }
    match (progress.get("progress"), progress.get("total")) {
        (Some(done), Some(total)) if done.is_number() && total.is_number() => {
            format!("{done}/{total}")
        }
        (Some(done), _) if done.is_number() => done.to_string(),
        _ => progress.to_string(),
    }
}

/// The approver of a served call: the client, by elicitation, where it takes it; else nobody,
/// and the first call its agent asks about stops the run and is what the client reads.
pub(super) struct Unattended {
    cancel: CancellationToken,
    asked: Mutex<Vec<ApprovalRequest>>,
    /// The client, when it declared form elicitation.
    client: Option<Peer<RoleServer>>,
}

impl Unattended {
    /// The approver of a call of `peer`'s, whose run `cancel` stops.
    pub(super) fn new(cancel: CancellationToken, peer: &Peer<RoleServer>) -> Self {
        let elicits = peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form);
        Unattended {
            cancel,
            asked: Mutex::default(),
            client: elicits.then(|| peer.clone()),
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
        if let Some(client) = &self.client {
            return Box::pin(async move {
                let mut answers = Vec::with_capacity(requests.len());
                for request in requests {
                    answers.push(elicit(client, request, &self.cancel).await?);
                }
                Ok(answers)
            });
        }
        self.asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(requests);
        // Denied, and the run stops: the model does not go on without what it asked for.
        self.cancel.cancel();
        Box::pin(async { Err("nobody can be asked at this MCP server".to_owned()) })
    }
}

/// Asks the client whether `request`'s call may run: a form with one boolean, `approve`. A
/// declined question denies the call; a cancelled one stops the run.
async fn elicit(
    client: &Peer<RoleServer>,
    request: &ApprovalRequest,
    cancel: &CancellationToken,
) -> Result<Answer, String> {
    let schema = ElicitationSchema::builder()
        .required_bool("approve")
        .description("true runs the call, false denies it")
        .build()
        .map_err(|e| format!("the approval form could not be made: {e}"))?;
    let agent = if request.agent.is_empty() {
        String::new()
    } else {
        format!(" (agent {})", request.agent)
    };
    let message = format!(
        "Allow the call of the tool {}{agent} with the arguments {}? The agent file's \
         [permissions] ask about it.",
        request.tool, request.arguments
    );
    let asked = client.create_elicitation(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    });
    let answer = tokio::select! {
        answer = asked => answer.map_err(|e| format!("the client could not be asked: {e}"))?,
        () = cancel.cancelled() => return Err("the call was cancelled".to_owned()),
    };
    match answer.action {
        ElicitationAction::Accept => match answer
            .content
            .as_ref()
            .and_then(|c| c.get("approve"))
            .and_then(Value::as_bool)
        {
            Some(true) => Ok(Answer::AllowOnce),
            Some(false) => Ok(Answer::DenyOnce),
            None => Err("the client's answer has no boolean `approve`".to_owned()),
        },
        ElicitationAction::Decline => Ok(Answer::DenyOnce),
        _ => {
            // Cancelled: the client stops the whole call.
            cancel.cancel();
            Err("the client cancelled the question".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn progress(report: Value) -> Event {
        Event {
            run_id: "r1".into(),
            turn: 1,
            kind: EventKind::ToolProgress {
                call_id: "c1".into(),
                tool: "render".into(),
                progress: report,
            },
        }
    }

    #[test]
    fn a_tools_progress_is_a_line_for_the_client_in_either_detail() {
        for detail in [Detail::Run, Detail::Calls] {
            let seen: Vec<Option<String>> = [
                json!({"progress": 50, "total": 100, "message": null}),
                json!({"progress": 2, "total": null, "message": null}),
                json!({"progress": 1, "total": 3, "message": "page 1 of 3"}),
                json!("halfway"),
                json!({"rows": 10}),
            ]
            .into_iter()
            .map(|r| describe(&progress(r), detail))
            .collect();
            assert_eq!(
                seen,
                [
                    "render: 50/100",
                    "render: 2",
                    "render: page 1 of 3",
                    "render: halfway",
                    "render: {\"rows\":10}"
                ]
                .map(|s| Some(s.to_owned()))
            );
        }
    }
}
