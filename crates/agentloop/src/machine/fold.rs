//! A batch's outcomes folded into the run: one result per call in the transcript, in decision
//! order and with matching ids, one record per call, the counts, and what the outcomes decide (a
//! fatal failure fails the run; a batch whose every call asked to terminate ends it).

use std::sync::Arc;

use super::{Pending, RunMachine, Slot};
use crate::error::RunError;
use crate::message::{Message, ToolContent, ToolResult};
use crate::outcome::{CallOutcome, CallStatus, StopReason, SubagentRun, ToolCallRecord, codes};

impl RunMachine {
    pub(super) fn fold(&mut self, mut pending: Box<Pending>) {
        // Folded in its box: its slots are inline there, and moving the batch out would copy
        // them.
        let turn = pending.turn;
        // The batch lent the arguments to the handlers; dropped first, so that each record takes
        // its call's text rather than a copy.
        pending.batch.calls = super::BatchCalls::new();
        let mut all_terminate = !pending.slots.is_empty();
        let slots = pending.slots.drain(..);
        let mut terminate_output: Option<String> = None;
        let mut fatal: Option<RunError> = None;
        let mut handoff: Option<(Slot, SubagentRun, ToolContent)> = None;
        // Each call's result goes straight into the transcript, in decision order.
        self.kept.transcript.reserve(slots.len());
        for slot in slots {
            let outcome = match slot.outcome {
                Some(o) => o,
                // Started, never completed: a synthetic "cancelled" keeps the transcript valid.
                None if slot.started => CallOutcome::cancelled(),
                None => {
                    // Admitted and never started: the call gives its slot back.
                    self.counters.tool_calls_used = self.counters.tool_calls_used.saturating_sub(1);
                    CallOutcome::not_run()
                }
            };
            if slot.started {
                self.counters.tool_calls_run += 1;
            }
            if outcome.status == CallStatus::Ok && outcome.terminate && slot.started {
                terminate_output = Some(outcome.content.to_text());
            } else {
                all_terminate = false;
            }
            if slot.started
                && handoff.is_none()
                && let Some(run) = outcome.subagent.as_deref()
                && run.answered_by.is_some()
            {
                let call = Slot {
                    call_id: Arc::clone(&slot.call_id),
                    tool: Arc::clone(&slot.tool),
                    arguments: slot.arguments.clone(),
                    outcome: None,
                    started: true,
                };
                handoff = Some((call, run.clone(), outcome.content.clone()));
            }
            if outcome.status == CallStatus::Fatal && fatal.is_none() {
                let message = outcome.diagnostic.as_deref().unwrap_or_default().to_owned();
                let (tool, call_id) = (slot.tool.to_string(), slot.call_id.to_string());
                fatal = Some(if outcome.code.as_deref() == Some(codes::TOOL_PANICKED) {
                    RunError::ToolPanicked {
                        tool,
                        call_id,
                        message,
                    }
                } else {
                    RunError::ToolFatal {
                        tool,
                        call_id,
                        message,
                    }
                });
            }
            self.kept.transcript.push(Message::Tool(ToolResult {
                call_id: Arc::clone(&slot.call_id),
                tool: Arc::clone(&slot.tool),
                content: outcome.content.clone(),
                is_error: outcome.is_error(),
            }));
            self.kept.records.push(ToolCallRecord {
                call_id: slot.call_id,
                tool: slot.tool,
                arguments: slot.arguments.into_record(),
                turn,
                outcome,
            });
        }
        if let Some(e) = fatal {
            self.fail(e);
            return;
        }
        if let Some((call, run, content)) = handoff {
            self.handed_off(&call, &run, &content);
            return;
        }
        if all_terminate {
            self.ending.output = terminate_output;
            self.finish(StopReason::Terminated);
        }
    }
}
