//! `[limits]`: each bound in range, and a cost budget only where answers are priced.

use super::{span_of, valid_seconds};
use crate::agent_file::MAX_DEPTH;
use crate::agent_file::check::Problems;
use crate::agent_file::spec::{LimitsSpec, ModelSpec, Provider};

pub(super) fn check_limits(limits: &LimitsSpec, problems: &mut Problems) {
    if let Some(c) = &limits.max_concurrency
        && *c.get_ref() == 0
    {
        problems.at(
            "limits.max_concurrency",
            span_of(c),
            "max_concurrency must be at least 1",
        );
    }
    if let Some(t) = &limits.stuck_loop_threshold
        && *t.get_ref() == 1
    {
        problems.at(
            "limits.stuck_loop_threshold",
            span_of(t),
            "stuck_loop_threshold must be at least 2 (or 0 to turn the rule off): at 1 every call would be a loop",
        );
    }
    if let Some(d) = &limits.max_depth
        && *d.get_ref() > MAX_DEPTH
    {
        problems.at(
            "limits.max_depth",
            span_of(d),
            format!("max_depth is at most {MAX_DEPTH}"),
        );
    }
    // 0 lifts the deadline, as it lifts every other bound here.
    if let Some(t) = &limits.timeout_secs
        && *t.get_ref() != 0.0
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            "limits.timeout_secs",
            span_of(t),
            "timeout_secs must be a positive number of seconds, at most a year (or 0 for no deadline)",
        );
    }
    if let Some(c) = &limits.max_cost_usd
        && !(c.get_ref().is_finite() && *c.get_ref() >= 0.0)
    {
        problems.at(
            "limits.max_cost_usd",
            span_of(c),
            "max_cost_usd must be zero (no bound) or more",
        );
    }
}

/// A cost budget needs a price for the model, or it could never hold: the file's
/// `[model] price`, or the built-in table's for a live model it knows.
/// A budget of 0 is none, and needs no price.
pub(super) fn check_budget_priced(limits: &LimitsSpec, model: &ModelSpec, problems: &mut Problems) {
    let Some(budget) = &limits.max_cost_usd else {
        return;
    };
    if limits.cost_bound().is_none() {
        return;
    }
    if crate::agent_file::model::price(model).is_some() {
        return;
    }
    let which = match (model.provider.get_ref(), &model.name) {
        (Provider::Scripted, _) => "the scripted model has no price".to_owned(),
        (_, Some(name)) => format!(
            "the model {:?} is not in the built-in price table",
            name.get_ref()
        ),
        (_, None) => "the model has no price".to_owned(),
    };
    problems.at(
        "limits.max_cost_usd",
        span_of(budget),
        format!(
            "max_cost_usd needs a price for the model, and {which}: give it in [model] as \
             `price = {{ input = 0.40, output = 1.60 }}` (USD per million tokens; optional \
             `cached_input`, `cache_write`)"
        ),
    );
}
