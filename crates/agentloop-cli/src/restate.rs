//! Runs past one machine: `serve` (agents as a Restate service endpoint), `submit` (a run
//! through the Restate ingress), `attach` (follow one to its end), and `approve --restate`.
//! Restate journals each step; the core decides what a run does, as in one process.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentloop::permissions::Answer;
use agentloop::{Agent, Event, EventSink, RunOutcome};
use agentloop_restate::{Agents, EndpointOptions, Ingress, RestateError, RunRequest};
use clap::Args;
use serde_json::{Value, json};

use crate::agent_file::AgentFile;
use crate::approval::NO_TERMINAL_REASON;
use crate::args::AgentFileArg;
use crate::assemble::{self, Approval, StartedMcp};
use crate::error::{CliError, outcome_exit_code};
use crate::render::{self, Progress};
use crate::runs::{finish_trace, print_final_text};

/// The Restate ingress a command talks to.
#[derive(Debug, Args)]
pub(crate) struct IngressArg {
    /// The Restate ingress (default: $AGENTLOOP_RESTATE, else http://127.0.0.1:8080). A URL with
    /// a user and password belongs in the variable: the command line is readable by every
    /// process of this user.
    #[arg(
        long = "restate",
        value_name = "URL",
        env = INGRESS_ENV,
        default_value = DEFAULT_INGRESS
    )]
    pub url: String,
}

impl IngressArg {
    fn ingress(&self) -> Result<Ingress, CliError> {
        warn_argv_credentials("--restate", &self.url, INGRESS_ENV);
        Ingress::new(&self.url).map_err(restate_error)
    }
}

/// The ingress a `--restate [URL]` of `approve`, `answer` or `approvals list` names: without a
/// URL, $AGENTLOOP_RESTATE's, else http://127.0.0.1:8080 (those commands read a journal unless
/// the flag is there, so the variable alone cannot choose Restate for them).
fn ingress_at(url: &str) -> Result<Ingress, CliError> {
    let url = if url.is_empty() {
        std::env::var(INGRESS_ENV).unwrap_or_else(|_| DEFAULT_INGRESS.to_owned())
    } else {
        warn_argv_credentials("--restate", url, INGRESS_ENV);
        url.to_owned()
    };
    Ingress::new(&url).map_err(restate_error)
}

/// The ingress when nothing names one.
const DEFAULT_INGRESS: &str = "http://127.0.0.1:8080";
/// The variable `--restate` falls back to.
const INGRESS_ENV: &str = "AGENTLOOP_RESTATE";
/// The variable `serve --register` falls back to.
const ADMIN_ENV: &str = "AGENTLOOP_RESTATE_ADMIN";

/// Warns on stderr when `url`, given as `flag` on the command line, carries credentials (a user
/// and password, or query values): a process's arguments are readable by every process of its
/// user (`/proc/<pid>/cmdline`), the agent's own tools included, where its environment is not
/// (the sandbox keeps `env` from tools, and `AGENTLOOP_RESTATE*` is never passed to one).
fn warn_argv_credentials(flag: &str, url: &str, env: &str) {
    let from_env = std::env::var(env).ok();
    if let Some(warning) = argv_credentials_warning(flag, url, env, from_env.as_deref()) {
        err!("{warning}");
    }
}

/// The warning [`warn_argv_credentials`] prints, if any: none for a URL without credentials, or
/// one that is the value of `env` (clap took it from there, not from the arguments).
fn argv_credentials_warning(
    flag: &str,
    url: &str,
    env: &str,
    from_env: Option<&str>,
) -> Option<String> {
    if agentloop::url_secrets::secrets(url).is_empty() || from_env == Some(url) {
        return None;
    }
    // `approve`, `answer` and `approvals list` read the variable only when the flag is given.
    let hint = if flag == "--restate" {
        " (`approve`, `answer` and `approvals list` then take --restate without a URL)"
    } else {
        ""
    };
    Some(format!(
        "agentloop: warning: {flag} {} carries credentials in the command line, which every \
         process of this user can read (the agent's tools included); set {env} instead{hint}",
        agentloop_restate::ingress::shown(url)
    ))
}

/// `agentloop serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The agent files to serve (runs name the agent by its `name`).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Where the endpoint listens (HTTP/2 without TLS). Several worker processes on one machine
    /// may share the address: Restate sends a run's next attempt there, and whichever answers
    /// takes it.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9080")]
    restate_endpoint: SocketAddr,
    /// A public key of the Restate server (`publickeyv1_…`, its
    /// `request-identity-private-key-pem-file`'s): the endpoint answers only requests it signed.
    /// Repeatable; without one, anyone who reaches the endpoint can run the agents, so it stays
    /// on loopback.
    #[arg(
        long,
        value_name = "KEY",
        env = "AGENTLOOP_RESTATE_IDENTITY_KEYS",
        value_delimiter = ','
    )]
    identity_key: Vec<String>,
    /// Registers the endpoint with the Restate admin API at this URL (http://127.0.0.1:9070;
    /// default: $AGENTLOOP_RESTATE_ADMIN, else no registration). A URL with a user and password
    /// belongs in the variable: the command line is readable by every process of this user.
    #[arg(long, value_name = "ADMIN_URL", env = ADMIN_ENV)]
    register: Option<String>,
    /// Where runs publish their events and approvals for `attach` and `approve`.
    #[command(flatten)]
    ingress: IngressArg,
    /// Also records the runs this worker drives to this trace file.
    #[arg(long, value_name = "PATH")]
    trace: Option<PathBuf>,
    /// During a long step (a slow model call or tool), a journal entry this often, in seconds:
    /// Restate cuts an attempt that stays silent past its inactivity timeout (a minute by
    /// default), and its cancel reaches a run at the next entry.
    #[arg(long, value_name = "SECS", default_value_t = 5.0, value_parser = heartbeat_secs)]
    heartbeat_secs: f64,
    /// How long a run's events are kept for `attach` after it ends, in seconds (a day).
    #[arg(long, value_name = "SECS", default_value_t = 86_400)]
    news_retention_secs: u64,
}

fn heartbeat_secs(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.05..=3600.0).contains(&s) => Ok(s),
        _ => Err("a number of seconds from 0.05 to 3600".into()),
    }
}

/// `agentloop submit`.
#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    agent: AgentFileArg,
    /// The input text.
    #[arg(long)]
    input: String,
    /// The conversation: runs of one session key run one at a time, each on the transcript the
    /// last one left (default: a new one).
    #[arg(long, value_name = "KEY")]
    session: Option<String>,
    /// Submitting again with the same key starts no second run (default: a new key). Without
    /// --session, the key names the run's session too (`idempotent-` and a digest of it).
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    #[command(flatten)]
    ingress: IngressArg,
    /// Prints {"id", "session", "status"} as JSON.
    #[arg(long)]
    json: bool,
}

/// `agentloop attach`.
#[derive(Debug, Args)]
pub(crate) struct AttachArgs {
    /// The run's id, as `submit` printed it.
    id: String,
    #[command(flatten)]
    ingress: IngressArg,
    /// Prints exactly one JSON object on stdout when the run ends (as `run --json`), and
    /// nothing else there.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Prints only the final output (warnings still go to stderr; AGENTLOOP_LOG=off hides them).
    #[arg(long, short)]
    quiet: bool,
}

fn restate_error(e: RestateError) -> CliError {
    CliError::Restate {
        code: e.code(),
        message: e.to_string(),
    }
}

/// The agents a worker serves: their files, their MCP servers, and the trace.
struct Served {
    files: Vec<(AgentFile, StartedMcp)>,
    trace: Option<Arc<agentloop_store::TraceSink>>,
}

impl Agents for Served {
    fn agent(&self, name: &str) -> Result<Agent, String> {
        let Some((file, mcp)) = self
            .files
            .iter()
            .find(|(f, _)| f.spec.name.get_ref() == name)
        else {
            return Err(format!("this worker serves no agent named {name:?}"));
        };
        // A resumed run's script goes on where its journal left it (the core's resume does it).
        let model = assemble::model(file).map_err(|e| e.to_string())?;
        // Nobody is at a worker's terminal: a call that asks suspends the run until
        // `agentloop approve --restate` answers it.
        let approval = Approval::Nobody(NO_TERMINAL_REASON);
        assemble::agent(file, model, &approval, mcp).map_err(|e| e.to_string())
    }

    fn sinks(&self, _run_id: &str) -> Vec<Arc<dyn EventSink>> {
        self.trace
            .iter()
            .map(|t| Arc::clone(t) as Arc<dyn EventSink>)
            .collect()
    }

    fn report(&self, outcome: &RunOutcome) -> Value {
        // The outcome names no agent: its cost is unknown (null) when every agent served prices
        // its answers, as `run` shows it.
        let priced = self
            .files
            .iter()
            .all(|(f, _)| assemble::has_pricing(f.model()));
        json!({
            "outcome": render::priced_outcome_json(outcome, false, priced),
            "exit_code": outcome_exit_code(outcome),
            "closing_line": render::closing_line(outcome, render::cost_unknown(outcome, priced)),
        })
    }

    fn refused(&self, run_id: &str, error: &agentloop::journal::JournalError) -> Value {
        let code = CliError::Journal(error.clone()).exit_code();
        json!({
            "outcome": {
                "run_id": run_id,
                "stop_reason": agentloop::StopReason::Failed.as_str(),
                "output": null,
                "error": {"code": error.code(), "message": error.to_string()},
            },
            "exit_code": code,
            "closing_line": format!("■ run {run_id} cannot go on: {} ({error})", error.code()),
        })
    }
}

/// `agentloop serve FILE...`: until Ctrl-C or SIGTERM.
pub(crate) async fn serve(args: ServeArgs) -> Result<i32, CliError> {
    // From here a stop signal waits for the start to finish, then stops it in order.
    let signal = crate::runs::terminated();
    let stores: Vec<PathBuf> = args.trace.iter().cloned().collect();
    let loaded = crate::served::load_together(&args.files, &stores)?;
    // The trace exists before any server starts, as for `a2a serve`: a server's view keeps only
    // what exists when it starts read-only.
    let trace = match &args.trace {
        Some(path) => Some(Arc::new(
            agentloop_store::TraceSink::open(path, agentloop_store::TraceOptions::default())
                .map_err(|e| CliError::Io {
                    message: format!(
                        "cannot open the trace {}: {e}",
                        crate::terminal::shown_path(path)
                    ),
                })?,
        )),
        None => None,
    };
    let mut files = Vec::new();
    for file in loaded {
        let mcp = StartedMcp::start(&file).await?;
        files.push((file, mcp));
    }
    let names: Vec<String> = files
        .iter()
        .map(|(f, _)| f.spec.name.get_ref().clone())
        .collect();
    let mut options = EndpointOptions::default();
    options.ingress = Some(args.ingress.ingress()?);
    options.heartbeat = Duration::from_secs_f64(args.heartbeat_secs);
    options.news_retention = Duration::from_secs(args.news_retention_secs);
    options.identity_keys = args.identity_key.clone();
    if options.identity_keys.is_empty()
        && let Some(warning) = crate::served::exposed_warning(args.restate_endpoint)
    {
        err!("{warning}, or --identity-key to answer only your Restate server");
    }
    let served = Arc::new(Served {
        files,
        trace: trace.clone(),
    });
    let endpoint = agentloop_restate::endpoint(served.clone(), options).map_err(restate_error)?;
    let listener = agentloop_restate::listener(args.restate_endpoint).map_err(restate_error)?;
    let url = format!("http://{}", args.restate_endpoint);
    err!("serving {} at {url}", names.join(", "));
    // A registration that fails stops the worker: nothing would ever reach it.
    let (refused_tx, refused) = tokio::sync::oneshot::channel::<RestateError>();
    if let Some(admin) = &args.register {
        warn_argv_credentials("--register", admin, ADMIN_ENV);
        // The listener is bound: Restate's discovery waits in its queue until it is served.
        let (admin, url) = (admin.clone(), url.clone());
        tokio::spawn(async move {
            match agentloop_restate::register(&admin, &url).await {
                Ok(()) => err!(
                    "registered {url} with {}",
                    agentloop_restate::ingress::shown(&admin)
                ),
                Err(e) => {
                    let _ = refused_tx.send(e);
                }
            }
        });
    }
    let refusal = std::sync::Mutex::new(None);
    let stop = async {
        let refused = async {
            match refused.await {
                Ok(e) => e,
                // Registered, or not asked to: only a signal stops the worker.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            () = signal => {}
            e = refused => {
                if let Ok(mut slot) = refusal.lock() {
                    *slot = Some(e);
                }
            }
        }
    };
    agentloop_restate::serve(endpoint, listener, stop).await;
    if let Ok(served) = Arc::try_unwrap(served) {
        for (_, mcp) in served.files {
            mcp.shutdown().await;
        }
    }
    finish_trace(trace.as_ref())?;
    match refusal.into_inner().ok().flatten() {
        Some(e) => Err(restate_error(e)),
        None => Ok(0),
    }
}

/// `agentloop submit FILE --input TEXT`.
pub(crate) async fn submit(args: SubmitArgs) -> Result<i32, CliError> {
    let file = args.agent.load()?;
    let ingress = args.ingress.ingress()?;
    // Restate keeps an idempotency key per session (the run handler's object key): a submit
    // without --session on a fresh session each time would start the run again. The key names
    // the session then, so that a repeated submit finds the first one's.
    let session = match (args.session, &args.idempotency_key) {
        (Some(session), _) => session,
        (None, Some(key)) => session_for_key(key),
        (None, None) => uuid::Uuid::now_v7().to_string(),
    };
    let key = args
        .idempotency_key
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let request = RunRequest {
        agent: file.spec.name.get_ref().clone(),
        input: args.input,
    };
    let submitted = ingress
        .submit(&session, &request, &key)
        .await
        .map_err(restate_error)?;
    if args.json {
        out!(
            "{}",
            json!({"id": submitted.id, "session": session, "status": submitted.status})
        );
    } else {
        out!("{}", submitted.id);
    }
    Ok(0)
}

/// The session of a submit that names an idempotency key and no session: the same for the same
/// key, and shows nothing of it.
fn session_for_key(key: &str) -> String {
    let digest = agentloop::journal::fingerprint(&serde_json::Value::String(key.to_owned()));
    let hex: String = digest
        .trim_start_matches("sha256:")
        .chars()
        .take(32)
        .collect();
    format!("idempotent-{hex}")
}

/// How often `attach` reads a run's news.
const NEWS_EVERY: Duration = Duration::from_millis(150);

/// `agentloop attach ID`: the run's events as they come, then its outcome.
pub(crate) async fn attach(args: AttachArgs) -> Result<i32, CliError> {
    let ingress = args.ingress.ingress()?;
    let progress = crate::logging::progress();
    let shown = !args.json && !args.quiet;
    let ended = ingress.attach(&args.id);
    tokio::pin!(ended);
    let mut next = 0;
    let mut asked = HashSet::new();
    let report = loop {
        tokio::select! {
            report = &mut ended => break report.map_err(restate_error)?,
            () = tokio::time::sleep(NEWS_EVERY) => {
                if shown {
                    next = follow(&ingress, &args.id, next, &progress, &mut asked).await;
                }
            }
        }
    };
    if shown {
        // What was published before the end.
        loop {
            let after = follow(&ingress, &args.id, next, &progress, &mut asked).await;
            if after == next {
                break;
            }
            next = after;
        }
        progress.end_line();
    }
    let outcome = report.get("outcome").cloned().unwrap_or(Value::Null);
    if args.json {
        out!("{outcome}");
    } else {
        let text = outcome.get("output").and_then(Value::as_str);
        print_final_text(text.unwrap_or_default(), &progress, args.quiet);
        if !args.quiet
            && let Some(line) = report.get("closing_line").and_then(Value::as_str)
        {
            err!("{line}");
        }
    }
    let code = report
        .get("exit_code")
        .and_then(Value::as_i64)
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or(crate::error::code::RUN_FAILED);
    Ok(code)
}

/// Shows the news from `from` on; answers where to read next.
async fn follow(
    ingress: &Ingress,
    id: &str,
    from: u64,
    progress: &Progress,
    asked: &mut HashSet<String>,
) -> u64 {
    let Ok(news) = ingress.news(id, from).await else {
        return from;
    };
    for value in news.events {
        if let Ok(event) = serde_json::from_value::<Event>(value) {
            progress.emit(&event);
        }
    }
    for p in &news.approvals {
        if !asked.insert(p.request.call_id.clone()) {
            continue;
        }
        progress.end_line();
        if let Some(q) = &p.request.question {
            err!(
                "? the run asks (call {}): {:?}{}: agentloop answer {id} --call {} --json JSON {}",
                p.request.call_id,
                crate::terminal::escape_invisible(&q.text),
                q.schema
                    .as_ref()
                    .map(|s| format!(" (answer matching {s})"))
                    .unwrap_or_default(),
                p.request.call_id,
                restate_flag(ingress.url()),
            );
        } else {
            err!(
                "? the run waits for approval of call {} ({} {}): agentloop approve {id} --call {} --allow {}",
                p.request.call_id,
                p.request.tool,
                p.request.arguments,
                p.request.call_id,
                restate_flag(ingress.url()),
            );
        }
    }
    news.next
}

/// The `--restate` a printed `approve` or `answer` command takes to reach `url`: the flag alone
/// when the variable holds it or it carries credentials (which a terminal's log must not show,
/// and which belong in the variable), else the flag and the URL.
fn restate_flag(url: &str) -> String {
    let from_env = std::env::var(INGRESS_ENV)
        .is_ok_and(|v| v.trim_end_matches('/') == url.trim_end_matches('/'));
    if from_env || !agentloop::url_secrets::secrets(url).is_empty() {
        "--restate".to_owned()
    } else {
        format!("--restate {}", url.trim_end_matches('/'))
    }
}

/// `agentloop approve ID --call C --allow|--deny --restate URL`.
pub(crate) async fn approve(
    run: &str,
    call: &str,
    answer: Answer,
    url: &str,
) -> Result<i32, CliError> {
    let ingress = ingress_at(url)?;
    ingress
        .approve(run, call, answer)
        .await
        .map_err(answer_error)?;
    err!("answered call {call} of run {run}");
    Ok(0)
}

/// `agentloop answer ID --call C --json JSON --restate URL`: the answer is checked against the
/// question's schema before the awakeable is resolved; a wrong one resolves nothing.
pub(crate) async fn answer(
    run: &str,
    call: &str,
    reply: &Value,
    url: &str,
) -> Result<i32, CliError> {
    let ingress = ingress_at(url)?;
    ingress
        .reply(run, call, reply)
        .await
        .map_err(answer_error)?;
    err!("answered question {call} of run {run}");
    Ok(0)
}

/// A wrong answer (a reply off its schema, `approve` on a question, `answer` on an approval) is
/// a usage error, as it is against a journal; the rest are Restate's.
fn answer_error(e: RestateError) -> CliError {
    match e {
        RestateError::Answer(_)
        | RestateError::Question { .. }
        | RestateError::NotAQuestion { .. } => CliError::Usage {
            message: format!("{e} ({})", e.code()),
        },
        e => restate_error(e),
    }
}

/// The calls run `run` (started with `submit`) waits on, as `approvals list` shows a journal's.
pub(crate) async fn waiting(
    url: &str,
    run: &str,
) -> Result<Vec<agentloop_store::WaitingCall>, CliError> {
    let ingress = ingress_at(url)?;
    let news = ingress.news(run, u64::MAX).await.map_err(restate_error)?;
    Ok(news
        .approvals
        .into_iter()
        .map(|p| agentloop_store::WaitingCall {
            run_id: run.to_owned(),
            // The run's agent: the top of the tree (a subagent's call names its path from it).
            agent: p
                .request
                .agent
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
            request: p.request,
            answer: None,
            reply: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::argv_credentials_warning;

    #[test]
    fn a_url_with_credentials_on_the_command_line_is_warned_of_without_them() {
        let url = "http://agent:s3cretpw@127.0.0.1:8080/?key=k3yvalue";
        let warning = argv_credentials_warning("--restate", url, "AGENTLOOP_RESTATE", None)
            .unwrap_or_default();
        assert!(
            warning.contains("set AGENTLOOP_RESTATE instead"),
            "{warning}"
        );
        assert!(
            !warning.contains("s3cretpw") && !warning.contains("k3yvalue"),
            "{warning}"
        );
        // Another value in the variable: the flag's URL still came from the command line.
        let other = Some("http://127.0.0.1:8080");
        assert!(argv_credentials_warning("--restate", url, "AGENTLOOP_RESTATE", other).is_some());
    }

    #[test]
    fn a_url_from_the_variable_or_without_credentials_is_not() {
        let url = "http://agent:s3cretpw@127.0.0.1:9070";
        let env = "AGENTLOOP_RESTATE_ADMIN";
        assert_eq!(
            argv_credentials_warning("--register", url, env, Some(url)),
            None
        );
        let plain = "http://127.0.0.1:9070/";
        assert_eq!(
            argv_credentials_warning("--register", plain, env, None),
            None
        );
    }
}
