//! The admission seam. After a decision is validated and before any of its calls starts, each
//! gate sees the calls still admitted and answers each: allow, allow as a person approved it
//! ([`crate::Verdict::Approved`], which the call's handler sees), deny (the model reads why), or
//! run with rewritten arguments (validated again). Gates compose in the order they were added, after
//! the hooks' `before_tool_call`; a call denied by one is never put to the next. Permission rules
//! with human approval ([`crate::permissions::PermissionGate`]) are one gate; an application adds its own.
//!
//! A gate sees the run's cancellation: a prompt waiting for a human should end when it fires. The
//! driver also races every gate against cancellation and the deadline.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::machine::{AdmittedCall, Verdict};

/// A human's answer about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Run it this once.
    AllowOnce,
    /// Run it, and every later call of this tool.
    AllowAlways,
    /// Do not run it.
    DenyOnce,
    /// Do not run it, nor any later call of this tool.
    DenyAlways,
}

/// A call a human is asked about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments.
    pub arguments: Value,
    /// The agent whose call it is (a subagent's calls reach the same prompt as its parent's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent: String,
    /// Set when the call is the model's question to the user (`ask_user`): it waits for an
    /// answer (a JSON value, [`Approvals::take_reply`]) rather than an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<Question>,
}

impl ApprovalRequest {
    /// The request about `call`, a call of agent `agent` (not a question: set
    /// [`ApprovalRequest::question`] for one).
    pub fn of_call(call: &AdmittedCall, agent: &str) -> Self {
        ApprovalRequest {
            call_id: call.call_id.to_string(),
            tool: call.tool.to_string(),
            arguments: call.arguments.to_value(),
            agent: agent.to_owned(),
            question: None,
        }
    }
}

/// The model's question to the user, as a suspended run lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// What the model asks.
    pub text: String,
    /// The JSON Schema an answer must match (a choice, a number, a form); none: any text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
}

/// What a gate knows of the run it admits calls for.
#[derive(Debug, Clone, Copy)]
pub struct GateContext<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The agent's name; a subagent's path from the top of its tree (`coordinator/worker`).
    pub agent: &'a str,
    /// The turn of the batch.
    pub turn: u32,
    /// Fires when the run is cancelled or its deadline passes while the gate waits.
    pub cancel: &'a CancellationToken,
    /// Answers recorded for a durable run, and its way to suspend.
    pub approvals: &'a Approvals,
}

/// The durable side of asking a human, for one run: the answers already recorded in its journal,
/// and, for a journaled run, the way to suspend it until the rest are answered. A run without a
/// journal has no answers and cannot suspend.
///
/// An answer is for the call it was given for: it is found only by a call with the same id,
/// tool and arguments (compared by [`crate::journal::fingerprint`]), and it is used once.
#[derive(Debug, Default)]
pub struct Approvals {
    answers: Mutex<HashMap<String, Recorded>>,
    /// The "always" answers among them, in the order they were recorded, until a gate takes
    /// them ([`Approvals::take_always`]).
    always: Mutex<Vec<RecordedAlways>>,
    suspend: Option<Suspension>,
}

/// A recorded "always" answer: the call it was given for, its tool, the agent whose call it
/// was, and the answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecordedAlways {
    pub(crate) call_id: String,
    pub(crate) tool: String,
    pub(crate) agent: String,
    pub(crate) answer: Answer,
}

impl RecordedAlways {
    /// True when it answered a call of `agent` itself, not one of its subagents' (which the
    /// top run's journal also holds, for the tree, under [`crate::journal::child_approval_id`]).
    /// A subagent's tool is another agent's, however it is named: its "always" is the
    /// subagent's own, which it recalls from its own journal. A record without an agent (a
    /// journal written before requests named theirs) counts as the top run's when its id is
    /// no subagent's.
    fn answers_agent(&self, agent: &str) -> bool {
        if self.agent.is_empty() {
            return !self.call_id.contains('/');
        }
        self.agent == agent
    }
}

/// An answer with what it answers, by call id.
#[derive(Debug)]
struct Recorded {
    tool: String,
    arguments: String,
    answer: Answer,
    /// A question's answer.
    reply: Option<Value>,
}

#[derive(Debug, Default)]
struct Suspension {
    fired: CancellationToken,
    pending: Mutex<Vec<ApprovalRequest>>,
}

impl Approvals {
    /// No answers, no suspension: a run without a journal.
    pub fn none() -> Self {
        Self::default()
    }

    /// A journaled run's: these recorded answers, each with the request it answers, and
    /// suspension allowed. A later answer for a call id replaces an earlier one.
    pub fn durable(answers: impl IntoIterator<Item = (ApprovalRequest, Answer)>) -> Self {
        Self::durable_with_replies(answers.into_iter().map(|(r, a)| (r, a, None)))
    }

    /// [`Approvals::durable`] with the answers to questions too: a question's entry carries its
    /// reply.
    pub fn durable_with_replies(
        answers: impl IntoIterator<Item = (ApprovalRequest, Answer, Option<Value>)>,
    ) -> Self {
        let mut always = Vec::new();
        let answers = answers
            .into_iter()
            .map(|(request, answer, reply)| {
                if matches!(answer, Answer::AllowAlways | Answer::DenyAlways) {
                    always.push(RecordedAlways {
                        call_id: request.call_id.clone(),
                        tool: request.tool.clone(),
                        agent: request.agent.clone(),
                        answer,
                    });
                }
                let recorded = Recorded {
                    arguments: crate::fingerprint::fingerprint(&request.arguments),
                    tool: request.tool,
                    answer,
                    reply,
                };
                (request.call_id, recorded)
            })
            .collect();
        Approvals {
            answers: Mutex::new(answers),
            always: Mutex::new(always),
            suspend: Some(Suspension::default()),
        }
    }

    /// The recorded "always" answers to `agent`'s own calls, in the order they were recorded,
    /// handed over once: the first gate to see a batch of the run remembers them for the run's
    /// later calls, as the process that took them did (the journal keeps them; a permission
    /// store may not). Those its subagents were given are left out: each is a tool of another
    /// agent, which a tool of the same name here must not take as its own answer.
    pub(crate) fn take_always(&self, agent: &str) -> Vec<RecordedAlways> {
        let all = std::mem::take(&mut *self.always.lock().unwrap_or_else(|p| p.into_inner()));
        all.into_iter().filter(|r| r.answers_agent(agent)).collect()
    }

    /// Takes the recorded answer for this call: given for the same call id, tool and
    /// arguments. Once taken it is gone, so that it answers one call only. An answer recorded
    /// under the id for another tool or other arguments is no answer (the call is asked about).
    pub fn take(&self, call_id: &str, tool: &str, arguments: &serde_json::Value) -> Option<Answer> {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = answers.get(call_id)?;
        if recorded.tool != tool || recorded.arguments != crate::fingerprint::fingerprint(arguments)
        {
            return None;
        }
        answers.remove(call_id).map(|r| r.answer)
    }

    /// Takes the recorded answer to a question: given for the same call id, tool and arguments,
    /// as [`Approvals::take`] finds approvals; once taken it is gone.
    pub fn take_reply(&self, call_id: &str, tool: &str, arguments: &Value) -> Option<Value> {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = answers.get(call_id)?;
        if recorded.reply.is_none()
            || recorded.tool != tool
            || recorded.arguments != crate::fingerprint::fingerprint(arguments)
        {
            return None;
        }
        answers.remove(call_id).and_then(|r| r.reply)
    }

    /// Adds requests the run will suspend on without suspending it yet: a gate that holds
    /// questions and then asks another gate about the rest of its batch suspends once, on
    /// both, when that gate suspends or when it calls [`Approvals::suspend`] itself. Without
    /// suspension it does nothing and returns false.
    pub fn hold(&self, requests: Vec<ApprovalRequest>) -> bool {
        let Some(s) = &self.suspend else {
            return false;
        };
        s.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(requests);
        true
    }

    /// True when the run can suspend.
    pub fn can_suspend(&self) -> bool {
        self.suspend.is_some()
    }

    /// Suspends the run on these calls. The driver stops the run as soon as this is called (the
    /// gate's own future is abandoned), so a gate then waits forever:
    /// `approvals.suspend(requests); std::future::pending().await`. Without suspension
    /// (see [`Approvals::can_suspend`]) it does nothing and returns false.
    pub fn suspend(&self, requests: Vec<ApprovalRequest>) -> bool {
        // Held as `hold` holds them, then fired: one way into the pending list.
        let held = self.hold(requests);
        if let Some(s) = &self.suspend {
            s.fired.cancel();
        }
        held
    }

    /// True once the run suspended (its subagents' children are then left to resume, not
    /// cancelled).
    pub(crate) fn suspended(&self) -> bool {
        self.suspend.as_ref().is_some_and(|s| {
            !s.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
        })
    }

    /// The token a driver races its steps against: `cancel` itself without suspension, else a
    /// child of it that a suspension also fires (so one wait covers both).
    pub(crate) fn link(&mut self, cancel: &CancellationToken) -> CancellationToken {
        match &mut self.suspend {
            Some(s) => {
                s.fired = cancel.child_token();
                s.fired.clone()
            }
            None => cancel.clone(),
        }
    }

    /// The calls the run suspended on.
    pub(crate) fn take_pending(&self) -> Vec<ApprovalRequest> {
        match &self.suspend {
            Some(s) => std::mem::take(&mut *s.pending.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        }
    }
}

/// Decides, per call, whether an admitted batch may run. Sees the batch once per turn, before any
/// tool of it starts.
pub trait Gate: Send + Sync {
    /// The gate's name, for errors and events.
    fn name(&self) -> &str {
        "gate"
    }

    /// One verdict per call of `calls`, in order. An error fails the run (the calls are answered
    /// "not run").
    fn check<'a>(
        &'a self,
        cx: GateContext<'a>,
        calls: &'a [AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>>;
}

impl<G: Gate + ?Sized> Gate for std::sync::Arc<G> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn check<'a>(
        &'a self,
        cx: GateContext<'a>,
        calls: &'a [AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>> {
        (**self).check(cx, calls)
    }
}

const _: Option<&dyn Gate> = None;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(call_id: &str, tool: &str, arguments: serde_json::Value) -> ApprovalRequest {
        ApprovalRequest {
            call_id: call_id.into(),
            tool: tool.into(),
            arguments,
            agent: String::new(),
            question: None,
        }
    }

    #[test]
    fn an_answer_is_found_only_by_its_own_call_and_only_once() {
        let approvals = Approvals::durable([(
            request(
                "c1",
                "shell",
                json!({"command": "ls", "cwd": {"a": 1, "b": 2}}),
            ),
            Answer::AllowOnce,
        )]);
        assert_eq!(
            approvals.take("c1", "shell", &json!({"command": "rm -rf ~"})),
            None,
            "other arguments under the id"
        );
        assert_eq!(
            approvals.take("c1", "write", &json!({"command": "ls"})),
            None,
            "another tool"
        );
        assert_eq!(
            approvals.take("c2", "shell", &json!({"command": "ls"})),
            None
        );
        // The same arguments, whatever order their keys come in.
        let same = json!({"cwd": {"b": 2, "a": 1}, "command": "ls"});
        assert_eq!(
            approvals.take("c1", "shell", &same),
            Some(Answer::AllowOnce)
        );
        assert_eq!(approvals.take("c1", "shell", &same), None, "used once");
    }
}
