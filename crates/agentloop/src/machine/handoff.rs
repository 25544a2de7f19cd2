//! Hand-offs ([`crate::handoff::Handoff`]): a call that passes the conversation to another
//! agent, whose answer is the run's. Three rules, here so that every driver keeps them alike: a
//! hand-off runs only as the one call of its turn; it sees the conversation before the response
//! that handed off; and when it returns, the run ends as the other agent's run ended.

use serde_json::Value;

use super::{BatchCalls, RunMachine, Slot};
use crate::error::RunError;
use crate::event::EventKind;
use crate::message::{Message, ToolContent};
use crate::outcome::{CallOutcome, StopReason, SubagentRun, codes};

impl RunMachine {
    fn is_handoff(&self, index: usize) -> bool {
        self.tools.spec(index).is_some_and(|s| s.handoff)
    }

    /// A hand-off beside other calls of its turn does not run: the others do, and the model
    /// reads that it may hand off again, alone, once it has their results. (Handing the
    /// conversation on while calls of this agent still run would leave their results to no one.)
    pub(super) fn handoffs_alone(&self, calls: &mut BatchCalls, slots: &mut [Slot]) {
        if calls.len() < 2 || !calls.iter().any(|c| self.is_handoff(c.index)) {
            return;
        }
        calls.retain(|c| {
            if !self.is_handoff(c.index) {
                return true;
            }
            if let Some(slot) = slots.get_mut(c.position) {
                slot.outcome = Some(CallOutcome::rejected(
                    codes::HANDOFF_NOT_ALONE,
                    format!(
                        "not run: {} hands the conversation to another agent, and a hand-off must \
                         be the only call of its turn; the other calls of this turn ran: read \
                         their results, then call {} alone if the other agent should still take \
                         over",
                        c.tool, c.tool
                    ),
                ));
            }
            false
        });
    }

    /// The conversation a hand-off passes on: the transcript before the response that handed
    /// off (that response's calls have no results yet, so it is not a conversation to go on).
    pub(crate) fn handoff_history(&self) -> Vec<Message> {
        let t = &self.kept.transcript;
        let end = t
            .iter()
            .rposition(|m| matches!(m, Message::Assistant(_)))
            .unwrap_or(t.len());
        t.get(..end).unwrap_or_default().to_vec()
    }

    /// A hand-off returned: the run ends as the other agent's run ended, with its answer (its
    /// structured answer, when it has an output schema) and its stop reason.
    pub(super) fn handed_off(&mut self, call: &Slot, run: &SubagentRun, content: &ToolContent) {
        self.ending.answered_by = run.answered_by.clone();
        let from = self.cfg.name().to_owned();
        self.emit(|| EventKind::HandedOff {
            call_id: call.call_id.to_string(),
            tool: call.tool.to_string(),
            from,
            to: run.agent.clone(),
            answered_by: run.answered_by.clone().unwrap_or_else(|| run.agent.clone()),
            run_id: run.run_id.clone(),
        });
        let stop = serde_json::from_value::<StopReason>(Value::String(run.stop_reason.clone()))
            .unwrap_or(StopReason::Failed);
        if let ToolContent::Json(v) = content {
            self.ending.structured = Some(v.clone());
        }
        self.ending.output = Some(content.to_text());
        if !stop.is_success() {
            let why = run.error.as_deref().unwrap_or(&run.stop_reason);
            self.ending.error = Some(Box::new(RunError::Other {
                message: format!(
                    "the agent {} took over the conversation and stopped: {why}",
                    run.agent
                ),
            }));
        }
        self.finish(stop);
    }
}
