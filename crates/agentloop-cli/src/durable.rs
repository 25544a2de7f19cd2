//! Durable runs from the command line: `run --journal`, `resume`, `approvals list`, `approve`,
//! and `journal list|show|fork`. The journal is SQLite (`agentloop-store`), written at the
//! durability level `--durability` or the agent file's `durability` names; the core decides
//! what a resumed (or forked) run does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop::journal::{Journal, JournaledRun};
use agentloop::permissions::{Answer, ApprovalRequest};
use agentloop::{RunOptions, RunOutcome, StopReason};
use agentloop_store::{Durability, JournalReader, SqliteJournal, WaitingCall};
use clap::{Args, Subcommand};

use crate::agent_file::AgentFile;
use crate::args::{AgentFileArg, ApprovalArgs, TraceArgs};
use crate::assemble;
use crate::error::CliError;
use crate::runs::{
    Shown, approval_for, exit_code, finish_trace, left_unfinished, print_outcome, run_sinks,
    stop_on_signals,
};

/// `agentloop resume`.
#[derive(Debug, Args)]
pub(crate) struct ResumeArgs {
    /// The run's id (or a unique prefix of it).
    run_id: String,
    #[command(flatten)]
    journal: JournalArg,
    /// Goes on even though the agent changed since the run started.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    pub go: GoOnArgs,
}

/// What `resume` and `journal fork` share: the agent, the output, the trace, approvals and the
/// journal's durability.
#[derive(Debug, Args)]
pub(crate) struct GoOnArgs {
    /// The agent file (the one the run was started with, by default).
    #[arg(long, value_name = "FILE")]
    agent: Option<PathBuf>,
    /// Prints exactly one JSON object on stdout when the run ends, and nothing else there.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Prints only the final output (warnings still go to stderr; AGENTLOOP_LOG=off hides them).
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    trace: TraceArgs,
    #[command(flatten)]
    approval: ApprovalArgs,
    #[command(flatten)]
    pub durability: DurabilityArg,
}

/// `--durability`, as the commands that write a journal take it.
#[derive(Debug, Args)]
pub(crate) struct DurabilityArg {
    /// What each journaled step survives before the run moves on: `process` (any kill of the
    /// process) or `power` (a power cut too: fsync'd, and the steps of runs that are ready
    /// together share one fsync). Default: the agent file's `durability`, else `power`.
    #[arg(long, value_name = "LEVEL")]
    durability: Option<Durability>,
}

impl DurabilityArg {
    /// The level a journal of `file`'s runs is written at.
    pub(crate) fn level(&self, file: &AgentFile) -> Durability {
        self.durability.or(file.spec.durability).unwrap_or_default()
    }
}

/// `--journal`, as every durable command but `run` takes it.
#[derive(Debug, Args)]
pub(crate) struct JournalArg {
    /// The journal (default: $AGENTLOOP_JOURNAL, else runs.db).
    #[arg(
        long = "journal",
        value_name = "PATH",
        env = "AGENTLOOP_JOURNAL",
        default_value = "runs.db"
    )]
    pub(crate) path: PathBuf,
}

impl JournalArg {
    /// The journal, to record answers in: a file that is no journal is refused, never made one.
    pub(crate) fn reader(&self) -> Result<JournalReader, CliError> {
        Ok(JournalReader::open(&self.path)?)
    }

    /// The journal, to read only: a file that is no journal is refused and left unchanged.
    pub(crate) fn read_only(&self) -> Result<JournalReader, CliError> {
        Ok(JournalReader::open_read_only(&self.path)?)
    }
}

/// `agentloop approvals`.
#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// Lists the calls suspended runs wait on, with the answers recorded so far.
    List(#[command(flatten)] WaitingArgs),
}

/// Where `approvals list` and `questions list` find the calls runs wait on, and how they print
/// them.
#[derive(Debug, Args)]
pub(crate) struct WaitingArgs {
    #[command(flatten)]
    journal: JournalArg,
    /// Prints JSON.
    #[arg(long)]
    json: bool,
    /// Lists what run `--run ID` (started with `agentloop submit`) waits on, through the
    /// Restate ingress at this URL (without one: $AGENTLOOP_RESTATE, else
    /// http://127.0.0.1:8080), instead of a journal's runs.
    #[arg(long, value_name = "URL", requires = "run", num_args = 0..=1, default_missing_value = "")]
    restate: Option<String>,
    /// The run, with `--restate`.
    #[arg(long, value_name = "ID", requires = "restate")]
    run: Option<String>,
}

impl WaitingArgs {
    /// The calls waited on (those `keep` takes), printed: as JSON, `none` when there are none,
    /// else one `line` each.
    pub(crate) async fn print(
        &self,
        keep: impl Fn(&WaitingCall) -> bool,
        none: &str,
        line: impl Fn(&WaitingCall) -> String,
    ) -> Result<i32, CliError> {
        let waiting = match (&self.restate, &self.run) {
            (Some(url), Some(run)) => crate::restate::waiting(url, run).await?,
            _ => self.journal.read_only()?.pending()?,
        };
        let waiting: Vec<WaitingCall> = waiting.into_iter().filter(|w| keep(w)).collect();
        if self.json {
            out!(
                "{}",
                serde_json::to_string_pretty(&waiting).unwrap_or_default()
            );
            return Ok(crate::error::code::OK);
        }
        if waiting.is_empty() {
            out!("{none}");
        }
        for w in &waiting {
            out!("{}", line(w));
        }
        Ok(crate::error::code::OK)
    }
}

/// `agentloop approve`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["allow", "deny"])))]
pub(crate) struct ApproveArgs {
    /// The run's id (or a unique prefix of it).
    run_id: String,
    /// The call to answer.
    #[arg(long = "call", value_name = "ID")]
    call_id: String,
    /// Lets the call run.
    #[arg(long)]
    allow: bool,
    /// Denies the call (the model reads that it was denied).
    #[arg(long)]
    deny: bool,
    /// Also for every later call of this tool: for the rest of the run, across its later
    /// suspensions and resumes (the journal keeps it), and, when the agent has a permission
    /// store, for its later runs too (saved to it as the run goes on).
    #[arg(long)]
    always: bool,
    #[command(flatten)]
    journal: JournalArg,
    /// Answers a run started with `agentloop submit`, through the Restate ingress at this URL
    /// (without one: $AGENTLOOP_RESTATE, else http://127.0.0.1:8080), instead of one in a
    /// journal.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    restate: Option<String>,
}

impl ApproveArgs {
    fn answer(&self) -> Answer {
        match (self.allow, self.always) {
            (true, false) => Answer::AllowOnce,
            (true, true) => Answer::AllowAlways,
            (false, false) => Answer::DenyOnce,
            (false, true) => Answer::DenyAlways,
        }
    }
}

/// For `approve --restate URL`: the run, the call, the answer and the ingress.
pub(crate) fn restate_answer(args: &ApproveArgs) -> Option<(String, String, Answer, String)> {
    let url = args.restate.clone()?;
    Some((
        args.run_id.clone(),
        args.call_id.clone(),
        args.answer(),
        url,
    ))
}

/// `agentloop journal`.
#[derive(Debug, Subcommand)]
pub(crate) enum JournalCommand {
    /// Lists the runs of a journal.
    List {
        #[command(flatten)]
        journal: JournalArg,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Shows one run's steps, checked: a damaged row is reported with its step, and the steps
    /// before it are shown.
    Show {
        /// The run's id (or a unique prefix of it).
        run_id: String,
        #[command(flatten)]
        journal: JournalArg,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Starts a new run from the state after step STEP of a journaled run (to try a different
    /// answer from there, or a changed tool) and drives it as `resume` does. The new run's
    /// header names its origin (`journal list` shows it); the first run is left as it is.
    Fork(ForkArgs),
}

/// `agentloop journal fork`.
#[derive(Debug, Args)]
pub(crate) struct ForkArgs {
    /// The run's id (or a unique prefix of it).
    run_id: String,
    /// The last step the new run shares with it (as `journal show` numbers them).
    #[arg(long, value_name = "STEP")]
    at: u64,
    #[command(flatten)]
    journal: JournalArg,
    #[command(flatten)]
    pub go: GoOnArgs,
}

/// Opens (or creates) a journal for writing, at `durability`.
pub(crate) fn open_journal(
    path: &Path,
    durability: Durability,
) -> Result<Arc<SqliteJournal>, CliError> {
    Ok(Arc::new(
        SqliteJournal::open(path)?.with_durability(durability),
    ))
}

/// The agent file's path as the journal keeps it: absolute, so `resume` finds it from anywhere.
pub(crate) fn origin(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// The calls a suspended run still waits on (none when the journal cannot be read).
pub(crate) fn waiting(journal: &Path, run_id: &str) -> Vec<ApprovalRequest> {
    JournalReader::open(journal)
        .and_then(|r| r.load(run_id))
        .map(|run| run.unanswered().cloned().collect())
        .unwrap_or_default()
}

/// After a journaled run, on stderr: its id, and how to go on when it waits for approvals.
pub(crate) fn how_to_go_on(
    outcome: &RunOutcome,
    journal: &Path,
    waiting: &[ApprovalRequest],
    quiet: bool,
) {
    let path = crate::terminal::shown_path(journal);
    let id = &outcome.run_id;
    if !quiet {
        err!("■ journaled as run {id} in {path}");
    }
    if outcome.stop_reason != StopReason::Suspended {
        return;
    }
    let questions = waiting.iter().filter(|w| w.question.is_some()).count();
    err!(
        "■ suspended: the run waits for approval of {} call(s) and the answer to {questions} question(s):",
        waiting.len() - questions
    );
    for w in waiting {
        match &w.question {
            Some(q) => err!(
                "    {}  question {:?}{}",
                w.call_id,
                q.text,
                q.schema
                    .as_ref()
                    .map(|s| format!("  schema {s}"))
                    .unwrap_or_default()
            ),
            None => err!("    {}  {} {}", w.call_id, w.tool, w.arguments),
        }
    }
    if questions < waiting.len() {
        err!(
            "  answer each:  agentloop approve {id} --call CALL_ID --allow|--deny [--always] --journal {path}"
        );
    }
    if questions > 0 {
        err!(
            "  and each question:  agentloop answer {id} --call CALL_ID --json JSON --journal {path}"
        );
    }
    err!("  then:         agentloop resume {id} --journal {path}");
}

/// Reads run `wanted` (an id or a unique prefix) off the async workers. The commands that write
/// the journal read it with a writer's access (still refusing a file that is no journal): the
/// connection that closes last folds the file's write-ahead log into it, which a read-only one
/// cannot do.
async fn read_run(path: &Path, wanted: &str) -> Result<JournaledRun, CliError> {
    let (path, wanted) = (path.to_path_buf(), wanted.to_owned());
    tokio::task::spawn_blocking(move || {
        let reader = JournalReader::open(&path)?;
        let run_id = reader.find(&wanted)?;
        reader.load(&run_id)
    })
    .await
    .map_err(|e| CliError::Io {
        message: format!("reading the journal failed: {e}"),
    })?
    .map_err(CliError::from)
}

/// The agent file a journaled run goes on with: `--agent`, else the one it started with.
fn agent_file(go: &GoOnArgs, run: &JournaledRun, journal: &Path) -> Result<AgentFile, CliError> {
    let path = match (&go.agent, &run.header.origin) {
        (Some(p), _) => p.clone(),
        (None, Some(origin)) => PathBuf::from(origin),
        (None, None) => {
            return Err(CliError::Usage {
                message: format!(
                    "the journal does not say which agent file run {} was started with: \
                     give --agent FILE",
                    run.header.run_id
                ),
            });
        }
    };
    let mut file = AgentFileArg { file: path }.load()?;
    file.protect(
        &[Some(journal.to_path_buf()), go.trace.trace.clone()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
    );
    Ok(file)
}

/// `agentloop resume`.
pub(crate) async fn resume(args: ResumeArgs) -> Result<i32, CliError> {
    let path = &args.journal.path;
    // The agent file (and so the journal's durability) is the run's: read it first. The run is
    // owned before its steps are read for good, so a process still driving it refuses this one
    // (journal.busy) rather than leaving it a stale state to resume from.
    let first = read_run(path, &args.run_id).await?;
    if let Some(parent) = &first.header.parent {
        // A subagent's run goes on with its parent, which resumes it.
        return Err(CliError::from(parent.not_resumable(&first.header.run_id)));
    }
    let file = agent_file(&args.go, &first, path)?;
    let journal = open_journal(path, args.go.durability.level(&file))?;
    journal.own(&first.header.run_id)?;
    let run = read_run(path, &first.header.run_id).await?;
    let elapsed = waited(path, &run);
    go_on(&args.go, file, journal, args.force, elapsed, |_| {
        Box::pin(async move { Ok(run) })
    })
    .await
}

/// A suspended run's clock ([`JournalReader::waited`]).
fn waited(path: &Path, run: &JournaledRun) -> Option<std::time::Duration> {
    JournalReader::open(path).ok()?.waited(run)
}

/// `agentloop journal fork`.
async fn fork(args: ForkArgs) -> Result<i32, CliError> {
    let path = &args.journal.path;
    let mut from = read_run(path, &args.run_id).await?;
    let file = agent_file(&args.go, &from, path)?;
    let journal = open_journal(path, args.go.durability.level(&file))?;
    from.steps
        .truncate(usize::try_from(args.at.saturating_add(1)).unwrap_or(usize::MAX));
    let (origin, at, writer) = (from.header.run_id, args.at, journal.clone());
    go_on(&args.go, file, journal, false, None, move |definition| {
        Box::pin(async move {
            let id = agentloop::ids::run_id();
            let run = writer.fork(&origin, at, &id, Some(definition)).await?;
            err!("■ forked run {origin} after step {at} as run {id}");
            Ok(run)
        })
    })
    .await
}

/// A run the caller has in hand (`start` gives it, from the agent's definition) goes on with
/// `file`'s agent in this process, journaled in `journal`; prints its outcome.
async fn go_on(
    go: &GoOnArgs,
    file: AgentFile,
    journal: Arc<SqliteJournal>,
    force: bool,
    elapsed: Option<std::time::Duration>,
    start: impl FnOnce(
        agentloop::journal::Definition,
    ) -> futures::future::BoxFuture<'static, Result<JournaledRun, CliError>>,
) -> Result<i32, CliError> {
    // A script goes on where the journal left it: `Agent::resume` asks the model.
    let model = assemble::model(&file)?;
    let progress = crate::logging::progress();
    let cancel = agentloop::CancellationToken::new();
    let approval = approval_for(&go.approval, go.json, &progress);
    // The trace before the servers, as for `run` (the journal is open already).
    let trace = go.trace.open()?;
    let mcp = assemble::StartedMcp::start(&file).await?;
    let agent = match assemble::agent(&file, model, &approval, &mcp) {
        Ok(agent) => agent,
        Err(e) => {
            mcp.shutdown().await;
            return Err(e);
        }
    };
    let run = match start(agent.definition().clone()).await {
        Ok(run) => run,
        Err(e) => {
            mcp.shutdown().await;
            return Err(e);
        }
    };
    let path = journal.path().to_path_buf();
    // Open until the servers are stopped, as for `run`: closing it deletes SQLite's `-wal` and
    // `-shm`, which drops a server's read-only binds of them.
    let journal_open = Arc::clone(&journal);
    let journal: Arc<dyn Journal> = journal;
    let run_id = run.header.run_id.clone();
    let stopped = stop_on_signals(cancel.clone(), true);
    let options = RunOptions {
        cancel: Some(cancel),
        sinks: run_sinks(&progress, trace.as_ref(), !go.json && !go.quiet),
        journal: Some(journal),
        ..RunOptions::default()
    };
    let running = async {
        match elapsed {
            Some(elapsed) => agent.resume_at(run, options, force, elapsed).await,
            None => agent.resume(run, options, force).await,
        }
    };
    // Dropped at the environment's stop, as `run --journal` does.
    let outcome = tokio::select! {
        biased;
        () = stopped.left_unfinished() => None,
        outcome = running => Some(outcome),
    };
    mcp.shutdown().await;
    drop(journal_open);
    let Some(outcome) = outcome else {
        return Err(left_unfinished(
            &stopped,
            run_id,
            Some(&path),
            trace.as_ref(),
            None,
        ));
    };
    let outcome = outcome?;
    if let Err(e) = finish_trace(trace.as_ref()) {
        err!("agentloop: warning: {e}");
    }
    let shown = Shown {
        json: go.json,
        quiet: go.quiet,
        dry_run: false,
        journal: Some(&path),
        priced: assemble::has_pricing(file.model()),
        unsaved: None,
    };
    print_outcome(&outcome, &shown, &progress);
    stopped.shown();
    Ok(exit_code(&outcome, &stopped))
}

/// `agentloop approvals list`.
pub(crate) async fn approvals(cmd: ApprovalsCommand) -> Result<i32, CliError> {
    let ApprovalsCommand::List(list) = cmd;
    list.print(|_| true, "no run waits for approval", approval_line)
        .await
}

/// One waiting call as `approvals list` shows it (a question as `questions list` does).
fn approval_line(w: &WaitingCall) -> String {
    if w.request.question.is_some() {
        return crate::questions::shown(w);
    }
    let answer = match w.answer {
        None => "waiting",
        Some(Answer::AllowOnce) => "allowed",
        Some(Answer::AllowAlways) => "allowed always",
        Some(Answer::DenyOnce) => "denied",
        Some(Answer::DenyAlways) => "denied always",
    };
    format!(
        "{}  {}  {}  {} {}{}",
        w.run_id,
        w.request.call_id,
        answer,
        w.request.tool,
        w.request.arguments,
        crate::questions::place(w)
    )
}

/// `agentloop approve`.
pub(crate) fn approve(args: &ApproveArgs) -> Result<i32, CliError> {
    let reader = args.journal.reader()?;
    let run_id = reader.find(&args.run_id)?;
    let asked = reader.load(&run_id)?;
    if asked
        .approvals
        .iter()
        .any(|a| a.request.call_id == args.call_id && a.request.question.is_some())
    {
        return Err(CliError::Usage {
            message: format!(
                "call {} of run {run_id} is a question: answer it with `agentloop answer {run_id} --call {} --json JSON`",
                args.call_id, args.call_id
            ),
        });
    }
    reader.answer(&run_id, &args.call_id, args.answer())?;
    what_is_left(&reader, &run_id, &args.journal.path)
}

/// After an answer (`approve`, `answer`), on stderr: the calls the run still waits on, or how
/// to resume it.
pub(crate) fn what_is_left(
    reader: &JournalReader,
    run_id: &str,
    journal: &Path,
) -> Result<i32, CliError> {
    let run = reader.load(run_id)?;
    let left: Vec<&str> = run.unanswered().map(|r| r.call_id.as_str()).collect();
    let path = crate::terminal::shown_path(journal);
    if left.is_empty() {
        err!("■ every call is answered: agentloop resume {run_id} --journal {path}");
    } else {
        err!("■ still waiting: {}", left.join(", "));
    }
    Ok(crate::error::code::OK)
}

/// `agentloop journal list|show|fork`.
pub(crate) async fn journal(cmd: JournalCommand) -> Result<i32, CliError> {
    match cmd {
        JournalCommand::Fork(args) => fork(args).await,
        JournalCommand::List { journal, json } => {
            let runs = journal.read_only()?.runs()?;
            if json {
                out!(
                    "{}",
                    serde_json::to_string_pretty(&runs).unwrap_or_default()
                );
            } else {
                for r in &runs {
                    out!(
                        "{}  {}  {}{}  {} steps{}{}",
                        r.run_id,
                        r.agent,
                        r.status,
                        r.stop_reason
                            .as_ref()
                            .map(|s| format!(" ({s})"))
                            .unwrap_or_default(),
                        r.steps,
                        r.forked_from
                            .as_ref()
                            .map(|f| format!("  forked from {} after step {}", f.run_id, f.step))
                            .unwrap_or_default(),
                        r.parent
                            .as_ref()
                            .map(|p| format!("  subagent of {p}"))
                            .unwrap_or_default()
                    );
                }
            }
            Ok(crate::error::code::OK)
        }
        JournalCommand::Show {
            run_id,
            journal,
            json,
        } => {
            let reader = journal.read_only()?;
            let run_id = reader.find(&run_id)?;
            let (run, damage) = reader.load_intact(&run_id)?;
            if json {
                let value = serde_json::json!({
                    "run_id": run.header.run_id,
                    "agent": run.header.agent,
                    "fingerprint": run.header.fingerprint,
                    "forked_from": reader.runs()?.into_iter().find(|r| r.run_id == run_id).and_then(|r| r.forked_from),
                    "status": run.status,
                    "steps": run.steps,
                    "approvals": run.approvals,
                    "damage": damage.as_ref().map(|e| serde_json::json!({"code": e.code(), "message": e.to_string()})),
                });
                out!("{value}");
            } else {
                out!(
                    "run {}  agent {}  {}  fingerprint {}",
                    run.header.run_id,
                    run.header.agent,
                    run.status.as_str(),
                    run.header.fingerprint
                );
                for (seq, step) in run.steps.iter().enumerate() {
                    let text = serde_json::to_string(&step.input).unwrap_or_default();
                    let short: String = text.chars().take(160).collect();
                    out!("{seq:>5}  {:>9.3}s  {short}", step.at.as_secs_f64());
                }
            }
            match damage {
                Some(e) => Err(CliError::Journal(e)),
                None => Ok(crate::error::code::OK),
            }
        }
    }
}
