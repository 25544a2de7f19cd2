//! The `shell` tool: `sh -c COMMAND` in a folder of the [`Workspace`], with a scrubbed
//! environment, a timeout that kills the command's whole process group, and an output cap that
//! keeps the head and the tail of each stream. The exit status is the first line of the result;
//! a non-zero status is a result the model reads, not a tool error, since a failing test run is
//! information.
//!
//! The environment holds only the variables of an allow list ([`DEFAULT_SHELL_ENV`] and the
//! names given with [`ShellTool::allow_env`]) and never a secret ([`is_secret_env`](crate::is_secret_env)), whatever
//! the list says. Its permission default is [`Permission::Ask`](agentloop::permissions::Permission)
//! (see [`Builtin::default_permission`](crate::Builtin::default_permission)).
//!
//! Commands run in a sandbox ([`ShellTool::sandbox`]), `workspace-write` without network by
//! default: they write only under the workspace root and a private `TMPDIR`, and no command or
//! child of it can leave the call's process group, so a timeout kills them all.
//!
//! Given the permission rules ([`Workspace::withhold`]), it judges its command by their `deny`
//! and `ask` command prefixes again as it runs, with the programs its words name looked up in
//! its `cwd` ([`CommandRefused`]): the gate judged the call before its batch ran, and another
//! call of the batch may since have made `./tidy` a link to a denied program.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::permissions::{CommandRules, FileText, Permission, ResolvePaths};
use agentloop::{Tool, ToolContext, ToolError, ToolOutput, tool::ExecutionMode};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use agentloop_sandbox::{Sandbox, SandboxPolicy};

use crate::process::{
    GroupCommand, HeadTail, Stopped, describe_status, env_pairs, not_cancelled, run_until,
    scrubbed_env,
};
use crate::workspace::{Workspace, program_files, read_text_bounded};

/// The variables a shell command sees by default, when this process has them.
pub const DEFAULT_SHELL_ENV: &[&str] =
    &["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER"];
/// The default timeout of one command (two minutes).
pub const DEFAULT_SHELL_TIMEOUT: Duration = Duration::from_secs(120);
/// The default cap of each stream the model reads (32 KiB: half head, half tail).
pub const DEFAULT_SHELL_OUTPUT_BYTES: usize = 32 * 1024;

/// The `shell` tool's definition. Build it, then turn it into a [`Tool`] with
/// [`ShellTool::into_tool`].
#[must_use]
#[derive(Debug, Clone)]
pub struct ShellTool {
    workspace: Workspace,
    timeout: Duration,
    max_output_bytes: usize,
    allowed_env: Vec<String>,
    base_env: Option<Vec<(OsString, OsString)>>,
    sandbox: SandboxPolicy,
}

impl ShellTool {
    /// A shell confined to `workspace`, with the defaults.
    pub fn new(workspace: Workspace) -> Self {
        ShellTool {
            workspace,
            timeout: DEFAULT_SHELL_TIMEOUT,
            max_output_bytes: DEFAULT_SHELL_OUTPUT_BYTES,
            allowed_env: DEFAULT_SHELL_ENV.iter().map(|s| (*s).to_owned()).collect(),
            base_env: None,
            sandbox: SandboxPolicy::default(),
        }
    }

    /// The sandbox of its commands (default `workspace-write`, no network); under
    /// `workspace-write` they may write the workspace root.
    pub fn sandbox(mut self, policy: SandboxPolicy) -> Self {
        self.sandbox = policy;
        self
    }

    /// Kills a command (and its process group) after this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The most bytes of each stream the model reads: the first and the last half of it.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Also passes this variable through, when it is set and is not a secret.
    pub fn allow_env(mut self, name: impl Into<String>) -> Self {
        self.allowed_env.push(name.into());
        self
    }

    /// The environment the allow list picks from, instead of this process's.
    pub fn base_env(
        mut self,
        vars: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>,
    ) -> Self {
        self.base_env = Some(env_pairs(vars));
        self
    }

    /// The tool, named `name`.
    pub fn into_tool(self, name: impl Into<String>) -> Tool {
        let name = name.into();
        let description = format!(
            "Runs a shell command (`sh -c`) in the workspace and answers its exit status, stdout \
             and stderr. `cwd` is a folder relative to the workspace root (default: the root). \
             Commands are killed after {} s; of long output the first and last {} bytes of each \
             stream are kept. Example: {{\"command\": \"cargo test 2>&1 | tail -n 20\", \"cwd\": \
             \"crates/core\"}}",
            self.timeout.as_secs_f64(),
            self.max_output_bytes / 2
        );
        let allowed = self.allowed_env;
        let env = scrubbed_env(self.base_env, |name| allowed.iter().any(|a| a == name));
        // The workspace resolved its root once; the agent's own files under it stay read-only.
        let sandbox = Sandbox::new(self.sandbox)
            .writable_resolved(self.workspace.root())
            .read_only(self.workspace.protected().iter().cloned());
        let commands = self.workspace.withheld_commands(&name, "command");
        let runner = Arc::new(ShellRunner {
            sandbox,
            commands,
            workspace: self.workspace,
            timeout: self.timeout,
            max_output_bytes: self.max_output_bytes,
            env,
        });
        Tool::builder(name)
            .description(description)
            .mutating(true)
            .mode(ExecutionMode::Sequential)
            .handler(move |args: ShellArgs, ctx: ToolContext| {
                let runner = runner.clone();
                async move { runner.run(args, ctx).await }
            })
    }
}

// `shell`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShellArgs {
    /// The command line, run by `sh -c`.
    command: String,
    /// The folder to run in, relative to the workspace root (default: the root).
    #[serde(default)]
    cwd: Option<String>,
}

struct ShellRunner {
    sandbox: Sandbox,
    /// The `deny` and `ask` command prefix rules the command is judged by again as it runs.
    commands: Option<CommandRules>,
    workspace: Workspace,
    timeout: Duration,
    max_output_bytes: usize,
    env: Vec<(OsString, OsString)>,
}

impl ShellRunner {
    async fn run(&self, args: ShellArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let cwd: PathBuf = self.workspace.resolve(args.cwd.as_deref().unwrap_or("."))?;
        if !cwd.is_dir() {
            return Err(ToolError::new(
                "not_a_folder",
                format!("cwd {} is not a folder", self.workspace.shown(&cwd)),
            )
            .permanent());
        }
        if let Some(rules) = &self.commands {
            let programs = ProgramsIn {
                folder: &cwd,
                home: variable(&self.env, "HOME"),
                config_home: variable(&self.env, "XDG_CONFIG_HOME"),
            };
            refused_now(rules, &args.command, &programs, ctx.approved())?;
        }
        not_cancelled(&ctx.cancel, "the command")?;
        let argv = ["-c".to_owned(), args.command];
        let command = GroupCommand {
            program: std::path::Path::new("sh"),
            args: &argv,
            working_dir: &cwd,
            env: &self.env,
            stdin: None,
            sandbox: &self.sandbox,
        };
        // Shared with the running child, so that a command killed on timeout still shows what
        // it had said: where a hanging build or test stopped is what the model needs.
        let stdout = Arc::new(Mutex::new(HeadTail::new(self.max_output_bytes)));
        let stderr = Arc::new(Mutex::new(HeadTail::new(self.max_output_bytes)));
        let work = command.spawn(stdout.clone(), stderr.clone()).map_err(|e| {
            e.into_tool_error(|e| {
                ToolError::new("shell_not_started", format!("cannot start sh: {e}"))
            })
        })?;
        let finished = run_until(work, &ctx.cancel, Some(self.timeout)).await;
        let streams = |head: String| -> (String, usize, usize) {
            let (Ok(out), Ok(err)) = (stdout.lock(), stderr.lock()) else {
                return (head, 0, 0);
            };
            (streams_text(head, &out, &err), out.total(), err.total())
        };
        let (status, note) = match finished {
            Ok(f) => (f.status, f.sandbox_note),
            Err(Stopped::Cancelled) => {
                let (text, _, _) =
                    streams("the call was cancelled and the command was killed".to_owned());
                return Err(ToolError::new("cancelled", text));
            }
            Err(Stopped::TimedOut) => {
                let (text, _, _) = streams(format!(
                    "the command did not finish within {} s and was killed with its whole \
                     process group",
                    self.timeout.as_secs_f64()
                ));
                return Err(ToolError::new("timeout", text));
            }
        };
        let status = status
            .map_err(|e| ToolError::new("shell_failed", format!("waiting for sh failed: {e}")))?;
        let (mut text, out_bytes, err_bytes) = streams(describe_status(&status));
        if let Some(note) = &note {
            text.push_str(&format!("\n[{note}]"));
        }
        Ok(ToolOutput::text(text).with_details(json!({
            "exit_code": status.code(),
            "stdout_bytes": out_bytes,
            "stderr_bytes": err_bytes,
            "sandbox_note": note,
        })))
    }
}

/// Why the shell refused a command the gate had let through: a command prefix rule matches it
/// as it runs, with its programs looked up where it runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandRefused {
    /// A `deny` command prefix rule matches the command now: one of its words leads to a
    /// program the rule denies (a link another call of the batch made after the gate judged
    /// the call, or one in the call's `cwd`, where the gate did not look).
    #[error(
        "the command runs a program the permission rules deny to this tool (one of its words now leads to it, where the command runs)"
    )]
    Denied,
    /// An `ask` command prefix rule matches the command now, and nobody approved this call.
    /// Calling again gets the call judged with the link in place, and so asked about.
    #[error(
        "the command runs a program the permission rules ask about for this tool (one of its words now leads to it, where the command runs), and nobody approved this call: call again to be asked"
    )]
    Unapproved,
}

impl CommandRefused {
    /// The stable code, also the code of the tool error the model reads.
    pub fn code(&self) -> &'static str {
        match self {
            CommandRefused::Denied => "command_denied",
            CommandRefused::Unapproved => "command_not_approved",
        }
    }
}

impl From<CommandRefused> for ToolError {
    fn from(e: CommandRefused) -> Self {
        // No retry turns a refused command into an accepted one.
        ToolError::new(e.code(), e.to_string()).permanent()
    }
}

/// Programs and files as a command started in `folder` with the tool's environment finds them
/// ([`program_files`]; git's global configuration in its `HOME`).
#[derive(Debug)]
struct ProgramsIn<'a> {
    folder: &'a Path,
    home: Option<&'a Path>,
    config_home: Option<&'a Path>,
}

impl ResolvePaths for ProgramsIn<'_> {
    fn root(&self) -> &Path {
        self.folder
    }

    fn resolve(&self, path: &str) -> Option<PathBuf> {
        Some(self.folder.join(path))
    }

    fn programs(&self, word: &str) -> Vec<PathBuf> {
        program_files(self.folder, word)
    }

    fn read_text(&self, path: &str) -> FileText {
        read_text_bounded(&self.folder.join(path))
    }

    fn home(&self) -> Option<&Path> {
        self.home
    }

    fn config_home(&self) -> Option<&Path> {
        self.config_home
    }
}

/// The folder the variable `name` of `env` holds, when it holds one.
fn variable<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a Path> {
    env.iter()
        .find(|(k, v)| k == name && !v.is_empty())
        .map(|(_, v)| Path::new(v))
}

/// Refuses `command`, about to run in `cwd`, when a command prefix rule the gate would not
/// have let pass matches it now: a `deny` rule always, an `ask` rule unless a person approved
/// this very call (`approved`, [`ToolContext::approved`]).
fn refused_now(
    rules: &CommandRules,
    command: &str,
    programs: &ProgramsIn<'_>,
    approved: bool,
) -> Result<(), CommandRefused> {
    match rules.judge(command, Some(programs)) {
        Some(Permission::Deny) => Err(CommandRefused::Denied),
        Some(Permission::Ask) if !approved => Err(CommandRefused::Unapproved),
        _ => Ok(()),
    }
}

/// `head`, then each stream that said something under a header of its own, or `(no output)`.
fn streams_text(mut head: String, out: &HeadTail, err: &HeadTail) -> String {
    for (name, stream) in [("stdout", out), ("stderr", err)] {
        let body = stream.text();
        let body = body.trim_end();
        if !body.is_empty() {
            head.push_str(&format!("\n--- {name} ---\n{body}"));
        }
    }
    if out.total() == 0 && err.total() == 0 {
        head.push_str(" (no output)");
    }
    head
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )]
    use super::*;
    use crate::testing::{call, code};
    use serde_json::Value;

    fn shell(dir: &std::path::Path) -> ShellTool {
        ShellTool::new(Workspace::new(dir).unwrap()).base_env([
            ("PATH", std::env::var("PATH").unwrap_or_default().as_str()),
            ("HOME", "/var/empty/test-home"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("MY_API_KEY", "sk-other"),
            ("UNLISTED", "nope"),
            ("EXTRA", "yes"),
        ])
    }

    async fn run(tool: &Tool, args: Value) -> Result<String, ToolError> {
        call(tool, args).await.map(|(text, _)| text)
    }

    #[tokio::test]
    async fn runs_in_the_workspace_with_the_status_and_both_streams() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let tool = shell(dir.path()).into_tool("shell");
        let got = run(
            &tool,
            json!({"command": "pwd; echo oops >&2; exit 3", "cwd": "sub"}),
        )
        .await
        .unwrap();
        let sub = std::fs::canonicalize(dir.path().join("sub")).unwrap();
        assert_eq!(
            got,
            format!(
                "exit status 3\n--- stdout ---\n{}\n--- stderr ---\noops",
                sub.display()
            )
        );
        let got = run(&tool, json!({"command": "true"})).await.unwrap();
        assert_eq!(got, "exit status 0 (no output)");
    }

    #[tokio::test]
    async fn a_command_is_judged_again_as_it_runs_with_its_programs_found_where_it_runs() {
        use agentloop::permissions::{PermissionRule, PermissionStore};
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/keep.txt"), "kept").unwrap();
        let rm = program_files(&root, "rm");
        let rm = rm.first().expect("rm on PATH");
        std::os::unix::fs::symlink(rm, root.join("sub/tidy")).unwrap();
        let rule =
            |prefix: &str, permission| PermissionRule::command_prefix("shell", prefix, permission);
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("rm", Permission::Deny))
            .configure(rule("rmdir", Permission::Ask));
        let workspace = Workspace::new(&root).unwrap().withhold(&store);
        let tool = ShellTool::new(workspace).into_tool("shell");
        // `./tidy` leads to `rm` in `sub`, where the command runs.
        let tidy = json!({"command": "./tidy -f keep.txt", "cwd": "sub"});
        let refused = run(&tool, tidy).await.unwrap_err();
        assert_eq!(code(&refused), "command_denied");
        assert!(root.join("sub/keep.txt").exists());
        // An ask rule: refused unless a person approved this very call.
        std::fs::create_dir(root.join("gone")).unwrap();
        let rmdir = json!({"command": "rmdir gone"});
        let unasked = run(&tool, rmdir.clone()).await.unwrap_err();
        assert_eq!(code(&unasked), "command_not_approved");
        assert!(root.join("gone").exists());
        let approved = ToolContext::detached("c", "shell").approved_by_a_person();
        tool.call(rmdir, approved).await.unwrap();
        assert!(!root.join("gone").exists(), "an approved call runs");
        // A command no rule matches runs, wherever it runs.
        run(&tool, json!({"command": "ls", "cwd": "sub"}))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_global_git_alias_in_the_tool_s_home_is_judged_as_the_command_runs() {
        use agentloop::permissions::{PermissionRule, PermissionStore};
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        std::fs::write(root.join("work/keep.txt"), "kept").unwrap();
        std::fs::write(
            root.join("home/.gitconfig"),
            "[alias]\n\tst = !rm -f keep.txt\n",
        )
        .unwrap();
        let mut store = PermissionStore::new(Permission::Allow);
        store.configure(PermissionRule::command_prefix(
            "shell",
            "rm",
            Permission::Deny,
        ));
        let workspace = Workspace::new(root.join("work")).unwrap().withhold(&store);
        let home = root.join("home");
        let tool = ShellTool::new(workspace)
            .base_env([
                ("PATH", std::env::var("PATH").unwrap_or_default()),
                ("HOME", home.to_string_lossy().into_owned()),
            ])
            .into_tool("shell");
        // The tool's `HOME`, not this process's, is where its git finds `st`.
        let refused = run(&tool, json!({"command": "git st"})).await.unwrap_err();
        assert_eq!(code(&refused), "command_denied");
        assert!(root.join("work/keep.txt").exists());
    }

    #[tokio::test]
    async fn the_environment_is_the_allow_list_minus_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let tool = shell(dir.path())
            .allow_env("EXTRA")
            .allow_env("OPENAI_API_KEY")
            .into_tool("shell");
        let got = run(&tool, json!({"command": "env | sort"})).await.unwrap();
        assert!(got.contains("HOME=/var/empty/test-home"), "{got}");
        assert!(got.contains("EXTRA=yes"), "{got}");
        assert!(!got.contains("UNLISTED"), "{got}");
        assert!(!got.contains("sk-"), "a secret reached the shell: {got}");
    }

    #[tokio::test]
    async fn a_cwd_outside_the_workspace_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("root/up")).unwrap();
        let tool = shell(&dir.path().join("root")).into_tool("shell");
        for (cwd, want) in [
            ("..", "path_parent_dir"),
            ("/tmp", "path_absolute"),
            ("up", "path_outside_root"),
        ] {
            let e = run(&tool, json!({"command": "touch planted", "cwd": cwd}))
                .await
                .unwrap_err();
            assert_eq!(code(&e), want, "{cwd}: {e}");
        }
        assert!(!dir.path().join("planted").exists());
    }

    #[tokio::test]
    async fn long_output_keeps_the_head_and_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let tool = shell(dir.path()).max_output_bytes(64).into_tool("shell");
        let got = run(
            &tool,
            json!({"command": "echo FIRST; seq 1 5000; echo LAST"}),
        )
        .await
        .unwrap();
        assert!(got.contains("FIRST"), "{got}");
        assert!(got.contains("LAST"), "{got}");
        assert!(got.contains("bytes cut from the middle"), "{got}");
        assert!(got.len() < 400, "{got}");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("sleeper.pid");
        let tool = shell(dir.path())
            // Long enough for a loaded machine to start sh and write the pid first.
            .timeout(Duration::from_secs(5))
            .into_tool("shell");
        // The background sleeper outlives its shell unless the whole group is killed.
        let e = run(
            &tool,
            json!({"command": "sleep 300 & echo $! > sleeper.pid; echo started; wait"}),
        )
        .await
        .unwrap_err();
        assert_eq!(code(&e), "timeout", "{e}");
        assert!(e.to_string().contains("--- stdout ---\nstarted"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(pid);
        // The kill is sent on timeout; reaping by init may take a moment on a loaded machine.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let gone = nix::sys::signal::kill(pid, None).is_err() || is_zombie(pid);
            if gone {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the background sleeper survived"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A killed process that its parent has not reaped yet is dead all the same.
    fn is_zombie(pid: nix::unistd::Pid) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    }
}
