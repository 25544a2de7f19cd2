//! What holds of the agent file checker ([`AgentFile::parse`], what `agentloop check` and every
//! command that loads a file go through) on any text, checked by the property test
//! (`tests/agent_file_props.rs`) and the cargo fuzz target (`fuzz/`, `agent_file`) alike: a
//! file or a list of problems, never a panic; a refused file has at least one problem, each at a
//! line and column of the text, and the problems print.

use std::path::Path;

use agentloop_cli::agent_file::AgentFile;

/// Checks `text` as an agent file in a folder that does not exist (a relative path it names
/// reads nothing); says what failed to hold, if anything did.
pub(crate) fn check(text: &str) -> Result<(), String> {
    let path = Path::new("/nonexistent-agentloop-check/agent.toml");
    let problems = match AgentFile::parse(path, text) {
        Ok(file) => {
            let _ = file.warnings();
            return Ok(());
        }
        Err(problems) => problems,
    };
    if problems.list().is_empty() {
        return Err("refused with no problem".to_owned());
    }
    let lines = text.split('\n').count();
    if let Some(p) = problems
        .list()
        .iter()
        .find(|p| p.line == 0 || p.line > lines || p.column == 0)
    {
        return Err(format!("{p:?} is not in the text's {lines} lines"));
    }
    let _ = problems.to_string();
    Ok(())
}
