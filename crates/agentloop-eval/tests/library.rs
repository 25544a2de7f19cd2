#![allow(clippy::unwrap_used, clippy::indexing_slicing)]
//! The library, as a Rust user writes an evaluation: a dataset and a check of their own in code,
//! an agent run by `evaluate_agent` with repeats, and the report compared with a baseline.

use std::collections::HashMap;

use agentloop::model::ModelResponse;
use agentloop::testing::FunctionModel;
use agentloop::{Agent, Message, RunOutcome};
use agentloop_eval::{
    Case, Check, CheckSpec, Dataset, EvalOptions, Score, Suite, SuiteCase, Tolerance,
};
use futures::future::BoxFuture;

/// A check of the user's own: the answer is at most this many words.
struct AtMostWords(usize);

impl Check for AtMostWords {
    fn label(&self) -> String {
        format!("at most {} words", self.0)
    }

    fn score<'a>(&'a self, _case: &'a Case, run: &'a RunOutcome) -> BoxFuture<'a, Score> {
        let words = run
            .output
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .count();
        Box::pin(async move { Score::of(words <= self.0, format!("{words} words")) })
    }
}

/// An agent whose model echoes the last user message.
fn echo() -> Agent {
    Agent::builder()
        .model(FunctionModel::new(|request| {
            let last = request
                .messages
                .iter()
                .rev()
                .find(|m| matches!(m, Message::User { .. }))
                .map(Message::text)
                .unwrap_or_default();
            Ok(ModelResponse::text(format!("you said: {last}")))
        }))
        .build()
        .unwrap()
}

fn suite(dataset: &Dataset) -> Suite {
    let cases = dataset
        .cases
        .iter()
        .map(|case| {
            let mut checks = agentloop_eval::build_checks(case, &HashMap::new()).unwrap();
            checks.push(Box::new(AtMostWords(4)));
            SuiteCase {
                case: case.clone(),
                checks,
            }
        })
        .collect();
    Suite {
        name: dataset.name.clone(),
        cases,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dataset_and_a_check_written_in_code_score_an_agents_runs() {
    let dataset = Dataset::new(
        "echo",
        vec![
            Case::new("short", "hello")
                .check(CheckSpec::StopReason("finished".into()))
                .check(CheckSpec::Equals("you said: hello".into())),
            Case::new("long", "one two three four")
                .check(CheckSpec::Regex("^you said: one".into())),
        ],
    )
    .unwrap();
    let suite = suite(&dataset);
    let options = EvalOptions {
        repeat: 2,
        concurrency: 3,
    };
    let report =
        agentloop_eval::evaluate_agent(&echo(), &suite, options, |_| Default::default()).await;
    assert_eq!(report.summary.runs, 4);
    assert_eq!(report.summary.passed_runs, 2);
    let short = &report.cases[0];
    assert_eq!(short.pass_rate, 1.0);
    assert_eq!(short.checks[2].check, "at most 4 words");
    let long = &report.cases[1];
    assert_eq!(long.pass_rate, 0.0);
    assert_eq!(long.checks[0].pass_rate, 1.0, "the regex holds");
    assert_eq!(
        long.runs[0].failures(),
        ["at most 4 words: 6 words".to_owned()]
    );
    assert_eq!(
        long.runs.iter().map(|r| r.repeat).collect::<Vec<_>>(),
        [1, 2]
    );

    // The same suite against itself is no worse; against a report where every run passed, the
    // long case is named.
    let json = report.to_json().unwrap();
    let again = agentloop_eval::Report::from_json(&json, "mem").unwrap();
    assert!(agentloop_eval::compare(&report, &again, Tolerance::default()).is_empty());
    let mut perfect = again;
    for c in &mut perfect.cases {
        c.pass_rate = 1.0;
    }
    perfect.summary.pass_rate = 1.0;
    let worse = agentloop_eval::compare(&report, &perfect, Tolerance::default());
    let named: Vec<&str> = worse.iter().map(|r| r.message.as_str()).collect();
    assert_eq!(
        named,
        [
            "the suite's pass rate fell from 100% to 50%",
            "case long: its pass rate fell from 100% to 0%"
        ]
    );
}
