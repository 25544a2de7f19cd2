//! The command line: every subcommand and its flags (clap's derive), and the arguments several
//! commands share (the agent file, `--trace`/`--otel`, `--yes`) with what they open.

use std::path::PathBuf;
use std::sync::Arc;

use agentloop_store::{TraceOptions, TraceSink};
use clap::{Arg, Args, Parser, Subcommand};

use crate::agent_file::{AgentFile, LoadError};
use crate::error::{CliError, EXIT_CODES_HELP};
use crate::{a2a, completions, durable, init, mcp, otel, questions, restate, sessions};

/// `agentloop --help`'s text above the commands: the one-line about (the package's description), and the
/// variable that sets the log on stderr (`logging.rs`).
const LONG_ABOUT: &str = concat!(
    env!("CARGO_PKG_DESCRIPTION"),
    "

What agentloop's crates log (a model call retried, an MCP server that exited or whose tools
collide) is shown on stderr, one line each (`agentloop: warning: ...`), never on
stdout. AGENTLOOP_LOG sets what is shown, as a tracing filter: a level (`off`, `error`, `warn`,
`info`, `debug`, `trace`) or TARGET=LEVEL pairs, comma-separated (`agentloop_providers=debug`).
Unset, it is `agentloop=warn`: agentloop's warnings and errors, none of its dependencies'
(rmcp, hyper, reqwest, h2, restate-sdk). Colour only on a terminal, and not with NO_COLOR set (non-empty)."
);

/// Runs bounded, tool-using LLM agents described in TOML agent files.
#[derive(Debug, Parser)]
#[command(name = "agentloop", version, about, long_about = LONG_ABOUT, after_help = EXIT_CODES_HELP)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// Lists the questions (`ask_user`) that suspended runs wait on.
    #[command(subcommand)]
    Questions(questions::QuestionsCommand),
    /// Answers a question a suspended run waits on (checked against its schema).
    Answer(questions::AnswerArgs),
    /// Reads a journal: its runs, and one run's steps (checked).
    #[command(subcommand)]
    Journal(durable::JournalCommand),
    /// Stored conversations (`run`/`chat --session NAME`): list, show, delete, fork.
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// MCP: `mcp list FILE` prints the file's MCP servers' tools with their schemas; `mcp serve
    /// FILE...` serves the agents to MCP clients.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Agents served to other agents over the A2A protocol: `a2a serve FILE... --addr ADDR`.
    #[command(subcommand)]
    A2a(a2a::A2aCommand),
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
    /// Runs a dataset of cases against the agent, scores each run by its checks, and reports
    /// pass rates, cost and spread (a table, --json, --junit), against a --baseline if given.
    #[command(after_help = EXIT_CODES_HELP)]
    Eval(crate::eval::EvalArgs),
}

#[derive(Debug, Args)]
#[command(mut_arg("durability", |a| a.requires("journal")))]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) agent: AgentFileArg,
    /// The input text.
    #[arg(long, conflicts_with = "input_file")]
    pub(crate) input: Option<String>,
    /// Reads the input from this file (stdin is read when neither --input nor --input-file is given).
    #[arg(long)]
    pub(crate) input_file: Option<PathBuf>,
    /// Prints exactly one JSON object on stdout when the run ends, and nothing else there.
    #[arg(long, conflicts_with = "quiet")]
    pub(crate) json: bool,
    /// Prints only the final output (warnings still go to stderr; AGENTLOOP_LOG=off hides them).
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Runs nothing with side effects: a scripted agent runs its script with every tool skipped;
    /// a live agent prints the first request it would send (secrets redacted) and exits.
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
    #[command(flatten)]
    pub(crate) approval: ApprovalArgs,
    /// Makes the run durable: each step is written to this SQLite journal before the run moves
    /// on (`agentloop resume` goes on after a crash), and a call that needs approval suspends
    /// the run instead of being denied (`agentloop approvals list`).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["dry_run", "session"])]
    pub(crate) journal: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) durability: durable::DurabilityArg,
    #[command(flatten)]
    pub(crate) session: sessions::SessionArgs,
}

#[derive(Debug, Args)]
#[command(mut_args(chat_wording))]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    pub(crate) agent: AgentFileArg,
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
    #[command(flatten)]
    pub(crate) approval: ApprovalArgs,
    #[command(flatten)]
    pub(crate) session: sessions::SessionArgs,
}

/// `chat`'s own help for two of the flags it shares with `run`: it traces every run of the
/// conversation, and has no --json.
pub(crate) fn chat_wording(arg: Arg) -> Arg {
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
pub(crate) struct PlanArgs {
    #[command(flatten)]
    pub(crate) agent: AgentFileArg,
    /// Prints the plan as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The agent file, the argument of `run`, `chat` and `plan`.
#[derive(Debug, Args)]
pub(crate) struct AgentFileArg {
    /// The agent file.
    pub(crate) file: PathBuf,
}

impl AgentFileArg {
    /// Reads and checks the agent file.
    pub(crate) fn load(&self) -> Result<AgentFile, CliError> {
        let file = AgentFile::load(&self.file).map_err(|e| match e {
            LoadError::Read { .. } => CliError::AgentFileUnreadable {
                message: e.to_string(),
            },
            LoadError::Invalid(p) => CliError::AgentFile(p),
        })?;
        for w in file.warnings() {
            eprintln!("agentloop: warning: {}: {w}", self.file.display());
        }
        Ok(file)
    }
}

/// `--trace` and `--trace-payloads`, as `run` and `chat` take them (`chat` words `--trace` its
/// own way: see [`chat_wording`]).
#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    /// Records the run to this trace file (.ndjson, or .sqlite/.db), appending.
    #[arg(long, value_name = "PATH")]
    pub(crate) trace: Option<PathBuf>,
    /// Also records prompts, arguments and outputs in the trace (never secrets).
    #[arg(long, requires = "trace")]
    pub(crate) trace_payloads: bool,
    /// Exports the run as OpenTelemetry spans (GenAI conventions) over OTLP, configured by the
    /// standard OTEL_EXPORTER_OTLP_* variables (as `otel = true` in the agent file).
    #[arg(long)]
    pub(crate) otel: bool,
    /// Also records prompts, arguments and outputs in the spans (never secrets).
    #[arg(long)]
    pub(crate) otel_payloads: bool,
}

impl TraceArgs {
    /// Starts the OpenTelemetry exporter, when `--otel` or the agent file asks for it.
    pub(crate) fn open_otel(&self, file: &AgentFile) -> Result<Option<otel::Otel>, CliError> {
        if self.otel || self.otel_payloads || file.spec.otel == Some(true) {
            otel::Otel::start(self.otel_payloads).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Opens the trace file, when one was asked for.
    pub(crate) fn open(&self) -> Result<Option<Arc<TraceSink>>, CliError> {
        let Some(path) = &self.trace else {
            return Ok(None);
        };
        let options = TraceOptions {
            payloads: self.trace_payloads,
        };
        TraceSink::open(path, options)
            .map(|s| Some(Arc::new(s)))
            .map_err(|e| CliError::Io {
                message: format!(
                    "cannot open the trace {}: {e}",
                    crate::terminal::shown_path(path)
                ),
            })
    }
}

/// `--yes`, as `run` and `chat` take it (`chat` words it its own way: see [`chat_wording`]).
#[derive(Debug, Args)]
pub(crate) struct ApprovalArgs {
    /// Approves every tool call the agent file's `[permissions]` would ask about, this once (a
    /// `deny` still denies). Without it, an asked call is put to you in a terminal, and denied
    /// with --json or without a terminal.
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TraceCommand {
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
        /// Lists only an evaluation's runs (`agentloop eval --trace ... --report REPORT`), each
        /// with its case, repeat and verdict.
        #[arg(long, value_name = "REPORT")]
        eval: Option<PathBuf>,
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
