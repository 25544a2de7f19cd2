//! `agentloop a2a serve FILE... --addr ADDR`: agents served to other agents over A2A (version
//! 1.0, JSON-RPC): each at `http://ADDR/NAME` (the first also at the root) with its agent card,
//! each message a run of the agent as its file describes it, streamed as the task's status. A
//! call its permissions ask about waits for the task's caller (`input-required`, then a message
//! on the task: approve or deny). With `--journal` a task is its journaled run (the same id): after
//! a restart `GetTask` finds it, and a run that was interrupted goes on. With `--sessions` a
//! context is a stored session.

use std::net::SocketAddr;
use std::sync::Arc;

use agentloop_a2a::{A2aServer, ServedAgent};
use clap::{Args, Subcommand};

use crate::assemble::{self, Approval};
use crate::error::{CliError, code};
use crate::served::{ServedArgs, ServedFiles};

/// `agentloop a2a ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum A2aCommand {
    /// Serves the agents over A2A: each one's card at http://ADDR/NAME/.well-known/agent-card.json
    /// (the first's also at the root), messages and tasks by JSON-RPC at http://ADDR/NAME.
    Serve(ServeArgs),
}

/// `agentloop a2a serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The files (each agent is served at its name), the journal and the trace.
    #[command(flatten)]
    served: ServedArgs,
    /// Where to listen (127.0.0.1:0 picks a free port; a bare PORT is loopback's; an address
    /// beyond this machine is warned about); the URL is printed on stderr.
    #[arg(long, value_name = "ADDR", value_parser = crate::served::listen_addr)]
    addr: SocketAddr,
    /// Keeps each context as a session in this store (its id is the context's): a context goes
    /// on after a restart, and `agentloop sessions` shows it. Without it contexts live in memory.
    #[arg(long, value_name = "PATH")]
    sessions: Option<std::path::PathBuf>,
    /// How long a task waits in input-required for its caller's answer, in seconds (default
    /// 3600): then it fails, its asked calls not run, and its context takes the next message.
    #[arg(long, value_name = "SECS",
          default_value_t = agentloop_a2a::DEFAULT_ANSWER_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    approval_timeout: u64,
}

/// Runs an `a2a` command.
pub(crate) async fn a2a(command: A2aCommand) -> Result<i32, CliError> {
    match command {
        A2aCommand::Serve(args) => serve(args).await,
    }
}

async fn serve(args: ServeArgs) -> Result<i32, CliError> {
    // From here a stop signal waits for the start to finish, then stops it in order.
    let stop = crate::runs::terminated();
    // The session store before the servers start, as the journal and the trace: a server's view
    // keeps only what exists then read-only, and one started first could rewrite a context's
    // history. It stays open until they are stopped: closing it deletes SQLite's `-wal` and
    // `-shm`, which drops a server's read-only binds of them.
    let sessions = match &args.sessions {
        Some(path) => Some(Arc::new(agentloop_store::SqliteSessions::open(path)?)
            as Arc<dyn agentloop::session::SessionStore>),
        None => None,
    };
    let more: Vec<std::path::PathBuf> = args.sessions.iter().cloned().collect();
    let served = ServedFiles::load(&args.served, &more).await?;
    let result = serve_files(&args, &served, sessions.clone(), stop).await;
    served.shutdown().await;
    drop(sessions);
    result
}

async fn serve_files(
    args: &ServeArgs,
    served: &ServedFiles,
    sessions: Option<Arc<dyn agentloop::session::SessionStore>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<i32, CliError> {
    let mut agents = Vec::new();
    for (i, l) in served.files.iter().enumerate() {
        let file = &l.0;
        served.warn_collisions(file, &l.1);
        let name = file.spec.name.get_ref().clone();
        // Each agent is served at its name's path: two of one name is a setup error naming both
        // files, as `mcp serve` reports two served tools of one name.
        let earlier = served.files.get(..i).unwrap_or_default();
        if let Some(first) = earlier.iter().find(|f| f.0.spec.name.get_ref() == &name) {
            let (first, second) = (&first.0.path, &file.path);
            return Err(CliError::Setup {
                message: format!(
                    "a2a.duplicate_agent: two served agents are named {name:?}: the agent of {} and \
                     the agent of {}",
                    crate::terminal::shown_path(first),
                    crate::terminal::shown_path(second)
                ),
            });
        }
        let description = file
            .spec
            .description
            .clone()
            .unwrap_or_else(|| format!("The agent {name}."));
        let l = l.clone();
        agents.push(ServedAgent {
            name,
            description,
            version: file
                .spec
                .version
                .clone()
                .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
            options: served.options(file),
            claim: served.claim(),
            release: served.release(),
            build: std::sync::Arc::new(move |approver| {
                let model = assemble::model(&l.0).map_err(|e| e.to_string())?;
                // Nobody answers at the server: a call the permissions ask about is asked of
                // the task's caller (the task waits in input-required for its answer).
                let approval = Approval::Prompter(approver);
                assemble::agent(&l.0, model, &approval, &l.1).map_err(|e| e.to_string())
            }),
        });
    }
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| CliError::Io {
            message: format!("cannot listen on {}: {e}", args.addr),
        })?;
    let at = listener.local_addr().map_or(args.addr, |a| a);
    if let Some(warning) = crate::served::exposed_warning(at) {
        err!("{warning}");
    }
    for name in &names {
        err!("agentloop: serving {name} over A2A at http://{at}/{name}");
    }
    let server = A2aServer::with_sessions(agents, sessions)
        .with_max_runs(args.served.max_runs)
        .with_answer_timeout(std::time::Duration::from_secs(args.approval_timeout));
    agentloop_a2a::serve(&server, listener, stop)
        .await
        .map_err(|e| CliError::Setup {
            message: format!("{}: {e}", e.code()),
        })?;
    Ok(code::OK)
}
