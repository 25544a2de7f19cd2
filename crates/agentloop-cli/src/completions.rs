//! `agentloop completions SHELL`: the shell completion script, generated from the command line's
//! own definition so that it never falls behind a new flag.

use std::io::Write;

use clap::Args;
use clap_complete::Shell;

use crate::error::{CliError, code};

/// Which shell to write completions for.
#[derive(Debug, Args)]
#[command(
    after_help = "To load them in every new shell, add to its startup file:
  bash (.bashrc):        source <(agentloop completions bash)
  zsh (.zshrc):          source <(agentloop completions zsh)
  fish (config.fish):    agentloop completions fish | source"
)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    shell: Shell,
}

/// Prints the completion script for `command` (the whole `agentloop` command line) on stdout.
pub(crate) fn completions(
    args: &CompletionsArgs,
    mut command: clap::Command,
) -> Result<i32, CliError> {
    let name = command.get_name().to_owned();
    // Generated into memory first: clap_complete panics when its writer fails, and stdout can
    // (a closed pipe, `| head`); a write to a Vec cannot.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, name, &mut script);
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Ok(()) => Ok(code::OK),
        // The reader went away having read what it wanted: nothing to report.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(code::OK),
        Err(e) => Err(CliError::Io {
            message: format!("cannot write the completion script: {e}"),
        }),
    }
}
