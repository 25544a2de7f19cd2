//! A run's budget as subagents share it: what is left of each resource ([`Pool`]), and the
//! scope the subagent calls of one batch draw from together ([`Scope`]). Pure arithmetic and a
//! lock, no agent: the machine computes the pool and how many calls share it, the driver hands
//! the scope to the calls, and the subagent tool reserves and settles its grant (a child
//! journal records it, and a resumed child reserves exactly that).

use std::any::Any;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::event::Sinks;
use crate::limits::Limits;
use crate::outcome::SubagentRun;

/// What is left of a run's budget, per resource; `None` is unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Pool {
    pub(crate) turns: Option<u32>,
    pub(crate) model_calls: Option<u32>,
    pub(crate) tool_calls: Option<u32>,
    pub(crate) tokens: Option<u64>,
    pub(crate) cost: Option<f64>,
    /// How many subagent calls of the batch have not drawn their grant yet: each takes at most
    /// an even share of what is left, so that the first to start cannot starve its siblings.
    pub(crate) waiting: u32,
}

/// Takes up to `want` (an even share of what is left when `None`) from `left`; refused when
/// nothing is left.
fn take(
    left: &mut Option<u64>,
    want: Option<u64>,
    waiting: u32,
    what: &str,
) -> Result<Option<u64>, String> {
    match left {
        None => Ok(want),
        Some(0) => Err(format!("no {what} left in the budget")),
        Some(n) => {
            let share = (*n / u64::from(waiting.max(1))).max(1);
            let grant = want.map_or(share, |w| w.min(share));
            *n -= grant;
            Ok(Some(grant))
        }
    }
}

fn min_opt<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y < x { y } else { x }),
        (x, y) => x.or(y),
    }
}

fn wide(v: Option<u32>) -> Option<u64> {
    v.map(u64::from)
}

fn narrow(v: Option<u64>) -> Option<u32> {
    v.map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Gives back what a grant did not use.
fn give_back(left: &mut Option<u64>, granted: Option<u64>, spent: u64) {
    if let (Some(l), Some(g)) = (left.as_mut(), granted) {
        *l = l.saturating_add(g.saturating_sub(spent));
    }
}

impl Pool {
    /// Reserves a grant for one subagent: up to `cap` of each resource, at most what is left.
    /// All or nothing: a resource with nothing left refuses the whole grant.
    pub(crate) fn reserve(&mut self, cap: &Pool) -> Result<Pool, String> {
        let mut next = *self;
        let w = next.waiting;
        let mut turns = wide(next.turns);
        let mut model_calls = wide(next.model_calls);
        let mut tool_calls = wide(next.tool_calls);
        let grant = Pool {
            turns: narrow(take(&mut turns, wide(cap.turns), w, "turns")?),
            model_calls: narrow(take(
                &mut model_calls,
                wide(cap.model_calls),
                w,
                "model calls",
            )?),
            tool_calls: narrow(take(
                &mut tool_calls,
                wide(cap.tool_calls),
                w,
                "tool calls",
            )?),
            tokens: take(&mut next.tokens, cap.tokens, w, "tokens")?,
            cost: match next.cost.as_mut() {
                None => cap.cost,
                Some(left) if *left <= 0.0 => return Err("no dollars left in the budget".into()),
                Some(left) => {
                    let share = *left / f64::from(w.max(1));
                    let g = cap.cost.map_or(share, |c| c.min(share));
                    *left -= g;
                    Some(g)
                }
            },
            waiting: 0,
        };
        next.turns = narrow(turns);
        next.model_calls = narrow(model_calls);
        next.tool_calls = narrow(tool_calls);
        next.waiting = w.saturating_sub(1);
        *self = next;
        Ok(grant)
    }

    /// Settles a grant: what the subagent did not spend is left for its siblings.
    pub(crate) fn settle(&mut self, grant: &Pool, spent: &SubagentRun) {
        let mut turns = wide(self.turns);
        let mut model_calls = wide(self.model_calls);
        let mut tool_calls = wide(self.tool_calls);
        give_back(&mut turns, wide(grant.turns), spent.turns.into());
        give_back(
            &mut model_calls,
            wide(grant.model_calls),
            spent.model_calls.into(),
        );
        give_back(
            &mut tool_calls,
            wide(grant.tool_calls),
            spent.tool_calls.into(),
        );
        give_back(&mut self.tokens, grant.tokens, spent.spent_tokens());
        self.turns = narrow(turns);
        self.model_calls = narrow(model_calls);
        self.tool_calls = narrow(tool_calls);
        if let (Some(l), Some(g)) = (self.cost.as_mut(), grant.cost) {
            *l += (g - spent.cost_usd).max(0.0);
        }
    }

    /// Reserves exactly `grant` (a resumed child's, as its journal recorded it), whatever the
    /// even share: the child goes on within what it was given. What is not left is taken as far
    /// as it goes, never below nothing.
    pub(crate) fn reserve_exact(&mut self, grant: &Pool) {
        let mut turns = wide(self.turns);
        let mut model_calls = wide(self.model_calls);
        let mut tool_calls = wide(self.tool_calls);
        for (left, g) in [
            (&mut turns, wide(grant.turns)),
            (&mut model_calls, wide(grant.model_calls)),
            (&mut tool_calls, wide(grant.tool_calls)),
            (&mut self.tokens, grant.tokens),
        ] {
            if let (Some(l), Some(g)) = (left.as_mut(), g) {
                *l = l.saturating_sub(g);
            }
        }
        self.turns = narrow(turns);
        self.model_calls = narrow(model_calls);
        self.tool_calls = narrow(tool_calls);
        if let (Some(l), Some(g)) = (self.cost.as_mut(), grant.cost) {
            *l = (*l - g).max(0.0);
        }
        self.waiting = self.waiting.saturating_sub(1);
    }

    /// The caps a [`Limits`] puts on a subagent.
    pub(crate) fn of(limits: &Limits) -> Pool {
        Pool {
            turns: Limits::bound(limits.max_turns),
            model_calls: Limits::bound(limits.max_model_calls),
            tool_calls: Limits::bound(limits.max_tool_calls),
            tokens: limits.max_tokens.filter(|&n| n > 0),
            cost: limits.cost_bound(),
            waiting: 0,
        }
    }

    /// The smaller of two caps, resource by resource.
    pub(crate) fn min(&self, other: &Pool) -> Pool {
        Pool {
            turns: min_opt(self.turns, other.turns),
            model_calls: min_opt(self.model_calls, other.model_calls),
            tool_calls: min_opt(self.tool_calls, other.tool_calls),
            tokens: min_opt(self.tokens, other.tokens),
            cost: min_opt(self.cost, other.cost),
            waiting: 0,
        }
    }
}

/// What the subagent calls of one batch share: the run's remaining budget when the batch
/// started, and the run's place in the tree.
pub(crate) struct Scope {
    /// The path of the run making the calls, from the top of its tree.
    pub(crate) path: String,
    pub(crate) sinks: Sinks,
    /// The depth of the run making the calls (0 for a top-level run).
    pub(crate) depth: u32,
    pub(crate) max_depth: u32,
    pub(crate) deadline: Option<Instant>,
    /// The run's grace period: how long its cancelled calls get to finish. A child's is at most
    /// half of it, so that a child cut short reports what it spent before its parent stops
    /// waiting for it.
    pub(crate) grace: std::time::Duration,
    pub(crate) pool: Mutex<Pool>,
    /// For a hand-off's call: the conversation it passes on (`RunMachine::handoff_history`).
    pub(crate) history: Option<Vec<crate::message::Message>>,
    /// What the subagent calls need of the run above its budget (the driver's `Tree`: the run's
    /// journal and approvals). Those are the seams' types, a layer above this one that the tool
    /// context carrying this scope must not name (it would close a circle of imports through
    /// the machine); the subagent tool, at the top, names them again with [`Scope::tree`].
    tree: Arc<dyn Any + Send + Sync>,
    /// The runs of the batch's subagents that returned, by call id, until the driver puts each
    /// on its call's outcome: a tool's output knows nothing of subagents.
    runs: Mutex<Vec<(String, SubagentRun)>>,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("depth", &self.depth)
            .field("max_depth", &self.max_depth)
            .finish_non_exhaustive()
    }
}

impl Scope {
    /// The handles of the run above, as the layer that put them here names them.
    pub(crate) fn tree<T: 'static>(&self) -> Option<&T> {
        self.tree.downcast_ref()
    }

    pub(crate) fn reserve(&self, cap: &Pool) -> Result<Pool, String> {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve(cap)
    }

    pub(crate) fn reserve_exact(&self, grant: &Pool) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve_exact(grant);
    }

    pub(crate) fn settle(&self, grant: &Pool, spent: &SubagentRun) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .settle(grant, spent);
    }

    /// A subagent's call returned: its run, for the call's outcome.
    pub(crate) fn finished(&self, call_id: &str, run: SubagentRun) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.retain(|(id, _)| id != call_id);
        runs.push((call_id.to_owned(), run));
    }

    /// The run a subagent's call returned, once.
    pub(crate) fn take_run(&self, call_id: &str) -> Option<SubagentRun> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let at = runs.iter().position(|(id, _)| id == call_id)?;
        Some(runs.swap_remove(at).1)
    }
}

/// Where a batch's subagent calls stand in the run: its path, sinks, depth, deadline, and the
/// handles of the run above (see [`Scope`]'s `tree`).
pub(crate) struct Place {
    pub(crate) path: String,
    pub(crate) sinks: Sinks,
    pub(crate) depth: u32,
    pub(crate) max_depth: u32,
    pub(crate) deadline: Option<Instant>,
    pub(crate) grace: std::time::Duration,
    pub(crate) tree: Arc<dyn Any + Send + Sync>,
    pub(crate) history: Option<Vec<crate::message::Message>>,
}

/// The scope of a batch's subagent calls, from the pool the machine gives them
/// (`RunMachine::subagent_pool`).
pub(crate) fn scope(place: Place, pool: Pool) -> Arc<Scope> {
    Arc::new(Scope {
        path: place.path,
        sinks: place.sinks,
        depth: place.depth,
        max_depth: place.max_depth,
        deadline: place.deadline,
        grace: place.grace,
        pool: Mutex::new(pool),
        history: place.history,
        tree: place.tree,
        runs: Mutex::new(Vec::new()),
    })
}
