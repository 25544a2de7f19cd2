#![allow(clippy::unwrap_used, clippy::indexing_slicing)]
//! The library, as a Rust user writes an evaluation: a dataset and a check of their own in code,
//! an agent run by `evaluate_agent` with repeats, and the report compared with a baseline.

use std::collections::HashMap;

use agentloop::model::ModelResponse;
use agentloop::permissions::{Permission, PermissionGate, PermissionStore};
use agentloop::testing::FunctionModel;
use agentloop::{Agent, Limits, Message, RunOutcome, Tool, ToolOutput};
use agentloop_eval::{
    Case, Check, CheckSpec, Dataset, EvalOptions, JudgeSpec, Report, Score, Suite, SuiteCase,
    Tolerance, ToolMatch, Trajectory,
};
use futures::future::BoxFuture;
use serde_json::json;

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

/// The suite of a dataset with its built-in checks only, judges found in `judges`.
fn built(dataset: &Dataset, judges: &HashMap<String, Agent>) -> Suite {
    let cases = dataset
        .cases
        .iter()
        .map(|case| SuiteCase {
            case: case.clone(),
            checks: agentloop_eval::build_checks(case, judges).unwrap(),
        })
        .collect();
    Suite {
        name: dataset.name.clone(),
        cases,
    }
}

/// The report of one run of each case of `dataset` by `agent`.
async fn evaluated(agent: &Agent, dataset: &Dataset, judges: &HashMap<String, Agent>) -> Report {
    agentloop_eval::evaluate_agent(
        agent,
        &built(dataset, judges),
        EvalOptions::default(),
        |_| Default::default(),
    )
    .await
}

/// An agent whose model answers every request with `answer`.
fn answering(answer: &'static str) -> Agent {
    Agent::builder()
        .model(FunctionModel::new(move |_| Ok(ModelResponse::text(answer))))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_case_without_checks_fails_a_run_that_did_not_finish() {
    // Inputs alone: each case is checked for a finished run, so an agent whose every run hits
    // its turn limit passes none of them.
    let dataset = Dataset::from_jsonl(
        "{\"name\": \"a\", \"input\": \"go\"}\n{\"name\": \"b\", \"input\": \"go on\"}\n",
        "inputs.jsonl",
    )
    .unwrap();
    assert_eq!(
        dataset.cases[0].checks,
        [CheckSpec::StopReason("finished".into())]
    );
    let looping = Agent::builder()
        .model(FunctionModel::new(|_| {
            Ok(ModelResponse::tool_calls([("c1", "noop", "{}")]))
        }))
        .tool(Tool::dynamic(
            "noop",
            "Does nothing.",
            json!({"type": "object"}),
            |_, _| async { Ok(ToolOutput::text("nothing")) },
        ))
        .limits(Limits {
            max_turns: Some(1),
            ..Limits::default()
        })
        .build()
        .unwrap();
    let report = evaluated(&looping, &dataset, &HashMap::new()).await;
    assert_eq!(report.summary.runs, 2);
    assert_eq!(report.summary.passed_runs, 0, "{}", report.render_table());
    assert!(!report.all_passed());
    assert_eq!(
        report.cases[0].runs[0].failures(),
        ["stop_reason finished: the run stopped: max_turns".to_owned()]
    );
    // A case with checks of its own keeps them alone.
    let own = Dataset::from_jsonl(
        "{\"name\": \"a\", \"input\": \"go\", \"checks\": [{\"max_turns\": 3}]}\n",
        "own.jsonl",
    )
    .unwrap();
    assert_eq!(own.cases[0].checks, [CheckSpec::MaxTurns(3)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn called_and_trajectory_count_only_calls_that_ran_unless_a_status_is_named() {
    // The model asks for a denied deploy, a tool that does not exist, then a check that runs.
    let model = FunctionModel::new(|request| {
        if request.messages.len() > 1 {
            return Ok(ModelResponse::text("done"));
        }
        Ok(ModelResponse::tool_calls([
            ("c1", "deploy", r#"{"env": "prod"}"#),
            ("c2", "launch", "{}"),
            ("c3", "status", "{}"),
        ]))
    });
    let tool = |name: &str| {
        Tool::dynamic(name, "A tool.", json!({"type": "object"}), |_, _| async {
            Ok(ToolOutput::text("ok"))
        })
    };
    let mut store = PermissionStore::new(Permission::Allow);
    store.tool_default("deploy", Permission::Deny);
    let agent = Agent::builder()
        .model(model)
        .tools([tool("deploy"), tool("status")])
        .gate(PermissionGate::new(store))
        .build()
        .unwrap();
    let called = |status: Option<&str>| {
        CheckSpec::Called(ToolMatch {
            tool: "deploy".into(),
            args: json!({"env": "prod"}).as_object().unwrap().clone(),
            args_match: Default::default(),
            status: status.map(|s| serde_json::from_value(json!(s)).unwrap()),
            result_contains: None,
            times: None,
        })
    };
    let trajectory = |tools: &[&str]| {
        CheckSpec::Trajectory(Trajectory {
            tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            order: agentloop_eval::Order::Exact,
        })
    };
    let dataset = Dataset::new(
        "calls",
        vec![
            Case::new("c", "deploy")
                .check(called(None))
                .check(called(Some("denied")))
                .check(trajectory(&["status"]))
                .check(trajectory(&["deploy", "launch", "status"]))
                .check(CheckSpec::NotCalled("deploy".into())),
        ],
    )
    .unwrap();
    let report = evaluated(&agent, &dataset, &HashMap::new()).await;
    let checks = &report.cases[0].runs[0].checks;
    let passed: Vec<bool> = checks.iter().map(|c| c.score.passed).collect();
    assert_eq!(passed, [false, true, true, false, false], "{checks:#?}");
    assert!(
        checks[0]
            .score
            .reason
            .contains("deploy called 0 times (1 more never ran: denied)"),
        "{}",
        checks[0].score.reason
    );
    assert_eq!(
        checks[2].score.reason,
        "the calls were [status] (never ran: deploy denied, launch rejected)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_judges_own_pass_decides_and_min_score_decides_a_verdict_without_one() {
    let judges: HashMap<String, Agent> = [
        (
            "harsh".to_owned(),
            answering(r#"{"pass": false, "score": 0.7, "reason": "wrong city"}"#),
        ),
        (
            "scoring".to_owned(),
            answering(r#"{"score": 0.7, "reason": "close enough"}"#),
        ),
    ]
    .into_iter()
    .collect();
    let judge = |agent: &str, min_score: f64| {
        CheckSpec::Judge(JudgeSpec {
            agent: agent.into(),
            rubric: "Names the city.".into(),
            min_score: Some(min_score),
        })
    };
    let dataset = Dataset::new(
        "judged",
        vec![
            Case::new("c", "Where?")
                .check(judge("harsh", 0.6))
                .check(judge("scoring", 0.6))
                .check(judge("scoring", 0.8)),
        ],
    )
    .unwrap();
    let report = evaluated(&answering("Lisbon"), &dataset, &judges).await;
    let checks = &report.cases[0].runs[0].checks;
    let passed: Vec<bool> = checks.iter().map(|c| c.score.passed).collect();
    assert_eq!(passed, [false, true, false], "{checks:#?}");
    assert_eq!(checks[0].score.reason, "the judge: wrong city");
    // Two judges with one agent share a label, not a key.
    let rates = &report.cases[0].checks;
    assert_eq!(rates[1].check, rates[2].check);
    assert_ne!(rates[1].key, rates[2].key);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_baseline_compares_checks_whose_labels_are_cut_the_same_each_with_its_own() {
    // The same first 40 characters, where a label is cut.
    let short = "The temperature in Paris today is 18 °C and sunny";
    let long = "The temperature in Paris today is 18 °C and sunny, with a breeze";
    let dataset = Dataset::new(
        "weather",
        vec![
            Case::new("paris", short)
                .check(CheckSpec::Contains(short.into()))
                .check(CheckSpec::Contains(long.into())),
        ],
    )
    .unwrap();
    let report = evaluated(&echo(), &dataset, &HashMap::new()).await;
    let rates = &report.cases[0].checks;
    assert_eq!(rates[0].check, rates[1].check, "both labels are cut short");
    assert_eq!((rates[0].pass_rate, rates[1].pass_rate), (1.0, 0.0));
    // Before, the long one passed too: its fall is named, though the short one still passes.
    let mut before = agentloop_eval::Report::from_json(&report.to_json().unwrap(), "mem").unwrap();
    before.cases[0].checks[1].pass_rate = 1.0;
    let worse = agentloop_eval::compare(&report, &before, Tolerance::default());
    let named: Vec<Option<&str>> = worse.iter().map(|r| r.check.as_deref()).collect();
    assert_eq!(named, [Some(rates[1].check.as_str())], "{worse:#?}");
    // A baseline written before keys were kept matches by label, in order.
    for c in &mut before.cases[0].checks {
        c.key.clear();
    }
    assert_eq!(
        agentloop_eval::compare(&report, &before, Tolerance::default()).len(),
        1
    );
}
