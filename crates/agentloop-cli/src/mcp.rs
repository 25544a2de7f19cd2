//! `agentloop mcp list FILE`: starts the `[[mcp]]` servers of the agent file (and of its
//! subagents' files) and prints each one's tools as the model would see them (name, description,
//! input and output schemas), then stops them. No model and no credentials are needed; the
//! servers' own variables are.
//!
//! `agentloop mcp serve FILE...`: the other way round, the agents (or with `--tools` their
//! tools) served to MCP clients, over stdio or streamable HTTP. Each call is a run of the agent
//! as the file describes it: its limits, permissions, sandbox and, with `--journal`, journal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentloop::CancellationToken;
use agentloop_mcp::serve::{AgentServer, Offer, ServeError, ServedAgent, ServedTools};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::assemble::{self, Approval};
use crate::error::{CliError, code};
use crate::served::{ServedArgs, ServedFiles};

/// `agentloop mcp ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Starts each declared MCP server and prints its tools with their schemas (no model needed).
    List {
        /// The agent file.
        file: PathBuf,
        /// Prints one JSON object: the servers and their tools.
        #[arg(long)]
        json: bool,
    },
    /// Serves the agents to MCP clients: each agent is one tool (called with a `task`, answering
    /// with its final output), over stdio, or streamable HTTP with --http.
    Serve(ServeArgs),
}

/// `agentloop mcp serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The files (each agent is one MCP tool, named as the agent), the journal and the trace.
    #[command(flatten)]
    served: ServedArgs,
    /// Serves streamable HTTP at http://ADDR/mcp (127.0.0.1:0 picks a free port) instead of
    /// stdio. A bare PORT is loopback's; an address beyond this machine is warned about. The
    /// address is printed on stderr.
    #[arg(long, value_name = "ADDR", value_parser = crate::served::listen_addr)]
    http: Option<SocketAddr>,
    /// Serves each file's tools instead of its agent (its command tools, built-in tools and its
    /// MCP servers' tools, as its model sees them), under the file's permissions and sandbox.
    /// Such a call's run is one call made for the client, not the agent's: it is not journaled.
    /// A server's tool named as an earlier tool or a hand-off is left out, as a run leaves it.
    #[arg(long, conflicts_with = "journal")]
    tools: bool,
    /// How long an HTTP session (a client of MCP before 2026-07-28) lives with no call of it
    /// running and no stream of it open, in seconds, or `off` to keep it until its client ends
    /// it: past it the session is closed, and its client's next request is answered 404 (it
    /// starts a session again). A call in progress never loses its session.
    #[arg(long, value_name = "SECS|off", requires = "http",
          default_value = SESSION_IDLE_DEFAULT, value_parser = session_idle)]
    session_idle: SessionIdle,
}

/// `--session-idle`'s default: [`agentloop_mcp::serve::DEFAULT_SESSION_IDLE`], in seconds (a
/// test holds them equal).
const SESSION_IDLE_DEFAULT: &str = "3600";

/// `--session-idle`: the bound, or none (`off`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct SessionIdle(Option<Duration>);

/// Reads `--session-idle`: a whole number of seconds, at least one, or `off`. Zero is refused
/// rather than taken as `off`: a session closed as soon as its call ends would read as a
/// server that forgets its clients.
fn session_idle(text: &str) -> Result<SessionIdle, String> {
    if text == "off" {
        return Ok(SessionIdle(None));
    }
    match text.parse::<u64>() {
        Ok(secs) if secs >= 1 => Ok(SessionIdle(Some(Duration::from_secs(secs)))),
        _ => Err("a whole number of seconds, at least 1 (3600 is an hour), or `off`".into()),
    }
}

/// Runs an `mcp` command.
pub(crate) async fn mcp(command: McpCommand) -> Result<i32, CliError> {
    match command {
        McpCommand::List { file, json } => list(file, json).await,
        McpCommand::Serve(args) => serve(args).await,
    }
}

async fn list(path: PathBuf, as_json: bool) -> Result<i32, CliError> {
    let file = crate::args::AgentFileArg { file: path }.load()?;
    let started = crate::assemble::StartedMcp::start(&file).await?;
    if started.files().next().is_none() {
        if as_json {
            out!("{}", json!({"servers": []}));
        } else {
            out!(
                "{} and its subagents' files declare no [[mcp]] servers",
                crate::terminal::shown_path(&file.path)
            );
        }
        return Ok(code::OK);
    }
    let collisions: Vec<Value> = started
        .files()
        .flat_map(|(path, servers)| {
            servers.collisions().into_iter().map(move |c| {
                json!({
                    "name": c.name,
                    "kept": {"server": c.kept_server, "tool": c.kept_tool},
                    "dropped": {"server": c.dropped_server, "tool": c.dropped_tool},
                    "file": path.display().to_string(),
                })
            })
        })
        .collect();
    let warnings = started.collision_warnings(&file);
    let mut listed: Vec<Value> = Vec::new();
    for (path, servers) in started.files() {
        for s in servers.servers() {
            let tools: Vec<Value> = s
                .tools()
                .iter()
                .map(|t| serde_json::to_value(t.spec()).unwrap_or_default())
                .collect();
            listed.push(json!({
                "name": s.name(),
                "file": path.display().to_string(),
                "protocol_version": s.protocol_version().await,
                "tools": tools,
            }));
        }
    }
    started.shutdown().await;
    if as_json {
        out!("{}", json!({"servers": listed, "collisions": collisions}));
        return Ok(code::OK);
    }
    // A server's text (its tools' names and descriptions) reaches a terminal: a description can
    // hold escape sequences (OSC 52 writes the clipboard, others the title or the screen), shown
    // as `\u{…}` instead. `--json` escapes them as JSON does.
    let mut text = String::new();
    let mut out = |line: String| {
        text.push_str(&line);
        text.push('\n');
    };
    for w in warnings {
        out(format!("warning: {w}"));
        out(String::new());
    }
    for server in &listed {
        let tools = server["tools"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let name = server["name"].as_str().unwrap_or_default();
        let of = server["file"].as_str().unwrap_or_default();
        let of = if of == file.path.display().to_string() {
            String::new()
        } else {
            format!(" (of {of})")
        };
        let version = server["protocol_version"]
            .as_str()
            .map(|v| format!(", MCP {v}"))
            .unwrap_or_default();
        out(format!(
            "{name}{of} — {} tool{}{version}",
            tools.len(),
            if tools.len() == 1 { "" } else { "s" }
        ));
        for tool in tools {
            out(String::new());
            out(format!("  {}", tool["name"].as_str().unwrap_or_default()));
            let description = tool["description"].as_str().unwrap_or_default();
            for line in description.lines().filter(|l| !l.trim().is_empty()) {
                out(format!("    {line}"));
            }
            for (label, key) in [("input", "input_schema"), ("output", "output_schema")] {
                if let Some(schema) = tool.get(key) {
                    out(format!("    {label} schema: {schema}"));
                }
            }
        }
        out(String::new());
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stdout().lock(),
        crate::terminal::escape_controls(&text).as_bytes(),
    );
    Ok(code::OK)
}

fn serve_error(e: &ServeError) -> CliError {
    CliError::Setup {
        message: format!("{}: {e}", e.code()),
    }
}

async fn serve(args: ServeArgs) -> Result<i32, CliError> {
    // From here a stop signal waits for the start to finish, then stops it in order.
    let stop = crate::runs::terminated();
    let served = ServedFiles::load(&args.served, &[]).await?;
    let result = match offer(&args, &served) {
        Ok(offer) => serve_offer(&args, offer, stop).await,
        Err(e) => Err(e),
    };
    served.shutdown().await;
    result
}

/// What the files offer: their agents, or with `--tools` their tools.
///
/// Two files never share a served name: that is a setup error naming both, as no file comes
/// before the other. Within one file `--tools` serves what its agent's model sees under each
/// name, as a run decides it: the file's own tools and hand-offs first, then its servers' tools
/// in declaration order, a name kept by the first that has it ([`file_tools`]).
fn offer(args: &ServeArgs, served: &ServedFiles) -> Result<Offer, CliError> {
    let mut offer = Offer::new();
    let mut names = ServedNames::default();
    for l in &served.files {
        let file = &l.0;
        let options = served.options(file);
        let shown = crate::terminal::shown_path(&file.path);
        if args.tools {
            let mut specs = Vec::new();
            for (spec, what) in file_tools(file, l.1.servers(file))? {
                names.claim(&spec.name, format!("{what} of {shown}"))?;
                specs.push(spec);
            }
            // The client names each tool it calls: nothing is deferred from it.
            let (file, l) = (crate::deferred::undeferred(file), l.clone());
            offer
                .tools(ServedTools {
                    specs,
                    build: Arc::new(move |model, prompter| {
                        assemble::agent(&file, model, &Approval::Prompter(prompter), &l.1)
                            .map_err(|e| e.to_string())
                    }),
                    options,
                })
                .map_err(|e| serve_error(&e))?;
        } else {
            served.warn_collisions(file, &l.1);
            let name = file.spec.name.get_ref().clone();
            names.claim(&name, format!("the agent of {shown}"))?;
            let description = file
                .spec
                .description
                .clone()
                .unwrap_or_else(|| format!("Hands a task to the agent {name}."));
            let output_schema = file
                .spec
                .output_schema
                .as_ref()
                .map(|s| s.get_ref().clone());
            let l = l.clone();
            offer
                .agent(ServedAgent {
                    name,
                    description,
                    output_schema,
                    build: Arc::new(move |prompter| {
                        let model = assemble::model(&l.0).map_err(|e| e.to_string())?;
                        assemble::agent(&l.0, model, &Approval::Prompter(prompter), &l.1)
                            .map_err(|e| e.to_string())
                    }),
                    options,
                })
                .map_err(|e| serve_error(&e))?;
        }
    }
    Ok(offer)
}

/// The served names so far, each with what it serves, for an error that names both holders of
/// one name.
#[derive(Default)]
struct ServedNames(Vec<(String, String)>);

impl ServedNames {
    fn claim(&mut self, name: &str, what: String) -> Result<(), CliError> {
        if let Some((_, first)) = self.0.iter().find(|(n, _)| n == name) {
            let e = ServeError::DuplicateTool {
                name: name.to_owned(),
            };
            return Err(CliError::Setup {
                message: format!("{}: {e}: {first} and {what}", e.code()),
            });
        }
        self.0.push((name.to_owned(), what));
        Ok(())
    }
}

/// A file's tools as `--tools` serves them, each with what it is: its own tools, then its
/// servers' tools, each name served as the tool its agent's runs give it. A run registers the
/// file's tools and hand-offs first and leaves out a server's tool whose name is taken (the
/// first listed of a name keeps it), so a server's tool named as one of those, or as an earlier
/// server's tool, is left out here too, with a warning naming both: listed, it would reach
/// another tool when called. Hand-offs are not served (each passes a conversation, which a
/// client's call has none of), but their names are still theirs.
fn file_tools(
    file: &crate::agent_file::AgentFile,
    servers: Option<&agentloop_mcp::McpServers>,
) -> Result<Vec<(agentloop::tool::ToolSpec, String)>, CliError> {
    let mut out: Vec<(agentloop::tool::ToolSpec, String)> = assemble::tools(file)?
        .iter()
        .map(|t| (t.spec().clone(), format!("the tool {:?}", t.spec().name)))
        .collect();
    let mut holders: Vec<(String, String)> = out
        .iter()
        .map(|(spec, _)| {
            (
                spec.name.clone(),
                format!("the agent's tool {:?}", spec.name),
            )
        })
        .collect();
    holders.extend(
        file.handoffs
            .iter()
            .map(|h| (h.tool.clone(), format!("the agent's hand-off {:?}", h.tool))),
    );
    for server in servers.map(|s| s.servers()).unwrap_or_default() {
        for tool in server.tools() {
            let spec = tool.spec();
            let what = format!(
                "the tool {:?} of the MCP server {}",
                spec.name,
                server.name()
            );
            if let Some((_, holder)) = holders.iter().find(|(n, _)| *n == spec.name) {
                err!(
                    "agentloop: warning: {}: {what} is not served: {holder} has its name, listed \
                     before it, and a run of the agent calls that one by it",
                    crate::terminal::shown_path(&file.path)
                );
                continue;
            }
            holders.push((spec.name.clone(), what.clone()));
            out.push((spec.clone(), what));
        }
    }
    Ok(out)
}

/// Serves until the client leaves (stdio), or Ctrl-C or SIGTERM.
async fn serve_offer(
    args: &ServeArgs,
    offer: Offer,
    stop_signal: impl Future<Output = ()> + Send + 'static,
) -> Result<i32, CliError> {
    let names: Vec<String> = offer.names().map(str::to_owned).collect();
    let server = AgentServer::new(offer)
        .with_max_runs(args.served.max_runs)
        .with_session_idle(args.session_idle.0);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let signals = tokio::spawn(async move {
        stop_signal.await;
        stop.cancel();
    });
    let served = match args.http {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| CliError::Io {
                    message: format!("cannot listen on {addr}: {e}"),
                })?;
            let at = listener.local_addr().map_or(addr, |a| a);
            if let Some(warning) = crate::served::exposed_warning(at) {
                err!("{warning}");
            }
            err!("agentloop: serving {} at http://{at}/mcp", names.join(", "));
            agentloop_mcp::serve::serve_http(server, listener, shutdown).await
        }
        None => {
            err!("agentloop: serving {} on stdio", names.join(", "));
            agentloop_mcp::serve::serve_stdio(server, shutdown).await
        }
    };
    signals.abort();
    served.map_err(|e| serve_error(&e))?;
    Ok(code::OK)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn session_idle_takes_whole_seconds_or_off_and_defaults_to_the_librarys_bound() {
        assert_eq!(
            session_idle(SESSION_IDLE_DEFAULT).unwrap(),
            SessionIdle(Some(agentloop_mcp::serve::DEFAULT_SESSION_IDLE))
        );
        assert_eq!(
            session_idle("90").unwrap(),
            SessionIdle(Some(Duration::from_secs(90)))
        );
        assert_eq!(session_idle("off").unwrap(), SessionIdle(None));
        for bad in ["0", "-1", "1.5", "1h", "", "OFF", "none"] {
            assert!(session_idle(bad).unwrap_err().contains("`off`"), "{bad}");
        }
    }
}
