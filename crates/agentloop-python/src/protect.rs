//! Keeping the Python process's credentials out of its tools' reach, as the CLI does
//! ([`agentloop_sandbox::protect_process`]: non-dumpable, so that no process it starts can read
//! `/proc/<pid>/environ` or `/mem` of it, or ptrace it).
//!
//! The CLI protects itself first thing in `main`. A Python process is not agentloop's alone, and
//! non-dumpable also means no core dump and no same-user debugger (py-spy, gdb) attaching, so
//! importing the package changes nothing: the process is protected when an agent file whose
//! tools can start processes is loaded ([`NativeAgent::from_file`](crate::agent::NativeAgent),
//! before its MCP servers start or any of its tools can run), or when the application asks
//! ([`protect_process`]). An agent of Python tools starts no process of agentloop's: what its
//! functions run is the application's, which calls `agentloop.protect_process()` if they run
//! commands the model gives.

use agentloop_cli::agent_file::AgentFile;
use agentloop_tools::Builtin;
use pyo3::prelude::*;

use crate::error;

/// Makes this process non-dumpable (Linux; nothing elsewhere), so that no process it starts can
/// read its environment or memory: what `agentloop` does at start, and `Agent.from_file` for an
/// agent file whose tools start processes. Raises `AgentloopError` (`sandbox.protect`) when it
/// cannot be done.
#[pyfunction]
pub(crate) fn protect_process() -> PyResult<()> {
    // As the CLI does: a process that cannot be protected does not go on to start tools.
    agentloop_sandbox::protect_process().map_err(|e| {
        error(
            "sandbox.protect",
            format!("cannot keep this process out of its tools' sight: {e}"),
        )
    })
}

/// Protects this process when the agent file, or any agent file its subagents and hand-offs
/// reach, can start a process.
pub(crate) fn protect_for(file: &AgentFile) -> PyResult<()> {
    if starts_processes(file) {
        protect_process()?;
    }
    Ok(())
}

/// True when the tools of `file` or of an agent file below it can start a process: a command
/// tool, the `shell`, a stdio MCP server. Anything not known to start none counts as one that
/// does: a new kind of tool is protected against until it is listed here.
fn starts_processes(file: &AgentFile) -> bool {
    let tool_starts = |t: &agentloop_cli::agent_file::ToolFileSpec| {
        if t.command.is_some() {
            return true;
        }
        if let Some(name) = &t.builtin {
            return !Builtin::from_name(name.get_ref()).is_some_and(starts_none);
        }
        // Subagents are their own files (walked below); a2a agents run elsewhere.
        t.agent.is_none() && t.a2a.is_none()
    };
    let mcp_starts = |m: &agentloop_cli::agent_file::McpFileSpec| m.url.is_none();
    file.tools().iter().any(tool_starts)
        || file.mcp().iter().any(mcp_starts)
        || file
            .subagents
            .iter()
            .map(|(_, child)| child)
            .chain(file.handoff_files.iter().map(|(_, child)| child))
            .any(starts_processes)
}

/// The built-in tools that start no process.
fn starts_none(builtin: Builtin) -> bool {
    matches!(
        builtin,
        Builtin::ReadFile
            | Builtin::WriteFile
            | Builtin::EditFile
            | Builtin::ListDir
            | Builtin::Glob
            | Builtin::Grep
            | Builtin::WebFetch
            | Builtin::Todo
            | Builtin::AskUser
    )
}
