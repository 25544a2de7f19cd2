//! Command tools: a program run once per call. The call's arguments go to its stdin as one JSON
//! document; its stdout is what the model reads; a non-zero exit is a recoverable tool error whose
//! message holds the exit status, then what the program wrote to stdout and to stderr, each
//! bounded: test runners, linters, `grep` and `diff` say what matters on stdout.
//!
//! The rules, each pinned by a test:
//! - The child starts in the tool's working directory (for agent files: the file's directory). A
//!   program path with a `/` in it is taken relative to that directory.
//! - Its environment is an allow list picked from this process's (or the one given with
//!   [`CommandTool::base_env`]): the shell's ([`DEFAULT_SHELL_ENV`]: `PATH`, `HOME`, `LANG`, ...)
//!   and the names given with [`CommandTool::allow_env`], never a secret ([`is_secret_env`](crate::is_secret_env):
//!   `*_API_KEY`, `*_TOKEN`, `*_SECRET`, ...) nor a name given with [`CommandTool::hide_env`] (the
//!   CLI passes the agent's `api_key_env`).
//! - It runs in a sandbox ([`CommandTool::sandbox`]; `workspace-write` without network by
//!   default) whose writable root is its [`root`](CommandTool::root), by default its working
//!   directory; `TMPDIR` is a private folder removed after the call.
//! - Stdout beyond [`DEFAULT_MAX_OUTPUT_BYTES`] and stderr beyond [`DEFAULT_MAX_ERROR_BYTES`] are
//!   cut, and the text says so, on success and on failure alike.
//! - The child leads its own process group. When the call is cancelled (its
//!   [`agentloop::ToolContext`] token), times out, or its future is dropped, the whole group is
//!   killed; when the program exits, whatever it left running in its group is killed too.
//! - A program that cannot be started (missing, not executable) is a clear tool error, never a
//!   panic.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use agentloop::{Tool, ToolContext, ToolError, ToolOutput, tool::ExecutionMode};
use serde_json::{Value, json};

use agentloop_sandbox::{Sandbox, SandboxPolicy};

use crate::process::{
    Captured, Finished, GroupCommand, Stopped, describe_status, env_pairs, not_cancelled,
    run_until, scrubbed_env,
};
use crate::shell::DEFAULT_SHELL_ENV;

/// The most stdout bytes the model reads from one call (64 KiB).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// The most stderr bytes a result holds (4 KiB).
pub const DEFAULT_MAX_ERROR_BYTES: usize = 4 * 1024;

/// Why a command tool could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandToolError {
    /// The command has no program.
    #[error("the command of tool {tool:?} is empty: give at least the program to run")]
    EmptyCommand {
        /// The tool.
        tool: String,
    },
}

impl CommandToolError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CommandToolError::EmptyCommand { .. } => "command.empty",
        }
    }
}

/// A command tool's definition. Build it, then turn it into a [`Tool`] with
/// [`CommandTool::into_tool`].
#[must_use]
#[derive(Debug, Clone)]
pub struct CommandTool {
    name: String,
    description: String,
    command: Vec<String>,
    input_schema: Value,
    mode: ExecutionMode,
    poller: bool,
    idempotent: bool,
    timeout: Option<Duration>,
    retries: u32,
    working_dir: PathBuf,
    root: Option<PathBuf>,
    read_only: Vec<PathBuf>,
    allowed_env: Vec<String>,
    hidden_env: Vec<String>,
    base_env: Option<Vec<(OsString, OsString)>>,
    max_output_bytes: usize,
    max_error_bytes: usize,
    sandbox: SandboxPolicy,
}

impl CommandTool {
    /// A tool named `name` that runs `command` (the program, then its arguments).
    pub fn new(
        name: impl Into<String>,
        command: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        CommandTool {
            name: name.into(),
            description: String::new(),
            command: command.into_iter().map(Into::into).collect(),
            input_schema: json!({"type": "object", "properties": {}}),
            mode: ExecutionMode::Parallel,
            poller: false,
            idempotent: false,
            timeout: None,
            retries: 0,
            working_dir: PathBuf::from("."),
            root: None,
            read_only: Vec::new(),
            allowed_env: DEFAULT_SHELL_ENV.iter().map(|s| (*s).to_owned()).collect(),
            hidden_env: Vec::new(),
            base_env: None,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_error_bytes: DEFAULT_MAX_ERROR_BYTES,
            sandbox: SandboxPolicy::default(),
        }
    }

    /// What the tool does, for the model.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// The JSON Schema of the arguments.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }

    /// Parallel (the default) or sequential.
    pub fn mode(mut self, mode: ExecutionMode) -> Self {
        self.mode = mode;
        self
    }

    /// Marks the tool a poller: the stuck-loop rule judges its repeated calls by their results
    /// alone (see `ToolSpec::poller`).
    pub fn poller(mut self, yes: bool) -> Self {
        self.poller = yes;
        self
    }

    /// Marks the tool idempotent: a call of it that was running when a durable run's process
    /// stopped runs again on resume (see `ToolSpec::idempotent`).
    pub fn idempotent(mut self, yes: bool) -> Self {
        self.idempotent = yes;
        self
    }

    /// Kills the command and answers a `timeout` tool error after this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Runs a failed call (a non-zero exit, a timeout) up to `retries` more times
    /// ([`ToolPolicy::retry`](agentloop::tool::ToolPolicy::retry)).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The directory the command runs in, and that a relative program path starts from.
    pub fn working_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.working_dir = dir.into();
        self
    }

    /// The sandbox of its process (default `workspace-write`, no network).
    pub fn sandbox(mut self, policy: SandboxPolicy) -> Self {
        self.sandbox = policy;
        self
    }

    /// The folder its process may write under `workspace-write` (default: its working
    /// directory).
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }

    /// Paths under its root that its process may not write, replace or remove (the agent's own
    /// files: [`crate::Sandbox::read_only`]); it may write the rest of the root.
    pub fn read_only(mut self, paths: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        self.read_only.extend(paths.into_iter().map(Into::into));
        self
    }

    /// Also passes this variable through, when it is set and is not a secret
    /// ([`is_secret_env`](crate::is_secret_env)).
    pub fn allow_env(mut self, name: impl Into<String>) -> Self {
        self.allowed_env.push(name.into());
        self
    }

    /// Never passes this variable, even when allowed (besides every secret).
    pub fn hide_env(mut self, name: impl Into<String>) -> Self {
        self.hidden_env.push(name.into());
        self
    }

    /// The environment the allow list picks from, instead of this process's. Secrets are still
    /// removed from it.
    pub fn base_env(
        mut self,
        vars: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>,
    ) -> Self {
        self.base_env = Some(env_pairs(vars));
        self
    }

    /// The most stdout bytes the model reads.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// The most stderr bytes a result holds.
    pub fn max_error_bytes(mut self, bytes: usize) -> Self {
        self.max_error_bytes = bytes;
        self
    }

    /// The tool. The name and schema are checked when the tool is registered with an agent.
    pub fn into_tool(self) -> Result<Tool, CommandToolError> {
        if self.command.first().is_none_or(|p| p.is_empty()) {
            return Err(CommandToolError::EmptyCommand { tool: self.name });
        }
        let mut builder = Tool::builder(self.name.clone())
            .description(self.description.clone())
            .mode(self.mode)
            .poller(self.poller)
            .idempotent(self.idempotent)
            .retries(self.retries);
        if let Some(t) = self.timeout {
            builder = builder.timeout(t);
        }
        let schema = self.input_schema.clone();
        let runner = Arc::new(Runner::from(self));
        Ok(
            builder.dynamic(schema, move |args: Value, ctx: ToolContext| {
                let runner = runner.clone();
                async move { runner.run(args, ctx).await }
            }),
        )
    }
}

/// What a call needs, resolved once.
struct Runner {
    sandbox: Sandbox,
    program: PathBuf,
    args: Vec<String>,
    working_dir: PathBuf,
    env: Vec<(OsString, OsString)>,
    timeout: Option<Duration>,
    max_output_bytes: usize,
    max_error_bytes: usize,
}

impl From<CommandTool> for Runner {
    fn from(t: CommandTool) -> Self {
        let mut argv = t.command.into_iter();
        let program = argv.next().unwrap_or_default();
        let program = if program.contains('/') && Path::new(&program).is_relative() {
            t.working_dir.join(&program)
        } else {
            PathBuf::from(program)
        };
        let (allowed, hidden) = (t.allowed_env, t.hidden_env);
        let env = scrubbed_env(t.base_env, |name| {
            allowed.iter().any(|a| a == name) && !hidden.iter().any(|h| h == name)
        });
        let root = t.root.unwrap_or_else(|| t.working_dir.clone());
        // Resolved once, here: a link put in the root's place later is refused, not followed.
        let sandbox = match std::fs::canonicalize(&root) {
            Ok(root) => Sandbox::new(t.sandbox).writable_resolved(root),
            Err(_) => Sandbox::new(t.sandbox).writable(root),
        };
        Runner {
            sandbox: sandbox.read_only(t.read_only),
            program,
            args: argv.collect(),
            working_dir: t.working_dir,
            env,
            timeout: t.timeout,
            max_output_bytes: t.max_output_bytes,
            max_error_bytes: t.max_error_bytes,
        }
    }
}

/// The text of captured bytes, trimmed with `trim`, saying so when it was cut at the bound.
fn bounded_text(c: &Captured, what: &str, trim: fn(&str) -> &str) -> String {
    let text = String::from_utf8_lossy(&c.bytes);
    let text = trim(text.as_ref());
    if c.total > c.bytes.len() {
        format!(
            "{text}\n[{what} cut: showing the first {} of {} bytes]",
            c.bytes.len(),
            c.total
        )
    } else {
        text.to_owned()
    }
}

/// A stream of a failed program: all of it within the bound, else its head and its tail (where a
/// failing program says why) with the cut counted between them.
fn failure_stream(c: &Captured, what: &str, trim: fn(&str) -> &str) -> String {
    if c.was_cut() {
        trim(&c.ends().text()).to_owned()
    } else {
        bounded_text(c, what, trim)
    }
}

/// What the model reads when a program exits non-zero: the status on the first line, then each
/// stream that said something under a header of its own, stdout first:
///
/// ```text
/// exit status 1
/// --- stdout ---
/// test parse ... FAILED
/// --- stderr ---
/// error: 1 test failed
/// ```
///
/// A program that wrote only to stderr is read as its message, the status after it
/// (`no such city\n(exit status 1)`): a model reads the words first and acts on them.
///
/// Stdout past its bound and stderr past its own keep their head and tail, the middle cut and
/// counted; trailing blank lines are dropped (stderr is trimmed at both ends). A program that
/// wrote nothing says so.
fn failure_text(status: &ExitStatus, out: &Captured, err: &Captured) -> String {
    let mut text = describe_status(status);
    let stdout = failure_stream(out, "stdout", str::trim_end);
    let stderr = failure_stream(err, "stderr", str::trim);
    if stdout.is_empty() && !stderr.is_empty() {
        return format!("{stderr}\n({text})");
    }
    if stdout.is_empty() && stderr.is_empty() {
        text.push_str(" (nothing on stdout or stderr)");
    }
    for (name, body) in [("stdout", stdout), ("stderr", stderr)] {
        if !body.is_empty() {
            text.push_str(&format!("\n--- {name} ---\n{body}"));
        }
    }
    text
}

impl Runner {
    fn display_program(&self) -> String {
        self.program.display().to_string()
    }

    async fn run(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        not_cancelled(&ctx.cancel, &format!("`{}`", self.display_program()))?;
        let command = GroupCommand {
            program: &self.program,
            args: &self.args,
            working_dir: &self.working_dir,
            env: &self.env,
            stdin: Some(serde_json::to_vec(&args).unwrap_or_default()),
            sandbox: &self.sandbox,
        };
        let work = match command.spawn(
            Captured::new(self.max_output_bytes),
            Captured::new(self.max_error_bytes),
        ) {
            Ok(work) => work,
            Err(e) => return Err(e.into_tool_error(|e| self.spawn_error(&e))),
        };
        let program = self.display_program();
        let finished = match run_until(work, &ctx.cancel, self.timeout).await {
            Ok(finished) => finished,
            Err(Stopped::Cancelled) => {
                return Err(ToolError::new(
                    "cancelled",
                    format!("the call was cancelled and `{program}` was killed"),
                ));
            }
            Err(Stopped::TimedOut) => {
                let secs = self.timeout.map_or(0.0, |t| t.as_secs_f64());
                return Err(ToolError::new(
                    "timeout",
                    format!("`{program}` did not finish within {secs:.1} s and was killed"),
                ));
            }
        };
        let Finished {
            status,
            stdout: out,
            stderr: err,
            sandbox_note,
        } = finished;
        let status = status.map_err(|e| {
            ToolError::new(
                "command_failed",
                format!("waiting for `{}` failed: {e}", self.display_program()),
            )
        })?;
        if status.success() {
            let details = json!({"exit_code": 0, "stdout_bytes": out.total, "stderr": bounded_text(&err, "stderr", str::trim), "sandbox_note": sandbox_note});
            let mut text = bounded_text(&out, "output", |t| t);
            if let Some(note) = &sandbox_note {
                text.push_str(&format!("\n[{note}]"));
            }
            return Ok(ToolOutput::text(text).with_details(details));
        }
        let mut text = failure_text(&status, &out, &err);
        if let Some(note) = &sandbox_note {
            text.push_str(&format!("\n[{note}]"));
        }
        Err(ToolError::new("command_failed", text))
    }

    fn spawn_error(&self, e: &std::io::Error) -> ToolError {
        let program = self.display_program();
        let dir = self.working_dir.display();
        // A program that is missing or not executable stays so: retrying cannot help.
        let error = match e.kind() {
            std::io::ErrorKind::NotFound if !self.working_dir.is_dir() => ToolError::new(
                "command_not_found",
                format!("cannot start `{program}`: the working directory {dir} does not exist"),
            ),
            std::io::ErrorKind::NotFound => ToolError::new(
                "command_not_found",
                format!(
                    "cannot start `{program}`: no such program (looked on PATH, and relative to {dir} for a path)"
                ),
            ),
            std::io::ErrorKind::PermissionDenied => ToolError::new(
                "command_not_executable",
                format!("cannot start `{program}`: permission denied (is it executable?)"),
            ),
            _ => {
                return ToolError::new(
                    "command_not_started",
                    format!("cannot start `{program}`: {e}"),
                );
            }
        };
        error.permanent()
    }
}
