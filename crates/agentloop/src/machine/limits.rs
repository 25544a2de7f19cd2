//! Limits: what each would let happen next, what is left for subagents, and the stop when one
//! is reached.

use super::{AdmittedCall, Phase, RunMachine};
use crate::error::RunError;
use crate::event::EventKind;
use crate::limits::{LimitHit, LimitKind, Limits, OnLimit};
use crate::message::Message;
use crate::outcome::StopReason;

impl RunMachine {
    pub(super) fn check_before_model_call(&self) -> Option<LimitHit> {
        let l = self.limits();
        let now = self.now;
        if let Some(t) = l.deadline()
            && now >= t
        {
            return Some(hit(
                LimitKind::Deadline,
                t.as_millis() as f64,
                now.as_millis() as f64,
                0.0,
            ));
        }
        if self.wrap_up.is_some() {
            // The last answer after a limit is the one call past it.
            return None;
        }
        if !self.retry.retrying_output
            && let Some(hit) = self.turn_hit()
        {
            return Some(hit);
        }
        self.model_call_hit().or_else(|| self.spent_hit())
    }

    /// The budget the subagent calls of the batch running now share: what is left of the run's,
    /// less one turn and one model call held back for this run's next turn, split evenly among
    /// them as each starts (`waiting`: how many they are). Children that used the last turn
    /// would leave no model call to read their work, and the run would stop on its turn limit
    /// with their answers unread: the rule that starts no tool whose result no model call would
    /// read. A hand-off (always alone in its batch) keeps the whole: its answer is the run's.
    /// Here so that every driver hands out the same; each child's journal records its grant.
    pub(crate) fn subagent_pool(&self) -> crate::budget::Pool {
        let calls: &[AdmittedCall] = match &self.phase {
            Phase::Run(p) => &p.batch.calls,
            _ => &[],
        };
        let mut waiting = 0usize;
        let mut hands_off = false;
        for spec in calls.iter().filter_map(|c| self.tools.spec(c.index)) {
            waiting += usize::from(spec.subagent);
            hands_off |= spec.handoff;
        }
        let held = u32::from(!hands_off);
        let left = self.remaining();
        crate::budget::Pool {
            turns: left.turns.map(|n| n.saturating_sub(held)),
            model_calls: left.model_calls.map(|n| n.saturating_sub(held)),
            waiting: u32::try_from(waiting).unwrap_or(u32::MAX),
            ..left
        }
    }

    /// What is left of the run's budget: what its subagents may draw on.
    pub(crate) fn remaining(&self) -> crate::budget::Pool {
        let l = self.limits();
        crate::budget::Pool {
            turns: Limits::bound(l.max_turns).map(|m| {
                m.saturating_sub(self.counters.turn.saturating_add(self.counters.sub_turns))
            }),
            model_calls: Limits::bound(l.max_model_calls).map(|m| {
                m.saturating_sub(
                    self.counters
                        .model_calls
                        .saturating_add(self.counters.sub_model_calls),
                )
            }),
            tool_calls: Limits::bound(l.max_tool_calls)
                .map(|m| m.saturating_sub(self.counters.tool_calls_used)),
            tokens: l
                .max_tokens
                .filter(|&n| n > 0)
                .map(|m| m.saturating_sub(self.spent_tokens())),
            cost: l.cost_bound().map(|m| (m - self.counters.cost).max(0.0)),
            waiting: 0,
        }
    }

    /// The turn limit, when this turn is the last allowed.
    pub(super) fn turn_hit(&self) -> Option<LimitHit> {
        let max = Limits::bound(self.limits().max_turns)?;
        let turns = self.counters.turn.saturating_add(self.counters.sub_turns);
        (turns >= max).then(|| hit(LimitKind::Turns, max.into(), turns.into(), 1.0))
    }

    /// The model-call limit, when no model call is left.
    pub(super) fn model_call_hit(&self) -> Option<LimitHit> {
        let max = Limits::bound(self.limits().max_model_calls)?;
        let calls = self
            .counters
            .model_calls
            .saturating_add(self.counters.sub_model_calls);
        (calls >= max).then(|| hit(LimitKind::ModelCalls, max.into(), calls.into(), 1.0))
    }

    /// The tokens the run's models read and wrote, its subagents' included: its usage less
    /// what a response cache served (no model spent those).
    pub(super) fn spent_tokens(&self) -> u64 {
        self.counters
            .usage
            .total_tokens()
            .saturating_sub(self.counters.cached_tokens)
    }

    /// Counts an answer's usage: a cached answer's in the run's usage as it reports it, and
    /// apart, so that `max_tokens` leaves it out.
    pub(super) fn count_usage(&mut self, response: &crate::model::ModelResponse) {
        self.counters.usage.add(&response.usage);
        if response.cached {
            self.counters.cached_tokens = self
                .counters
                .cached_tokens
                .saturating_add(response.usage.total_tokens());
        }
    }

    /// The warning for a run that ends past its token or cost budget with no limit stopping it:
    /// the last model call crossed the bound and asked for no more work (a final answer), so
    /// there was nothing left to refuse, but the spend is over and the outcome must say so.
    pub(super) fn over_budget_warning(&self) -> Option<String> {
        use crate::outcome::OVER_BUDGET;
        let l = self.limits();
        let ended = "with the run's last model call, which asked for no more work, so no limit \
                     stopped the run";
        if let Some(max) = l.max_tokens.filter(|&n| n > 0)
            && self.spent_tokens() > max
        {
            let spent = self.spent_tokens();
            return Some(format!(
                "{OVER_BUDGET}max_tokens went past its bound (bound {max}, spent {spent}) {ended}"
            ));
        }
        let max = l.cost_bound()?;
        let cost = self.counters.cost;
        match self.counters.unpriced.0 {
            0 if cost > max => Some(format!(
                "{OVER_BUDGET}max_cost_usd went past its bound (bound {max}, spent {cost}) {ended}"
            )),
            0 => None,
            n => Some(format!(
                "{OVER_BUDGET}max_cost_usd could not be held: the cost of {n} model answer{} is \
                 unknown (bound {max}, priced spend {cost}) {ended}",
                if n == 1 { "" } else { "s" }
            )),
        }
    }

    /// The token or cost budget, when it is spent.
    pub(super) fn spent_hit(&self) -> Option<LimitHit> {
        let l = self.limits();
        if let Some(max) = l.max_tokens.filter(|&n| n > 0)
            && self.spent_tokens() >= max
        {
            let used = self.spent_tokens() as f64;
            return Some(hit(LimitKind::Tokens, max as f64, used, 0.0));
        }
        match l.cost_bound() {
            // An answer of unknown cost: the budget can no longer be held, so nothing more is
            // spent (see `stop_on_limit`).
            Some(max) if self.counters.cost >= max || self.counters.unpriced.0 > 0 => {
                Some(hit(LimitKind::Cost, max, self.counters.cost, 0.0))
            }
            _ => None,
        }
    }

    /// True when a limit of this kind asks the model for a last answer instead of stopping.
    /// Never when no model call is left, whichever limit is reported: another (the turn limit,
    /// a budget) can trip on the same response as the model-call limit and be reported first.
    pub(super) fn answers_on(&self, kind: LimitKind) -> bool {
        self.limits().on_limit == OnLimit::Answer
            && self.wrap_up.is_none()
            && !matches!(kind, LimitKind::ModelCalls | LimitKind::Deadline)
            && self.model_call_hit().is_none()
            // A last answer of unknown cost would be spent unmetered too.
            && !(kind == LimitKind::Cost && self.counters.unpriced.0 > 0)
    }

    /// A limit stops the run: at once, or (`on_limit = "answer"`) after one last model call with
    /// tools off. Every call in the transcript is answered before this is called.
    pub(super) fn stop_on_limit(&mut self, hit: LimitHit) {
        let reason = limit_stop(hit.limit);
        if self.answers_on(hit.limit) {
            self.ending.limit = Some(hit);
            self.ending.error = Some(Box::new(RunError::LimitReached(hit)));
            self.emit(|| EventKind::LimitReached { limit: hit });
            self.wrap_up = Some(hit);
            self.recent_turns.clear();
            self.kept.transcript.push(Message::user(format!(
                "The run has reached its {} limit: no more tools can run. Give your final answer now, from what you have so far.",
                hit.limit
            )));
            self.count_model_call();
            return;
        }
        if let Some(first) = self.wrap_up {
            // Something stopped the last answer: the first limit still names the stop.
            self.finish(limit_stop(first.limit));
            return;
        }
        self.ending.limit = Some(hit);
        self.ending.error = Some(Box::new(match hit.limit {
            LimitKind::Deadline => RunError::Deadline {
                elapsed_ms: self.now.as_millis() as u64,
            },
            LimitKind::Cost if self.counters.unpriced.0 > 0 => RunError::CostUnknown {
                model: self.counters.unpriced.1.clone().unwrap_or_default(),
            },
            _ => RunError::LimitReached(hit),
        }));
        self.emit(|| EventKind::LimitReached { limit: hit });
        self.finish(reason);
    }
}

/// The stop reason of a limit.
pub(super) fn limit_stop(kind: LimitKind) -> StopReason {
    match kind {
        LimitKind::Turns => StopReason::MaxTurns,
        LimitKind::ToolCalls => StopReason::MaxToolCalls,
        LimitKind::ModelCalls => StopReason::MaxModelCalls,
        LimitKind::Tokens | LimitKind::Cost => StopReason::Budget,
        LimitKind::Deadline => StopReason::Deadline,
        LimitKind::StuckLoop => StopReason::StuckLoop,
    }
}

pub(super) fn hit(limit: LimitKind, bound: f64, consumed: f64, requested: f64) -> LimitHit {
    LimitHit {
        limit,
        bound,
        consumed,
        requested,
    }
}
