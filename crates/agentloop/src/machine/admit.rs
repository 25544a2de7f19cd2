//! A model's answer, judged: a final answer (checked against the output schema) or a decision
//! to call tools, validated whole before anything runs: ids, known tools, arguments against their
//! schemas, the stuck-loop rule and the tool-call budget; then the admission gates' verdicts, and
//! the dispatch of the admitted calls.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::{Batch, HookFailure, Pending, Phase, RunMachine, Slot, Verdict, hit};
use crate::config::OnInvalidCall;
use crate::error::RunError;
use crate::event::EventKind;
use crate::limits::LimitKind;
use crate::machine::{AdmittedCall, MAX_CALL_ID_LEN};
use crate::message::{AssistantMessage, ContentPart, Message, ToolResult};
use crate::model::{ModelError, ModelErrorKind, ModelResponse};
use crate::outcome::{CallOutcome, CallStatus, StopReason, ToolCallRecord, codes};
use crate::tool::{ExecutionMode, join_violations};

impl RunMachine {
    /// The model answered: count its usage and cost, then judge it (after the hooks' review).
    pub(super) fn on_model_response(&mut self, response: ModelResponse, cost: Option<f64>) {
        self.usage.add(&response.usage);
        self.cost += cost.unwrap_or(0.0);
        let duration = self.now.saturating_sub(self.called_at);
        self.emit(|| EventKind::ModelResponse {
            usage: response.usage,
            cost_usd: cost,
            finish_reason: response.finish_reason,
            tool_calls: response.message.tool_calls.len(),
            text: response.message.text.clone(),
            duration,
        });
        if self.seams.hooks {
            self.phase = Phase::Review(Box::new((response, cost)));
        } else {
            self.decide(response);
        }
    }

    pub(super) fn decide(&mut self, mut response: ModelResponse) {
        self.retrying_output = false;
        if response.truncated {
            response.message.tool_calls.clear();
            self.transcript.push(Message::Assistant(response.message));
            self.fail(RunError::Model(ModelError::new(
                ModelErrorKind::Truncated,
                "the response was cut off inside a tool call (output token limit); the call was not run",
            )));
            return;
        }
        if response.message.tool_calls.is_empty() {
            self.on_final_answer(response.message);
        } else {
            self.on_tool_decision(response.message);
        }
    }

    fn on_final_answer(&mut self, message: AssistantMessage) {
        let text = message.text.clone();
        self.transcript.push(Message::Assistant(message));
        let Some(schema) = &self.cfg.output_schema else {
            self.output = Some(text);
            self.finish(StopReason::Finished);
            return;
        };
        let parsed = parse_json_answer(&text);
        let problems = match &parsed {
            Ok(value) => schema.check(value).err(),
            Err(e) => Some(format!("the answer is not JSON: {e}")),
        };
        match problems {
            None => {
                self.output = Some(text);
                self.structured = parsed.ok();
                self.finish(StopReason::Finished);
            }
            Some(p) if self.output_retries_used < self.limits.output_retries => {
                self.output_retries_used += 1;
                self.retrying_output = true;
                self.transcript.push(Message::User {
                    content: vec![ContentPart::Text {
                        text: format!(
                            "Your final answer does not match the required JSON schema: {p}. Answer again with only a JSON value that matches the schema."
                        ),
                    }],
                });
                self.need_model();
            }
            Some(p) => {
                self.output = Some(text);
                self.fail(RunError::OutputInvalid { message: p });
            }
        }
    }

    fn on_tool_decision(&mut self, mut message: AssistantMessage) {
        // Ids first: blank ones come from the injected id source; overlong or duplicate ones make
        // the whole decision invalid, because results could not be matched to calls.
        self.assign_call_ids(&mut message);
        if let Some(reason) = id_problem(&message) {
            self.refuse_decision(message, reason);
            return;
        }

        let tools = &self.cfg.tools;
        let policy = self.cfg.policy;
        let mut slots: Vec<Slot> = Vec::with_capacity(message.tool_calls.len());
        let mut calls: Vec<AdmittedCall> = Vec::with_capacity(message.tool_calls.len());
        let mut fatal: Option<String> = None;
        let mut sequential = false;
        for (position, call) in message.tool_calls.iter().enumerate() {
            let call_id: Arc<str> = Arc::from(call.id.as_str());
            let Some(index) = tools.index_of(&call.name) else {
                let text = unknown_tool_message(&call.name, tools.names());
                if policy.unknown_tool == OnInvalidCall::Fail && fatal.is_none() {
                    fatal = Some(text.clone());
                }
                slots.push(Slot::decided(
                    call_id,
                    Arc::from(call.name.as_str()),
                    raw_arguments(&call.arguments),
                    CallOutcome::rejected(codes::UNKNOWN_TOOL, text),
                ));
                continue;
            };
            let tool: Arc<str> = match tools.shared_name(index) {
                Some(name) => Arc::clone(name),
                None => Arc::from(call.name.as_str()),
            };
            match check_arguments(tools, index, &call.name, &call.arguments) {
                Ok(value) => {
                    if tools
                        .spec(index)
                        .is_some_and(|s| s.mode == ExecutionMode::Sequential)
                    {
                        sequential = true;
                    }
                    let arguments = Arc::new(value);
                    calls.push(AdmittedCall {
                        position,
                        call_id: Arc::clone(&call_id),
                        tool: Arc::clone(&tool),
                        // Shared: the batch lends them to the handlers, the slot keeps them for
                        // the record (a gate that rewrites them replaces the batch's copy only).
                        arguments: Arc::clone(&arguments),
                        index,
                    });
                    slots.push(Slot {
                        call_id,
                        tool,
                        arguments,
                        outcome: None,
                        started: false,
                    });
                }
                Err((text, value)) => {
                    if policy.invalid_arguments == OnInvalidCall::Fail && fatal.is_none() {
                        fatal = Some(text.clone());
                    }
                    slots.push(Slot::decided(
                        call_id,
                        tool,
                        value,
                        CallOutcome::rejected(codes::INVALID_ARGUMENTS, text),
                    ));
                }
            }
        }

        if let Some(reason) = fatal {
            self.refuse_decision(message, reason);
            return;
        }
        if let Some((tool, count)) = self.stuck(&slots) {
            let threshold = self.limits.stuck_loop_threshold;
            let h = hit(
                LimitKind::StuckLoop,
                threshold.into(),
                (count - 1).into(),
                1.0,
            );
            let text = format!(
                "not executed: {tool} was called with the same arguments in {count} turns in a row"
            );
            self.answer_all(message, &CallOutcome::refused(codes::STUCK_LOOP, text));
            self.stop_on_limit(h);
            return;
        }
        // The tool-call budget: a batch larger than what remains is refused whole.
        let admitted = calls.len() as u32;
        if let Some(max) = self.limits.max_tool_calls
            && self.tool_calls_used.saturating_add(admitted) > max
        {
            let h = hit(
                LimitKind::ToolCalls,
                max.into(),
                self.tool_calls_used.into(),
                admitted.into(),
            );
            self.answer_all(
                message,
                &CallOutcome::refused(
                    codes::MAX_TOOL_CALLS,
                    "not executed: the run's tool call limit was reached",
                ),
            );
            self.stop_on_limit(h);
            return;
        }
        self.tool_calls_used += admitted;
        for slot in &slots {
            if let Some(o) = &slot.outcome {
                self.emit(|| rejected_event(slot, o));
            }
        }
        self.transcript.push(Message::Assistant(message));
        let pending = Box::new(Pending {
            turn: self.turn,
            slots,
            batch: Batch {
                turn: self.turn,
                calls,
                sequential,
            },
            gate: 0,
            next: 0,
            running: 0,
            open: true,
            failure: None,
            interrupted: None,
        });
        if pending.batch.calls.is_empty() {
            self.end_batch(pending);
        } else if self.gates() > 0 {
            self.phase = Phase::Admit(pending);
        } else {
            self.start_run(pending);
        }
    }

    /// A decision that cannot be fed back: every call is refused with it, and the run fails.
    fn refuse_decision(&mut self, message: AssistantMessage, reason: String) {
        let text = format!("not executed: invalid decision ({reason})");
        self.answer_all(
            message,
            &CallOutcome::refused(codes::DECISION_INVALID, text),
        );
        self.fail(RunError::InvalidDecision { reason });
    }

    fn gates(&self) -> usize {
        usize::from(self.seams.hooks) + self.seams.gates
    }

    /// The stuck-loop rule: the same call (tool and arguments, key order aside) in N turns in a
    /// row stops the run before the Nth runs. Identical calls within one batch count once. Each
    /// streak points at the record its call will have once this batch is folded, so the next turn
    /// compares against the records without keeping a copy of the arguments.
    fn stuck(&mut self, slots: &[Slot]) -> Option<(String, u32)> {
        let threshold = self.limits.stuck_loop_threshold;
        if threshold == 0 {
            return None;
        }
        let first_record = self.records.len();
        let mut streaks: Vec<(usize, u32)> = Vec::with_capacity(slots.len());
        let mut stuck = None;
        for (position, slot) in slots.iter().enumerate() {
            let repeated_in_batch = streaks.iter().any(|(record, _)| {
                slots
                    .get(record - first_record)
                    .is_some_and(|s| s.tool == slot.tool && *s.arguments == *slot.arguments)
            });
            if repeated_in_batch {
                continue;
            }
            let count = self
                .streaks
                .iter()
                .find(|(record, _)| {
                    self.records
                        .get(*record)
                        .is_some_and(|r| r.tool == slot.tool && r.arguments == *slot.arguments)
                })
                .map_or(1, |(_, n)| n + 1);
            streaks.push((first_record + position, count));
            if count >= threshold && stuck.is_none() {
                stuck = Some((slot.tool.to_string(), count));
            }
        }
        if stuck.is_none() {
            self.streaks = streaks;
        }
        stuck
    }

    /// Pushes the assistant message and `outcome` for each of its calls, so the transcript stays
    /// valid to continue later.
    pub(super) fn answer_all(&mut self, message: AssistantMessage, outcome: &CallOutcome) {
        let turn = self.turn;
        let mut results = Vec::with_capacity(message.tool_calls.len());
        for call in &message.tool_calls {
            let call_id: Arc<str> = Arc::from(call.id.as_str());
            let tool: Arc<str> = Arc::from(call.name.as_str());
            let record = ToolCallRecord {
                call_id: Arc::clone(&call_id),
                tool: Arc::clone(&tool),
                arguments: raw_arguments(&call.arguments),
                turn,
                outcome: outcome.clone(),
            };
            if outcome.status == CallStatus::Refused {
                self.emit(|| EventKind::ToolRejected {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    code: outcome.code.clone().unwrap_or_default(),
                    reason: outcome.content.to_text(),
                });
            }
            self.records.push(record);
            results.push(Message::Tool(ToolResult {
                call_id,
                name: tool,
                content: outcome.content.clone(),
                is_error: outcome.is_error(),
            }));
        }
        self.transcript.push(Message::Assistant(message));
        self.transcript.extend(results);
    }

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
        let mut bad_rewrite: Option<RunError> = None;
        let hooks_gate = self.seams.hooks && p.gate == 0;
        for (call, verdict) in p.batch.calls.iter_mut().zip(verdicts) {
            match verdict {
                Verdict::Allow => {}
                Verdict::Deny(reason) => denied.push((call.position, reason)),
                Verdict::Rewrite(arguments) => {
                    match self.cfg.tools.validate(call.index, &arguments) {
                        Ok(()) => call.arguments = Arc::new(arguments),
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
            self.tool_calls_used = self.tool_calls_used.saturating_sub(1);
            if let Some(slot) = p.slots.get_mut(position) {
                let outcome = CallOutcome::denied(&reason);
                self.emit(|| EventKind::ToolRejected {
                    call_id: slot.call_id.to_string(),
                    tool: slot.tool.to_string(),
                    code: codes::DENIED.into(),
                    reason,
                });
                slot.outcome = Some(outcome);
            }
        }
        p.gate += 1;
        if p.gate < self.gates() && !p.batch.calls.is_empty() {
            self.phase = Phase::Admit(p);
        } else {
            self.start_run(p);
        }
    }

    fn start_run(&mut self, mut p: Box<Pending>) {
        if self.seams.skip_tools {
            for call in std::mem::take(&mut p.batch.calls) {
                if let Some(slot) = p.slots.get_mut(call.position) {
                    self.emit(|| EventKind::ToolRejected {
                        call_id: call.call_id.to_string(),
                        tool: call.tool.to_string(),
                        code: codes::SKIPPED.into(),
                        reason: "dry run: the tool was not run".into(),
                    });
                    slot.outcome = Some(CallOutcome::skipped());
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
        let expected = p.batch.calls.get(p.next).filter(|_| p.open);
        let Some(call) = expected.filter(|c| c.position == position) else {
            let message = format!("the driver started call {position}, which was not asked for");
            self.phase = Phase::Run(p);
            self.fail(RunError::Other { message });
            return;
        };
        self.emit(|| EventKind::ToolStarted {
            call_id: call.call_id.to_string(),
            tool: call.tool.to_string(),
            arguments: Value::clone(&call.arguments),
        });
        p.next += 1;
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
        outcome: CallOutcome,
        failures: Vec<HookFailure>,
    ) {
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
        if self.record_events {
            self.events.push((
                p.turn,
                EventKind::ToolFinished {
                    call_id: slot.call_id.to_string(),
                    tool: slot.tool.to_string(),
                    outcome: outcome.clone(),
                },
            ));
        }
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
        if p.running == 0 && (!p.open || p.next >= p.batch.calls.len()) {
            self.end_batch(p);
        } else {
            self.phase = Phase::Run(p);
        }
    }
}

impl Slot {
    fn decided(call_id: Arc<str>, tool: Arc<str>, arguments: Value, outcome: CallOutcome) -> Self {
        Slot {
            call_id,
            tool,
            arguments: Arc::new(arguments),
            outcome: Some(outcome),
            started: false,
        }
    }
}

fn rejected_event(slot: &Slot, o: &CallOutcome) -> EventKind {
    EventKind::ToolRejected {
        call_id: slot.call_id.to_string(),
        tool: slot.tool.to_string(),
        code: o.code.clone().unwrap_or_default(),
        reason: o.content.to_text(),
    }
}

fn id_problem(message: &AssistantMessage) -> Option<String> {
    let mut seen: HashSet<&str> = HashSet::new();
    for call in &message.tool_calls {
        if call.id.len() > MAX_CALL_ID_LEN {
            return Some(format!(
                "call id of {} bytes for tool {} (at most {MAX_CALL_ID_LEN})",
                call.id.len(),
                call.name
            ));
        }
        if !seen.insert(call.id.as_str()) {
            return Some(format!("duplicate call id {:?} in one response", call.id));
        }
    }
    None
}

fn unknown_tool_message<'a>(name: &str, valid: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = valid.collect();
    if names.is_empty() {
        format!("unknown tool {name:?}: no tools are available")
    } else {
        format!("unknown tool {name:?}; valid tools: {}", names.join(", "))
    }
}

/// Parses and validates a call's arguments; on failure, the message the model reads and the
/// arguments as far as they could be read.
fn check_arguments(
    tools: &crate::tool::ToolSet,
    index: usize,
    name: &str,
    raw: &str,
) -> Result<Value, (String, Value)> {
    let parsed = if raw.trim().is_empty() {
        Ok(Value::Object(Default::default()))
    } else {
        serde_json::from_str::<Value>(raw)
    };
    match parsed {
        Err(e) => Err((
            format!("invalid arguments for {name}: not valid JSON ({e})"),
            raw_arguments(raw),
        )),
        Ok(value) => match tools.validate(index, &value) {
            Ok(()) => Ok(value),
            Err(v) => Err((
                format!("invalid arguments for {name}: {}", join_violations(&v)),
                value,
            )),
        },
    }
}

/// The arguments as the model sent them: parsed when they are JSON, else the raw text.
fn raw_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// Parses a final answer as JSON, allowing a fenced code block around it.
fn parse_json_answer(text: &str) -> Result<Value, serde_json::Error> {
    let t = text.trim();
    let inner = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|s| s.strip_suffix("```"))
        .unwrap_or(t);
    serde_json::from_str(inner.trim())
}
