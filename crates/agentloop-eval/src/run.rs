//! Running a suite: every case as an ordinary run, `repeat` times, at most `concurrency` runs at
//! a time; each run scored by its case's checks. How a run is made is the caller's (the CLI
//! assembles an agent file; [`evaluate_agent`] runs an [`Agent`]), so a case's run is exactly a
//! run as it would be outside the evaluation.

use std::future::Future;

use agentloop::{Agent, RunOptions, RunOutcome};
use futures::StreamExt;

use crate::dataset::Case;
use crate::report::{CheckResult, Report, RunReport};
use crate::suite::{Suite, SuiteCase};

/// How often and how many at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalOptions {
    /// Runs of each case (at least 1).
    pub repeat: u32,
    /// Runs at a time (at least 1).
    pub concurrency: usize,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            repeat: 1,
            concurrency: 1,
        }
    }
}

/// One run to make: the case and which repeat it is (from 1).
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The case.
    pub case: Case,
    /// Which repeat, from 1.
    pub repeat: u32,
}

/// Runs every case `repeat` times through `run` and scores each run. `run` gives the run's
/// outcome, or why no run could be made (a setup error: reported as a failed run).
pub async fn evaluate<F, Fut>(suite: &Suite, options: EvalOptions, run: F) -> Report
where
    F: Fn(RunRequest) -> Fut,
    Fut: Future<Output = Result<RunOutcome, String>>,
{
    let repeat = options.repeat.max(1);
    let requests = suite
        .cases
        .iter()
        .enumerate()
        .flat_map(|(i, c)| (1..=repeat).map(move |r| (i, c, r)));
    let run = &run;
    let mut results: Vec<(usize, RunReport)> = futures::stream::iter(requests)
        .map(|(i, c, r)| async move {
            let request = RunRequest {
                case: c.case.clone(),
                repeat: r,
            };
            let report = match run(request).await {
                Ok(outcome) => score_run(c, r, &outcome).await,
                Err(message) => RunReport::not_run(r, message),
            };
            (i, report)
        })
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    results.sort_by_key(|(i, r)| (*i, r.repeat));
    Report::build(&suite.name, repeat, &suite.cases, results)
}

async fn score_run(c: &SuiteCase, repeat: u32, outcome: &RunOutcome) -> RunReport {
    let mut checks = Vec::with_capacity(c.checks.len());
    for check in &c.checks {
        checks.push(CheckResult {
            check: check.label(),
            score: check.score(&c.case, outcome).await,
        });
    }
    RunReport::of(repeat, outcome, checks)
}

/// Evaluates an agent built in code: each case runs as `agent.run_with(conversation, input)`,
/// with `options` giving each run its sinks (a trace) and the like.
pub async fn evaluate_agent(
    agent: &Agent,
    suite: &Suite,
    options: EvalOptions,
    run_options: impl Fn(&RunRequest) -> RunOptions,
) -> Report {
    evaluate(suite, options, |request| {
        let options = run_options(&request);
        async move {
            Ok(agent
                .run_with(
                    request.case.conversation.clone(),
                    request.case.input_message(),
                    options,
                )
                .await)
        }
    })
    .await
}
