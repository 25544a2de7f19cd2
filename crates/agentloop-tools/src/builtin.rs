//! The built-in tools by name ([`Builtin`]), their options ([`BuiltinOptions`]) and their
//! permission defaults: what an agent file's `[[tools]] builtin = "read_file"` becomes.

use std::path::PathBuf;
use std::time::Duration;

use agentloop::Tool;
use agentloop::permissions::{Permission, PermissionStore};
use agentloop_sandbox::SandboxPolicy;

use crate::files::{self, DEFAULT_MAX_READ_BYTES, DEFAULT_MAX_RESULTS, FileLimits};
use crate::shell::ShellTool;
use crate::web::{WebFetchError, WebFetchTool};
use crate::workspace::{Workspace, WorkspaceError};

/// A built-in tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Builtin {
    /// `read_file`: a text file, by line ranges, within a size cap.
    ReadFile,
    /// `write_file`: a whole file, written atomically.
    WriteFile,
    /// `edit_file`: an exact, unique text replacement, answered with a diff.
    EditFile,
    /// `list_dir`: a folder's entries.
    ListDir,
    /// `glob`: the files whose path matches a pattern.
    Glob,
    /// `grep`: the lines matching a regular expression.
    Grep,
    /// `shell`: `sh -c COMMAND` in the workspace.
    Shell,
    /// `web_fetch`: a public http(s) URL as text.
    WebFetch,
    /// `todo`: the plan the model keeps (add, update a status, list), in the run's outcome.
    Todo,
    /// `ask_user`: a question to the user, answered at admission by the run's answer gate
    /// (`agentloop::ask::AskGate`).
    AskUser,
}

impl Builtin {
    /// Every built-in tool.
    pub const ALL: [Builtin; 10] = [
        Builtin::ReadFile,
        Builtin::WriteFile,
        Builtin::EditFile,
        Builtin::ListDir,
        Builtin::Glob,
        Builtin::Grep,
        Builtin::Shell,
        Builtin::WebFetch,
        Builtin::Todo,
        Builtin::AskUser,
    ];

    /// Its name, also the default name the model calls it by.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "read_file",
            Builtin::WriteFile => "write_file",
            Builtin::EditFile => "edit_file",
            Builtin::ListDir => "list_dir",
            Builtin::Glob => "glob",
            Builtin::Grep => "grep",
            Builtin::Shell => "shell",
            Builtin::WebFetch => "web_fetch",
            Builtin::Todo => "todo",
            Builtin::AskUser => "ask_user",
        }
    }

    /// The built-in tool of a name.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// What a permission gate should do with its calls when the configuration says nothing
    /// about the tool: [`Permission::Ask`] for `shell` (it can do anything the user can),
    /// [`Permission::Allow`] for the others, which cannot leave their workspace or reach a
    /// private network. Applications (the CLI) add it as a rule for the tool when their
    /// permission rules neither list nor name it.
    pub fn default_permission(self) -> Permission {
        match self {
            Builtin::Shell => Permission::Ask,
            _ => Permission::Allow,
        }
    }

    /// True for the tools confined to a workspace folder (all but `web_fetch`, `todo` and
    /// `ask_user`).
    pub fn uses_root(self) -> bool {
        !matches!(self, Builtin::WebFetch | Builtin::Todo | Builtin::AskUser)
    }

    /// True for the tools that walk folders (`list_dir`, `glob`, `grep`): they meet files no
    /// call named, and leave out those [`BuiltinOptions::withhold`]'s path rules deny or ask
    /// about.
    pub fn walks(self) -> bool {
        matches!(self, Builtin::ListDir | Builtin::Glob | Builtin::Grep)
    }

    /// True for the tools that judge paths by [`BuiltinOptions::withhold`]'s path rules as they
    /// run: those that walk ([`Builtin::walks`]), and `read_file`, `write_file` and `edit_file`,
    /// which refuse a path a `deny` rule matches by then (another call of their batch may have
    /// made it a link to a denied file after the gate allowed them).
    pub fn judges_paths(self) -> bool {
        self.walks()
            || matches!(
                self,
                Builtin::ReadFile | Builtin::WriteFile | Builtin::EditFile
            )
    }

    /// True for the tools that judge their command by [`BuiltinOptions::withhold`]'s `deny` and
    /// `ask` command prefix rules as they run (the shell: another call of its batch may have
    /// made a word of its command a link to a denied program after the gate allowed it, and its
    /// `cwd` is where its programs are looked up).
    pub fn judges_commands(self) -> bool {
        self == Builtin::Shell
    }

    /// The tool, under its own name.
    pub fn tool(self, options: &BuiltinOptions) -> Result<Tool, BuiltinError> {
        self.tool_named(self.name(), options)
    }

    /// The tool, under the name `name`.
    pub fn tool_named(self, name: &str, options: &BuiltinOptions) -> Result<Tool, BuiltinError> {
        if self == Builtin::Todo {
            return Ok(crate::todo::todo_tool(name));
        }
        if self == Builtin::AskUser {
            return Ok(agentloop::ask::ask_user_tool(name));
        }
        if self == Builtin::WebFetch {
            let mut tool = WebFetchTool::new();
            for entry in &options.allow_private {
                tool = tool.allow(entry)?;
            }
            if let Some(bytes) = options.max_bytes {
                tool = tool.max_bytes(bytes);
            }
            if let Some(t) = options.timeout {
                tool = tool.timeout(t);
            }
            return Ok(tool.into_tool(name));
        }
        let mut workspace = Workspace::new(&options.root)?.protect(&options.protected);
        if let Some(rules) = &options.withhold {
            workspace = workspace.withhold(rules);
        }
        if self == Builtin::Shell {
            let mut tool = ShellTool::new(workspace).sandbox(options.sandbox);
            for var in &options.env {
                tool = tool.allow_env(var.clone());
            }
            if let Some(bytes) = options.max_bytes {
                tool = tool.max_output_bytes(bytes);
            }
            if let Some(t) = options.timeout {
                tool = tool.timeout(t);
            }
            return Ok(tool.into_tool(name));
        }
        let limits = FileLimits {
            workspace,
            max_bytes: options.max_bytes.unwrap_or(DEFAULT_MAX_READ_BYTES),
            max_results: options.max_results.unwrap_or(DEFAULT_MAX_RESULTS),
            max_entries_read: crate::beneath::MAX_ENTRIES_READ,
            withheld: None,
        };
        let make = match self {
            Builtin::ReadFile => files::read_file,
            Builtin::WriteFile => files::write_file,
            Builtin::EditFile => files::edit_file,
            Builtin::ListDir => files::list_dir,
            Builtin::Glob => files::glob,
            _ => files::grep,
        };
        Ok(make(name, &limits))
    }
}

impl std::fmt::Display for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The options of a built-in tool; each tool reads those that concern it.
#[must_use]
#[derive(Debug, Clone)]
pub struct BuiltinOptions {
    /// The workspace folder of the file tools and the shell (default `.`).
    pub root: PathBuf,
    /// Files: the most bytes of text a call answers; shell: the cap of each stream; web_fetch:
    /// the most body bytes read.
    pub max_bytes: Option<usize>,
    /// list_dir, glob, grep: the most entries or matches a call answers.
    pub max_results: Option<usize>,
    /// Shell: the timeout of a command; web_fetch: of a fetch.
    pub timeout: Option<Duration>,
    /// web_fetch: hosts, addresses and networks it may reach although they are not public.
    pub allow_private: Vec<String>,
    /// Shell: variables passed through besides the default allow list (never a secret).
    pub env: Vec<String>,
    /// File tools: paths they never write, wherever the root is (the agent's own files: its
    /// definition, scripts, instructions and the stores its runs write). Reading stays allowed.
    pub protected: Vec<PathBuf>,
    /// Shell: the sandbox of its commands (default `workspace-write`, no network).
    pub sandbox: SandboxPolicy,
    /// list_dir, glob, grep: the permission rules whose `deny` and `ask` path rules they apply
    /// to each entry they walk, leaving out what those match; read_file, write_file, edit_file:
    /// the rules whose `deny` path rules they judge their path by again as they run
    /// ([`Workspace::withhold`], [`Builtin::judges_paths`]); shell: the rules whose `deny` and
    /// `ask` command prefix rules it judges its command by again as it runs
    /// ([`Builtin::judges_commands`]). Give the store the gate decides with.
    pub withhold: Option<PermissionStore>,
}

impl Default for BuiltinOptions {
    fn default() -> Self {
        BuiltinOptions {
            root: PathBuf::from("."),
            max_bytes: None,
            max_results: None,
            timeout: None,
            allow_private: Vec::new(),
            env: Vec::new(),
            protected: Vec::new(),
            sandbox: SandboxPolicy::default(),
            withhold: None,
        }
    }
}

impl BuiltinOptions {
    /// Options with the workspace folder `root`.
    pub fn rooted(root: impl Into<PathBuf>) -> Self {
        BuiltinOptions {
            root: root.into(),
            ..BuiltinOptions::default()
        }
    }
}

/// Why a built-in tool could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuiltinError {
    /// The workspace folder could not be opened.
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    /// The web fetch options are wrong.
    #[error(transparent)]
    WebFetch(#[from] WebFetchError),
}

impl BuiltinError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            BuiltinError::Workspace(e) => e.code(),
            BuiltinError::WebFetch(e) => e.code(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_builtin_builds_under_its_name_and_only_shell_asks() {
        let dir = tempfile::tempdir().unwrap();
        for b in Builtin::ALL {
            assert_eq!(Builtin::from_name(b.name()), Some(b));
            let tool = b.tool(&BuiltinOptions::rooted(dir.path())).unwrap();
            assert_eq!(tool.name(), b.name());
            agentloop::tool::check_schema(&tool.spec().input_schema).unwrap();
            assert_eq!(
                b.default_permission() == Permission::Ask,
                b == Builtin::Shell
            );
        }
        assert_eq!(Builtin::from_name("rm_rf"), None);
        let renamed = Builtin::ReadFile
            .tool_named("cat", &BuiltinOptions::rooted(dir.path()))
            .unwrap();
        assert_eq!(renamed.name(), "cat");
    }

    #[test]
    fn a_missing_root_or_a_bad_allow_entry_is_a_setup_error() {
        let e = Builtin::Grep
            .tool(&BuiltinOptions::rooted("/no/such/folder"))
            .unwrap_err();
        assert_eq!(e.code(), "workspace.root");
        let options = BuiltinOptions {
            allow_private: vec!["not a host!".into()],
            ..BuiltinOptions::default()
        };
        let e = Builtin::WebFetch.tool(&options).unwrap_err();
        assert_eq!(e.code(), "web_fetch.invalid_allow");
    }
}
