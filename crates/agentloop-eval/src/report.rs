//! The report of an evaluation: each run with its checks' scores, each case's pass rate (and per
//! check), pass@k and pass^k over the repeats, the mean and spread of cost, tokens, turns and
//! time; the same as a terminal table, JSON (what `--baseline` reads back) and JUnit XML.

use std::fmt::Write as _;

use agentloop::RunOutcome;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::EvalError;
use crate::score::Score;
use crate::suite::SuiteCase;

/// The report's format version; a baseline of another version is refused.
pub const REPORT_VERSION: u32 = 1;

/// An evaluation's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The report's format version ([`REPORT_VERSION`]).
    pub version: u32,
    /// The suite's name.
    pub suite: String,
    /// Runs of each case.
    pub repeat: u32,
    /// Over all cases.
    pub summary: Summary,
    /// Each case, in the dataset's order.
    pub cases: Vec<CaseReport>,
    /// What got worse against a baseline (empty without one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regressions: Vec<Regression>,
}

/// Something that got worse.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Regression {
    /// The case, unless it is the suite's pass rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case: Option<String>,
    /// The check, when it is a check's pass rate within a case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// The pass rate in the baseline.
    pub baseline: f64,
    /// The pass rate now (0 for a case that is gone).
    pub current: f64,
    /// What got worse, in words.
    pub message: String,
}

/// The whole suite's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Cases.
    pub cases: usize,
    /// Runs made.
    pub runs: usize,
    /// Runs that passed every check.
    pub passed_runs: usize,
    /// `passed_runs / runs`.
    pub pass_rate: f64,
    /// The k of pass@k and pass^k: the repeats.
    pub k: u32,
    /// The mean over cases of pass@k: the chance that at least one of k runs passes.
    pub pass_at_k: f64,
    /// The mean over cases of pass^k: the chance that all k runs pass.
    pub pass_hat_k: f64,
    /// USD a run (the runs' own; the judges' are apart).
    pub cost_usd: Stat,
    /// Tokens a run.
    pub tokens: Stat,
    /// Turns a run.
    pub turns: Stat,
    /// Seconds a run.
    pub seconds: Stat,
    /// What the judges cost, over all runs.
    pub judge_cost_usd: f64,
    /// The judges' tokens, over all runs.
    pub judge_tokens: u64,
}

/// Mean and spread of a figure over runs.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Stat {
    /// The mean.
    pub mean: f64,
    /// The sample standard deviation (0 with one run).
    pub stddev: f64,
    /// The least.
    pub min: f64,
    /// The most.
    pub max: f64,
}

impl Stat {
    /// The figure over these values.
    pub fn of(values: &[f64]) -> Stat {
        let n = values.len();
        if n == 0 {
            return Stat::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Stat {
            mean,
            stddev: var.sqrt(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// One case over its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    /// The case's name.
    pub name: String,
    /// The case's metadata.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// Runs that passed every check.
    pub passed_runs: usize,
    /// `passed_runs` over the runs.
    pub pass_rate: f64,
    /// pass@k, k the repeats.
    pub pass_at_k: f64,
    /// pass^k, k the repeats.
    pub pass_hat_k: f64,
    /// Each check's pass rate over the runs.
    pub checks: Vec<CheckRate>,
    /// USD a run.
    pub cost_usd: Stat,
    /// Tokens a run.
    pub tokens: Stat,
    /// Turns a run.
    pub turns: Stat,
    /// Seconds a run.
    pub seconds: Stat,
    /// Each run.
    pub runs: Vec<RunReport>,
}

/// A check's pass rate over a case's runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRate {
    /// The check's label (short: two checks of a case may share it).
    pub check: String,
    /// The check in full ([`crate::Check::key`]: a built-in check's JSON), what a baseline
    /// matches it by; empty in a report written before it was kept, matched by label then.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Runs it passed.
    pub passed: usize,
    /// `passed` over the runs.
    pub pass_rate: f64,
}

/// One run of a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Which repeat, from 1.
    pub repeat: u32,
    /// The run's id (in the trace, when there is one); empty when no run was made.
    pub run_id: String,
    /// Whether every check passed (and a run was made).
    pub passed: bool,
    /// Why the run stopped (`not_run` when none could be made).
    pub stop_reason: String,
    /// The output, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The run's error, or why no run was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// USD.
    pub cost_usd: f64,
    /// Tokens, input and output.
    pub tokens: u64,
    /// Turns.
    pub turns: u32,
    /// The tools called, in order.
    pub tool_calls: Vec<String>,
    /// Seconds.
    pub seconds: f64,
    /// Each check's score.
    pub checks: Vec<CheckResult>,
}

/// A check's score on one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The check's label.
    pub check: String,
    /// What it found.
    #[serde(flatten)]
    pub score: Score,
}

impl RunReport {
    /// A run's report from its outcome and its checks' scores.
    pub fn of(repeat: u32, outcome: &RunOutcome, checks: Vec<CheckResult>) -> RunReport {
        RunReport {
            repeat,
            run_id: outcome.run_id.clone(),
            passed: checks.iter().all(|c| c.score.passed),
            stop_reason: outcome.stop_reason.as_str().to_owned(),
            output: outcome.output.clone(),
            error: outcome.error.as_ref().map(ToString::to_string),
            cost_usd: outcome.cost_usd,
            tokens: outcome.usage.total_tokens(),
            turns: outcome.turns,
            tool_calls: outcome
                .tool_calls
                .iter()
                .map(|c| c.tool.to_string())
                .collect(),
            seconds: outcome.duration.as_secs_f64(),
            checks,
        }
    }

    /// A run that could not be made: it fails, with the reason.
    pub fn not_run(repeat: u32, message: String) -> RunReport {
        RunReport {
            repeat,
            run_id: String::new(),
            passed: false,
            stop_reason: "not_run".into(),
            output: None,
            error: Some(message),
            cost_usd: 0.0,
            tokens: 0,
            turns: 0,
            tool_calls: Vec::new(),
            seconds: 0.0,
            checks: Vec::new(),
        }
    }

    /// The reasons it failed, one line each: the failed checks, or why no run was made.
    pub fn failures(&self) -> Vec<String> {
        if self.stop_reason == "not_run" {
            return vec![format!(
                "no run: {}",
                self.error.as_deref().unwrap_or_default()
            )];
        }
        self.checks
            .iter()
            .filter(|c| !c.score.passed)
            .map(|c| format!("{}: {}", c.check, c.score.reason))
            .collect()
    }
}

/// pass@k from n runs of which c passed: the chance that at least one of k runs drawn passes
/// (the unbiased estimator of Chen et al., 2021).
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if k == 0 || n < k {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c + 1)..=n).fold(1.0, |p, i| p * (1.0 - k as f64 / i as f64))
}

/// pass^k from n runs of which c passed: the chance that all of k runs drawn pass.
pub fn pass_hat_k(n: usize, c: usize, k: usize) -> f64 {
    if k == 0 || n < k || c < k {
        return 0.0;
    }
    (0..k).fold(1.0, |p, i| p * (c - i) as f64 / (n - i) as f64)
}

fn stats(runs: &[&RunReport]) -> [Stat; 4] {
    let of =
        |f: &dyn Fn(&RunReport) -> f64| Stat::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
    [
        of(&|r| r.cost_usd),
        of(&|r| r.tokens as f64),
        of(&|r| f64::from(r.turns)),
        of(&|r| r.seconds),
    ]
}

fn rate(passed: usize, of: usize) -> f64 {
    if of == 0 {
        0.0
    } else {
        passed as f64 / of as f64
    }
}

impl Report {
    /// The report of these runs (sorted by case, then repeat).
    pub(crate) fn build(
        suite: &str,
        repeat: u32,
        cases: &[SuiteCase],
        runs: Vec<(usize, RunReport)>,
    ) -> Report {
        let k = repeat as usize;
        let mut by_case: Vec<Vec<RunReport>> = cases.iter().map(|_| Vec::new()).collect();
        for (i, r) in runs {
            if let Some(list) = by_case.get_mut(i) {
                list.push(r);
            }
        }
        let reports: Vec<CaseReport> = cases
            .iter()
            .zip(by_case)
            .map(|(c, runs)| {
                let n = runs.len();
                let passed = runs.iter().filter(|r| r.passed).count();
                let checks = c
                    .checks
                    .iter()
                    .enumerate()
                    .map(|(j, check)| {
                        let ok = runs
                            .iter()
                            .filter(|r| r.checks.get(j).is_some_and(|s| s.score.passed))
                            .count();
                        CheckRate {
                            check: check.label(),
                            key: check.key(),
                            passed: ok,
                            pass_rate: rate(ok, n),
                        }
                    })
                    .collect();
                let refs: Vec<&RunReport> = runs.iter().collect();
                let [cost_usd, tokens, turns, seconds] = stats(&refs);
                CaseReport {
                    name: c.case.name.clone(),
                    metadata: c.case.metadata.clone(),
                    passed_runs: passed,
                    pass_rate: rate(passed, n),
                    pass_at_k: pass_at_k(n, passed, k),
                    pass_hat_k: pass_hat_k(n, passed, k),
                    checks,
                    cost_usd,
                    tokens,
                    turns,
                    seconds,
                    runs,
                }
            })
            .collect();
        let all: Vec<&RunReport> = reports.iter().flat_map(|c| &c.runs).collect();
        let passed_runs = all.iter().filter(|r| r.passed).count();
        let [cost_usd, tokens, turns, seconds] = stats(&all);
        let mean = |f: &dyn Fn(&CaseReport) -> f64| {
            rate(1, reports.len()) * reports.iter().map(f).sum::<f64>()
        };
        let summary = Summary {
            cases: reports.len(),
            runs: all.len(),
            passed_runs,
            pass_rate: rate(passed_runs, all.len()),
            k: repeat,
            pass_at_k: mean(&|c| c.pass_at_k),
            pass_hat_k: mean(&|c| c.pass_hat_k),
            cost_usd,
            tokens,
            turns,
            seconds,
            judge_cost_usd: all
                .iter()
                .flat_map(|r| &r.checks)
                .map(|c| c.score.cost_usd)
                .sum(),
            judge_tokens: all
                .iter()
                .flat_map(|r| &r.checks)
                .map(|c| c.score.tokens)
                .sum(),
        };
        Report {
            version: REPORT_VERSION,
            suite: suite.to_owned(),
            repeat,
            summary,
            cases: reports,
            regressions: Vec::new(),
        }
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> Result<String, EvalError> {
        serde_json::to_string_pretty(self).map_err(|e| EvalError::Report {
            message: e.to_string(),
        })
    }

    /// A report read back from its JSON (a baseline).
    pub fn from_json(text: &str, path: &str) -> Result<Report, EvalError> {
        let report: Report = serde_json::from_str(text).map_err(|e| EvalError::Baseline {
            path: path.into(),
            message: e.to_string(),
        })?;
        if report.version != REPORT_VERSION {
            return Err(EvalError::Baseline {
                path: path.into(),
                message: format!(
                    "report version {}, this agentloop writes {REPORT_VERSION}",
                    report.version
                ),
            });
        }
        Ok(report)
    }

    /// True when every run passed every check.
    pub fn all_passed(&self) -> bool {
        self.summary.passed_runs == self.summary.runs
    }

    /// The report as a table for the terminal: a line a case, the failed runs' reasons under
    /// it, then the suite's figures and what got worse.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let width = self
            .cases
            .iter()
            .map(|c| c.name.chars().count())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:<width$}  {:>6}  {:>9}  {:>9}  {:>6}  {:>8}",
            "case", "pass", "cost $", "tokens", "turns", "seconds"
        );
        for c in &self.cases {
            let _ = writeln!(
                out,
                "{:<width$}  {:>6}  {:>9}  {:>9}  {:>6}  {:>8}",
                c.name,
                format!("{}/{}", c.passed_runs, c.runs.len()),
                spread(c.cost_usd, 4),
                spread(c.tokens, 0),
                spread(c.turns, 1),
                spread(c.seconds, 2),
            );
            for r in c.runs.iter().filter(|r| !r.passed) {
                for f in r.failures() {
                    let _ = writeln!(out, "    ✗ run {}: {f}", r.repeat);
                }
            }
        }
        let s = &self.summary;
        let _ = writeln!(
            out,
            "\n{}: {}/{} runs passed ({:.1}%) over {} cases",
            self.suite,
            s.passed_runs,
            s.runs,
            100.0 * s.pass_rate,
            s.cases
        );
        if self.repeat > 1 {
            let _ = writeln!(
                out,
                "pass@{k} {:.3}, pass^{k} {:.3}",
                s.pass_at_k,
                s.pass_hat_k,
                k = self.repeat
            );
        }
        let _ = writeln!(
            out,
            "a run: cost ${} tokens {} turns {} seconds {}",
            spread(s.cost_usd, 4),
            spread(s.tokens, 0),
            spread(s.turns, 1),
            spread(s.seconds, 2)
        );
        if s.judge_tokens > 0 || s.judge_cost_usd > 0.0 {
            let _ = writeln!(
                out,
                "the judges: ${:.4}, {} tokens (not in the runs' cost)",
                s.judge_cost_usd, s.judge_tokens
            );
        }
        for r in &self.regressions {
            let _ = writeln!(out, "worse than the baseline: {}", r.message);
        }
        out
    }
}

/// `mean±stddev`, or the mean alone when there is no spread.
fn spread(s: Stat, decimals: usize) -> String {
    if s.stddev > 0.0 {
        format!("{:.decimals$}±{:.decimals$}", s.mean, s.stddev)
    } else {
        format!("{:.decimals$}", s.mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_and_pass_hat_k_follow_their_definitions() {
        // 3 runs, 1 passed, k = 3: one of three passes for sure; all three never.
        assert!((pass_at_k(3, 1, 3) - 1.0).abs() < 1e-12);
        assert!(pass_hat_k(3, 1, 3).abs() < 1e-12);
        // 4 runs, 2 passed, k = 2: 1 - C(2,2)/C(4,2) = 5/6; C(2,2)/C(4,2) = 1/6.
        assert!((pass_at_k(4, 2, 2) - 5.0 / 6.0).abs() < 1e-12);
        assert!((pass_hat_k(4, 2, 2) - 1.0 / 6.0).abs() < 1e-12);
        assert!(pass_at_k(5, 0, 3).abs() < 1e-12);
        assert!((pass_hat_k(5, 5, 3) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_spread_is_the_sample_standard_deviation() {
        let s = Stat::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((s.mean - 5.0).abs() < 1e-12);
        assert!((s.stddev - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!((s.min, s.max), (2.0, 9.0));
        assert_eq!(Stat::of(&[]), Stat::default());
    }
}
