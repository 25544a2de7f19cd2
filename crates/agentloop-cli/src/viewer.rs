//! `agentloop trace serve`: a trace viewer on loopback. The page (`viewer/index.html`, its script
//! and styles inline) is bundled into the binary, so it needs no network; it reads the trace
//! through a small JSON API that rereads the file on each request, which is how it follows a
//! trace still being written.
//!
//! - `GET /`: the page.
//! - `GET /api/runs`: `{file, runs: [summary], warnings}`, in the order runs started. With
//!   `--eval REPORT` (an `agentloop eval --report` file), only the evaluation's runs (and their
//!   subagents'), each with `eval: {case, repeat, passed, failures}`, and `eval: {suite,
//!   passed_runs, runs}` beside them.
//! - `GET /api/runs/{id}`: the run as a tree (its turns with their model calls, tool calls and
//!   compactions), with its subagents' trees under `children`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::error::{CliError, code};

const PAGE: &str = include_str!("viewer/index.html");

/// How deep the subagent trees of one answer go.
const MAX_DEPTH: usize = 8;

/// What the viewer serves: the trace, and the evaluation whose runs it lists, if any.
struct Served {
    trace: PathBuf,
    eval: Option<PathBuf>,
}

/// Serves the viewer until Ctrl-C.
pub(crate) async fn serve(
    path: PathBuf,
    port: u16,
    eval: Option<PathBuf>,
) -> Result<i32, CliError> {
    // A trace that cannot be read at all is refused now rather than shown as an error page.
    agentloop_store::read_trace(&path).map_err(|e| CliError::Io {
        message: format!(
            "cannot read the trace {}: {e}",
            crate::terminal::shown_path(&path)
        ),
    })?;
    if let Some(report) = &eval {
        read_report(report).map_err(|message| CliError::Io { message })?;
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| CliError::Io {
            message: format!("cannot listen on 127.0.0.1:{port}: {e}"),
        })?;
    let addr = listener.local_addr().map_err(|e| CliError::Io {
        message: e.to_string(),
    })?;
    let app = Router::new()
        .route("/", get(page))
        .route("/api/runs", get(runs))
        .route("/api/runs/{id}", get(run))
        .with_state(Arc::new(Served {
            trace: path.clone(),
            eval,
        }));
    // A page the browser shows must not read the trace through a name of its own.
    let app = agentloop_serve::host_checked(app, agentloop_serve::allowed_hosts(addr));
    out!("http://{addr}/");
    err!(
        "agentloop: serving {} at http://{addr}/ (Ctrl-C stops)",
        crate::terminal::shown_path(&path)
    );
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    agentloop_serve::serve(listener, app, stop, agentloop_serve::Limits::default())
        .await
        .map_err(|e| CliError::Io {
            message: format!("the viewer stopped: {e}"),
        })?;
    Ok(code::OK)
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Everything the page needs is in it: nothing may load from elsewhere.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 img-src 'self' data:",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
        .into_response()
}

async fn runs(State(served): State<Arc<Served>>) -> Response {
    let trace = match read(&served.trace) {
        Ok(trace) => trace,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    let summaries = agentloop_store::summarize_runs(&trace.records);
    let mut body = json!({
        "file": served.trace.display().to_string(),
        "runs": summaries,
        "warnings": trace.warnings,
    });
    if let Some(path) = &served.eval {
        match read_report(path) {
            Ok(report) => crate::eval::mark_runs(&mut body, &report),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e),
        }
    }
    json_response(body)
}

fn read_report(path: &Path) -> Result<agentloop_eval::Report, String> {
    let text =
        agentloop_cli::text_file::read_text(path, agentloop_cli::text_file::MAX_REPORT_BYTES)
            .map_err(|e| {
                format!(
                    "cannot read the evaluation {}: {e}",
                    crate::terminal::shown_path(path)
                )
            })?;
    agentloop_eval::Report::from_json(&text, &crate::terminal::shown_path(path))
        .map_err(|e| e.to_string())
}

async fn run(State(served): State<Arc<Served>>, UrlPath(id): UrlPath<String>) -> Response {
    let trace = match read(&served.trace) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    match tree(&trace.records, &id, 0) {
        Ok(v) => json_response(v),
        Err(e) => error(StatusCode::NOT_FOUND, &e.to_string()),
    }
}

/// A run's tree with its subagents' trees under `children`.
fn tree(
    records: &[agentloop_store::TraceRecord],
    id: &str,
    depth: usize,
) -> Result<Value, agentloop_store::TraceError> {
    let t = agentloop_store::run_tree(records, Some(id))?;
    let children: Vec<Value> = if depth < MAX_DEPTH {
        t.subagents
            .iter()
            .filter_map(|child| tree(records, child, depth + 1).ok())
            .collect()
    } else {
        Vec::new()
    };
    let mut v = serde_json::to_value(&t).map_err(agentloop_store::TraceError::Render)?;
    if let Some(map) = v.as_object_mut() {
        map.insert("children".into(), Value::Array(children));
    }
    Ok(v)
}

fn read(path: &Path) -> Result<agentloop_store::Trace, String> {
    agentloop_store::read_trace(path).map_err(|e| format!("cannot read the trace: {e}"))
}

fn json_response(v: Value) -> Response {
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(v)).into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}
