#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `agentloop mcp serve`, driven by MCP clients no one here wrote: the official Python SDK
//! (`scripts/mcp/serve_client.py` is a thin script over it) and the MCP Inspector's CLI, both
//! installed at pinned versions by `scripts/mcp/install.sh`, over stdio and streamable HTTP on
//! loopback. A scripted agent answers, so no key is needed: the clients list the agent as a tool,
//! call it and read its progress and structured answer, cancel a call (the run stops and its tool
//! with it), and read the error results of a bad call and of a call the agent's permissions ask
//! about; a client that takes elicitation is asked about that call instead, and its answer holds.
//! With `--tools` the agent file's own tools (a command tool, an `[[mcp]]` server's tool) are
//! served under its permissions. And, with JSON-RPC lines on stdio, a stop during a journaled
//! call, which leaves its run to resume.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// How a client reaches the server.
enum Transport {
    Stdio,
    Http,
}

/// Runs the Python SDK's client through `steps` against `mcp serve` with `args`, and returns
/// what each step saw.
async fn python_client(transport: &Transport, args: &[&str], steps: Value) -> Vec<Value> {
    let installed = mcp_installed();
    let server;
    let (mode, target) = match transport {
        Transport::Stdio => {
            let mut command = vec![bin().to_owned(), "mcp".into(), "serve".into()];
            command.extend(args.iter().map(|a| (*a).to_owned()));
            ("stdio", json!(command).to_string())
        }
        Transport::Http => {
            server = HttpServer::start("mcp", args);
            ("http", server.url.clone())
        }
    };
    python_client_steps(
        installed.join("venv/bin/python"),
        "scripts/mcp/serve_client.py",
        vec![mode.to_owned(), target, steps.to_string()],
    )
    .await
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn lists_calls_and_reads_progress(transport: Transport) {
    let dir = forecaster("");
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();
    let seen = python_client(
        &transport,
        &[agent],
        json!([
            {"do": "list"},
            {"do": "call", "tool": "forecaster", "arguments": {"task": "The weather in Paris?"}},
            {"do": "call", "tool": "forecaster", "arguments": {}},
            {"do": "call", "tool": "no_such_agent", "arguments": {"task": "x"}}
        ]),
    )
    .await;
    let tools = seen[0]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{tools:?}");
    assert_eq!(tools[0]["name"], "forecaster");
    assert_eq!(tools[0]["description"], "Forecasts the weather of a city.");
    assert_eq!(tools[0]["inputSchema"]["required"], json!(["task"]));
    assert_eq!(
        tools[0]["outputSchema"]["required"],
        json!(["forecast"]),
        "{tools:?}"
    );

    let call = &seen[1];
    assert_eq!(call["result"]["isError"], false, "{call}");
    assert_eq!(
        call["result"]["structuredContent"],
        json!({"forecast": "18 degrees and sunny"}),
        "{call}"
    );
    assert_eq!(
        call["progress"],
        json!([
            "turn 1",
            "calling forecast",
            "forecast: ok",
            "turn 2",
            "run finished"
        ]),
        "{call}"
    );
    // The agent's own tool really ran, with what its model gave it.
    assert_eq!(dir.tool_inputs(), vec![json!({"city": "Paris"})]);

    // A call without a task: an error result the client reads.
    let bad = &seen[2];
    assert_eq!(bad["result"]["isError"], true, "{bad}");
    assert!(text_of(&bad["result"]).contains("`task`"), "{bad}");
    // A tool the server does not have: a protocol error (invalid params).
    let unknown = &seen[3];
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no_such_agent"),
        "{unknown}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_lists_calls_and_reads_progress_over_stdio() {
    lists_calls_and_reads_progress(Transport::Stdio).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_lists_calls_and_reads_progress_over_http() {
    lists_calls_and_reads_progress(Transport::Http).await;
}

/// Waits until the trace records the end of a run, and returns its stop reason.
fn run_finished_in(trace: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(trace).unwrap_or_default();
        if let Some(stop) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["kind"] == "run" && e.get("stop_reason").is_some())
        {
            return stop["stop_reason"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the trace never recorded the run's end:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn a_cancelled_call_stops_its_run(transport: Transport) {
    let dir = forecaster("");
    slow_script(&dir);
    let agent = dir.agent();
    let trace = dir.path("trace.ndjson");
    let started = Instant::now();
    let seen = python_client(
        &transport,
        &[agent.to_str().unwrap(), "--trace", trace.to_str().unwrap()],
        json!([
            {"do": "cancel", "tool": "forecaster", "arguments": {"task": "Take your time."},
             "after": "calling slow", "when_exists": dir.path("started")},
            {"do": "list"}
        ]),
    )
    .await;
    assert_eq!(seen[0]["cancelled"], true, "{}", seen[0]);
    assert!(seen[0].get("result").is_none(), "{}", seen[0]);
    // The session goes on after the cancellation.
    assert_eq!(seen[1]["tools"][0]["name"], "forecaster");
    let trace_path = trace.clone();
    let stop = tokio::task::spawn_blocking(move || run_finished_in(&trace_path))
        .await
        .unwrap();
    assert_eq!(stop, "cancelled");
    // The tool's process went with its run: it never finishes its sleep.
    let after = Duration::from_secs(10).saturating_sub(started.elapsed());
    tokio::time::sleep(after).await;
    assert!(!dir.path("finished").exists(), "the slow tool ran on");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_the_python_sdk_cancels_stops_its_run_over_stdio() {
    a_cancelled_call_stops_its_run(Transport::Stdio).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_the_python_sdk_cancels_stops_its_run_over_http() {
    a_cancelled_call_stops_its_run(Transport::Http).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_the_permissions_ask_about_is_an_error_result_and_never_runs() {
    let dir = forecaster("[permissions]\nask = [\"forecast\"]\n");
    let agent = dir.agent();
    let seen = python_client(
        &Transport::Stdio,
        &[agent.to_str().unwrap()],
        json!([{"do": "call", "tool": "forecaster", "arguments": {"task": "Paris?"}}]),
    )
    .await;
    let result = &seen[0]["result"];
    assert_eq!(result["isError"], true, "{result}");
    let text = text_of(result);
    assert!(text.starts_with("approval required"), "{text}");
    assert!(text.contains("forecast"), "{text}");
    assert!(dir.tool_inputs().is_empty(), "the asked call ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_takes_elicitation_is_asked_about_the_call_and_its_answer_holds() {
    let dir = forecaster("[permissions]\nask = [\"forecast\"]\n");
    let agent = dir.agent();
    let call = |answer: Value| {
        json!({"do": "call", "tool": "forecaster", "arguments": {"task": "Paris?"},
               "elicit": answer})
    };
    for transport in [Transport::Stdio, Transport::Http] {
        let seen = python_client(
            &transport,
            &[agent.to_str().unwrap()],
            json!([
                call(json!({"action": "accept", "content": {"approve": false}})),
                call(json!({"action": "decline"})),
                call(json!({"action": "accept", "content": {"approve": true}})),
            ]),
        )
        .await;
        // Each call asked once, in a form with one boolean, naming the tool and its arguments.
        for step in &seen {
            let asked = step["elicited"].as_array().unwrap();
            assert_eq!(asked.len(), 1, "{step}");
            let message = asked[0]["message"].as_str().unwrap();
            assert!(message.contains("forecast"), "{message}");
            assert!(message.contains("Paris"), "{message}");
            let schema = &asked[0]["requestedSchema"];
            assert_eq!(
                schema["properties"]["approve"]["type"], "boolean",
                "{schema}"
            );
        }
        // Denied (not approved, or declined): the agent answers on without the call; approved:
        // the call runs. Of the three calls' tool calls, only the approved one ran.
        for step in &seen {
            assert_eq!(step["result"]["isError"], false, "{step}");
            assert_eq!(
                step["result"]["structuredContent"]["forecast"], "18 degrees and sunny",
                "{step}"
            );
        }
        assert_eq!(dir.tool_inputs().len(), 1, "a denied call ran");
        std::fs::remove_file(dir.path("stdin.log")).unwrap();
    }
}

/// Runs the MCP Inspector's CLI against `target` (a command, or a URL) with `args`.
async fn inspector(target: Vec<String>, args: &[&str]) -> (bool, Value) {
    let installed = mcp_installed();
    let node = installed.join("venv/bin/node");
    let cli = installed.join("node_modules/.bin/mcp-inspector");
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(node)
            .arg(cli)
            .arg("--cli")
            .args(target)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let value = serde_json::from_str(&text).unwrap_or_else(|_| {
        panic!(
            "the Inspector printed no JSON: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), value)
}

async fn the_inspector_lists_calls_and_reads_an_error(transport: Transport) {
    let dir = forecaster("");
    let agent = dir.agent().to_str().unwrap().to_owned();
    let server;
    let target: Vec<String> = match transport {
        Transport::Stdio => vec![bin().into(), "mcp".into(), "serve".into(), agent],
        Transport::Http => {
            server = HttpServer::start("mcp", &[&agent]);
            vec![server.url.clone()]
        }
    };
    let (ok, listed) = inspector(target.clone(), &["--method", "tools/list"]).await;
    assert!(ok, "{listed}");
    assert_eq!(listed["tools"][0]["name"], "forecaster", "{listed}");
    assert_eq!(
        listed["tools"][0]["inputSchema"]["properties"]["task"]["type"],
        "string"
    );

    let (ok, called) = inspector(
        target.clone(),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "forecaster",
            "--tool-arg",
            "task=Paris?",
        ],
    )
    .await;
    assert!(ok, "{called}");
    assert_eq!(called["isError"], false, "{called}");
    assert_eq!(
        called["structuredContent"]["forecast"], "18 degrees and sunny",
        "{called}"
    );

    // No task: the Inspector reads the error result and fails.
    let (ok, failed) = inspector(
        target,
        &["--method", "tools/call", "--tool-name", "forecaster"],
    )
    .await;
    assert!(!ok, "{failed}");
    assert!(failed.to_string().contains("isError"), "{failed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_inspector_cli_lists_calls_and_reads_an_error_over_stdio() {
    the_inspector_lists_calls_and_reads_an_error(Transport::Stdio).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_inspector_cli_lists_calls_and_reads_an_error_over_http() {
    the_inspector_lists_calls_and_reads_an_error(Transport::Http).await;
}

/// The forecaster with the PyPI time server declared as `[[mcp]]`, and `slow` denied.
fn forecaster_with_time_server() -> AgentDir {
    let time = mcp_installed().join("venv/bin/mcp-server-time");
    let dir = forecaster(&format!(
        "\n[[mcp]]\nname = \"time\"\ncommand = [\"{}\"]\ntimeout_secs = 60\n\n[permissions]\ndeny = [\"slow\"]\n",
        time.display()
    ));
    // The tools are called by the client, never by a model.
    dir.write("script.json", "[]");
    dir
}

/// A call of the time server's `get_current_time` for `Etc/UTC`, answered by it: its structured
/// answer names the zone.
fn time_server_answered(call: &Value) {
    assert_eq!(call["result"]["isError"], false, "{call}");
    assert_eq!(
        call["result"]["structuredContent"]["timezone"], "Etc/UTC",
        "{call}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_tools_the_files_own_tools_are_served_under_its_permissions() {
    let dir = forecaster_with_time_server();
    let agent = dir.agent();
    let seen = python_client(
        &Transport::Stdio,
        &[agent.to_str().unwrap(), "--tools"],
        json!([
            {"do": "list"},
            {"do": "call", "tool": "forecast", "arguments": {"city": "Lisbon"}},
            {"do": "call", "tool": "forecast", "arguments": {"town": "Lisbon"}},
            {"do": "call", "tool": "slow", "arguments": {}},
            {"do": "call", "tool": "time__get_current_time", "arguments": {"timezone": "Etc/UTC"}}
        ]),
    )
    .await;
    let names: Vec<&str> = seen[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.starts_with(&["forecast", "slow"]) && names.contains(&"time__get_current_time"),
        "{names:?}"
    );

    let ran = &seen[1];
    assert_eq!(ran["result"]["isError"], false, "{ran}");
    assert_eq!(text_of(&ran["result"]), "18 degrees and sunny\n", "{ran}");
    assert_eq!(
        ran["progress"],
        json!(["calling forecast", "forecast: ok"]),
        "{ran}"
    );
    // Arguments its schema refuses never reach the tool.
    let invalid = &seen[2];
    assert_eq!(invalid["result"]["isError"], true, "{invalid}");
    assert_eq!(dir.tool_inputs(), vec![json!({"city": "Lisbon"})]);
    // The file's `deny` holds for the client's calls too.
    let denied = &seen[3];
    assert_eq!(denied["result"]["isError"], true, "{denied}");
    assert!(
        text_of(&denied["result"]).starts_with("denied: ")
            && !text_of(&denied["result"]).contains("denied: denied"),
        "{denied}"
    );
    assert!(!dir.path("started").exists());
    // An [[mcp]] server's tool, through agentloop: the time server's structured answer.
    time_server_answered(&seen[4]);
}

/// `examples/served`, started as its `mcp.json` tells an MCP client to start it.
#[tokio::test(flavor = "multi_thread")]
async fn the_served_example_answers_a_client_configured_by_its_mcp_json() {
    let example = repo().join("examples/served");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(example.join("mcp.json")).unwrap()).unwrap();
    let server = &config["mcpServers"]["weather_report"];
    assert_eq!(server["command"], "agentloop");
    let args: Vec<String> = server["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            // The user writes where their clone is.
            a.strip_prefix("/path/to/agentloop/").map_or_else(
                || a.to_owned(),
                |rest| repo().join(rest).display().to_string(),
            )
        })
        .collect();
    assert_eq!(args[..2], ["mcp", "serve"]);
    let rest: Vec<&str> = args[2..].iter().map(String::as_str).collect();
    let seen = python_client(
        &Transport::Stdio,
        &rest,
        json!([
            {"do": "list"},
            {"do": "call", "tool": "weather_report", "arguments": {"task": "The weather in Lisbon?"}}
        ]),
    )
    .await;
    assert_eq!(seen[0]["tools"][0]["name"], "weather_report");
    assert_eq!(
        seen[0]["tools"][0]["outputSchema"]["required"],
        json!(["city", "celsius", "sky"])
    );
    let call = &seen[1];
    assert_eq!(
        call["result"]["structuredContent"],
        json!({"city": "Lisbon", "celsius": 23, "sky": "sunny"}),
        "{call}"
    );
    assert!(
        call["progress"]
            .as_array()
            .unwrap()
            .contains(&json!("get_weather: ok")),
        "{call}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_served_tools_call_is_never_journaled() {
    let dir = forecaster("");
    let agent = dir.agent();
    let journal = dir.path("runs.db");
    let out = agentloop(args(&[
        "mcp",
        "serve",
        agent.to_str().unwrap(),
        "--tools",
        "--journal",
        journal.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--journal"), "{}", stderr(&out));
    assert!(!journal.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn past_its_most_runs_a_call_is_an_error_result_and_starts_nothing() {
    let dir = forecaster("");
    slow_script(&dir);
    let agent = dir.agent();
    let call =
        json!({"do": "call", "tool": "forecaster", "arguments": {"task": "Take your time."}});
    let seen = python_client(
        &Transport::Http,
        &[agent.to_str().unwrap(), "--max-runs", "1"],
        json!([{"do": "together", "calls": [call, call]}]),
    )
    .await;
    let results: Vec<&Value> = seen[0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["result"])
        .collect();
    let (busy, ran): (Vec<&Value>, Vec<&Value>) = results
        .into_iter()
        .partition(|r| text_of(r).contains("most calls at once"));
    assert_eq!((busy.len(), ran.len()), (1, 1), "{seen:?}");
    assert_eq!(busy[0]["isError"], true, "{}", busy[0]);
    assert_eq!(ran[0]["isError"], false, "{}", ran[0]);
    assert!(text_of(ran[0]).contains("late"), "{}", ran[0]);
}

/// agentloop's own MCP client (an `[[mcp]]` entry) against `agentloop mcp serve`, over `transport`,
/// at each wire: negotiated (2026-07-28, which both ends speak) and each pinned one. It lists the
/// served agent and calls it; the answer is the served agent's structured output, which only its
/// run makes.
async fn agentloops_client_speaks_each_wire(transport: Transport) {
    let dir = forecaster("");
    // Its tools write their folder, which holds its own files: an agentloop started by a tool
    // (here by the stdio MCP client) cannot make the view that keeps those read-only, so the
    // file would be refused at load. Unconfined by their own sandbox, they are still confined
    // by the client's, around the whole server.
    let text = std::fs::read_to_string(dir.agent()).unwrap();
    dir.write("agent.toml", &format!("sandbox = \"off\"\n{text}"));
    let served = dir.agent();
    let served = served.to_str().unwrap();
    let server = match transport {
        Transport::Http => Some(HttpServer::start("mcp", &[served])),
        Transport::Stdio => None,
    };
    // The client's file sits beside the served one, which the stdio server runs in.
    let reach = match &server {
        Some(http) => format!(
            "url = {:?}\nheaders = {{ X-Caller = \"agentloop ${{HOME}}\" }}",
            http.url
        ),
        None => format!("command = {:?}", [bin(), "mcp", "serve", served]),
    };
    dir.write(
        "caller.json",
        &json!([
            {"tool_calls": [{"id": "c1", "name": "fc__forecaster", "arguments": {"task": "Paris?"}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    for (pinned, spoken) in [
        (None, "2026-07-28"),
        (Some("2025-11-25"), "2025-11-25"),
        (Some("2026-07-28"), "2026-07-28"),
    ] {
        let pin = pinned
            .map(|v| format!("protocol_version = {v:?}"))
            .unwrap_or_default();
        dir.write(
            "caller.toml",
            &format!(
                "name = \"caller\"\n[model]\nprovider = \"scripted\"\nscript = \"caller.json\"\n\n\
                 [[mcp]]\nname = \"fc\"\n{reach}\n{pin}\n"
            ),
        );
        let caller = dir.path("caller.toml");
        let caller = caller.to_str().unwrap();
        let listed = Command::new(bin())
            .args(["mcp", "list", "--json", caller])
            .output()
            .unwrap();
        assert!(listed.status.success(), "{spoken}: {}", stderr(&listed));
        let listed = stdout_json(&listed);
        let server = &listed["servers"][0];
        assert_eq!(server["protocol_version"], spoken, "{listed}");
        assert_eq!(server["tools"][0]["name"], "fc__forecaster", "{listed}");
        let ran = Command::new(bin())
            .args(["run", "--json", "--input", "go", caller])
            .output()
            .unwrap();
        assert!(ran.status.success(), "{spoken}: {}", stderr(&ran));
        let ran = stdout_json(&ran);
        let call = &ran["tool_calls"][0];
        assert_eq!(call["status"], "ok", "{spoken}: {ran}");
        assert_eq!(
            call["output"],
            json!({"forecast": "18 degrees and sunny"}),
            "{spoken}: {ran}"
        );
        // The scripted answer comes whatever the tool did: its log shows that it ran (over
        // stdio the served agentloop runs in the entry's sandbox, inside which its tool starts
        // in no group of its own).
        assert_eq!(
            dir.tool_inputs(),
            vec![json!({"city": "Paris"})],
            "{spoken}: the served agent's command tool did not run: {ran}"
        );
        std::fs::remove_file(dir.path("stdin.log")).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn agentloops_client_speaks_each_wire_with_mcp_serve_over_stdio() {
    agentloops_client_speaks_each_wire(Transport::Stdio).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn agentloops_client_speaks_each_wire_with_mcp_serve_over_http() {
    agentloops_client_speaks_each_wire(Transport::Http).await;
}

/// One MCP message posted by hand as a client of MCP before 2026-07-28 (which has a session):
/// the answer's status, and the session id it names.
fn post_mcp(url: &str, session: Option<&str>, message: &Value) -> (u16, Option<String>) {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    if let Some(id) = session {
        headers.push(("Mcp-Session-Id", id));
    }
    let (status, fields) = http_head(url, "POST", "127.0.0.1", &headers, &message.to_string());
    let id = fields
        .into_iter()
        .find(|(name, _)| name == "mcp-session-id")
        .map(|(_, value)| value);
    (status, id)
}

/// A session started by hand: `initialize`, then `notifications/initialized`.
fn start_session(url: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "1"}}});
    let (status, id) = post_mcp(url, None, &init);
    assert_eq!(status, 200);
    let id = id.expect("no session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post_mcp(url, Some(&id), &initialized).0, 202);
    id
}

fn ping(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

#[test]
fn session_idle_closes_an_http_session_left_idle_and_off_keeps_it() {
    let dir = forecaster("");
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();

    let server = HttpServer::start("mcp", &[agent, "--session-idle", "1"]);
    let session = start_session(&server.url);
    assert_eq!(post_mcp(&server.url, Some(&session), &ping(2)).0, 200);
    // Idle past its second (and the reaper's quarter of it): gone, and its client is told so
    // as MCP says, with a 404, after which it starts a session again.
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(post_mcp(&server.url, Some(&session), &ping(3)).0, 404);
    let again = start_session(&server.url);
    assert_ne!(again, session);
    assert_eq!(post_mcp(&server.url, Some(&again), &ping(4)).0, 200);
    server.terminate();

    let server = HttpServer::start("mcp", &[agent, "--session-idle", "off"]);
    let session = start_session(&server.url);
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(post_mcp(&server.url, Some(&session), &ping(5)).0, 200);
    server.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn session_idle_refuses_a_bad_value_and_stdio_which_has_no_sessions() {
    let dir = forecaster("");
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();
    for (flags, says) in [
        (
            &["--http", "127.0.0.1:0", "--session-idle", "0"][..],
            "at least 1",
        ),
        (&["--http", "127.0.0.1:0", "--session-idle", "1h"], "`off`"),
        (&["--session-idle", "60"], "--http"),
    ] {
        let mut command = vec!["mcp", "serve", agent];
        command.extend_from_slice(flags);
        let out = agentloop(args(&command)).await;
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{flags:?}: {}", stderr(&out));
    }
}

/// An agent whose names meet: its own tool `get_current_time` and its hand-off `convert_time`
/// have the names of the time server `t1`'s two tools (kept as the server names them); `t2`'s
/// tools are `t_*`, and `t3` renames its `get_current_time` to `t2`'s name of it.
fn clock_with_names_that_meet() -> AgentDir {
    let time = mcp_installed().join("venv/bin/mcp-server-time");
    let server = |name: &str, naming: &str| {
        format!(
            "\n[[mcp]]\nname = \"{name}\"\ncommand = [\"{}\"]\ntimeout_secs = 60\n{naming}\n",
            time.display()
        )
    };
    let dir = AgentDir::new(&format!(
        "name = \"clock\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\n\
         [[tools]]\nname = \"get_current_time\"\ndescription = \"The agent's own clock.\"\n\
         command = [\"python3\", \"tool.py\"]\n\n\
         [[handoffs]]\nagent = \"helper.toml\"\nname = \"convert_time\"\n{}{}{}",
        server("t1", "prefix = \"\""),
        server("t2", "prefix = \"t_\""),
        server(
            "t3",
            "prefix = \"x_\"\nrename = { get_current_time = \"t_get_current_time\" }"
        ),
    ));
    dir.write(
        "helper.toml",
        "name = \"helper\"\ndescription = \"Helps.\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n",
    );
    dir.write("script.json", "[]");
    dir
}

/// With `--tools` a name is served as the tool a run of the agent gives it (its own tools and
/// hand-offs first, then its servers' in order): a server's tool whose name is taken is left out,
/// with a warning naming both, where it was listed and a call of it reached the hand-off, or the
/// server refused to start.
#[tokio::test(flavor = "multi_thread")]
async fn with_tools_a_name_taken_before_a_servers_tool_is_served_as_a_run_calls_it() {
    let dir = clock_with_names_that_meet();
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();
    // Its stdin closed at once, it says what it serves and ends.
    let out = agentloop(args(&["mcp", "serve", agent, "--tools"])).await;
    let err = stderr(&out);
    assert!(
        err.contains(
            "serving get_current_time, t_get_current_time, t_convert_time, x_convert_time on stdio"
        ),
        "{err}"
    );
    for (left_out, holder) in [
        (
            "the tool \"get_current_time\" of the MCP server t1",
            "the agent's tool \"get_current_time\"",
        ),
        (
            "the tool \"convert_time\" of the MCP server t1",
            "the agent's hand-off \"convert_time\"",
        ),
        (
            "the tool \"t_get_current_time\" of the MCP server t3",
            "the tool \"t_get_current_time\" of the MCP server t2",
        ),
    ] {
        assert!(
            err.contains(&format!("{left_out} is not served: {holder} has its name")),
            "{left_out}: {err}"
        );
    }

    let seen = python_client(
        &Transport::Stdio,
        &[agent, "--tools"],
        json!([
            {"do": "list"},
            {"do": "call", "tool": "get_current_time", "arguments": {}},
            {"do": "call", "tool": "t_get_current_time", "arguments": {"timezone": "Etc/UTC"}}
        ]),
    )
    .await;
    let tools = seen[0]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "get_current_time",
            "t_get_current_time",
            "t_convert_time",
            "x_convert_time"
        ]
    );
    assert_eq!(tools[0]["description"], "The agent's own clock.");
    // The listed tool is the one called: the agent's own...
    let own = &seen[1];
    assert_eq!(own["result"]["isError"], false, "{own}");
    assert_eq!(text_of(&own["result"]), "18 degrees and sunny\n", "{own}");
    assert_eq!(dir.tool_inputs(), vec![json!({})]);
    // ...and t2's, with its structured answer.
    time_server_answered(&seen[2]);
}

/// Serving the agent itself, the server says which of its servers' tools the agent's runs leave
/// out (two servers' tools named alike), as `agentloop run` says it.
#[tokio::test(flavor = "multi_thread")]
async fn serving_the_agent_says_which_servers_tools_its_runs_leave_out() {
    let dir = clock_with_names_that_meet();
    let agent = dir.agent();
    let out = agentloop(args(&["mcp", "serve", agent.to_str().unwrap()])).await;
    let err = stderr(&out);
    assert!(err.contains("serving clock on stdio"), "{err}");
    let said = "of t3 and \"get_current_time\" of t2 would both be named t_get_current_time";
    assert!(
        err.lines()
            .any(|l| l.starts_with("agentloop: warning: ") && l.contains(said)),
        "{err}"
    );
}

/// Two files never share a served name, as neither comes first: the server does not start, and
/// says which two have it.
#[tokio::test(flavor = "multi_thread")]
async fn two_files_serving_one_name_is_a_setup_error_naming_both() {
    let (one, two) = (forecaster(""), forecaster(""));
    let (one, two) = (one.agent(), two.agent());
    let (one, two) = (one.to_str().unwrap(), two.to_str().unwrap());
    for (tools, first, second) in [
        (
            true,
            format!("the tool \"forecast\" of {one}"),
            format!("the tool \"forecast\" of {two}"),
        ),
        (
            false,
            format!("the agent of {one}"),
            format!("the agent of {two}"),
        ),
    ] {
        let mut command = vec!["mcp", "serve", one, two];
        if tools {
            command.push("--tools");
        }
        let out = agentloop(args(&command)).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{err}");
        let name = if tools { "forecast" } else { "forecaster" };
        assert!(
            err.contains(&format!(
                "mcp.duplicate_tool: two served MCP tools are named \"{name}\": {first} and {second}"
            )),
            "{err}"
        );
    }
}

/// A stop signal sent while a server is still starting (its agent's stdio MCP server slow to
/// start) waits for the start, then stops it in order: the process exits 0 rather than dying by
/// the signal, and its MCP server is told to stop (its input closed), which it answers by writing
/// its report. Both `mcp serve` and `a2a serve`.
#[test]
fn a_stop_signal_during_the_start_stops_the_server_in_order() {
    let write_server =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/write_server.py");
    // Says it has started, then takes a second before it is the write server.
    let slow = format!(
        "import os, time\nopen('started', 'w').close()\ntime.sleep(1)\n\
         os.execvp('python3', ['python3', {:?}, '--at-exit', 'marker.txt'])\n",
        write_server.display().to_string()
    );
    for (protocol, addr) in [("mcp", "--http"), ("a2a", "--addr")] {
        let dir = AgentDir::new(
            "name = \"a\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\n\
             [[mcp]]\nname = \"w\"\ncommand = [\"python3\", \"slow.py\"]\n",
        );
        dir.write("script.json", &json!([{"text": "done"}]).to_string());
        dir.write("slow.py", &slow);
        let mut child = Command::new(bin())
            .args([protocol, "serve", addr, "127.0.0.1:0"])
            .arg(dir.agent())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let said = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        let waited = Instant::now();
        while !dir.path("started").exists() {
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "{protocol}: the server never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let kill = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let ended = child.wait().unwrap();
        let said = said.join().unwrap();
        assert_eq!(ended.code(), Some(0), "{protocol}: {ended}: {said}");
        // The server writes its report as it ends, which may be just after agentloop has.
        let report = || std::fs::read_to_string(dir.path("at-exit.txt")).unwrap_or_default();
        let waited = Instant::now();
        while report().is_empty() && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(report(), "marker.txt ok\n", "{protocol}: {said}");
    }
}

/// One JSON-RPC message as a line on a stdio server's stdin.
fn send_line(stdin: &mut impl std::io::Write, message: &Value) {
    writeln!(stdin, "{message}").unwrap();
    stdin.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_during_a_journaled_call_answers_it_and_leaves_the_run_to_resume() {
    use std::io::BufRead;
    let dir = forecaster("");
    slow_script(&dir);
    // The tool starts a process of its own and says both ids: neither may outlive the stop.
    dir.write(
        "slow.py",
        "import os, subprocess, time\np = subprocess.Popen(['sleep', '60'])\n\
         open('pids', 'w').write(f'{os.getpid()} {p.pid}')\nos.rename('pids', 'started')\n\
         time.sleep(30)\nopen('finished', 'w').close()\n",
    );
    let (agent, journal) = (dir.agent(), dir.path("journal.db"));
    let (agent, journal) = (agent.to_str().unwrap(), journal.to_str().unwrap());
    let mut server = Command::new(bin())
        .args(["mcp", "serve", agent, "--journal", journal])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = server.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(server.stdout.take().unwrap());
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}),
    );
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("\"id\":1"), "{line}");
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "forecaster", "arguments": {"task": "Take your time."}}}),
    );
    let started = dir.path("started");
    for _ in 0..300 {
        if started.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pids = std::fs::read_to_string(&started).unwrap();

    // Stopped as a service manager stops it, while the run is in its tool call.
    let stop = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let ended = server.wait().unwrap();
    assert_eq!(ended.code(), Some(0), "{ended}");
    assert!(
        stop.elapsed() < Duration::from_secs(10),
        "{:?}",
        stop.elapsed()
    );

    // The call is answered, in whole lines: an error result that names the run to resume.
    let answers: Vec<Value> = rest
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let answer = answers.iter().find(|a| a["id"] == 2).expect("no answer");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("the server stopped"), "{text}");

    // Neither the tool nor what it started runs on.
    std::thread::sleep(Duration::from_millis(500));
    for pid in pids.split_whitespace() {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            state.is_empty() || state.contains(") Z "),
            "process {pid} outlived the stop: {state}"
        );
    }

    // The run is not over in the journal, and resumes to its answer.
    let list = agentloop(args(&["journal", "list", "--journal", journal, "--json"])).await;
    let runs: Value = serde_json::from_slice(&list.stdout).unwrap();
    let run = &runs.as_array().unwrap()[0];
    let id = run["run_id"].as_str().unwrap();
    assert!(text.contains(&format!("agentloop resume {id}")), "{text}");
    assert_ne!(run["status"], "finished", "{run}");
    let resumed = agentloop(args(&["resume", id, "--journal", journal, "--json"])).await;
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let outcome: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(outcome["stop_reason"], "finished", "{outcome}");
    assert!(!dir.path("finished").exists(), "the slow tool ran on");
}

/// A stop over HTTP while a call's run is in its slow tool: the call's answer to it, on the
/// call's own event stream, ahead of the end of its session (rmcp ended the sessions first).
fn answer_to_a_stop_over_http(journaled: bool) -> String {
    let dir = forecaster("");
    slow_script(&dir);
    dir.write(
        "slow.py",
        "import os, time\nopen('started', 'w').close()\ntime.sleep(30)\n\
         open('finished', 'w').close()\n",
    );
    let (agent, journal) = (dir.agent(), dir.path("journal.db"));
    let (agent, journal) = (agent.to_str().unwrap(), journal.to_str().unwrap());
    let server = if journaled {
        HttpServer::start("mcp", &[agent, "--journal", journal])
    } else {
        HttpServer::start("mcp", &[agent])
    };
    let session = start_session(&server.url);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "forecaster", "arguments": {"task": "Take your time."}}});
    let url = server.url.clone();
    let answer = std::thread::spawn(move || {
        http_request(
            &url,
            "POST",
            "127.0.0.1",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("MCP-Protocol-Version", "2025-11-25"),
                ("Mcp-Session-Id", &session),
            ],
            &call.to_string(),
        )
    });
    server.terminate_once_exists(&dir.path("started"));
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let answered: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .filter(|m: &Value| m["id"] == 2)
        .collect();
    let answer = answered
        .first()
        .unwrap_or_else(|| panic!("no answer: {body:?}"));
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(!dir.path("finished").exists(), "the slow tool ran on");
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_stop_during_a_call_over_http_answers_it_before_its_session_ends() {
    let text = answer_to_a_stop_over_http(true);
    assert!(text.contains("the server stopped"), "{text}");
    assert!(text.contains("agentloop resume "), "{text}");
    let text = answer_to_a_stop_over_http(false);
    assert!(
        text.contains("the agent's run stopped: cancelled"),
        "{text}"
    );
}
