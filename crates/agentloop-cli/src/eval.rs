//! `agentloop eval FILE --cases CASES`: every case of a dataset runs as an ordinary run of the
//! agent file (its limits and permissions, traced where asked), `--repeat` times, `--concurrency`
//! at a time, and is scored by its checks (`agentloop-eval`). The report is a table (or
//! `--json`), JUnit XML with `--junit`, and with `--baseline` what got worse is named; the exit
//! code says whether the suite passed and whether it regressed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop::{Agent, CancellationToken, EventSink, Model, RunOptions};
use agentloop_eval::{Dataset, EvalError, EvalOptions, Report, Suite, SuiteCase};
use agentloop_store::TraceSink;
use clap::Args;

use crate::agent_file::{AgentFile, Provider};
use crate::approval::NO_TERMINAL_REASON;
use crate::args::{AgentFileArg, ApprovalArgs, TraceArgs};
use crate::assemble::{self, Approval, StartedMcp};
use crate::error::{CliError, code};
use crate::runs::{Stop, finish_trace, stop_on_signals};
use crate::{durable, otel};

#[derive(Debug, Args)]
pub(crate) struct EvalArgs {
    #[command(flatten)]
    pub(crate) agent: AgentFileArg,
    /// The cases: TOML (`[[cases]]`) or JSON Lines (`.jsonl`), each an input (or a
    /// conversation), optional metadata, and its checks.
    #[arg(long, value_name = "PATH")]
    pub(crate) cases: PathBuf,
    /// Runs each case this many times (pass@k and pass^k are over them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) repeat: u32,
    /// Runs at most this many runs at a time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) concurrency: u32,
    /// Prints the report as one JSON object on stdout, and nothing else there.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also writes the report as JUnit XML to this file.
    #[arg(long, value_name = "PATH")]
    pub(crate) junit: Option<PathBuf>,
    /// Also writes the report's JSON to this file (a baseline for later runs).
    #[arg(long, value_name = "PATH")]
    pub(crate) report: Option<PathBuf>,
    /// Compares with an earlier report's JSON and names what got worse.
    #[arg(long, value_name = "PATH")]
    pub(crate) baseline: Option<PathBuf>,
    /// How far a pass rate may fall below the baseline's before it counts as worse (0 to 1):
    /// room for the spread of a real model's runs.
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    pub(crate) tolerance: f64,
    /// Nor counts a fall within this many standard errors of the difference of two pass rates
    /// (from each report's number of runs): room for a real model's spread that narrows as runs
    /// grow.
    #[arg(long, default_value_t = 0.0, value_parser = sigmas)]
    pub(crate) sigmas: f64,
    /// The share of runs that must pass for the suite to pass (0 to 1).
    #[arg(long, default_value_t = 1.0, value_parser = fraction)]
    pub(crate) min_pass_rate: f64,
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
    #[command(flatten)]
    pub(crate) approval: ApprovalArgs,
}

fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number from 0 to 1")),
    }
}

fn sigmas(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=10.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number from 0 to 10")),
    }
}

fn eval_error(e: EvalError) -> CliError {
    CliError::Eval {
        code: e.code(),
        message: e.to_string(),
    }
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError::Io {
        message: format!(
            "cannot write the {what} {}: {e}",
            crate::terminal::shown_path(path)
        ),
    }
}

/// Runs the evaluation.
pub(crate) async fn eval(args: EvalArgs) -> Result<i32, CliError> {
    let mut file = args.agent.load()?;
    // What the evaluation writes, which no tool of the agent or of a judge may write.
    let written = [
        args.trace.trace.clone(),
        args.report.clone(),
        args.junit.clone(),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    file.protect(&written);
    let dataset = Dataset::load(&args.cases).map_err(eval_error)?;
    let baseline = args.baseline.as_deref().map(read_baseline).transpose()?;
    // Nobody is asked during an evaluation: a call the file's permissions would ask about is
    // denied, as without a terminal, unless --yes.
    let approval = if args.approval.yes {
        Approval::Yes
    } else {
        Approval::Nobody(NO_TERMINAL_REASON)
    };
    // The trace before the servers (the judges' too): a server's view keeps only what exists
    // when it starts read-only.
    let trace = args.trace.open()?;
    let judges = Judges::start(&dataset, &written).await?;
    let suite = suite(&dataset, &judges.agents)?;
    let mcp = StartedMcp::start(&file).await?;
    // The trace stays open until the servers are stopped: closing a SQLite trace deletes its
    // `-wal` and `-shm`, which drops a server's read-only binds of them.
    let result = run_suite(
        &args,
        &file,
        &dataset,
        &suite,
        &approval,
        &mcp,
        trace.clone(),
    )
    .await;
    mcp.shutdown().await;
    judges.shutdown().await;
    drop(trace);
    let (mut report, stopped) = result?;
    if let Some(b) = &baseline {
        report.regressions = agentloop_eval::compare(
            &report,
            b,
            agentloop_eval::Tolerance {
                margin: args.tolerance,
                sigmas: args.sigmas,
            },
        );
    }
    write_outputs(&args, &report)?;
    if args.json {
        out!("{}", report.to_json().map_err(eval_error)?);
    } else {
        print!("{}", report.render_table());
    }
    // A suite the environment stopped (its runs cancelled, the report of what ran written) exits
    // with the signal's code, as it did when the signal killed the process.
    Ok(if let Some(stop) = stopped {
        stop.exit_code()
    } else if !report.regressions.is_empty() {
        code::EVAL_REGRESSED
    } else if report.summary.pass_rate + 1e-9 < args.min_pass_rate {
        code::EVAL_FAILED
    } else {
        code::OK
    })
}

fn read_baseline(path: &Path) -> Result<Report, CliError> {
    let text =
        agentloop_cli::text_file::read_text(path, agentloop_cli::text_file::MAX_REPORT_BYTES)
            .map_err(|e| {
                eval_error(EvalError::Baseline {
                    path: crate::terminal::shown_path(path),
                    message: e.to_string(),
                })
            })?;
    Report::from_json(&text, &crate::terminal::shown_path(path)).map_err(eval_error)
}

fn suite(dataset: &Dataset, judges: &HashMap<String, Agent>) -> Result<Suite, CliError> {
    let cases = dataset
        .cases
        .iter()
        .map(|case| {
            Ok(SuiteCase {
                case: case.clone(),
                checks: agentloop_eval::build_checks(case, judges).map_err(eval_error)?,
            })
        })
        .collect::<Result<_, CliError>>()?;
    Ok(Suite {
        name: dataset.name.clone(),
        cases,
    })
}

async fn run_suite(
    args: &EvalArgs,
    file: &AgentFile,
    dataset: &Dataset,
    suite: &Suite,
    approval: &Approval,
    mcp: &StartedMcp,
    trace: Option<Arc<TraceSink>>,
) -> Result<(Report, Option<Stop>), CliError> {
    let scripted = *file.model().provider.get_ref() == Provider::Scripted;
    // A live model is shared by every run; a scripted one is read afresh for each, so that each
    // run plays its script from the start (the case's own script, where it names one).
    let shared = if scripted {
        None
    } else {
        Some(assemble::agent(
            file,
            assemble::model(file)?,
            approval,
            mcp,
        )?)
    };
    let otel = args.trace.open_otel(file)?;
    let cancel = CancellationToken::new();
    let stopped = stop_on_signals(cancel.clone(), false);
    let origin = durable::origin(&file.path);
    if !args.json {
        err!(
            "agentloop: eval {}: {} cases × {} runs, {} at a time",
            suite.name,
            suite.cases.len(),
            args.repeat,
            args.concurrency
        );
    }
    let options = EvalOptions {
        repeat: args.repeat,
        concurrency: usize::try_from(args.concurrency).unwrap_or(1),
    };
    let report = agentloop_eval::evaluate(suite, options, |request| {
        let mut sinks: Vec<Arc<dyn EventSink>> = Vec::new();
        sinks.extend(trace.iter().map(|t| t.clone() as Arc<dyn EventSink>));
        sinks.extend(otel.as_ref().map(otel::Otel::sink));
        let run_options = RunOptions {
            cancel: Some(cancel.clone()),
            sinks,
            origin: Some(origin.clone()),
            ..RunOptions::default()
        };
        let agent = match &shared {
            Some(a) => Ok(a.clone()),
            None => case_model(file, dataset, request.case.script.as_deref())
                .and_then(|model| assemble::agent(file, model, approval, mcp))
                .map_err(|e| e.to_string()),
        };
        let shown = !args.json;
        async move {
            let agent = agent?;
            let outcome = agent
                .run_with(
                    request.case.conversation.clone(),
                    request.case.input_message(),
                    run_options,
                )
                .await;
            if shown {
                // A line a run as it ends, so a long suite on a real model shows it is moving.
                err!(
                    "  {} #{}: {} ({} turns, {:.1}s)",
                    request.case.name,
                    request.repeat,
                    outcome.stop_reason,
                    outcome.turns,
                    outcome.duration.as_secs_f64()
                );
            }
            Ok(outcome)
        }
    })
    .await;
    if let Err(e) = finish_trace(trace.as_ref()) {
        err!("agentloop: warning: {e}");
    }
    // The report is not shown yet, but the runs are over: a stop signal does not wait for
    // the spans' export.
    stopped.shown();
    if let Some(o) = otel {
        o.finish();
    }
    Ok((report, stopped.by_environment()))
}

/// The scripted model of one run: the case's script (relative to the dataset), or the file's.
fn case_model(
    file: &AgentFile,
    dataset: &Dataset,
    script: Option<&str>,
) -> Result<Arc<dyn Model>, CliError> {
    let model = match script {
        Some(s) => crate::agent_file::model::read_script(&dataset.dir.join(s))
            .map_err(|message| CliError::Setup { message })?
            .streaming(file.model().stream.unwrap_or(true)),
        None => assemble::scripted_model(file)?,
    };
    Ok(Arc::new(model))
}

fn write_outputs(args: &EvalArgs, report: &Report) -> Result<(), CliError> {
    if let Some(path) = &args.junit {
        let xml = report.to_junit().map_err(eval_error)?;
        std::fs::write(path, xml).map_err(|e| io_error("JUnit XML", path, e))?;
    }
    if let Some(path) = &args.report {
        let json = report.to_json().map_err(eval_error)?;
        std::fs::write(path, json + "\n").map_err(|e| io_error("report", path, e))?;
    }
    Ok(())
}

/// The judges' agents, by the agent file a dataset names (relative to the dataset), each file
/// loaded and its servers started once.
struct Judges {
    agents: HashMap<String, Agent>,
    started: Vec<StartedMcp>,
}

impl Judges {
    /// Starts the judges the cases name, each protected from writing `written`.
    async fn start(dataset: &Dataset, written: &[PathBuf]) -> Result<Judges, CliError> {
        let mut judges = Judges {
            agents: HashMap::new(),
            started: Vec::new(),
        };
        let named = dataset
            .cases
            .iter()
            .flat_map(|c| &c.checks)
            .filter_map(|c| match c {
                agentloop_eval::CheckSpec::Judge(j) => Some(j.agent.clone()),
                _ => None,
            });
        for name in named.collect::<Vec<_>>() {
            if judges.agents.contains_key(&name) {
                continue;
            }
            let mut file = AgentFileArg {
                file: dataset.dir.join(&name),
            }
            .load()?;
            file.protect(written);
            let mcp = StartedMcp::start(&file).await?;
            let built = assemble::model(&file).and_then(|m| {
                assemble::agent(&file, m, &Approval::Nobody(NO_TERMINAL_REASON), &mcp)
            });
            judges.started.push(mcp);
            match built {
                Ok(agent) => {
                    judges.agents.insert(name, agent);
                }
                Err(e) => {
                    judges.shutdown().await;
                    return Err(e);
                }
            }
        }
        Ok(judges)
    }

    async fn shutdown(&self) {
        for m in &self.started {
            m.shutdown().await;
        }
    }
}

/// Keeps in the viewer's run list (`{runs: [summary]}`) only an evaluation's runs and their
/// subagents', marks each of the evaluation's own with its case, repeat and verdict, and puts the
/// evaluation's figures beside them.
pub(crate) fn mark_runs(body: &mut serde_json::Value, report: &Report) {
    let mut of_eval: HashMap<&str, serde_json::Value> = HashMap::new();
    for c in &report.cases {
        for r in c.runs.iter().filter(|r| !r.run_id.is_empty()) {
            of_eval.insert(
                &r.run_id,
                serde_json::json!({
                    "case": c.name,
                    "repeat": r.repeat,
                    "passed": r.passed,
                    "failures": r.failures(),
                }),
            );
        }
    }
    let Some(runs) = body.get_mut("runs").and_then(|r| r.as_array_mut()) else {
        return;
    };
    let id_of = |r: &serde_json::Value| r["id"].as_str().unwrap_or_default().to_owned();
    let parent_of = |r: &serde_json::Value| r["parent_id"].as_str().map(str::to_owned);
    // Runs are listed in the order they started, so a subagent comes after its parent.
    let mut kept: std::collections::HashSet<String> =
        of_eval.keys().map(|k| (*k).to_owned()).collect();
    for r in runs.iter() {
        if parent_of(r).is_some_and(|p| kept.contains(&p)) {
            kept.insert(id_of(r));
        }
    }
    runs.retain(|r| kept.contains(&id_of(r)));
    for r in runs.iter_mut() {
        if let (Some(mark), Some(map)) = (of_eval.get(id_of(r).as_str()), r.as_object_mut()) {
            map.insert("eval".into(), mark.clone());
        }
    }
    if let Some(map) = body.as_object_mut() {
        map.insert(
            "eval".into(),
            serde_json::json!({
                "suite": report.suite,
                "passed_runs": report.summary.passed_runs,
                "runs": report.summary.runs,
            }),
        );
    }
}
