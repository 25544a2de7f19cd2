//! `agentloop`: run, chat with, plan and trace agents written as TOML agent files.
//!
//! The command line is `args`; what every command that runs an agent shares (sinks, Ctrl-C,
//! approvals, showing the outcome) is `runs`. This file dispatches the commands and holds `run`,
//! `chat`, `plan` and `trace`; the others have files of their own (`durable`, `restate`,
//! `questions`, `sessions`, `mcp`, `init`, `completions`, `viewer`).
#![forbid(unsafe_code)]

/// Prints a line on stdout. A stdout closed early (`agentloop ... | head`) ends the output, not
/// the process with a panic as `println!` would.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` that never panics: a closed stderr (`agentloop attach … 2>&-`, a reader that went
/// away) loses the line, not the process. Its control characters but line breaks and tabs are
/// shown as escapes: a message may quote a name the command was given or found (a file's), and
/// the terminal must not run the escape sequences such a name can hold.
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = agentloop_cli::terminal::escape_controls(&format!($($arg)*));
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }};
}

// The agent files' loader and assembler are the library's, shared with the Python package.
#[cfg(test)]
use agentloop_cli::permission_file;
use agentloop_cli::text_file::{MAX_INPUT_BYTES, read_bounded, read_text_or_pipe};
use agentloop_cli::{agent_file, assemble, deferred, error, live, render, terminal};

/// mimalloc's thread-local pages rather than glibc's shared arenas: at 10,000 concurrent runs the
/// loop took about half the CPU with it (BENCHMARKS.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod a2a;
mod approval;
mod args;
mod completions;
mod durable;
mod eval;
mod init;
mod logging;
mod mcp;
mod otel;
mod plan;
mod questions;
mod restate;
mod runs;
mod served;
mod sessions;
mod viewer;

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use agentloop::session::SessionTurn;
use agentloop::{CancellationToken, EventSink, Message, RunOptions};
use clap::{CommandFactory, Parser};

use crate::agent_file::Provider;
use crate::approval::{ChannelLines, DRY_RUN_REASON, NO_TERMINAL_REASON};
use crate::args::{ChatArgs, Cli, Command, PlanArgs, RunArgs, TraceCommand};
use crate::assemble::Approval;
use crate::error::{CliError, code, outcome_exit_code};
use crate::runs::{
    CurrentRun, Shown, approval_for, ask_at_the_terminal, can_prompt, chat_signals, finish_trace,
    print_final, print_outcome, run_sinks, stop_on_signals,
};

fn main() -> ExitCode {
    runs::note_ignored_signals();
    // Before anything reads a credential: no process this one starts (tools, MCP servers) may
    // read its environment or memory through /proc or ptrace, root's included.
    if let Err(e) = agentloop_sandbox::protect_process() {
        err!("agentloop: cannot keep this process out of its tools' sight: {e}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
    // After the command line is read (`--help` shows no warning about `AGENTLOOP_LOG`), before
    // anything logs.
    logging::install();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            err!("agentloop: cannot start the async runtime: {e}");
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
        Command::Eval(a) => a.json,
        Command::Mcp(mcp::McpCommand::List { json, .. }) => *json,
        _ => false,
    };
    let result = match cli.command {
        Command::Run(args) => run(args).await,
        Command::Chat(args) => chat(args).await,
        Command::Plan(args) => plan_command(&args),
        Command::Trace(TraceCommand::Serve { path, port, eval }) => {
            viewer::serve(path, port, eval).await
        }
        Command::Trace(t) => trace_command(t),
        Command::Resume(args) => durable::resume(args).await,
        Command::Approvals(c) => durable::approvals(c).await,
        Command::Questions(c) => questions::list(c).await,
        Command::Answer(args) => questions::answer(&args).await,
        Command::Approve(args) => match durable::restate_answer(&args) {
            Some((run, call, answer, url)) => restate::approve(&run, &call, answer, &url).await,
            None => durable::approve(&args),
        },
        Command::Journal(c) => durable::journal(c).await,
        Command::Sessions(c) => sessions::sessions(c),
        Command::Mcp(c) => mcp::mcp(c).await,
        Command::A2a(c) => a2a::a2a(c).await,
        Command::Init(args) => init::init(&args),
        Command::Completions(args) => completions::completions(&args, Cli::command()),
        Command::Serve(args) => restate::serve(args).await,
        Command::Submit(args) => restate::submit(args).await,
        Command::Attach(args) => restate::attach(args).await,
        Command::Eval(args) => eval::eval(args).await,
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
        let mut value = render::error_json(e.code(), &e.to_string(), problems);
        // A run left unfinished is named, for the `resume` that goes on with it.
        if let (CliError::Stopped { run_id, .. }, Some(map)) = (e, value.as_object_mut()) {
            map.insert("run_id".into(), run_id.clone().into());
        }
        out!("{value}");
    } else {
        let text = e.to_string();
        err!("agentloop: {}", text.trim_end());
    }
}

fn read_input(args: &RunArgs) -> Result<String, CliError> {
    if let Some(text) = &args.input {
        return Ok(text.clone());
    }
    if let Some(path) = &args.input_file {
        return read_text_or_pipe(path, MAX_INPUT_BYTES).map_err(|e| CliError::Io {
            message: format!(
                "cannot read the input file {}: {e}",
                terminal::shown_path(path)
            ),
        });
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(CliError::Usage {
            message: "no input: give --input TEXT or --input-file FILE, or pipe the input on stdin"
                .into(),
        });
    }
    // Bounded: `agentloop run a.toml < /dev/zero` (or `yes |`) would never end otherwise.
    let text = read_bounded(stdin.lock(), MAX_INPUT_BYTES).map_err(|e| CliError::Io {
        message: format!("cannot read stdin: {e}"),
    })?;
    if text.trim().is_empty() {
        return Err(CliError::Usage {
            message: "no input: stdin was empty; give --input TEXT or --input-file FILE".into(),
        });
    }
    Ok(text)
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
        return live_dry_run(&file, &args, &input).await;
    }
    let model = assemble::model(&file)?;
    let progress = logging::progress();
    let cancel = CancellationToken::new();
    let journal = args
        .journal
        .as_deref()
        .map(|path| durable::open_journal(path, args.durability.level(&file)))
        .transpose()?;
    let approval = if args.dry_run {
        Approval::Nobody(DRY_RUN_REASON)
    } else {
        approval_for(&args.approval, args.json, &progress)
    };
    // The run's stores exist before any server starts: a server's view keeps only what exists
    // when it starts read-only, and one started first could rewrite them or put a link in their
    // place.
    let trace = args.trace.open()?;
    // A dry run goes on from the session but stores nothing: no side effects.
    let (session, history) = if args.dry_run {
        (None, args.session.transcript_read_only()?)
    } else {
        (args.session.open()?, Vec::new())
    };
    // And the journal stays open until the servers are stopped (the run's options drop theirs
    // when it ends): closing it deletes SQLite's `-wal` and `-shm`, which drops a server's
    // read-only binds of them, and a `-wal` a server then writes is replayed into the journal at
    // its next open.
    let journal_open = journal.clone();
    let mcp = if args.dry_run {
        assemble::StartedMcp::start_servers(&file).await?
    } else {
        assemble::StartedMcp::start(&file).await?
    };
    warn_collisions(&file, &mcp);
    let agent = assemble::agent(&file, model, &approval, &mcp)?;
    let otel = args.trace.open_otel(&file)?;
    // A journaled run is named here, so that a stop that leaves it unfinished can say which run
    // to resume.
    let run_id = journal.is_some().then(agentloop::ids::run_id);
    let stopped = stop_on_signals(cancel.clone(), run_id.is_some());
    let mut sinks = run_sinks(&progress, trace.as_ref(), !args.json && !args.quiet);
    sinks.extend(otel.as_ref().map(otel::Otel::sink));
    let options = RunOptions {
        cancel: Some(cancel),
        sinks,
        skip_tools: args.dry_run,
        journal: journal.map(|j| j as Arc<dyn agentloop::journal::Journal>),
        origin: Some(durable::origin(&file.path)),
        run_id: run_id.clone(),
        ..RunOptions::default()
    };
    let running = async {
        match session {
            Some((store, name)) => agent.run_session_turn(&store, &name, input, options).await,
            None => Ok(SessionTurn {
                outcome: agent
                    .run_with(history, Some(Message::user(input)), options)
                    .await,
                unsaved: None,
            }),
        }
    };
    // Dropped at the environment's stop of a journaled run: its tools' process groups are
    // killed with their calls, and the journal keeps what it had, as after a crash.
    let ran = tokio::select! {
        biased;
        () = stopped.left_unfinished() => None,
        ran = running => Some(ran),
    };
    mcp.shutdown().await;
    drop(journal_open);
    let Some(ran) = ran else {
        return Err(runs::left_unfinished(
            &stopped,
            run_id.unwrap_or_default(),
            args.journal.as_deref(),
            trace.as_ref(),
            otel,
        ));
    };
    // An error here means nothing ran (the session was busy, damaged or unreadable).
    let SessionTurn { outcome, unsaved } = ran?;
    // A trace that could not be written is reported on stderr; the run's outcome still decides the
    // exit code, and stdout still holds only the outcome.
    if let Err(e) = finish_trace(trace.as_ref()) {
        err!("agentloop: warning: {e}");
    }
    let shown = Shown {
        json: args.json,
        quiet: args.quiet,
        dry_run: args.dry_run,
        journal: args.journal.as_deref(),
        priced: assemble::has_pricing(file.model()),
        unsaved: unsaved.as_ref(),
    };
    // The outcome first: the spans' export may wait on a slow collector.
    print_outcome(&outcome, &shown, &progress);
    stopped.shown();
    if let Some(o) = otel {
        o.finish();
    }
    // The run happened, but the conversation lacks it: the session's code, not the run's.
    Ok(match unsaved {
        Some(e) => CliError::from(e).exit_code(),
        None => runs::exit_code(&outcome, &stopped),
    })
}

/// `run --dry-run` of a live agent: prints the first request it would send (after the
/// session's conversation, with `--session`) and sends nothing.
async fn live_dry_run(
    file: &agentloop_cli::agent_file::AgentFile,
    args: &RunArgs,
    input: &str,
) -> Result<i32, CliError> {
    // The servers' tools are part of the request: they are started (their variables are
    // needed, as for a run; the model's key is not) and stopped again.
    let mcp = assemble::StartedMcp::start_servers(file).await?;
    warn_collisions(file, &mcp);
    // A deferred server's tools are not in it (the model finds them with `search_tools`),
    // or are, marked, where the provider searches them itself.
    let tools = mcp
        .servers(file)
        .map(|s| deferred::server_tools(file, s))
        .unwrap_or_default();
    mcp.shutdown().await;
    let history = args.session.transcript_read_only()?;
    let view = plan::first_request_view(file, history, input, tools)?;
    if args.json {
        out!("{}", serde_json::json!({"dry_run": true, "request": view}));
    } else {
        let text = serde_json::to_string_pretty(&view).unwrap_or_default();
        out!("{text}");
        if !args.quiet {
            err!("■ dry run: nothing was sent");
        }
    }
    Ok(code::OK)
}

/// Says which tools of the started servers their runs leave out, their names taken by tools
/// listed before them (a run keeps the first listed of a name; its first turn reports the
/// others refused, without naming the servers' own names).
fn warn_collisions(file: &agentloop_cli::agent_file::AgentFile, mcp: &assemble::StartedMcp) {
    for w in mcp.collision_warnings(file) {
        err!("agentloop: warning: {w}");
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
    let progress = logging::progress();
    let interactive = std::io::stdin().is_terminal();
    // Inputs and approval answers are both lines of stdin, read by one thread.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let lines = Arc::new(tokio::sync::Mutex::new(rx));
    let current: CurrentRun = Arc::default();
    let approval = if can_prompt() {
        let lines = Box::new(ChannelLines(lines.clone()));
        ask_at_the_terminal(lines, &progress, args.approval.yes)
    } else if args.approval.yes {
        Approval::Yes
    } else {
        Approval::Nobody(NO_TERMINAL_REASON)
    };
    // The stores before the servers, as for `run`.
    let trace = args.trace.open()?;
    let session = args.session.open()?;
    let mcp = assemble::StartedMcp::start(&file).await?;
    warn_collisions(&file, &mcp);
    // The servers are the agent's tool source: each turn of each run lists again the tools of a
    // server that said they changed, so the agent is built once.
    let agent = assemble::agent(&file, model, &approval, &mcp)?;
    let otel = args.trace.open_otel(&file)?;
    let mut transcript: Vec<Message> = Vec::new();
    err!(
        "{} ({}) — one input per line; /exit or end of input quits",
        file.spec.name.get_ref(),
        file.model().provider.get_ref().as_str()
    );
    if let Some((store, name)) = &session {
        use agentloop::session::SessionStore;
        let held = store.load(name)?.map_or(0, |s| s.messages.len());
        err!("session {name}: {held} messages so far");
    }
    read_stdin_lines(tx);
    let stopped = chat_signals(current.clone());
    let mut last = code::OK;
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let next = async { lines.lock().await.recv().await };
        let line = tokio::select! {
            biased;
            () = stopped.left_unfinished() => None,
            line = next => line,
        };
        let Some(line) = line else {
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
        let mut unsaved = None;
        let outcome = match &session {
            // A stored conversation is read again at each turn: another process may have added
            // to it since.
            Some((store, name)) => {
                match agent.run_session_turn(store, name, input, options).await {
                    Ok(turn) => {
                        unsaved = turn.unsaved;
                        turn.outcome
                    }
                    Err(e) => {
                        err!("agentloop: {e}");
                        last = CliError::from(e).exit_code();
                        continue;
                    }
                }
            }
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
        err!(
            "{}",
            render::closing_line(&outcome, render::cost_unknown(&outcome, priced))
        );
        last = outcome_exit_code(&outcome);
        // The answer is shown; the stored conversation lacks this turn, and the next one reads
        // the store again.
        if let Some(e) = unsaved {
            err!("agentloop: {}", render::unsaved_session_message(&e));
            last = CliError::from(e).exit_code();
        }
        transcript = outcome.transcript;
        if stopped.by_environment().is_some() {
            break;
        }
    }
    mcp.shutdown().await;
    // The trace before the spans' export, which a stop signal does not wait for.
    let traced = finish_trace(trace.as_ref());
    stopped.shown();
    if let Some(o) = otel {
        o.finish();
    }
    traced?;
    Ok(stopped.by_environment().map_or(last, runs::Stop::exit_code))
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
        // An agent file's descriptions are its author's text, and a file may come from anyone.
        let shown = terminal::escape_controls(&plan::render_plan(&plan));
        let _ = std::io::stdout().lock().write_all(shown.as_bytes());
    }
    Ok(code::OK)
}

fn trace_command(cmd: TraceCommand) -> Result<i32, CliError> {
    let trace_error = |path: &Path, e: agentloop_store::TraceError| CliError::Io {
        message: format!("cannot read the trace {}: {e}", terminal::shown_path(path)),
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
        err!("agentloop: warning: {w}");
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

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
}
