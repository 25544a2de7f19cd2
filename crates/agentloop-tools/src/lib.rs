//! Built-in tools for agentloop: [`CommandTool`], a tool that runs a program with its arguments
//! as one JSON document on stdin and hands its stdout to the model; and the built-in tools an
//! agent file names with `builtin = "..."` ([`Builtin`]): files confined to a [`Workspace`]
//! (`read_file`, `write_file`, `edit_file`, `list_dir`, `glob`, `grep`), a [`ShellTool`], and a
//! [`WebFetchTool`] that refuses private networks, and `todo`, the plan the model keeps
//! ([`todo::todo_tool`], read back from an outcome with [`todo::todos_of`]); and [`ToolSearch`],
//! deferred tools the model finds with `search_tools`.
#![forbid(unsafe_code)]

mod beneath;
pub mod builtin;
pub mod command;
pub mod files;
mod process;
pub mod search;
pub mod shell;
pub mod todo;
pub mod web;
pub mod workspace;

/// The sandbox of the processes the shell and command tools start.
pub use agentloop_sandbox::{Resources, Sandbox, SandboxError, SandboxMode, SandboxPolicy};
pub use builtin::{Builtin, BuiltinError, BuiltinOptions};
pub use command::{
    CommandTool, CommandToolError, DEFAULT_MAX_ERROR_BYTES, DEFAULT_MAX_OUTPUT_BYTES,
};
pub use process::is_secret_env;
pub use search::{SEARCH_TOOLS, ToolSearch};
pub use shell::ShellTool;
pub use web::{WebFetchError, WebFetchTool, is_refused_ip};
pub use workspace::{PathError, Workspace, WorkspaceError};

/// What the crate's unit tests share: calling a tool and reading its answer.
#[cfg(test)]
mod testing {
    #![allow(clippy::panic)]
    use agentloop::{Tool, ToolContext, ToolError, message::ToolContent};
    use serde_json::Value;

    /// Calls a tool outside a run; its text and details, or its error.
    pub(crate) async fn call(
        tool: &Tool,
        args: Value,
    ) -> Result<(String, Option<Value>), ToolError> {
        tool.call(args, ToolContext::detached("c", tool.name()))
            .await
            .map(|o| match o.content {
                ToolContent::Text(t) => (t.to_string(), o.details),
                other => panic!("not text: {other:?}"),
            })
    }

    /// The code of an error (`fatal` for a fatal one).
    pub(crate) fn code(e: &ToolError) -> &str {
        match e {
            ToolError::Recoverable { code, .. } => code,
            ToolError::Fatal { .. } => "fatal",
        }
    }
}
