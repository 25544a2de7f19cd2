//! The command's errors and exit codes. Every way the command ends maps to one documented code.

use agentloop::{ErrorKind, RunOutcome, StopReason};

use crate::agent_file::Problems;

/// Exit codes, as documented in `--help` and the README.
pub mod code {
    /// The run finished, or a tool ended it; `plan`, `trace` and a live `--dry-run` succeeded.
    pub const OK: i32 = 0;
    /// Anything else went wrong (an unreadable input or trace, an internal error).
    pub const OTHER: i32 = 1;
    /// The command line was wrong (clap's code).
    pub const USAGE: i32 = 2;
    /// The agent file is invalid or unreadable.
    pub const INVALID_AGENT_FILE: i32 = 3;
    /// The model or its provider failed (including a missing API key).
    pub const MODEL: i32 = 4;
    /// A limit or budget stopped the run (turns, tool calls, model calls, tokens, cost, deadline,
    /// stuck loop).
    pub const LIMIT: i32 = 5;
    /// A tool failed fatally (or panicked).
    pub const TOOL: i32 = 6;
    /// The run failed for another reason (an invalid decision or final answer).
    pub const RUN_FAILED: i32 = 7;
    /// A journaled run suspended: it waits for approvals (`agentloop approvals list`).
    pub const SUSPENDED: i32 = 8;
    /// The journal cannot be used: damaged, not a journal, no such run, a changed agent (without
    /// `--force`), or a run that cannot go on.
    pub const JOURNAL: i32 = 9;
    /// The session cannot be used: another process holds it, or its stored transcript is
    /// damaged, or it could not be saved after the run (whose outcome is still shown); or
    /// another live process drives the journaled run (`journal.busy`).
    pub const SESSION: i32 = 10;
    /// Restate could not be reached or refused a request (`serve`, `submit`, `attach`,
    /// `approve --restate`).
    pub const RESTATE: i32 = 11;
    /// `eval`: fewer runs passed their checks than `--min-pass-rate` asks (all, by default).
    pub const EVAL_FAILED: i32 = 12;
    /// `eval --baseline`: a pass rate fell below the baseline's by more than `--tolerance`.
    pub const EVAL_REGRESSED: i32 = 13;
    /// The command was stopped by SIGHUP (a closed terminal or SSH session): its run cancelled,
    /// or a journaled one left unfinished for `agentloop resume`.
    pub const HUNG_UP: i32 = 129;
    /// The run was cancelled (Ctrl-C, or Restate's cancel of a submitted run).
    pub const CANCELLED: i32 = 130;
    /// The command was stopped by SIGTERM (`kill`, `docker stop`, systemd, a CI timeout): its
    /// run cancelled, or a journaled one left unfinished for `agentloop resume`.
    pub const TERMINATED: i32 = 143;
}

/// The text `--help` shows about exit codes.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0    the run finished (or a tool ended it); plan, trace and a live --dry-run succeeded
  1    another error (unreadable input or trace file, internal error)
  2    usage error (bad command line)
  3    invalid agent file (every problem is listed with its key path and line); for eval,
       an invalid cases file, check or baseline
  4    model or provider error (including a missing API key)
  5    a limit or budget stopped the run (max_turns, max_tool_calls, max_model_calls,
       max_tokens, max_cost_usd, timeout_secs, stuck loop)
  6    a tool failed fatally
  7    the run failed for another reason (invalid decision or final answer)
  8    suspended: a journaled run waits for approvals (agentloop approvals list)
  9    the journal cannot be used (damaged, not a journal, unknown run, changed agent
       without --force, a run that is over or still waits for answers)
  10   the session cannot be used (another process holds it; a damaged transcript;
       no such session; not saved after the run, whose outcome is still shown), or
       another live process drives the journaled run (journal.busy)
  11   Restate could not be reached or refused a request (serve, submit, attach,
       approve --restate)
  12   eval: the suite failed (fewer runs passed than --min-pass-rate; each failed
       check is named with its reason)
  13   eval: worse than the --baseline (each pass rate that fell is named)
  129  stopped by SIGHUP (a closed terminal): the run cancelled, or a journaled
       run left unfinished for agentloop resume
  130  cancelled (Ctrl-C, or Restate's cancel of a submitted run)
  143  stopped by SIGTERM: the run cancelled, or a journaled run left unfinished
       for agentloop resume";

/// Why the command failed before or outside a run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line was wrong beyond what clap checks.
    #[error("{message}")]
    Usage {
        /// What is wrong.
        message: String,
    },
    /// The agent file could not be read.
    #[error("{message}")]
    AgentFileUnreadable {
        /// What is wrong.
        message: String,
    },
    /// The agent file has problems.
    #[error("{0}")]
    AgentFile(Problems),
    /// The agent could not be set up (a tool or model could not be built).
    #[error("{message}")]
    Setup {
        /// What is wrong.
        message: String,
    },
    /// The API key variable is not set.
    #[error("the {provider} provider needs an API key: set the environment variable {var}")]
    MissingApiKey {
        /// The provider.
        provider: String,
        /// The variable.
        var: String,
    },
    /// The provider could not be set up.
    #[error("{message}")]
    Provider {
        /// What is wrong.
        message: String,
    },
    /// Reading input or writing output failed.
    #[error("{message}")]
    Io {
        /// What is wrong.
        message: String,
    },
    /// The journal cannot be used.
    #[error("{0}")]
    Journal(#[from] agentloop::journal::JournalError),
    /// The session cannot be used.
    #[error("{0}")]
    Session(#[from] agentloop::session::SessionError),
    /// `eval`: the cases, a check or the baseline cannot be used, or the report not written.
    #[error("{message}")]
    Eval {
        /// The stable code (`eval.dataset`, `eval.check`, ...).
        code: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The environment's stop (SIGTERM, SIGHUP) left a journaled run unfinished in its journal:
    /// its tools' processes were killed, and `agentloop resume` goes on with it.
    #[error(
        "stopped by {signal}: the run {run_id} is left unfinished in the journal {journal}; \
         `agentloop resume {run_id} --journal {journal}` goes on with it"
    )]
    Stopped {
        /// The signal's name (`SIGTERM`).
        signal: &'static str,
        /// 128 + the signal's number.
        exit_code: i32,
        /// The run.
        run_id: String,
        /// The journal, as shown.
        journal: String,
    },
    /// Restate could not be reached or refused a request.
    #[error("{message}")]
    Restate {
        /// The stable code (`restate.ingress`, ...).
        code: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl CliError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CliError::Usage { .. } => "cli.usage",
            CliError::AgentFileUnreadable { .. } => "agent_file.unreadable",
            CliError::AgentFile(_) => "agent_file.invalid",
            CliError::Setup { .. } => "agent.setup",
            CliError::MissingApiKey { .. } => "model.missing_api_key",
            CliError::Provider { .. } => "model.provider_setup",
            CliError::Io { .. } => "cli.io",
            CliError::Journal(e) => e.code(),
            CliError::Session(e) => e.code(),
            CliError::Restate { code, .. } | CliError::Eval { code, .. } => code,
            CliError::Stopped { .. } => "cli.stopped",
        }
    }

    /// The exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage { .. } => code::USAGE,
            CliError::AgentFileUnreadable { .. }
            | CliError::AgentFile(_)
            | CliError::Setup { .. }
            | CliError::Eval { .. } => code::INVALID_AGENT_FILE,
            CliError::MissingApiKey { .. } | CliError::Provider { .. } => code::MODEL,
            CliError::Io { .. } => code::OTHER,
            // Another process drives the run: as for a session another process holds.
            CliError::Journal(agentloop::journal::JournalError::Busy { .. }) => code::SESSION,
            CliError::Journal(_) => code::JOURNAL,
            CliError::Session(_) => code::SESSION,
            CliError::Restate { .. } => code::RESTATE,
            CliError::Stopped { exit_code, .. } => *exit_code,
        }
    }
}

/// The exit code of a run's outcome.
pub fn outcome_exit_code(outcome: &RunOutcome) -> i32 {
    match &outcome.stop_reason {
        StopReason::Finished | StopReason::Terminated => code::OK,
        StopReason::Cancelled => code::CANCELLED,
        StopReason::Suspended => code::SUSPENDED,
        r if r.is_limit() => code::LIMIT,
        _ => match outcome.error.as_ref().map(agentloop::RunError::kind) {
            Some(ErrorKind::Model) => code::MODEL,
            Some(ErrorKind::Tool) => code::TOOL,
            Some(ErrorKind::Limit) => code::LIMIT,
            Some(ErrorKind::Cancelled) => code::CANCELLED,
            _ => code::RUN_FAILED,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentloop::{
        ModelError, RunError, RunOutcome, StopReason,
        model::{ModelErrorKind, Usage},
    };

    use super::{code, outcome_exit_code};

    fn outcome(stop_reason: StopReason, error: Option<RunError>) -> RunOutcome {
        RunOutcome {
            run_id: "r".into(),
            stop_reason,
            output: None,
            structured_output: None,
            transcript: Vec::new(),
            new_messages_from: 0,
            usage: Usage::default(),
            cached_tokens: 0,
            cost_usd: 0.0,
            unpriced_model_calls: 0,
            turns: 1,
            model_calls: 1,
            tool_calls_run: 0,
            tool_calls: Vec::new(),
            limit: None,
            error,
            duration: Duration::ZERO,
            subagents: Vec::new(),
            compactions: Vec::new(),
            answered_by: "a".into(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn each_way_a_run_ends_has_its_documented_exit_code() {
        let fatal = RunError::ToolFatal {
            tool: "t".into(),
            call_id: "c".into(),
            message: "m".into(),
        };
        let model = RunError::Model(ModelError::new(ModelErrorKind::Server, "down"));
        let cases = [
            (outcome(StopReason::Finished, None), code::OK),
            (outcome(StopReason::Terminated, None), code::OK),
            (
                outcome(StopReason::Cancelled, Some(RunError::Cancelled)),
                code::CANCELLED,
            ),
            (outcome(StopReason::MaxTurns, None), code::LIMIT),
            (outcome(StopReason::MaxToolCalls, None), code::LIMIT),
            (outcome(StopReason::Budget, None), code::LIMIT),
            (outcome(StopReason::Deadline, None), code::LIMIT),
            (outcome(StopReason::StuckLoop, None), code::LIMIT),
            (outcome(StopReason::Failed, Some(model)), code::MODEL),
            (outcome(StopReason::Failed, Some(fatal)), code::TOOL),
            (
                outcome(
                    StopReason::Failed,
                    Some(RunError::OutputInvalid {
                        message: "m".into(),
                    }),
                ),
                code::RUN_FAILED,
            ),
        ];
        for (o, want) in cases {
            assert_eq!(outcome_exit_code(&o), want, "{:?}", o.stop_reason);
        }
    }
}
