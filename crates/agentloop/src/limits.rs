//! Limits and prices. Every limit is optional and a hard stop, checked before the work it would
//! admit; when one stops a run, the outcome says which, with its bound, what was consumed and what
//! was requested.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::Usage;

/// The default cap on tool calls running at once: high enough that a model's parallel calls really
/// run concurrently, low enough that a runaway batch cannot exhaust the process.
pub const DEFAULT_MAX_CONCURRENCY: usize = 16;
/// The default number of times a turn may repeat (the same calls, the same results) before the
/// run is stopped as stuck.
pub const DEFAULT_STUCK_LOOP_THRESHOLD: u32 = 3;
/// The default bound on turns. The loops we compare with use 10 to 25; a coding or research agent
/// that reads, edits and checks needs the upper end, and the stuck-loop rule stops a loop long
/// before it.
pub const DEFAULT_MAX_TURNS: u32 = 25;
/// The default bound on tool calls: four parallel calls a turn over the default turns, the
/// upper end of the 50 to 100 that the loops we compare with use.
pub const DEFAULT_MAX_TOOL_CALLS: u32 = 100;
/// The default bound on model calls: the default turns twice over, leaving room for re-asked
/// answers (a structured answer that failed its schema, a cut answer asked again, a rejected one).
pub const DEFAULT_MAX_MODEL_CALLS: u32 = 50;
/// How long cancelled or timed-out handlers get to finish before they are abandoned.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(2);
/// How often an invalid structured answer goes back to the model before the run fails.
pub const DEFAULT_OUTPUT_RETRIES: u32 = 2;
/// How deep a tree of subagents may grow by default: a run's subagents are at depth 1, theirs at
/// 2, and so on. Three levels cover a coordinator, its workers and their helpers; deeper trees are
/// more often a model delegating in circles than a design.
pub const DEFAULT_MAX_DEPTH: u32 = 3;

fn default_max_depth() -> u32 {
    DEFAULT_MAX_DEPTH
}

/// The limits of one run.
///
/// Every run is bounded even when nothing is set: [`Limits::default`] allows 25 turns (the loops we
/// compare with use 10 to 25; a coding agent that reads, edits and checks needs the upper end),
/// 100 tool calls (four parallel calls a turn) and 50 model calls (room for re-asked answers). `None` (or `Some(0)`) lifts a bound; [`Limits::unlimited`]
/// lifts them all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// The most turns (model calls with their tool batches). A response on the last turn does not
    /// start tools whose results no model call would read.
    pub max_turns: Option<u32>,
    /// The most tool calls that may run.
    pub max_tool_calls: Option<u32>,
    /// The most model calls (including those that re-ask for a valid structured answer, and
    /// compaction's summary calls: a summary is made only while the turn's own call still fits
    /// after it, and otherwise the compaction drops old tool results instead).
    pub max_model_calls: Option<u32>,
    /// The most tokens over the run: input plus output, counted the same on every provider (input
    /// includes cached input and cache writes; see [`Usage`]). An answer a response cache served
    /// ([`crate::model::cache`]) spent none: it counts in the run's usage, not here
    /// ([`crate::RunOutcome::cached_tokens`]). The response that crosses it does not run its
    /// tools.
    pub max_tokens: Option<u64>,
    /// The most USD the run may spend.
    pub max_cost_usd: Option<f64>,
    /// Wall-clock deadline from the start of the run. It interrupts a model call or running tools
    /// at their next await: a tool handler that blocks its thread delays it until it returns,
    /// unless its tool runs on a task of its own (`ToolBuilder::own_task`) or it hands the
    /// blocking work to `tokio::task::spawn_blocking`.
    #[serde(default, with = "crate::serde_duration::option")]
    pub timeout: Option<Duration>,
    /// How many times in a row a turn may come back the same before the run stops as stuck: the
    /// same calls (tool and arguments; a poller's arguments aside) with the same results, or a
    /// cycle of two or three such turns repeated. A turn without tool calls, a new user message
    /// or a different result starts the count again. 0 disables the rule; 1 is refused.
    pub stuck_loop_threshold: u32,
    /// The most tool calls running at once.
    pub max_concurrency: usize,
    /// How long cancelled handlers get to finish. A subagent's is at most half its parent's, so
    /// that a child cut short with its parent returns (with what it spent) before the parent
    /// stops waiting for it.
    #[serde(with = "crate::serde_duration")]
    pub grace_period: Duration,
    /// How often an invalid structured answer (or one a hook rejected) is sent back before the
    /// run fails.
    pub output_retries: u32,
    /// What a limit does to the run: stop at once (the default), or ask the model for a last
    /// answer from the partial work.
    #[serde(default)]
    pub on_limit: OnLimit,
    /// How deep its tree of subagents may grow ([`DEFAULT_MAX_DEPTH`]): a subagent call that would
    /// start deeper is an error result the model reads. A subagent keeps the smaller of its own
    /// and its parent's.
    #[serde(default = "default_max_depth")]
    pub max_depth: u32,
}

/// What happens when a limit stops a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    /// Stop at once; calls not yet run are answered "not run".
    #[default]
    Stop,
    /// When the turn, tool-call, token, cost or stuck-loop limit stops the run, answer its
    /// pending calls "stopped" and make one last model call with tools disabled, so that the
    /// caller gets a final answer from the partial work. The stop reason still names the limit.
    /// The model-call limit and the deadline stop at once, and so does any limit reached when
    /// no model call is left (the turn limit reached with the model-call limit).
    Answer,
}

impl Limits {
    /// No bound on turns, tool calls, model calls, tokens, cost or time; the stuck-loop rule and
    /// the execution settings keep their defaults.
    pub fn unlimited() -> Self {
        Limits {
            max_turns: None,
            max_tool_calls: None,
            max_model_calls: None,
            ..Limits::default()
        }
    }

    /// Checks the limits for values that cannot work: a stuck-loop threshold of 1 (every call
    /// would be a loop), a negative or NaN cost bound.
    pub fn check(&self) -> Result<(), String> {
        if self.stuck_loop_threshold == 1 {
            return Err(
                "stuck_loop_threshold must be at least 2 (or 0 to turn the rule off)".into(),
            );
        }
        if let Some(c) = self.max_cost_usd
            && (c.is_nan() || c < 0.0)
        {
            return Err(format!(
                "max_cost_usd must be a number of at least 0, not {c}"
            ));
        }
        Ok(())
    }

    /// The cost bound in force: `None` and `Some(0)` both mean none.
    pub(crate) fn cost_bound(&self) -> Option<f64> {
        self.max_cost_usd.filter(|&m| m > 0.0)
    }

    /// The deadline in force: `None` and `Some(0)` both mean none.
    pub(crate) fn deadline(&self) -> Option<Duration> {
        self.timeout.filter(|t| !t.is_zero())
    }

    /// A bound in force: `None` and `Some(0)` both mean none.
    pub(crate) fn bound(v: Option<u32>) -> Option<u32> {
        v.filter(|&n| n > 0)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_turns: Some(DEFAULT_MAX_TURNS),
            max_tool_calls: Some(DEFAULT_MAX_TOOL_CALLS),
            max_model_calls: Some(DEFAULT_MAX_MODEL_CALLS),
            max_tokens: None,
            max_cost_usd: None,
            timeout: None,
            stuck_loop_threshold: DEFAULT_STUCK_LOOP_THRESHOLD,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            grace_period: DEFAULT_GRACE_PERIOD,
            output_retries: DEFAULT_OUTPUT_RETRIES,
            on_limit: OnLimit::Stop,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

/// Which limit stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// `max_turns`.
    Turns,
    /// `max_tool_calls`.
    ToolCalls,
    /// `max_model_calls`.
    ModelCalls,
    /// `max_tokens`.
    Tokens,
    /// `max_cost_usd`.
    Cost,
    /// The deadline.
    Deadline,
    /// The stuck-loop rule.
    StuckLoop,
}

impl LimitKind {
    /// The stable word.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Turns => "max_turns",
            LimitKind::ToolCalls => "max_tool_calls",
            LimitKind::ModelCalls => "max_model_calls",
            LimitKind::Tokens => "max_tokens",
            LimitKind::Cost => "max_cost_usd",
            LimitKind::Deadline => "deadline",
            LimitKind::StuckLoop => "stuck_loop",
        }
    }
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit that stopped a run: its bound, what was consumed, and what the refused work asked for.
/// Costs are in USD, the deadline in milliseconds, the others in their own units.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LimitHit {
    /// Which limit.
    pub limit: LimitKind,
    /// Its bound.
    pub bound: f64,
    /// What was consumed when it stopped the run.
    pub consumed: f64,
    /// What the refused work asked for.
    pub requested: f64,
}

impl fmt::Display for LimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reached (bound {}, consumed {}, requested {})",
            self.limit, self.bound, self.consumed, self.requested
        )
    }
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// Per million input tokens.
    pub input: f64,
    /// Per million output tokens.
    pub output: f64,
    /// Per million cached input tokens (defaults to the input price).
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Per million tokens written to the cache (defaults to the input price).
    #[serde(default)]
    pub cache_write: Option<f64>,
}

impl Price {
    /// A price: input and output per million tokens.
    pub const fn new(input: f64, output: f64) -> Self {
        Price {
            input,
            output,
            cached_input: None,
            cache_write: None,
        }
    }

    /// With a cached-input price.
    #[must_use]
    pub const fn with_cached_input(mut self, cached: f64) -> Self {
        self.cached_input = Some(cached);
        self
    }

    /// The cost of a usage, counted as [`Usage`] says on every provider: the input tokens not
    /// read from or written to the cache at the input price, cache reads and writes at theirs.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let uncached = usage
            .input_tokens
            .saturating_sub(usage.cached_input_tokens)
            .saturating_sub(usage.cache_write_tokens);
        (uncached as f64 * self.input
            + usage.cached_input_tokens as f64 * self.cached_input.unwrap_or(self.input)
            + usage.cache_write_tokens as f64 * self.cache_write.unwrap_or(self.input)
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

/// Prices the tokens of a model call.
pub trait Pricing: Send + Sync {
    /// The cost in USD, or `None` when the model is not priced.
    fn cost(&self, provider: &str, model: &str, usage: &Usage) -> Option<f64>;
}

impl<F> Pricing for F
where
    F: Fn(&str, &str, &Usage) -> Option<f64> + Send + Sync,
{
    fn cost(&self, provider: &str, model: &str, usage: &Usage) -> Option<f64> {
        self(provider, model, usage)
    }
}

/// A table of prices by model name. A model matches its exact name, or else the entry its name
/// is a dated snapshot or alias of: the entry's name followed by one of
///
/// - `-YYYY-MM-DD` (OpenAI: `gpt-4.1-mini-2025-04-14` finds `gpt-4.1-mini`),
/// - `-YYYYMMDD` (Anthropic: `claude-3-5-sonnet-20241022` finds `claude-3-5-sonnet`),
/// - `@YYYYMMDD` or `@YYYY-MM-DD` (Vertex AI: `claude-3-5-sonnet@20240620`),
/// - `-latest` (`claude-3-5-sonnet-latest`).
///
/// Nothing else: a name that only starts like an entry is another model, often at another price
/// (`o1-pro` is not `o1`, `gpt-4o-mini` is not `gpt-4o`), so it is unpriced until it has an entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PriceTable {
    prices: HashMap<String, Price>,
}

impl PriceTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a model's price.
    pub fn insert(&mut self, model: impl Into<String>, price: Price) -> &mut Self {
        self.prices.insert(model.into(), price);
        self
    }

    /// Adds or replaces a model's price (builder style).
    #[must_use]
    pub fn with(mut self, model: impl Into<String>, price: Price) -> Self {
        self.insert(model, price);
        self
    }

    /// Extends with another table, whose entries win.
    pub fn extend(&mut self, other: PriceTable) {
        self.prices.extend(other.prices);
    }

    /// The price of a model: its exact name, or the base name of a dated snapshot (see
    /// [`PriceTable`]).
    pub fn get(&self, model: &str) -> Option<&Price> {
        self.prices
            .get(model)
            .or_else(|| snapshot_base(model).and_then(|base| self.prices.get(base)))
    }
}

/// The model a snapshot name stands for: the name without its `-YYYY-MM-DD`, `-YYYYMMDD`,
/// `@YYYYMMDD`, `@YYYY-MM-DD` or `-latest` suffix; `None` for a name with no such suffix.
fn snapshot_base(model: &str) -> Option<&str> {
    if let Some(base) = model.strip_suffix("-latest") {
        return Some(base);
    }
    let is_date = |d: &str| {
        let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
        digits(d, 8)
            || matches!(d.split('-').collect::<Vec<_>>().as_slice(),
                [y, m, day] if digits(y, 4) && digits(m, 2) && digits(day, 2))
    };
    let (base, date) = match model.rsplit_once('@') {
        Some(split) => split,
        None => {
            // `-YYYYMMDD` is the last dash-separated part; `-YYYY-MM-DD` the last three.
            let compact = model.rsplit_once('-')?;
            if is_date(compact.1) {
                compact
            } else {
                let dashed = model.len().checked_sub(11)?;
                let (base, rest) = model.split_at_checked(dashed)?;
                (base, rest.strip_prefix('-')?)
            }
        }
    };
    (!base.is_empty() && is_date(date)).then_some(base)
}

impl Pricing for PriceTable {
    /// Prices by model name alone: usage counts the same way on every provider.
    fn cost(&self, _provider: &str, model: &str, usage: &Usage) -> Option<f64> {
        self.get(model).map(|p| p.cost(usage))
    }
}
