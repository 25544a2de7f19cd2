//! Compaction as the machine's step before a model call: whether the request would pass the
//! context budget, the summary call or the dropped tool results, and the record of what was
//! replaced (see [`crate::compaction`] for the rules).

use std::time::Duration;

use crate::compaction::{self, CompactionPolicy, CompactionRecord};
use crate::event::EventKind;
use crate::message::Message;
use crate::model::{ModelResponse, Usage};

use super::{Phase, RunMachine, SummaryJob};

impl RunMachine {
    /// The request's estimated tokens: the provider's count of the last request where there is
    /// one, and an estimate of what came after it.
    pub(super) fn context_estimate(&self) -> u64 {
        match self.context.context_known {
            Some((len, tokens)) => {
                let after: u64 = self
                    .kept
                    .transcript
                    .get(len..)
                    .unwrap_or_default()
                    .iter()
                    .map(compaction::estimate_message)
                    .sum();
                tokens.saturating_add(after)
            }
            None => {
                // The schemas are serialized once a run, not once a call.
                let request = self.request();
                let fixed = *self
                    .context
                    .fixed_estimate
                    .get_or_init(|| compaction::estimate_fixed(&request));
                let messages: u64 = request
                    .messages
                    .iter()
                    .map(compaction::estimate_message)
                    .sum();
                fixed.saturating_add(messages)
            }
        }
    }

    /// Notes the provider's count of the request just answered.
    pub(super) fn note_context(&mut self, response: &ModelResponse) {
        self.context.context_known = (!response.cached && response.usage.input_tokens > 0)
            .then_some((self.kept.transcript.len(), response.usage.input_tokens));
    }

    /// Compacts the transcript when the next request would pass the budget. True when a summary
    /// call was asked for (the turn's model call follows it).
    pub(super) fn compact(&mut self) -> bool {
        let Some(c) = self.cfg.compaction.as_ref() else {
            return false;
        };
        let budget = c.budget(&self.cfg.settings);
        let tokens = self.context_estimate();
        if tokens <= budget {
            return false;
        }
        // A summary call is a model call like any other: it counts against `max_model_calls`,
        // and is made only when the turn's own call still fits after it.
        let calls_left = self.remaining().model_calls;
        let summary_fits = calls_left.is_none_or(|left| left >= 2);
        if c.policy == CompactionPolicy::Summarize
            && summary_fits
            && let Some(cut) = compaction::split_point(&self.kept.transcript, c.keep_turns)
        {
            let older = self.kept.transcript.get(..cut).unwrap_or_default();
            let job = SummaryJob {
                cut,
                tokens_before: tokens,
                started: self.now,
                messages: vec![Message::user(compaction::render_for_summary(older))],
                settings: compaction::summary_settings(c, &self.cfg.settings),
            };
            self.counters.model_calls += 1;
            self.phase = Phase::Summarize(Box::new(job));
            return true;
        }
        let fallback = (c.policy == CompactionPolicy::Summarize).then(|| {
            if summary_fits {
                "nothing older than the latest turns to summarize".to_owned()
            } else {
                "no model call left for a summary beside the turn's own (max_model_calls)"
                    .to_owned()
            }
        });
        self.drop_results(tokens, budget, None, fallback);
        false
    }

    /// The summary call answered (or failed): the older part is replaced by the summary, or, when
    /// there is none, tool results are dropped instead. Then the turn's model call, unless the
    /// summary spent what was left of the budget.
    pub(super) fn on_summary(
        &mut self,
        job: SummaryJob,
        answer: Result<(ModelResponse, Option<f64>), String>,
    ) {
        let (usage, cost, summary) = match answer {
            Ok((response, cost)) => {
                let cost = if response.cached { Some(0.0) } else { cost };
                self.count_usage(&response);
                self.count_cost(cost, response.model.as_deref());
                let text = response.message.text.trim().to_owned();
                let replaced: u64 = self
                    .kept
                    .transcript
                    .get(..job.cut)
                    .unwrap_or_default()
                    .iter()
                    .map(compaction::estimate_message)
                    .sum();
                let summary = if text.is_empty() {
                    Err("the summary call wrote nothing".to_owned())
                } else if compaction::estimate_message(&compaction::summary_message(&text))
                    >= replaced
                {
                    // A small model can ramble until its output limit: a summary no shorter than
                    // what it would replace saves nothing.
                    Err("the summary was no shorter than what it would replace".to_owned())
                } else {
                    Ok(text)
                };
                (response.usage, cost.unwrap_or(0.0), summary)
            }
            Err(message) => (
                Usage::default(),
                0.0,
                Err(format!("the summary call failed: {message}")),
            ),
        };
        match summary {
            Ok(text) => {
                let cut = job.cut.min(self.kept.transcript.len());
                let replaced: Vec<(usize, Message)> =
                    self.kept.transcript.drain(..cut).enumerate().collect();
                self.kept
                    .transcript
                    .insert(0, compaction::summary_message(&text));
                self.new_from = if self.new_from >= cut {
                    self.new_from - cut + 1
                } else {
                    0
                };
                self.context.context_known = None;
                let tokens_after = self.context_estimate();
                self.record_compaction(CompactionRecord {
                    turn: self.counters.turn,
                    policy: CompactionPolicy::Summarize,
                    tokens_before: job.tokens_before,
                    tokens_after,
                    replaced,
                    summary: Some(text),
                    usage,
                    cost_usd: cost,
                    fallback: None,
                    duration: self.now.saturating_sub(job.started),
                });
            }
            Err(why) => {
                let budget = self
                    .cfg
                    .compaction
                    .as_ref()
                    .map_or(0, |c| c.budget(&self.cfg.settings));
                let spent = self.now.saturating_sub(job.started);
                self.drop_results(
                    job.tokens_before,
                    budget,
                    Some((usage, cost, spent)),
                    Some(why),
                );
            }
        }
        // The summary spent tokens and money: the budgets are judged again before the turn's
        // call.
        if let Some(hit) = self.spent_hit() {
            self.stop_on_limit(hit);
        } else {
            self.count_model_call();
        }
    }

    /// Drops the bodies of the oldest tool results outside the latest turns.
    /// `summary` is what a failed summary call spent first (its usage, cost and time), when
    /// there was one: it is recorded even when nothing could be dropped.
    fn drop_results(
        &mut self,
        tokens: u64,
        budget: u64,
        summary: Option<(Usage, f64, Duration)>,
        fallback: Option<String>,
    ) {
        let called = summary.is_some();
        let (usage, cost, duration) = summary.unwrap_or_default();
        let keep = self.cfg.compaction.as_ref().map_or(1, |c| c.keep_turns);
        let keep_from = compaction::kept_from(&self.kept.transcript, keep);
        let replaced = compaction::drop_tool_results(
            &mut self.kept.transcript,
            keep_from,
            tokens.saturating_sub(budget),
        );
        if replaced.is_empty() && !called {
            // Nothing could be dropped: the request goes as it is, and the provider judges it.
            return;
        }
        self.context.context_known = None;
        let tokens_after = self.context_estimate();
        self.record_compaction(CompactionRecord {
            turn: self.counters.turn,
            policy: CompactionPolicy::DropToolResults,
            tokens_before: tokens,
            tokens_after,
            replaced,
            summary: None,
            usage,
            cost_usd: cost,
            fallback,
            duration,
        });
    }

    fn record_compaction(&mut self, record: CompactionRecord) {
        self.emit(|| EventKind::Compacted {
            policy: record.policy.as_str().to_owned(),
            messages_replaced: record.replaced.len(),
            tokens_before: record.tokens_before,
            tokens_after: record.tokens_after,
            summary: record.summary.clone(),
            replaced: record.replaced.iter().map(|(_, m)| m.clone()).collect(),
            usage: record.usage,
            cost_usd: record.cost_usd,
            fallback: record.fallback.clone(),
            duration: record.duration,
        });
        self.kept.compactions.push(record);
    }
}
