//! An admitted batch: the gates' verdicts, the dispatch of its calls, and each call's outcome
//! judged as it comes back (a subagent's run charged to this one, a tool's panic by policy).

use serde_json::Value;

use super::{HookFailure, Pending, Phase, RunMachine, Slot, Verdict};
use crate::config::OnToolPanic;
use crate::error::RunError;
use crate::event::EventKind;
use crate::outcome::{CallOutcome, CallStatus, StopReason, codes};
use crate::tool::join_violations;

impl RunMachine {
    pub(super) fn on_admitted(
        &mut self,
        mut p: Box<Pending>,
        verdicts: Vec<Verdict>,
        failures: Vec<HookFailure>,
    ) {
        if let Some(e) = self.hook_failures(failures) {
            self.phase = Phase::Admit(p);
            self.fail(e);
            return;
        }
        if verdicts.len() != p.batch.calls.len() {
            let message = format!(
                "an admission gate gave {} verdicts for {} calls",
                verdicts.len(),
                p.batch.calls.len()
            );
            self.phase = Phase::Admit(p);
            self.fail(RunError::Other { message });
            return;
        }
        let mut denied: Vec<(usize, String)> = Vec::new();
        let mut answered: Vec<(usize, Value)> = Vec::new();
        let mut bad_rewrite: Option<RunError> = None;
        let hooks_gate = self.seams.hooks && p.gate == 0;
        for (call, verdict) in p.batch.calls.iter_mut().zip(verdicts) {
            match verdict {
                Verdict::Allow => {}
                Verdict::Approved => call.approved = true,
                Verdict::Deny(reason) => denied.push((call.position, reason)),
                Verdict::Answer(value) => answered.push((call.position, value)),
                Verdict::Rewrite(arguments) => {
                    match self.tools.validate(call.index, &arguments) {
                        Ok(()) => {
                            call.arguments = crate::tool::Arguments::new(arguments);
                            // What a person approved was the call before this rewrite.
                            call.approved = false;
                        }
                        Err(v) => {
                            // A rewrite is validated again; one that breaks the schema is a bug in
                            // the program's hook or gate, not something the model can fix.
                            bad_rewrite.get_or_insert_with(|| RunError::Hook {
                            hook: if hooks_gate { "before_tool_call" } else { "gate" }.into(),
                            message: format!(
                                "rewrote the arguments of {} into ones that fail its schema: {}",
                                call.tool,
                                join_violations(&v)
                            ),
                        });
                        }
                    }
                }
            }
        }
        if let Some(e) = bad_rewrite {
            self.phase = Phase::Admit(p);
            self.fail(e);
            return;
        }
        for (position, reason) in denied {
            p.batch.calls.retain(|c| c.position != position);
            self.counters.tool_calls_used = self.counters.tool_calls_used.saturating_sub(1);
            if let Some(slot) = p.slots.get_mut(position) {
                let outcome = CallOutcome::denied(&reason);
                self.emit(|| EventKind::ToolRejected {
                    call_id: slot.call_id.to_string(),
                    tool: slot.tool.to_string(),
                    code: codes::DENIED.into(),
                    reason,
                    outcome: outcome.clone(),
                });
                slot.outcome = Some(outcome);
            }
        }
        for (position, value) in answered {
            self.answer_call(&mut p, position, value);
        }
        p.gate += 1;
        if p.gate < self.gates() && !p.batch.calls.is_empty() {
            self.phase = Phase::Admit(p);
        } else {
            self.start_run(p);
        }
    }

    /// A call a gate answered: it leaves the batch with that answer as its result, seen as a
    /// call that started and finished at once (it counts as run).
    fn answer_call(&mut self, p: &mut Pending, position: usize, value: Value) {
        let Some(call) = p.batch.calls.iter().find(|c| c.position == position) else {
            return;
        };
        let arguments = call.arguments.to_value();
        p.batch.calls.retain(|c| c.position != position);
        let Some(slot) = p.slots.get_mut(position) else {
            return;
        };
        let output = match value {
            Value::String(text) => crate::tool::ToolOutput::text(text),
            other => crate::tool::ToolOutput::json(other),
        };
        let outcome = CallOutcome::ok(output);
        self.emit(|| EventKind::ToolStarted {
            call_id: slot.call_id.to_string(),
            tool: slot.tool.to_string(),
            arguments,
        });
        self.emit(|| EventKind::ToolFinished {
            call_id: slot.call_id.to_string(),
            tool: slot.tool.to_string(),
            outcome: outcome.clone(),
        });
        slot.started = true;
        slot.outcome = Some(outcome);
    }

    pub(super) fn start_run(&mut self, mut p: Box<Pending>) {
        if self.seams.skip_tools {
            for call in std::mem::take(&mut p.batch.calls) {
                if let Some(slot) = p.slots.get_mut(call.position) {
                    let outcome = CallOutcome::skipped();
                    self.emit(|| EventKind::ToolRejected {
                        call_id: call.call_id.to_string(),
                        tool: call.tool.to_string(),
                        code: codes::SKIPPED.into(),
                        reason: "dry run: the tool was not run".into(),
                        outcome: outcome.clone(),
                    });
                    slot.outcome = Some(outcome);
                }
            }
        }
        if p.batch.calls.is_empty() {
            self.end_batch(p);
        } else {
            self.phase = Phase::Run(p);
        }
    }

    pub(super) fn on_started(&mut self, mut p: Box<Pending>, position: usize) {
        let restarting = p.restart.first().copied();
        let expected = match restarting {
            Some(i) => p.batch.calls.get(i),
            None => p.batch.calls.get(p.next),
        }
        .filter(|_| p.open);
        let Some(call) = expected.filter(|c| c.position == position) else {
            let message = format!("the driver started call {position}, which was not asked for");
            self.phase = Phase::Run(p);
            self.fail(RunError::Other { message });
            return;
        };
        self.emit(|| EventKind::ToolStarted {
            call_id: call.call_id.to_string(),
            tool: call.tool.to_string(),
            arguments: call.arguments.to_value(),
        });
        if restarting.is_some() {
            p.restart.remove(0);
        } else {
            p.next += 1;
        }
        p.running += 1;
        if let Some(slot) = p.slots.get_mut(position) {
            slot.started = true;
        }
        self.phase = Phase::Run(p);
    }

    pub(super) fn on_finished(
        &mut self,
        mut p: Box<Pending>,
        position: usize,
        mut outcome: CallOutcome,
        failures: Vec<HookFailure>,
    ) {
        if let Some(call) = p.batch.calls.iter().find(|c| c.position == position) {
            outcome = self.judge_outcome(call.index, outcome);
        }
        if outcome.subagent.is_some() {
            outcome = self.roll_up(outcome, p.interrupted.is_some());
        }
        // A call of an interrupted batch that answers `cancelled` stopped because it was told
        // to: it was cut short, as one the grace period ends is, not a failure of its own. So
        // a tool that stops at once when told is recorded as the tools the run had to drop are,
        // and the run need not wait out the grace period for the same record.
        if p.interrupted.is_some()
            && outcome.status == CallStatus::Error
            && outcome.code.as_deref() == Some(codes::CANCELLED)
        {
            outcome.status = CallStatus::Cancelled;
        }
        let Some(slot) = p
            .slots
            .get_mut(position)
            .filter(|s| s.started && s.outcome.is_none())
        else {
            let message = format!("the driver finished call {position}, which was not running");
            self.phase = Phase::Run(p);
            self.fail(RunError::Other { message });
            return;
        };
        self.emit_finished(p.turn, slot, &outcome);
        if outcome.status == CallStatus::Fatal {
            // A fatal failure drains the batch without cancelling the siblings.
            p.open = false;
        }
        slot.outcome = Some(outcome);
        p.running = p.running.saturating_sub(1);
        if let Some(e) = self.hook_failures(failures) {
            p.open = false;
            p.failure.get_or_insert(e);
        }
        if p.running == 0 && (!p.open || (p.next >= p.batch.calls.len() && p.restart.is_empty())) {
            self.end_batch(p);
        } else if self.only_children_left(&p) {
            self.on_grace_over(p);
        } else {
            self.phase = Phase::Run(p);
        }
    }

    /// A started call's `ToolFinished`, in the turn of its batch: once for each start, whatever
    /// ended the call.
    pub(super) fn emit_finished(&mut self, turn: u32, slot: &Slot, outcome: &CallOutcome) {
        if self.record_events {
            self.events.push((
                turn,
                EventKind::ToolFinished {
                    call_id: slot.call_id.to_string(),
                    tool: slot.tool.to_string(),
                    outcome: outcome.clone(),
                },
            ));
        }
    }

    /// A subagent's run is charged to this one (one budget for the tree: its tokens, cost, turns,
    /// model calls and tool calls count against this run's limits from here on) and judged: one
    /// that did not finish is an error the model reads, its partial output kept, or fatal when
    /// its tool says so. In a batch the run's cancel or deadline `interrupted`, a child that
    /// stopped `cancelled` or `deadline` was cut short with its parent: it is `cancelled`, as
    /// any call the interrupt cut, never fatal, so the run ends as the interrupt says.
    pub(super) fn roll_up(&mut self, mut outcome: CallOutcome, interrupted: bool) -> CallOutcome {
        let Some(sub) = outcome.subagent.as_deref() else {
            return outcome;
        };
        self.counters.usage.add(&sub.usage);
        self.counters.cached_tokens = self
            .counters
            .cached_tokens
            .saturating_add(sub.cached_tokens);
        self.count_cost(Some(sub.cost_usd), None);
        // The subtree's answers of unknown cost leave the run's cost unknown too (and stop a
        // budgeted run at its next check).
        self.counters.unpriced.0 = self
            .counters
            .unpriced
            .0
            .saturating_add(sub.unpriced_model_calls);
        self.counters.sub_turns = self.counters.sub_turns.saturating_add(sub.turns);
        self.counters.sub_model_calls = self
            .counters
            .sub_model_calls
            .saturating_add(sub.model_calls);
        self.counters.tool_calls_run = self.counters.tool_calls_run.saturating_add(sub.tool_calls);
        self.counters.tool_calls_used =
            self.counters.tool_calls_used.saturating_add(sub.tool_calls);
        self.kept.subagents.push(sub.clone());
        // A hand-off's run that did not finish ends this run as it ended (`handed_off`).
        if outcome.status == CallStatus::Ok && !sub.is_success() && sub.answered_by.is_none() {
            let stopped = sub.stop_reason.as_str();
            let cut_with_parent = interrupted
                && (stopped == StopReason::Cancelled.as_str()
                    || stopped == StopReason::Deadline.as_str());
            if cut_with_parent {
                // What the model reads keeps the child's partial output.
                outcome.status = CallStatus::Cancelled;
                outcome.code = Some(codes::CANCELLED.into());
                return outcome;
            }
            let code = format!("subagent.{}", sub.stop_reason);
            if sub.fatal {
                outcome.status = CallStatus::Fatal;
                outcome.diagnostic = Some(
                    format!(
                        "the subagent {} stopped: {}",
                        sub.agent,
                        sub.error.as_deref().unwrap_or(&sub.stop_reason)
                    )
                    .into(),
                );
            } else {
                outcome.status = CallStatus::Error;
            }
            outcome.code = Some(code.into());
        }
        outcome
    }

    /// The machine's rules on a finished call's outcome: a declared output schema is checked (a
    /// violation is an error the model reads), and a panic is fatal only under
    /// [`OnToolPanic::Fail`].
    pub(super) fn judge_outcome(&self, index: usize, outcome: CallOutcome) -> CallOutcome {
        if outcome.status == CallStatus::Ok
            && let Err(problem) = self.tools.check_output(index, &outcome.content)
        {
            let name = self.tools.spec(index).map_or("", |s| s.name.as_str());
            return CallOutcome {
                diagnostic: Some(format!("output: {}", outcome.content.to_text()).into()),
                details: outcome.details,
                duration: outcome.duration,
                retries: outcome.retries,
                ..CallOutcome::error(
                    codes::INVALID_OUTPUT,
                    format!(
                        "the output of {name} does not match its declared output schema: {problem}"
                    ),
                )
            };
        }
        if outcome.code.as_deref() == Some(codes::TOOL_PANICKED)
            && outcome.status != CallStatus::Fatal
            && self.cfg.policy.tool_panic == OnToolPanic::Fail
        {
            return CallOutcome {
                status: CallStatus::Fatal,
                ..outcome
            };
        }
        outcome
    }
}
