//! What the commands that serve agents to other programs share (`mcp serve`, `a2a serve`): the
//! agent files loaded with their MCP servers started, the trace and the journal their runs
//! record to, and each run's options.

use std::path::PathBuf;
use std::sync::Arc;

use agentloop::{EventSink, RunOptions};
use agentloop_store::{Durability, TraceSink};

use crate::agent_file::AgentFile;
use crate::assemble::StartedMcp;
use crate::error::CliError;

/// The arguments every serving command takes: the files, and where their runs are journaled and
/// traced.
#[derive(Debug, clap::Args)]
pub(crate) struct ServedArgs {
    /// The agent files: each agent is served under its name.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// Journals each run in this SQLite journal, at the files' durability (`agentloop resume`
    /// goes on with a run the server left).
    #[arg(long, value_name = "PATH")]
    pub(crate) journal: Option<PathBuf>,
    /// Records each run to this trace file (.ndjson, or .sqlite/.db).
    #[arg(long, value_name = "PATH")]
    pub(crate) trace: Option<PathBuf>,
    /// The most runs the server drives at once, all its agents' together: a request that would
    /// start one more is refused (A2A: HTTP 429 and `a2a.busy`; MCP: an error result) and
    /// starts nothing. A task waiting for its caller's approval holds no place.
    #[arg(long, value_name = "N", default_value_t = agentloop_serve::DEFAULT_MAX_RUNS,
          value_parser = clap::builder::TypedValueParser::map(
              clap::value_parser!(u32).range(1..), |n| n as usize))]
    pub(crate) max_runs: usize,
}

/// An agent file with its started MCP servers, shared by the runs of it.
pub(crate) type Loaded = Arc<(AgentFile, StartedMcp)>;

/// The served files, their trace and their journal.
pub(crate) struct ServedFiles {
    pub(crate) files: Vec<Loaded>,
    pub(crate) trace: Option<Arc<TraceSink>>,
    journal: Option<Arc<agentloop_store::SqliteJournal>>,
}

impl ServedFiles {
    /// Loads the files, opens the trace and the journal, and starts the files' MCP servers
    /// (stopping those started when one fails). One journal holds every file's runs: a power
    /// cut loses none unless each file says `durability = "process"`.
    ///
    /// The trace and the journal are opened before any server starts, so that each server sees
    /// them read-only: a store made after would be a plain file in its writable folder.
    /// `more`: other stores the caller opened already (`a2a serve --sessions`), kept from the
    /// files' tools as the journal and the trace are.
    pub(crate) async fn load(args: &ServedArgs, more: &[PathBuf]) -> Result<ServedFiles, CliError> {
        let (paths, trace, journal) = (&args.files, args.trace.as_ref(), args.journal.as_ref());
        let mut stores: Vec<PathBuf> = [journal, trace].into_iter().flatten().cloned().collect();
        stores.extend_from_slice(more);
        let files = load_together(paths, &stores)?;
        let trace = crate::args::TraceArgs {
            trace: trace.cloned(),
            trace_payloads: false,
            otel: false,
            otel_payloads: false,
        }
        .open()?;
        let level = if files
            .iter()
            .all(|f| f.spec.durability == Some(Durability::Process))
        {
            Durability::Process
        } else {
            Durability::Power
        };
        let journal = journal
            .map(|p| crate::durable::open_journal(p, level))
            .transpose()?;
        let mut served = ServedFiles {
            files: Vec::new(),
            trace,
            journal,
        };
        for file in files {
            match StartedMcp::start(&file).await {
                Ok(mcp) => served.files.push(Arc::new((file, mcp))),
                Err(e) => {
                    served.shutdown().await;
                    return Err(e);
                }
            }
        }
        Ok(served)
    }

    /// Says, for each file whose agent is served, which tools of its started servers its runs
    /// leave out (their names taken by tools listed before them), as `agentloop run` says it:
    /// a client of the served agent meets the same tools a run does.
    pub(crate) fn warn_collisions(&self, file: &AgentFile, mcp: &StartedMcp) {
        let shown = crate::terminal::shown_path(&file.path);
        for w in mcp.collision_warnings(file) {
            err!("agentloop: warning: {shown}: {w}");
        }
    }

    /// The options of each run of `file`: the trace, the journal, and where it is resumed from.
    pub(crate) fn options(&self, file: &AgentFile) -> Arc<dyn Fn() -> RunOptions + Send + Sync> {
        let trace = self.trace.clone();
        let journal = self.journal.clone();
        let origin = crate::durable::origin(&file.path);
        Arc::new(move || RunOptions {
            sinks: trace
                .iter()
                .map(|t| Arc::clone(t) as Arc<dyn EventSink>)
                .collect(),
            journal: journal
                .clone()
                .map(|j| j as Arc<dyn agentloop::journal::Journal>),
            origin: Some(origin.clone()),
            ..RunOptions::default()
        })
    }

    /// Takes a journaled run for this process before it goes on (none without a journal): a
    /// run another live process drives is refused.
    pub(crate) fn claim(&self) -> Option<agentloop_a2a::ClaimRun> {
        let journal = self.journal.clone()?;
        Some(Arc::new(move |run_id: &str| {
            journal
                .own(run_id)
                .map_err(|e| format!("{}: {e}", e.code()))
        }))
    }

    /// Lets go of a run [`ServedFiles::claim`] took that does not go on after all (none without a
    /// journal), so that another process may resume it.
    pub(crate) fn release(&self) -> Option<agentloop_a2a::ReleaseRun> {
        let journal = self.journal.clone()?;
        Some(Arc::new(move |run_id: &str| journal.release(run_id)))
    }

    /// Stops every file's MCP servers and writes the trace's end.
    pub(crate) async fn shutdown(&self) {
        for l in &self.files {
            l.1.shutdown().await;
        }
        if let Err(e) = crate::runs::finish_trace(self.trace.as_ref()) {
            err!("agentloop: warning: {e}");
        }
    }
}

/// Loads files one process serves together, each protected ([`AgentFile::protect`]) with the
/// own files of all and with `stores`, the files the runs write. They are one program, as a
/// file's tree is: a caller of one agent could otherwise have it rewrite a sibling's file, its
/// permission store or its scripts, which every later start of the server would run.
pub(crate) fn load_together(
    paths: &[PathBuf],
    stores: &[PathBuf],
) -> Result<Vec<AgentFile>, CliError> {
    let mut files = paths
        .iter()
        .map(|path| crate::args::AgentFileArg { file: path.clone() }.load())
        .collect::<Result<Vec<AgentFile>, CliError>>()?;
    let mut protected = stores.to_vec();
    protected.extend(files.iter().flat_map(AgentFile::own_files));
    for file in &mut files {
        file.protect(&protected);
    }
    Ok(files)
}

/// An address to listen on, as `--http` and `--addr` take it: `HOST:PORT`, or a bare `PORT`,
/// which is loopback's (127.0.0.1). Nothing listens beyond this machine unless an address says so.
pub(crate) fn listen_addr(given: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = given.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    given.parse().map_err(|_| {
        format!("{given:?} is neither HOST:PORT (127.0.0.1:8080, [::1]:8080) nor a PORT")
    })
}

/// A warning for an address other machines can reach: the served agents take no credentials.
pub(crate) fn exposed_warning(addr: std::net::SocketAddr) -> Option<String> {
    (!addr.ip().is_loopback()).then(|| {
        format!(
            "agentloop: warning: listening on {addr}, beyond this machine: anyone who reaches it \
             can run the served agents (no authentication); give a loopback address to keep \
             them local"
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_bare_port_listens_on_loopback_and_only_an_address_reaches_further() {
        let port = listen_addr("8080").unwrap();
        assert_eq!(port.to_string(), "127.0.0.1:8080");
        assert_eq!(exposed_warning(port), None);
        assert_eq!(exposed_warning(listen_addr("[::1]:0").unwrap()), None);
        let all = listen_addr("0.0.0.0:8080").unwrap();
        assert!(
            exposed_warning(all)
                .unwrap()
                .contains("beyond this machine")
        );
        assert!(listen_addr("localhost").unwrap_err().contains("PORT"));
    }
}
