//! A model's answer, judged: a final answer (checked against the output schema) or a decision
//! to call tools, validated whole before anything runs: ids, known tools, arguments against their
//! schemas (each call judged on its own by `admit_one`), the stuck-loop rule and the tool-call
//! budget. The admitted batch goes on in `batch.rs`.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::call_ids::ToolNames;
use super::{Batch, Pending, Phase, RunMachine, Slot, Slots, hit};
use crate::config::OnInvalidCall;
use crate::error::RunError;
use crate::event::EventKind;
use crate::limits::{LimitHit, LimitKind, Limits};
use crate::machine::{AdmittedCall, MAX_CALL_ID_LEN};
use crate::message::{AssistantMessage, ContentPart, Message, ToolCall, ToolResult};
use crate::model::{FinishReason, ModelError, ModelErrorKind, ModelResponse};
use crate::outcome::{CallArguments, CallOutcome, CallStatus, StopReason, ToolCallRecord, codes};
use crate::tool::{Arguments, ExecutionMode, Rejected, ToolCatalog, join_violations};

/// The largest output limit a cut answer is asked again with.
pub(super) const MAX_RAISED_OUTPUT_TOKENS: u32 = 32_768;

/// A priced answer's cost, when it is an amount of dollars. A pricing that answers infinity, NaN
/// or less than nothing (a price so large that the product overflows, a bug) gives no cost the
/// run can count: added up, it would make the run's cost NaN or infinite (`null` in JSON, and
/// never over a budget when NaN), or give a budget money back. Such an answer's cost is unknown,
/// as an unpriced one's is: reported, and a stop under a cost budget.
pub(super) fn known_cost(cost: Option<f64>) -> Option<f64> {
    cost.filter(|c| c.is_finite() && *c >= 0.0)
}

impl RunMachine {
    /// The model answered: count its usage and cost, then judge it (after the hooks' review).
    pub(super) fn on_model_response(&mut self, response: Box<ModelResponse>, cost: Option<f64>) {
        // A cached answer cost nothing this time.
        let cost = if response.cached {
            Some(0.0)
        } else {
            known_cost(cost)
        };
        self.count_usage(&response);
        self.count_cost(cost, response.model.as_deref());
        self.note_context(&response);
        let duration = self.now.saturating_sub(self.called_at);
        self.emit(|| EventKind::ModelResponse {
            usage: response.usage,
            cost_usd: cost,
            finish_reason: response.finish_reason,
            tool_calls: response.message.tool_calls.len(),
            text: response.message.text.clone(),
            duration,
            cached: response.cached,
            warnings: response.warnings.clone(),
        });
        if !response.warnings.is_empty() {
            let turn = self.counters.turn;
            self.kept.warnings.extend(
                response
                    .warnings
                    .iter()
                    .map(|w| format!("model answer in turn {turn}: {w}")),
            );
        }
        if self.seams.hooks {
            self.phase = Phase::Review(response);
        } else {
            self.decide(*response, None);
        }
    }

    /// Adds an answer's cost to the run's, or counts it unpriced when its cost is unknown (the
    /// pricing has no price for `model`): never as a silent zero.
    pub(super) fn count_cost(&mut self, cost: Option<f64>, model: Option<&str>) {
        match known_cost(cost) {
            // Finite costs can still add up past the largest finite number: the run's cost
            // stays a number (the largest), which any budget has reached.
            Some(c) => self.counters.cost = (self.counters.cost + c).min(f64::MAX),
            None => {
                self.counters.unpriced.0 = self.counters.unpriced.0.saturating_add(1);
                if self.counters.unpriced.1.is_none() {
                    self.counters.unpriced.1 = model.map(str::to_owned);
                }
            }
        }
    }

    /// Judges a response: a last answer after a limit, an answer that is not one (refused,
    /// filtered, cut), a final answer, or a decision to call tools.
    pub(super) fn decide(&mut self, mut response: ModelResponse, reask: Option<String>) {
        self.retry.retrying_output = false;
        // A driver did this before the step was logged; a step fed without it (a replay of an
        // older log) gets the same ids, since the rule depends only on the run's ids so far.
        self.assign_call_ids(&mut response);
        self.note_call_ids(&response);
        if let Some(hit) = self.wrap_up {
            self.last_answer(response, hit);
            return;
        }
        match response.finish_reason {
            FinishReason::Refusal | FinishReason::ContentFilter => {
                self.not_an_answer(response);
                return;
            }
            FinishReason::Error => {
                self.failed_answer(response);
                return;
            }
            _ => {}
        }
        if !calls_tools(&response) {
            // Cut by the output limit: a response that says so, or one whose only calls were
            // cut and dropped without a trace.
            if response.finish_reason == FinishReason::Length || response.truncated {
                self.on_cut_answer(response.message);
            } else if response.finish_reason == FinishReason::Other {
                self.unknown_ending(response);
            } else {
                self.on_final_answer(response.message, reask);
            }
            return;
        }
        if !response.cut_calls.is_empty() {
            self.raise_output_limit();
        }
        self.on_tool_decision(response.message, response.cut_calls);
    }

    /// A refused or filtered response: never an answer, and its calls never run.
    fn not_an_answer(&mut self, response: ModelResponse) {
        let (kind, stop, what) = if response.finish_reason == FinishReason::Refusal {
            (
                ModelErrorKind::Refused,
                StopReason::Refused,
                "refused to answer",
            )
        } else {
            (
                ModelErrorKind::ContentFiltered,
                StopReason::ContentFilter,
                "was stopped by a content filter",
            )
        };
        let words = response.message.text.trim().to_owned();
        let message = match &response.raw_finish_reason {
            Some(raw) if words.is_empty() => format!("the model {what} ({raw})"),
            Some(raw) => format!("the model {what} ({raw}): {words}"),
            None if words.is_empty() => format!("the model {what}"),
            None => format!("the model {what}: {words}"),
        };
        self.keep_with_calls_not_run(response.message, what);
        self.ending.output = (!words.is_empty()).then_some(words);
        self.ending.error = Some(Box::new(RunError::Model(ModelError::new(kind, message))));
        self.finish(stop);
    }

    /// A response the provider said ended in an error (Chat's `finish_reason: "error"`, a
    /// Responses status `failed`) without an error of its own: a failed model call, as if it
    /// had failed with that error. Its text is a fragment, never the run's output, and its calls
    /// never run.
    fn failed_answer(&mut self, response: ModelResponse) {
        let raw = response
            .raw_finish_reason
            .clone()
            .unwrap_or_else(|| FinishReason::Error.as_str().to_owned());
        let mut error = ModelError::new(
            ModelErrorKind::Server,
            format!("the model's response ended in an error (finish reason {raw:?})"),
        );
        error.provider_code = Some(raw);
        self.keep_with_calls_not_run(response.message, "ended in an error");
        self.ending.error = Some(Box::new(RunError::Model(error)));
        self.finish(StopReason::Failed);
    }

    /// An answer that ended for a reason no adapter knows ([`FinishReason::Other`]: a word the
    /// provider's API does not name, or a server's own): it may be whole, or cut by something
    /// the word would have said, so the run does not finish on it. It fails with
    /// `model.other`, the provider's word as the error's provider code; the text stays in the
    /// transcript and is the output, for a caller who judges it whole. (An answer with tool
    /// calls goes on: the calls, checked against their schemas, are what it is.)
    fn unknown_ending(&mut self, response: ModelResponse) {
        let raw = response
            .raw_finish_reason
            .clone()
            .unwrap_or_else(|| FinishReason::Other.as_str().to_owned());
        let text = response.message.text.clone();
        let kept = if text.trim().is_empty() {
            ""
        } else {
            "; its text is kept as the output"
        };
        let mut error = ModelError::new(
            ModelErrorKind::Other,
            format!(
                "the model's answer ended for a reason this client does not know (finish reason \
                 {raw:?}), so it is not taken for a whole answer{kept}"
            ),
        );
        error.provider_code = Some(raw);
        self.kept
            .transcript
            .push(Message::Assistant(response.message));
        self.ending.output = (!text.trim().is_empty()).then_some(text);
        self.ending.error = Some(Box::new(RunError::Model(error)));
        self.finish(StopReason::Failed);
    }

    /// Keeps a response that is not an answer in the transcript, each of its calls answered
    /// `not_run` (saying why: the response `what`), so the conversation can be continued.
    fn keep_with_calls_not_run(&mut self, message: AssistantMessage, what: &str) {
        if message.tool_calls.is_empty() {
            self.kept.transcript.push(Message::Assistant(message));
        } else {
            // `not_run` is `cancelled` wherever it is given; these calls are announced as
            // rejected all the same, as the response's refusal is what kept them from running.
            let outcome = CallOutcome::decided(
                CallStatus::Cancelled,
                codes::NOT_RUN,
                format!("not run: the response that made this call {what}"),
            );
            self.answer_all(message, &outcome, true);
        }
    }

    /// The output limit for the next call, raised once per run where the agent set one: doubled,
    /// up to [`MAX_RAISED_OUTPUT_TOKENS`]. False when it cannot be raised.
    fn raise_output_limit(&mut self) -> bool {
        if self.retry.output_raised {
            return false;
        }
        let current = self.settings().max_tokens.or(self.cfg.settings.max_tokens);
        let Some(n) = current else {
            return false;
        };
        let raised = n.saturating_mul(2).min(MAX_RAISED_OUTPUT_TOKENS);
        if raised <= n {
            return false;
        }
        self.retry.output_raised = true;
        self.retry.raise_output = Some(raised);
        true
    }

    /// A final answer cut off by the output limit: asked again once with a larger limit, then a
    /// `truncated` stop with the partial text kept.
    fn on_cut_answer(&mut self, message: AssistantMessage) {
        if self.raise_output_limit() {
            let limit = self.retry.raise_output.unwrap_or_default();
            self.emit(|| EventKind::AnswerRetried {
                reason: format!("the answer was cut off by the output limit; asking again with max_tokens {limit}"),
            });
            self.retry.retrying_output = true;
            self.need_model();
            return;
        }
        let text = message.text.clone();
        self.kept.transcript.push(Message::Assistant(message));
        self.ending.output = (!text.is_empty()).then_some(text);
        self.ending.error = Some(Box::new(RunError::Model(ModelError::new(
            ModelErrorKind::Truncated,
            "the final answer was cut off by the output token limit; the partial text is kept",
        ))));
        self.finish(StopReason::Truncated);
    }

    /// The answer after a limit (`on_limit = "answer"`): whatever it says, the run stops with
    /// the limit; calls it makes anyway are answered and never run.
    fn last_answer(&mut self, response: ModelResponse, hit: crate::limits::LimitHit) {
        let mut message = response.message;
        let text = message.text.trim().to_owned();
        if !text.is_empty() {
            self.ending.output = Some(message.text.clone());
            if let Some(schema) = &self.cfg.output_schema
                && let Ok(value) = parse_json_answer(&text)
                && schema.check(&value).is_ok()
            {
                self.ending.structured = Some(value);
            }
        }
        let calls = std::mem::take(&mut message.tool_calls);
        if calls.is_empty() {
            self.kept.transcript.push(Message::Assistant(message));
        } else {
            message.tool_calls = calls;
            self.answer_all(message, &CallOutcome::limited(hit.limit, true), true);
        }
        self.finish(super::limit_stop(hit.limit));
    }

    fn on_final_answer(&mut self, message: AssistantMessage, reask: Option<String>) {
        // A turn without tool calls ends any loop.
        self.recent_turns.clear();
        let text = message.text.clone();
        self.kept.transcript.push(Message::Assistant(message));
        if self.cfg.output_schema.is_none()
            && let Some(tool) =
                super::unread_call::unread_tool_call(&text, |n| self.tools.names().any(|t| t == n))
        {
            // Nothing read the call (no tool-call parser at the server, or a dialect that does
            // not know the shape): the tool never ran, so this is no answer.
            self.fail(RunError::InvalidDecision {
                reason: format!(
                    "the model's final answer is a call of tool `{tool}` written as text, which \
                     was not read as a call, so the tool never ran; a model served without a \
                     tool-call parser needs [model] tool_dialect = \"auto\" (it reads fenced, \
                     bare and <tool_call> calls alike)"
                ),
            });
            return;
        }
        // What is wrong, for the operator; the model reads it with how to answer again.
        let problem = match &self.cfg.output_schema {
            None => None,
            Some(schema) => match parse_json_answer(&text) {
                Ok(value) => match schema.check(&value) {
                    Ok(()) => {
                        self.ending.structured = Some(value);
                        None
                    }
                    Err(p) => Some(p.to_string()),
                },
                Err(e) => Some(format!("the answer is not JSON: {e}")),
            },
        };
        let problems = problem.as_ref().map(|p| {
            format!(
                "Your final answer does not match the required JSON schema: {p}. Answer again with only a JSON value that matches the schema."
            )
        });
        // The schema first, then the hooks' verdict: either sends the model back.
        let Some(again) = problems.or_else(|| reask.clone()) else {
            self.ending.output = Some(text);
            self.finish(StopReason::Finished);
            return;
        };
        self.ending.structured = None;
        let retries = self.limits().output_retries;
        if self.retry.output_retries_used < retries {
            self.retry.output_retries_used += 1;
            self.retry.retrying_output = true;
            // The event's reason starts as the run's error would, so that a trace without
            // payloads cuts the answer's values it quotes; a hook's words are its own.
            self.emit(|| EventKind::AnswerRetried {
                reason: match &problem {
                    Some(p) => format!("the final answer does not match the output schema: {p}"),
                    None => "a hook rejected the final answer".to_owned(),
                },
            });
            self.kept.transcript.push(Message::User {
                content: vec![ContentPart::Text { text: again }],
            });
            self.need_model();
        } else {
            self.ending.output = Some(text);
            // The operator reads what was wrong and that the retries are spent, not the words
            // that asked the model again.
            let why = problem.or(reask).unwrap_or(again);
            let spent = match retries {
                0 => "its only answer: no retries allowed".to_owned(),
                1 => "the last of 2 answers, its 1 retry spent".to_owned(),
                n => format!(
                    "the last of {} answers, its {n} retries spent",
                    n.saturating_add(1)
                ),
            };
            self.fail(RunError::OutputInvalid {
                message: format!("{why} ({spent})"),
            });
        }
    }

    fn on_tool_decision(&mut self, mut message: AssistantMessage, cut: Vec<ToolCall>) {
        // Calls cut off by the output limit stay in the transcript (with empty arguments, which
        // every provider accepts back) so the model reads that they were cut.
        let complete = message.tool_calls.len();
        let cut_arguments: Vec<String> = cut.iter().map(|c| c.arguments.clone()).collect();
        message.tool_calls.extend(cut.into_iter().map(|c| ToolCall {
            arguments: "{}".into(),
            ..c
        }));
        // Overlong or duplicate ids make the whole decision invalid, because results could not
        // be matched to calls.
        if let Some(reason) = id_problem(&message) {
            self.refuse_decision(message, reason);
            return;
        }
        // The response that crosses a budget, or comes on the last turn or model call, starts
        // no tool: no model call would read the results.
        if let Some(h) = self.limit_before_tools() {
            let outcome = CallOutcome::limited(h.limit, self.answers_on(h.limit));
            self.answer_all(message, &outcome, true);
            self.stop_on_limit(h);
            return;
        }

        // Taken out for the admissions, which borrow the run; given back before anything else.
        let mut names = std::mem::take(&mut self.tool_names);
        // The batch's box is made first and its slots written in it: inline, they would be
        // copied with every move of the batch.
        let mut pending = Box::new(Pending {
            turn: self.counters.turn,
            slots: Slots::new(),
            batch: Batch {
                turn: self.counters.turn,
                calls: super::BatchCalls::new(),
                sequential: false,
            },
            gate: 0,
            next: 0,
            running: 0,
            open: true,
            failure: None,
            interrupted: None,
            stopping: false,
            cut: false,
            restart: Vec::new(),
        });
        let p = &mut *pending;
        p.slots.reserve_exact(message.tool_calls.len());
        p.batch.calls.reserve_exact(message.tool_calls.len());
        let mut fatal: Option<String> = None;
        // Every admitted call's arguments are written in one buffer and shared as one text: a
        // batch of K calls allocates it once, not K times.
        let (admissions, text) = CallArguments::with_buffer(|buf| {
            let admissions: smallvec::SmallVec<[Admission; 4]> = message
                .tool_calls
                .iter()
                .enumerate()
                .map(|(position, call)| {
                    let cut_off = position
                        .checked_sub(complete)
                        .map(|i| cut_arguments.get(i).map(String::as_str).unwrap_or_default());
                    self.admit_one(&self.tools, &mut names, position, call, cut_off, buf)
                })
                .collect();
            (admissions, CallArguments::shared(buf))
        });
        for admission in admissions {
            match admission {
                Admission::Admitted(valid) => {
                    let arguments = Arguments::from_text(CallArguments::slice(
                        text.as_ref(),
                        valid.span.unwrap_or_default(),
                    ));
                    p.batch.sequential |= valid.sequential;
                    p.batch.calls.push(AdmittedCall {
                        position: valid.position,
                        call_id: Arc::clone(&valid.call_id),
                        tool: Arc::clone(&valid.tool),
                        // Shared: the batch lends them to the handlers, the slot keeps them for
                        // the record (a gate that rewrites them replaces the batch's copy only).
                        arguments: arguments.clone(),
                        index: valid.index,
                        approved: false,
                    });
                    p.slots.push(Slot {
                        call_id: valid.call_id,
                        tool: valid.tool,
                        arguments,
                        outcome: None,
                        started: false,
                    });
                }
                Admission::Decided { slot, fails } => {
                    if fatal.is_none() {
                        fatal = fails;
                    }
                    p.slots.push(slot);
                }
            }
        }
        self.tool_names = names;

        if let Some(reason) = fatal {
            self.refuse_decision(message, reason);
            return;
        }
        self.handoffs_alone(&mut p.batch.calls, &mut p.slots);
        let admitted = p.batch.calls.len() as u32;
        if let Some((h, outcome)) = self.tool_call_budget(admitted) {
            self.answer_all(message, &outcome, true);
            self.stop_on_limit(h);
            return;
        }
        self.counters.tool_calls_used += admitted;
        let slot_count = p.slots.len();
        for slot in &p.slots {
            if let Some(o) = &slot.outcome {
                self.emit(|| rejected_event(slot, o));
            }
        }
        self.kept.transcript.push(Message::Assistant(message));
        p.cut = complete < slot_count;
        if pending.batch.calls.is_empty() {
            self.end_batch(pending);
        } else if self.gates() > 0 {
            self.phase = Phase::Admit(pending);
        } else {
            self.start_run(pending);
        }
    }

    /// One call of a decision, judged on its own: cut off by the output limit, an unknown tool,
    /// arguments that fail the schema (each answered without running, and `fails` the whole
    /// decision when the policy says so), or admitted.
    fn admit_one(
        &self,
        tools: &ToolCatalog,
        names: &mut ToolNames,
        position: usize,
        call: &ToolCall,
        cut_off: Option<&str>,
        buf: &mut Vec<u8>,
    ) -> Admission {
        let call_id = Arc::clone(&call.call_id);
        let policy = self.cfg.policy;
        if let Some(partial) = cut_off {
            let outcome = CallOutcome::rejected(
                codes::TRUNCATED,
                format!(
                    "not run: this call to {} was cut off by the output token limit before its arguments were complete; make it again (with shorter arguments, or fewer calls at once)",
                    call.tool
                ),
            );
            let slot = Slot::decided(
                call_id,
                Arc::from(call.tool.as_str()),
                Value::String(partial.to_owned()),
                outcome,
            );
            return Admission::Decided { slot, fails: None };
        }
        let Some(index) = tools.index_of(&call.tool) else {
            let text = unknown_tool_message(&call.tool, tools.names());
            let fails = (policy.unknown_tool == OnInvalidCall::Fail).then(|| text.clone());
            let slot = Slot::decided(
                call_id,
                Arc::from(call.tool.as_str()),
                raw_arguments(&call.arguments),
                CallOutcome::rejected(codes::UNKNOWN_TOOL, text),
            );
            return Admission::Decided { slot, fails };
        };
        let tool = names.shared(&call.tool);
        match check_arguments(tools, index, &call.tool, &call.arguments, buf) {
            Ok(span) => Admission::Admitted(Valid {
                position,
                call_id,
                tool,
                index,
                sequential: tools
                    .spec(index)
                    .is_some_and(|s| s.mode == ExecutionMode::Sequential),
                span,
            }),
            Err((text, value)) => {
                let fails = (policy.invalid_arguments == OnInvalidCall::Fail).then(|| text.clone());
                let slot = Slot::decided(
                    call_id,
                    tool,
                    value,
                    CallOutcome::rejected(codes::INVALID_ARGUMENTS, text),
                );
                Admission::Decided { slot, fails }
            }
        }
    }

    /// The tool-call budget: a batch of `admitted` calls larger than what remains is refused
    /// whole, with the limit it hit and the outcome its calls are answered with.
    fn tool_call_budget(&self, admitted: u32) -> Option<(LimitHit, CallOutcome)> {
        let max = Limits::bound(self.limits().max_tool_calls)?;
        if self.counters.tool_calls_used.saturating_add(admitted) <= max {
            return None;
        }
        let h = hit(
            LimitKind::ToolCalls,
            max.into(),
            self.counters.tool_calls_used.into(),
            admitted.into(),
        );
        let outcome = if self.answers_on(LimitKind::ToolCalls) {
            CallOutcome::limited(LimitKind::ToolCalls, true)
        } else {
            CallOutcome::refused(
                codes::MAX_TOOL_CALLS,
                "not executed: the run's tool call limit was reached",
            )
        };
        Some((h, outcome))
    }

    /// A decision that cannot be fed back: every call is refused with it, and the run fails.
    fn refuse_decision(&mut self, message: AssistantMessage, reason: String) {
        let text = format!("not executed: invalid decision ({reason})");
        self.answer_all(
            message,
            &CallOutcome::refused(codes::DECISION_INVALID, text),
            true,
        );
        self.fail(RunError::InvalidDecision { reason });
    }

    pub(super) fn gates(&self) -> usize {
        usize::from(self.seams.hooks) + self.seams.gates
    }

    /// What keeps a response's tools from starting although they are valid: a token or cost
    /// budget the response crossed, or a turn or model-call limit that leaves no model call to
    /// read their results.
    fn limit_before_tools(&self) -> Option<crate::limits::LimitHit> {
        self.spent_hit()
            .or_else(|| self.turn_hit())
            .or_else(|| self.model_call_hit())
    }

    /// The stuck-loop rule, after a tool turn whose records start at `first`: the run is stuck
    /// when the turn came back the same (the same calls with the same results; a poller's
    /// arguments aside) `threshold` times in a row, or a cycle of two or three turns did.
    pub(super) fn stuck(&mut self, first: usize) -> Option<crate::limits::LimitHit> {
        let threshold = self.limits().stuck_loop_threshold;
        if threshold < 2 || first >= self.kept.records.len() {
            return None;
        }
        let keep = 3 * threshold as usize;
        if self.recent_turns.capacity() == 0 {
            // Its whole size at once (it never holds more than one past `keep`): grown from
            // empty, it was three allocations a run.
            self.recent_turns
                .reserve_exact(keep.saturating_add(1).min(64));
        }
        self.recent_turns.push((first, self.kept.records.len()));
        if self.recent_turns.len() > keep {
            let drop = self.recent_turns.len() - keep;
            self.recent_turns.drain(..drop);
        }
        let n = self.recent_turns.len();
        for period in 1..=3usize {
            let needed = period * (threshold as usize - 1);
            if n < needed + period {
                continue;
            }
            let mut repeats = 0;
            while repeats < needed {
                let (a, b) = (n - 1 - repeats, n - 1 - repeats - period);
                let same = match (self.recent_turns.get(a), self.recent_turns.get(b)) {
                    (Some(&x), Some(&y)) => self.same_turn(x, y),
                    _ => false,
                };
                if !same {
                    break;
                }
                repeats += 1;
            }
            if repeats >= needed {
                let times = (repeats / period + 1) as f64;
                return Some(hit(LimitKind::StuckLoop, threshold.into(), times, 0.0));
            }
        }
        None
    }

    /// Two tool turns, as ranges of records, are the same when their calls (as a set) match.
    fn same_turn(&self, a: (usize, usize), b: (usize, usize)) -> bool {
        let (Some(x), Some(y)) = (
            self.kept.records.get(a.0..a.1),
            self.kept.records.get(b.0..b.1),
        ) else {
            return false;
        };
        // A hostile response of thousands of calls is compared in order, not as a set.
        const SET_COMPARE_MAX: usize = 64;
        if x.len() > SET_COMPARE_MAX || y.len() > SET_COMPARE_MAX {
            return x.len() == y.len() && x.iter().zip(y).all(|(p, q)| self.same_call(p, q));
        }
        x.iter().all(|p| y.iter().any(|q| self.same_call(p, q)))
            && y.iter().all(|q| x.iter().any(|p| self.same_call(p, q)))
    }

    /// The same call with the same result; a poller's arguments aside. A call a dry run
    /// skipped has no result to compare (every one reads the same text, whatever the tool would
    /// have answered), so it is never the same as another: a dry run does not stop
    /// `stuck_loop` where the real run would go on.
    fn same_call(&self, p: &ToolCallRecord, q: &ToolCallRecord) -> bool {
        if p.outcome.status == CallStatus::Skipped
            || p.tool != q.tool
            || p.outcome.status != q.outcome.status
            || p.outcome.code != q.outcome.code
            || p.outcome.content != q.outcome.content
        {
            return false;
        }
        if p.arguments == q.arguments {
            return true;
        }
        // Only an agent with pollers pays for the lookup.
        self.has_pollers
            && self
                .tools
                .index_of(&p.tool)
                .and_then(|i| self.tools.spec(i))
                .is_some_and(|s| s.poller)
    }

    /// Pushes the assistant message and `outcome` for each of its calls, so the transcript stays
    /// valid to continue later; `announce` emits a `ToolRejected` for each.
    pub(super) fn answer_all(
        &mut self,
        message: AssistantMessage,
        outcome: &CallOutcome,
        announce: bool,
    ) {
        let turn = self.counters.turn;
        let mut results = Vec::with_capacity(message.tool_calls.len());
        for call in &message.tool_calls {
            let call_id = Arc::clone(&call.call_id);
            let tool: Arc<str> = Arc::from(call.tool.as_str());
            let record = ToolCallRecord {
                call_id: Arc::clone(&call_id),
                tool: Arc::clone(&tool),
                arguments: CallArguments::new(&raw_arguments(&call.arguments)),
                turn,
                outcome: outcome.clone(),
            };
            if announce {
                self.emit(|| EventKind::ToolRejected {
                    call_id: call.call_id.to_string(),
                    tool: call.tool.to_string(),
                    code: outcome.code.as_deref().unwrap_or_default().to_owned(),
                    reason: outcome.content.to_text(),
                    outcome: outcome.clone(),
                });
            }
            self.kept.records.push(record);
            results.push(Message::Tool(ToolResult {
                call_id,
                tool,
                content: outcome.content.clone(),
                is_error: outcome.is_error(),
            }));
        }
        self.kept.transcript.push(Message::Assistant(message));
        self.kept.transcript.extend(results);
    }
}

/// How one call of a decision is admitted ([`RunMachine::admit_one`]).
enum Admission {
    /// It runs, unless a gate says otherwise.
    Admitted(Valid),
    /// It is answered without running; `fails` is why the whole decision fails, when the
    /// policy says so.
    Decided { slot: Slot, fails: Option<String> },
}

/// An admitted call, before its arguments' text is shared with the batch's others.
struct Valid {
    position: usize,
    call_id: Arc<str>,
    tool: Arc<str>,
    index: usize,
    sequential: bool,
    /// Where its arguments' text is in the batch's buffer.
    span: Option<std::ops::Range<usize>>,
}

/// True when a response calls a tool (a call cut off by the output limit counts): otherwise it
/// is an answer.
pub(super) fn calls_tools(response: &ModelResponse) -> bool {
    !response.message.tool_calls.is_empty() || !response.cut_calls.is_empty()
}

impl Slot {
    fn decided(call_id: Arc<str>, tool: Arc<str>, arguments: Value, outcome: CallOutcome) -> Self {
        Slot {
            call_id,
            tool,
            // Only the record reads them: no tree kept.
            arguments: Arguments::from_text(CallArguments::new(&arguments)),
            outcome: Some(outcome),
            started: false,
        }
    }
}

fn rejected_event(slot: &Slot, o: &CallOutcome) -> EventKind {
    EventKind::ToolRejected {
        call_id: slot.call_id.to_string(),
        tool: slot.tool.to_string(),
        code: o.code.as_deref().unwrap_or_default().to_owned(),
        reason: o.content.to_text(),
        outcome: o.clone(),
    }
}

fn id_problem(message: &AssistantMessage) -> Option<String> {
    // A response holds a few calls: comparing each id with the ones before it costs less than
    // hashing them into a set, up to a few dozen.
    const SCAN_UP_TO: usize = 32;
    let calls = &message.tool_calls;
    let mut seen: HashSet<&str> = HashSet::new();
    for (i, call) in calls.iter().enumerate() {
        if call.call_id.len() > MAX_CALL_ID_LEN {
            return Some(format!(
                "call id of {} bytes for tool {} (at most {MAX_CALL_ID_LEN})",
                call.call_id.len(),
                call.tool
            ));
        }
        let repeated = if calls.len() <= SCAN_UP_TO {
            calls.iter().take(i).any(|c| c.call_id == call.call_id)
        } else {
            !seen.insert(&call.call_id)
        };
        if repeated {
            return Some(format!(
                "duplicate call id {:?} in one response",
                call.call_id
            ));
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

/// Reads and validates a call's arguments; on failure, the message the model reads and the
/// arguments as far as they could be read.
fn check_arguments(
    tools: &crate::tool::ToolCatalog,
    index: usize,
    name: &str,
    raw: &str,
    buf: &mut Vec<u8>,
) -> Result<Option<std::ops::Range<usize>>, (String, Value)> {
    tools
        .check_arguments_into(index, raw, buf)
        .map_err(|rejected| match rejected {
            Rejected::NotJson(e) => (
                format!("invalid arguments for {name}: not valid JSON ({e})"),
                raw_arguments(raw),
            ),
            Rejected::Invalid { violations, value } => (
                format!(
                    "invalid arguments for {name}: {}",
                    join_violations(&violations)
                ),
                value,
            ),
        })
}

/// The arguments as the model sent them: parsed when they are JSON (a lone half of a UTF-16 pair
/// read as U+FFFD, as the tool would have read it), else the raw text.
fn raw_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    crate::surrogates::from_str(raw, &mut None).unwrap_or_else(|_| Value::String(raw.to_owned()))
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
