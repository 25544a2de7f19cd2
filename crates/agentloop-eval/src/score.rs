//! What a check gives ([`Score`]: passed, a score, the reason, its own cost) and the [`Check`]
//! trait a user's own checks implement.

use agentloop::RunOutcome;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::dataset::Case;

/// What a check found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// Whether the run passes the check.
    pub passed: bool,
    /// A score from 0 to 1 (1 or 0 for the checks that only pass or fail; a judge's own score).
    pub score: f64,
    /// Why: what was found against what was wanted.
    pub reason: String,
    /// What the check itself cost (a judge's run), in USD; kept apart from the case's cost.
    #[serde(default)]
    pub cost_usd: f64,
    /// The tokens the check itself spent (a judge's run).
    #[serde(default)]
    pub tokens: u64,
}

impl Score {
    /// A pass, with its reason.
    pub fn pass(reason: impl Into<String>) -> Score {
        Score::of(true, reason)
    }

    /// A failure, with its reason.
    pub fn fail(reason: impl Into<String>) -> Score {
        Score::of(false, reason)
    }

    /// A pass or a failure.
    pub fn of(passed: bool, reason: impl Into<String>) -> Score {
        Score {
            passed,
            score: if passed { 1.0 } else { 0.0 },
            reason: reason.into(),
            cost_usd: 0.0,
            tokens: 0,
        }
    }
}

/// A check on one run of a case. Object safe, so a suite holds built-in and users' checks alike.
pub trait Check: Send + Sync {
    /// The check's label in the report: short, and the same from run to run.
    fn label(&self) -> String;

    /// What the check is, in full: a baseline matches checks by it. Two checks of a case may
    /// share a shortened label (two long `contains`, two judges with one agent); their keys
    /// differ. The label by default.
    fn key(&self) -> String {
        self.label()
    }

    /// Scores one run of `case`.
    fn score<'a>(&'a self, case: &'a Case, run: &'a RunOutcome) -> BoxFuture<'a, Score>;
}
