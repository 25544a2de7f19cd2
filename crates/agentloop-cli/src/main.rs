//! `agentloop`: run, chat with, plan and trace agents written as TOML agent files.
#![forbid(unsafe_code)]

/// Prints a line on stdout. A stdout closed early (`agentloop ... | head`) ends the output, not
/// the process with a panic as `println!` would.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod agent_file;
mod approval;
mod assemble;
mod completions;
mod durable;
mod error;
mod init;
mod live;
mod mcp;
mod otel;
mod permission_file;
mod permission_paths;
mod plan;
mod render;
mod restate;
mod sessions;
mod terminal;
mod viewer;

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use agentloop::{CancellationToken, EventSink, Message, RunOptions, RunOutcome};
use agentloop_store::{TraceOptions, TraceSink};
use clap::{Arg, Args, CommandFactory, Parser, Subcommand};

use crate::agent_file::{AgentFile, LoadError, Provider};
use crate::approval::{
    AnswerLines, CancelSlot, ChannelLines, Console, DRY_RUN_REASON, NO_TERMINAL_REASON, StdinLines,
    TerminalPrompter,
};
use crate::assemble::Approval;
use crate::error::{CliError, EXIT_CODES_HELP, code, outcome_exit_code};
use crate::render::Progress;

/// Runs bounded, tool-using LLM agents described in TOML agent files.
#[derive(Debug, Parser)]
#[command(name = "agentloop", version, about, after_help = EXIT_CODES_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs an agent on one input.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// A conversation in the terminal: each line is one input, the session kept across inputs.
    #[command(after_help = EXIT_CODES_HELP)]
    Chat(ChatArgs),
    /// Shows what the agent is (model, tools with schemas, limits) and what would be sent; never
    /// needs credentials, makes no request and runs no tool.
    #[command(visible_alias = "inspect", after_help = EXIT_CODES_HELP)]
    Plan(PlanArgs),
    /// Reads trace files written with `run --trace`.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Goes on with a journaled run (`run --journal`) after a crash, a kill or a suspension.
    #[command(after_help = EXIT_CODES_HELP)]
    Resume(durable::ResumeArgs),
    /// Lists the tool calls that suspended runs wait on.
    #[command(subcommand)]
    Approvals(durable::ApprovalsCommand),
    /// Answers a tool call a suspended run waits on.
    Approve(durable::ApproveArgs),
    /// Reads a journal: its runs, and one run's steps (checked).
    #[command(subcommand)]
    Journal(durable::JournalCommand),
    /// Stored conversations (`run`/`chat --session NAME`): list, show, delete, fork.
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// The agent file's MCP servers: `mcp list FILE` prints each one's tools with their schemas.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Writes a starter agent (agent file, a command tool, a scripted model) that runs at once,
    /// and prints the command that runs it.
    Init(init::InitArgs),
    /// Prints the shell completion script for bash, zsh, fish, elvish or powershell.
    Completions(completions::CompletionsArgs),
    /// Serves agents as a Restate service endpoint: their runs journaled by Restate, each step
    /// once, going on in another worker when one dies.
    Serve(restate::ServeArgs),
    /// Starts a run through the Restate ingress and prints its id.
    Submit(restate::SubmitArgs),
    /// Follows a run started with `submit` to its end, and prints its outcome as `run` does.
    #[command(after_help = EXIT_CODES_HELP)]
    Attach(restate::AttachArgs),
}

#[derive(Debug, Args)]
#[command(mut_arg("durability", |a| a.requires("journal")))]
struct RunArgs {
    #[command(flatten)]
    agent: AgentFileArg,
    /// The input text.
    #[arg(long, conflicts_with = "input_file")]
    input: Option<String>,
    /// Reads the input from this file (stdin is read when neither --input nor --input-file is given).
    #[arg(long)]
    input_file: Option<PathBuf>,
    /// Prints exactly one JSON object on stdout when the run ends, and nothing else there.
    #[arg(long, conflicts_with = "quiet")]
    json: bool,
    /// Prints only the final output.
    #[arg(long, short)]
    quiet: bool,
    /// Runs nothing with side effects: a scripted agent runs its script with every tool skipped;
    /// a live agent prints the first request it would send (secrets redacted) and exits.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    trace: TraceArgs,
    #[command(flatten)]
    approval: ApprovalArgs,
    /// Makes the run durable: each step is written to this SQLite journal before the run moves
    /// on (`agentloop resume` goes on after a crash), and a call that needs approval suspends
    /// the run instead of being denied (`agentloop approvals list`).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["dry_run", "session"])]
    journal: Option<PathBuf>,
    #[command(flatten)]
    durability: durable::DurabilityArg,
    #[command(flatten)]
    session: sessions::SessionArgs,
}

#[derive(Debug, Args)]
#[command(mut_args(chat_wording))]
struct ChatArgs {
    #[command(flatten)]
    agent: AgentFileArg,
    #[command(flatten)]
    trace: TraceArgs,
    #[command(flatten)]
    approval: ApprovalArgs,
    #[command(flatten)]
    session: sessions::SessionArgs,
}

/// `chat`'s own help for two of the flags it shares with `run`: it traces every run of the
/// conversation, and has no --json.
fn chat_wording(arg: Arg) -> Arg {
    match arg.get_id().as_str() {
        "trace" => {
            arg.help("Records the conversation's runs to this trace file (.ndjson, or .sqlite/.db)")
        }
        "yes" => arg.help(
            "Approves every tool call the agent file's `[permissions]` would ask about, this once \
             (a `deny` still denies). Without it, an asked call is put to you in a terminal, and \
             denied without one",
        ),
        _ => arg,
    }
}

#[derive(Debug, Args)]
struct PlanArgs {
    #[command(flatten)]
    agent: AgentFileArg,
    /// Prints the plan as JSON.
    #[arg(long)]
    json: bool,
}

/// The agent file, the argument of `run`, `chat` and `plan`.
#[derive(Debug, Args)]
struct AgentFileArg {
    /// The agent file.
    file: PathBuf,
}

impl AgentFileArg {
    /// Reads and checks the agent file.
    fn load(&self) -> Result<AgentFile, CliError> {
        AgentFile::load(&self.file).map_err(|e| match e {
            LoadError::Read { .. } => CliError::AgentFileUnreadable {
                message: e.to_string(),
            },
            LoadError::Invalid(p) => CliError::AgentFile(p),
        })
    }
}

/// `--trace` and `--trace-payloads`, as `run` and `chat` take them (`chat` words `--trace` its
/// own way: see [`chat_wording`]).
#[derive(Debug, Args)]
struct TraceArgs {
    /// Records the run to this trace file (.ndjson, or .sqlite/.db), appending.
    #[arg(long, value_name = "PATH")]
    trace: Option<PathBuf>,
    /// Also records prompts, arguments and outputs in the trace (never secrets).
    #[arg(long, requires = "trace")]
    trace_payloads: bool,
    /// Exports the run as OpenTelemetry spans (GenAI conventions) over OTLP, configured by the
    /// standard OTEL_EXPORTER_OTLP_* variables (as `otel = true` in the agent file).
    #[arg(long)]
    otel: bool,
    /// Also records prompts, arguments and outputs in the spans (never secrets).
    #[arg(long)]
    otel_payloads: bool,
}

impl TraceArgs {
    /// Starts the OpenTelemetry exporter, when `--otel` or the agent file asks for it.
    fn open_otel(&self, file: &AgentFile) -> Result<Option<otel::Otel>, CliError> {
        if self.otel || self.otel_payloads || file.spec.otel == Some(true) {
            otel::Otel::start(self.otel_payloads).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Opens the trace file, when one was asked for.
    fn open(&self) -> Result<Option<Arc<TraceSink>>, CliError> {
        let Some(path) = &self.trace else {
            return Ok(None);
        };
        let options = TraceOptions {
            payloads: self.trace_payloads,
        };
        TraceSink::open(path, options)
            .map(|s| Some(Arc::new(s)))
            .map_err(|e| CliError::Io {
                message: format!("cannot open the trace {}: {e}", path.display()),
            })
    }
}

/// `--yes`, as `run` and `chat` take it (`chat` words it its own way: see [`chat_wording`]).
#[derive(Debug, Args)]
struct ApprovalArgs {
    /// Approves every tool call the agent file's `[permissions]` would ask about, this once (a
    /// `deny` still denies). Without it, an asked call is put to you in a terminal, and denied
    /// with --json or without a terminal.
    #[arg(long, short = 'y')]
    yes: bool,
}

#[derive(Debug, Subcommand)]
enum TraceCommand {
    /// Lists the runs in a trace.
    List {
        /// The trace file (.ndjson, .sqlite or .db).
        path: PathBuf,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serves a trace viewer on loopback: the runs, and each run's timeline of turns and calls,
    /// its subagents, tokens, cost and errors (and payloads, when recorded). It follows a trace
    /// that is still being written.
    Serve {
        /// The trace file (.ndjson, .sqlite or .db).
        path: PathBuf,
        /// The port on 127.0.0.1 (0 picks a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// Shows one run as a tree of turns and calls (the last run when no id is given).
    Show {
        /// The trace file (.ndjson, .sqlite or .db).
        path: PathBuf,
        /// The run's id (or a unique prefix of it).
        #[arg(long)]
        run: Option<String>,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Before anything reads a credential: no process this one starts (tools, MCP servers) may
    // read its environment or memory through /proc or ptrace, root's included.
    if let Err(e) = agentloop_sandbox::protect_process() {
        eprintln!("agentloop: cannot keep this process out of its tools' sight: {e}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentloop: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(dispatch(cli));
    // A prompt given up on (Ctrl-C) may leave a blocking read of stdin behind: do not wait for it.
    runtime.shutdown_timeout(std::time::Duration::from_millis(250));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

async fn dispatch(cli: Cli) -> i32 {
    let json = match &cli.command {
        Command::Run(a) => a.json,
        Command::Plan(a) => a.json,
        Command::Resume(a) => a.go.json,
        Command::Journal(durable::JournalCommand::Fork(a)) => a.go.json,
        Command::Attach(a) => a.json,
        Command::Mcp(mcp::McpCommand::List { json, .. }) => *json,
        _ => false,
    };
    let result = match cli.command {
        Command::Run(args) => run(args).await,
        Command::Chat(args) => chat(args).await,
        Command::Plan(args) => plan_command(&args),
        Command::Trace(TraceCommand::Serve { path, port }) => viewer::serve(path, port).await,
        Command::Trace(t) => trace_command(t),
        Command::Resume(args) => durable::resume(args).await,
        Command::Approvals(c) => durable::approvals(c).await,
        Command::Approve(args) => match durable::restate_answer(&args) {
            Some((run, call, answer, url)) => restate::approve(&run, &call, answer, &url).await,
            None => durable::approve(&args),
        },
        Command::Journal(c) => durable::journal(c).await,
        Command::Sessions(c) => sessions::sessions(c),
        Command::Mcp(c) => mcp::mcp(c).await,
        Command::Init(args) => init::init(&args),
        Command::Completions(args) => completions::completions(&args, Cli::command()),
        Command::Serve(args) => restate::serve(args).await,
        Command::Submit(args) => restate::submit(args).await,
        Command::Attach(args) => restate::attach(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            report_error(&e, json);
            e.exit_code()
        }
    }
}

fn report_error(e: &CliError, json: bool) {
    if json {
        let problems = match e {
            CliError::AgentFile(p) => serde_json::to_value(p.list()).ok(),
            _ => None,
        };
        out!("{}", render::error_json(e.code(), &e.to_string(), problems));
    } else {
        let text = e.to_string();
        eprintln!("agentloop: {}", text.trim_end());
    }
}

fn read_input(args: &RunArgs) -> Result<String, CliError> {
    if let Some(text) = &args.input {
        return Ok(text.clone());
    }
    if let Some(path) = &args.input_file {
        return std::fs::read_to_string(path).map_err(|e| CliError::Io {
            message: format!("cannot read the input file {}: {e}", path.display()),
        });
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(CliError::Usage {
            message: "no input: give --input TEXT or --input-file FILE, or pipe the input on stdin"
                .into(),
        });
    }
    let mut text = String::new();
    stdin
        .lock()
        .read_to_string(&mut text)
        .map_err(|e| CliError::Io {
            message: format!("cannot read stdin: {e}"),
        })?;
    if text.trim().is_empty() {
        return Err(CliError::Usage {
            message: "no input: stdin was empty; give --input TEXT or --input-file FILE".into(),
        });
    }
    Ok(text)
}

fn finish_trace(trace: Option<&Arc<TraceSink>>) -> Result<(), CliError> {
    match trace {
        Some(t) => t.finish().map_err(|e| CliError::Io {
            message: format!("the trace could not be written: {e}"),
        }),
        None => Ok(()),
    }
}

/// Cancels `token` on Ctrl-C; a second Ctrl-C exits at once with the cancellation code.
fn cancel_on_ctrl_c(token: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\nagentloop: cancelling (Ctrl-C again to quit at once)");
            token.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(code::CANCELLED);
            }
        }
    })
}

/// In a chat, Ctrl-C cancels the run in progress; between runs it quits with the cancellation
/// code.
fn ctrl_c_in_chat(current: CancelSlot) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            let running = current
                .lock()
                .ok()
                .and_then(|slot| slot.clone())
                .filter(|t| !t.is_cancelled());
            match running {
                Some(token) => {
                    eprintln!(
                        "\nagentloop: cancelling this turn (Ctrl-C again between turns quits)"
                    );
                    token.cancel();
                }
                None => std::process::exit(code::CANCELLED),
            }
        }
    })
}

async fn run(args: RunArgs) -> Result<i32, CliError> {
    let mut file = args.agent.load()?;
    file.protect(
        &[
            args.journal.clone(),
            args.trace.trace.clone(),
            args.session.store_path(),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>(),
    );
    let provider = *file.model().provider.get_ref();
    let input = read_input(&args)?;
    if args.dry_run && provider != Provider::Scripted {
        // The servers' tools are part of the request: they are started (their variables are
        // needed, as for a run; the model's key is not) and stopped again.
        let mcp = assemble::StartedMcp::start(&file).await?;
        let tools = mcp
            .servers(&file)
            .map(agentloop_mcp::McpServers::tools)
            .unwrap_or_default();
        mcp.shutdown().await;
        let view = plan::first_request_view(&file, &input, tools)?;
        if args.json {
            out!("{}", serde_json::json!({"dry_run": true, "request": view}));
        } else {
            let text = serde_json::to_string_pretty(&view).unwrap_or_default();
            out!("{text}");
            if !args.quiet {
                eprintln!("■ dry run: nothing was sent");
            }
        }
        return Ok(code::OK);
    }
    let model = assemble::model(&file)?;
    let progress = Arc::new(Progress::new());
    let cancel = CancellationToken::new();
    let slot: CancelSlot = Arc::new(std::sync::Mutex::new(Some(cancel.clone())));
    let journal = args
        .journal
        .as_deref()
        .map(|path| durable::open_journal(path, args.durability.level(&file)))
        .transpose()?;
    let approval = if args.dry_run {
        Approval::Nobody(DRY_RUN_REASON)
    } else {
        approval_for(&args.approval, args.json, &progress, &slot)
    };
    let mcp = assemble::StartedMcp::start(&file).await?;
    let agent = assemble::agent(&file, model, &approval, &mcp)?;
    let trace = args.trace.open()?;
    let otel = args.trace.open_otel(&file)?;
    let signals = cancel_on_ctrl_c(cancel.clone());
    let mut sinks = run_sinks(&progress, trace.as_ref(), !args.json && !args.quiet);
    sinks.extend(otel.as_ref().map(otel::Otel::sink));
    let options = RunOptions {
        cancel: Some(cancel),
        sinks,
        skip_tools: args.dry_run,
        journal: journal.map(|j| j as Arc<dyn agentloop::journal::Journal>),
        origin: Some(durable::origin(&file.path)),
        ..RunOptions::default()
    };
    let outcome = match args.session.open()? {
        Some((store, name)) => agent.run_session(&store, &name, input, options).await,
        None => Ok(agent
            .run_with(Vec::new(), Some(Message::user(input)), options)
            .await),
    };
    mcp.shutdown().await;
    signals.abort();
    let outcome = outcome?;
    // A trace that could not be written is reported on stderr; the run's outcome still decides the
    // exit code, and stdout still holds only the outcome.
    if let Err(e) = finish_trace(trace.as_ref()) {
        eprintln!("agentloop: warning: {e}");
    }
    if let Some(o) = otel {
        o.finish();
    }
    let shown = Shown {
        json: args.json,
        quiet: args.quiet,
        dry_run: args.dry_run,
        journal: args.journal.as_deref(),
        priced: assemble::has_pricing(file.model()),
    };
    print_outcome(&outcome, &shown, &progress);
    Ok(outcome_exit_code(&outcome))
}

/// A run's sinks: the progress lines when `shown`, and the trace.
fn run_sinks(
    progress: &Arc<Progress>,
    trace: Option<&Arc<TraceSink>>,
    shown: bool,
) -> Vec<Arc<dyn EventSink>> {
    let mut sinks: Vec<Arc<dyn EventSink>> = Vec::new();
    if shown {
        sinks.push(progress.clone());
    }
    if let Some(t) = trace {
        sinks.push(t.clone());
    }
    sinks
}

/// Who answers a call that needs approval: `--yes`, the person at the terminal, or nobody (the
/// call is denied, or a journaled run suspends on it).
fn approval_for(
    args: &ApprovalArgs,
    json: bool,
    progress: &Arc<Progress>,
    slot: &CancelSlot,
) -> Approval {
    if args.yes {
        Approval::Yes
    } else if !json && can_prompt() {
        ask_at_the_terminal(Box::new(StdinLines), progress, slot)
    } else {
        Approval::Nobody(NO_TERMINAL_REASON)
    }
}

/// How a run's outcome is shown.
struct Shown<'a> {
    json: bool,
    quiet: bool,
    dry_run: bool,
    /// The journal of a durable run.
    journal: Option<&'a Path>,
    /// The agent prices its answers ([`assemble::has_pricing`]).
    priced: bool,
}

/// Approval asked of the person at the terminal: questions on stderr, answers from `lines`.
fn ask_at_the_terminal(
    lines: Box<dyn AnswerLines>,
    progress: &Arc<Progress>,
    cancel: &CancelSlot,
) -> Approval {
    Approval::Prompter(Arc::new(TerminalPrompter::new(
        Console {
            lines,
            out: Box::new(std::io::stderr()),
        },
        Some(progress.clone()),
        cancel.clone(),
    )))
}

/// True when a person can be asked: stdin and stderr are terminals.
fn can_prompt() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// True when stdout and stderr are the same terminal, so what streamed on stderr was seen where
/// stdout prints.
fn same_terminal() -> bool {
    let (out, err) = (std::io::stdout(), std::io::stderr());
    if !(out.is_terminal() && err.is_terminal()) {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let id = |fd: std::os::fd::BorrowedFd<'_>| {
            let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
            file.metadata().ok().map(|m| (m.dev(), m.ino(), m.rdev()))
        };
        let (a, b) = (id(out.as_fd()), id(err.as_fd()));
        a.is_some() && a == b
    }
    #[cfg(not(unix))]
    {
        true
    }
}

/// True when the final output was already shown: it streamed (progress on, not `--quiet`) to the
/// terminal that stdout prints to.
fn already_shown(quiet: bool, same_terminal: bool, streamed: &str, output: &str) -> bool {
    !quiet && same_terminal && !streamed.trim().is_empty() && streamed.trim() == output.trim()
}

/// Prints the final output on stdout, unless it already streamed to the same terminal.
fn print_final(outcome: &RunOutcome, progress: &Progress, quiet: bool) {
    print_final_text(
        outcome.output.as_deref().unwrap_or_default(),
        progress,
        quiet,
    );
}

/// The final output on stdout, unless it already streamed to the same terminal.
fn print_final_text(output: &str, progress: &Progress, quiet: bool) {
    if output.is_empty() {
        return;
    }
    if !already_shown(quiet, same_terminal(), &progress.last_streamed(), output) {
        let mut stdout = std::io::stdout().lock();
        let output = output.trim_end_matches('\n');
        // On a terminal the model's escape sequences would act; piped, the output stays as is.
        let _ = if stdout.is_terminal() {
            writeln!(stdout, "{}", terminal::strip_escapes(output))
        } else {
            writeln!(stdout, "{output}")
        };
        let _ = stdout.flush();
    }
}

fn print_outcome(outcome: &RunOutcome, args: &Shown<'_>, progress: &Progress) {
    let waiting = match args.journal {
        Some(path) if outcome.stop_reason == agentloop::StopReason::Suspended => {
            durable::waiting(path, &outcome.run_id)
        }
        _ => Vec::new(),
    };
    // An answer the pricing does not know has an unknown cost, never a silent $0.
    if render::cost_unknown(outcome, args.priced) {
        eprintln!("{}", render::unknown_cost_warning(outcome));
    }
    if args.json {
        let mut value = render::priced_outcome_json(outcome, args.dry_run, args.priced);
        if let (Some(path), Some(map)) = (args.journal, value.as_object_mut()) {
            map.insert("journal".into(), path.display().to_string().into());
            map.insert(
                "pending_approvals".into(),
                serde_json::to_value(&waiting).unwrap_or_default(),
            );
        }
        out!("{value}");
        return;
    }
    if let Some(path) = args.journal {
        durable::how_to_go_on(outcome, path, &waiting, args.quiet);
    }
    if !args.quiet {
        progress.end_line();
        for line in render::skipped_lines(outcome) {
            eprintln!("{line}");
        }
    }
    print_final(outcome, progress, args.quiet);
    if !args.quiet {
        eprintln!(
            "{}",
            render::closing_line(outcome, render::cost_unknown(outcome, args.priced))
        );
    }
}

async fn chat(args: ChatArgs) -> Result<i32, CliError> {
    let mut file = args.agent.load()?;
    let priced = assemble::has_pricing(file.model());
    file.protect(
        &[args.trace.trace.clone(), args.session.store_path()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
    );
    let model = assemble::model(&file)?;
    let progress = Arc::new(Progress::new());
    let interactive = std::io::stdin().is_terminal();
    // Inputs and approval answers are both lines of stdin, read by one thread.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let lines = Arc::new(tokio::sync::Mutex::new(rx));
    let current: CancelSlot = Arc::default();
    let approval = if args.approval.yes {
        Approval::Yes
    } else if can_prompt() {
        ask_at_the_terminal(Box::new(ChannelLines(lines.clone())), &progress, &current)
    } else {
        Approval::Nobody(NO_TERMINAL_REASON)
    };
    let mcp = assemble::StartedMcp::start(&file).await?;
    // The servers are the agent's tool source: each turn of each run lists again the tools of a
    // server that said they changed, so the agent is built once.
    let agent = assemble::agent(&file, model, &approval, &mcp)?;
    let trace = args.trace.open()?;
    let otel = args.trace.open_otel(&file)?;
    let mut transcript: Vec<Message> = Vec::new();
    eprintln!(
        "{} ({}) — one input per line; /exit or end of input quits",
        file.spec.name.get_ref(),
        file.model().provider.get_ref().as_str()
    );
    let session = args.session.open()?;
    if let Some((store, name)) = &session {
        use agentloop::session::SessionStore;
        let held = store.load(name)?.map_or(0, |s| s.messages.len());
        eprintln!("session {name}: {held} messages so far");
    }
    read_stdin_lines(tx);
    let signals = ctrl_c_in_chat(current.clone());
    let mut last = code::OK;
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.lock().await.recv().await else {
            break;
        };
        let input = line.trim();
        if input.is_empty() {
            continue;
        }
        if input == "/exit" || input == "/quit" {
            break;
        }
        let cancel = CancellationToken::new();
        if let Ok(mut slot) = current.lock() {
            *slot = Some(cancel.clone());
        }
        let mut sinks: Vec<Arc<dyn EventSink>> = vec![progress.clone()];
        if let Some(t) = &trace {
            sinks.push(t.clone());
        }
        sinks.extend(otel.as_ref().map(otel::Otel::sink));
        let options = RunOptions {
            cancel: Some(cancel),
            sinks,
            ..RunOptions::default()
        };
        let outcome = match &session {
            // A stored conversation is read again at each turn: another process may have added
            // to it since.
            Some((store, name)) => match agent.run_session(store, name, input, options).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    eprintln!("agentloop: {e}");
                    last = CliError::from(e).exit_code();
                    continue;
                }
            },
            None => {
                agent
                    .run_with(
                        std::mem::take(&mut transcript),
                        Some(Message::user(input)),
                        options,
                    )
                    .await
            }
        };
        if let Ok(mut slot) = current.lock() {
            *slot = None;
        }
        progress.end_line();
        print_final(&outcome, &progress, false);
        eprintln!(
            "{}",
            render::closing_line(&outcome, render::cost_unknown(&outcome, priced))
        );
        last = outcome_exit_code(&outcome);
        transcript = outcome.transcript;
    }
    mcp.shutdown().await;
    signals.abort();
    if let Some(o) = otel {
        o.finish();
    }
    finish_trace(trace.as_ref())?;
    Ok(last)
}

/// Sends each line of stdin to `tx`, from a thread of its own, until the end of input.
fn read_stdin_lines(tx: tokio::sync::mpsc::UnboundedSender<String>) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(line.clone()).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

fn plan_command(args: &PlanArgs) -> Result<i32, CliError> {
    let file = args.agent.load()?;
    let plan = plan::plan(&file)?;
    if args.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&plan).unwrap_or_default()
        );
    } else {
        print!("{}", plan::render_plan(&plan));
    }
    Ok(code::OK)
}

fn trace_command(cmd: TraceCommand) -> Result<i32, CliError> {
    let trace_error = |path: &Path, e: agentloop_store::TraceError| CliError::Io {
        message: format!("cannot read the trace {}: {e}", path.display()),
    };
    match cmd {
        TraceCommand::List { path, json } => {
            let trace = agentloop_store::read_trace(&path).map_err(|e| trace_error(&path, e))?;
            warn_trace(&trace.warnings);
            let text = if json {
                agentloop_store::render_list_json(&trace.records)
                    .map_err(|e| trace_error(&path, e))?
            } else {
                agentloop_store::render_list(&trace.records)
            };
            out!("{}", text.trim_end());
        }
        TraceCommand::Serve { .. } => {
            return Err(CliError::Usage {
                message: "trace serve runs through the async dispatch".into(),
            });
        }
        TraceCommand::Show { path, run, json } => {
            let trace = agentloop_store::read_trace(&path).map_err(|e| trace_error(&path, e))?;
            warn_trace(&trace.warnings);
            let text = if json {
                agentloop_store::render_run_json(&trace.records, run.as_deref())
            } else {
                agentloop_store::render_run_tree(&trace.records, run.as_deref())
            }
            .map_err(|e| trace_error(&path, e))?;
            out!("{}", text.trim_end());
        }
    }
    Ok(code::OK)
}

fn warn_trace(warnings: &[String]) {
    for w in warnings {
        eprintln!("agentloop: warning: {w}");
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{Cli, already_shown};

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn chat_words_the_trace_and_yes_flags_it_shares_with_run_its_own_way() {
        let cli = Cli::command();
        let help = |command: &str, flag: &str| {
            cli.find_subcommand(command)
                .and_then(|c| c.get_arguments().find(|a| a.get_id() == flag))
                .and_then(|a| a.get_help())
                .map(ToString::to_string)
                .unwrap_or_default()
        };
        assert!(help("run", "trace").ends_with("appending"));
        assert!(help("chat", "trace").contains("the conversation's runs"));
        assert!(help("run", "yes").ends_with("with --json or without a terminal"));
        assert!(help("chat", "yes").ends_with("denied without one"));
        assert_eq!(
            help("run", "trace_payloads"),
            help("chat", "trace_payloads")
        );
    }

    #[test]
    fn the_final_output_is_printed_again_only_where_it_was_not_seen() {
        let text = "Lisbon is warmer.";
        assert!(already_shown(false, true, "Lisbon is warmer.\n", text));
        assert!(!already_shown(false, false, text, text), "stdout elsewhere");
        assert!(
            !already_shown(true, true, text, text),
            "--quiet shows no progress"
        );
        assert!(
            !already_shown(false, true, "Let me look.", text),
            "other text streamed"
        );
        assert!(!already_shown(false, true, "", ""), "nothing streamed");
    }
}
