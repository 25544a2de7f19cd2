//! Real MCP servers, installed at pinned versions by `scripts/mcp/install.sh` and run on
//! loopback: the filesystem, everything (stdio and streamable HTTP), time and fetch servers.
//! Nothing here is skipped: a server that cannot be installed fails the test that needs it.
//! The wire each speaks is what the client negotiates with it: the npm servers' SDK
//! (`@modelcontextprotocol/sdk` 1.32) knows only the `initialize` handshake, up to 2025-11-25,
//! so they are reached by the client's fallback; the Python ones' (`mcp` 2.3) answers
//! `server/discover`, so they speak 2026-07-28.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agentloop::message::ToolContent;
use agentloop::testing::{FunctionModel, ScriptedModel};
use agentloop::{
    Agent, CallStatus, Event, EventKind, ModelResponse, Tool, ToolContext, ToolError, ToolOutput,
};
use agentloop_mcp::{McpServer, McpServers, Restart, ServerConfig, Transport};
use agentloop_tools::{SandboxMode, SandboxPolicy};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Generous: a loaded two-core machine starts node and python servers slowly.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A tool server-everything registers once the client says it is initialized, whatever the
/// client can do, and announces with `notifications/tools/list_changed`.
const LATE_TOOL: &str = "simulate-research-query";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The folder the servers are installed in (once per test process; the script itself is safe
/// to run from several processes at once).
fn servers() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = std::process::Command::new(repo().join("scripts/mcp/install.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("cannot run scripts/mcp/install.sh (it needs bash, npm and python3)");
        assert!(
            out.status.success(),
            "scripts/mcp/install.sh failed ({}): the MCP test servers could not be installed",
            out.status
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn npm_bin(name: &str) -> String {
    servers()
        .join("node_modules/.bin")
        .join(name)
        .display()
        .to_string()
}

fn py_bin(name: &str) -> String {
    servers().join("venv/bin").join(name).display().to_string()
}

fn config(name: &str, command: Vec<String>) -> ServerConfig {
    let mut c = ServerConfig::stdio(name, command);
    c.timeout = TIMEOUT;
    c
}

/// A stdio server run in `dir`, the folder its sandbox lets it write.
fn working_in(mut c: ServerConfig, dir: &Path) -> ServerConfig {
    if let Transport::Stdio { cwd, .. } = &mut c.transport {
        *cwd = Some(dir.to_path_buf());
    }
    c
}

fn tool<'a>(tools: &'a [Tool], name: &str) -> &'a Tool {
    tools.iter().find(|t| t.name() == name).unwrap_or_else(|| {
        let names: Vec<_> = tools.iter().map(Tool::name).collect();
        panic!("no tool {name} among {names:?}")
    })
}

async fn call(tool: &Tool, args: Value) -> Result<ToolOutput, ToolError> {
    tool.call(args, ToolContext::detached("c1", tool.name()))
        .await
}

fn text(output: &ToolOutput) -> String {
    output.content.to_text()
}

fn recoverable(e: ToolError) -> (String, String) {
    match e {
        ToolError::Recoverable { code, message, .. } => (code, message),
        ToolError::Fatal { message } => panic!("fatal: {message}"),
    }
}

/// A run of an agent on `tools` whose model calls `name` once with `args`, then says "done".
/// The run's first call, asserted to have ended well.
fn the_only_call_ok(outcome: &agentloop::RunOutcome) -> &agentloop::ToolCallRecord {
    let record = &outcome.tool_calls[0];
    assert_eq!(
        record.outcome.status,
        CallStatus::Ok,
        "{:?}",
        record.outcome
    );
    record
}

async fn run_one_call(tools: Vec<Tool>, name: &str, args: &str) -> agentloop::RunOutcome {
    let agent = Agent::builder()
        .model(ScriptedModel::new([
            ModelResponse::tool_calls([("c1".to_owned(), name.to_owned(), args.to_owned())]),
            ModelResponse::text("done"),
        ]))
        .tools(tools)
        .build()
        .unwrap();
    tokio::time::timeout(TIMEOUT, agent.run("go"))
        .await
        .expect("the run hung")
}

fn everything_stdio(name: &str) -> ServerConfig {
    config(name, vec![npm_bin("mcp-server-everything"), "stdio".into()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_server_writes_only_its_own_folder_whatever_it_is_told() {
    // The server is told it may write `outside`, but runs in `inside`: its sandbox lets it
    // write there only (the test above, run in the folder it writes, is the control).
    let inside = tempfile_dir("fs-inside");
    let outside = tempfile_dir("fs-outside");
    let server = McpServer::connect(working_in(
        config(
            "fs",
            vec![
                npm_bin("mcp-server-filesystem"),
                outside.display().to_string(),
            ],
        ),
        &inside,
    ))
    .await
    .unwrap();
    let tools = server.tools();
    let target = outside.join("planted.txt");
    let err = call(
        tool(&tools, "fs__write_file"),
        json!({"path": target.display().to_string(), "content": "x"}),
    )
    .await
    .unwrap_err();
    let (code, message) = recoverable(err);
    assert_eq!(code, "mcp.tool_error", "{message}");
    assert!(
        // EROFS from the read-only view where the system gives one, else Landlock's EACCES.
        message.contains("EACCES") || message.contains("denied") || message.contains("EROFS"),
        "{message}"
    );
    assert!(
        !target.exists(),
        "the sandboxed server wrote {}",
        target.display()
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_server_lists_reads_writes_and_answers_an_error_result() {
    let dir = tempfile_dir("fs");
    std::fs::write(dir.join("notes.txt"), "alpha\nbeta\n").unwrap();
    // Trusted, so that its read-only hints count (untrusted, every tool is mutating: the CLI's
    // `trust_hints` test shows both).
    let mut fs = working_in(
        config(
            "fs",
            vec![npm_bin("mcp-server-filesystem"), dir.display().to_string()],
        ),
        &dir,
    );
    fs.trust_hints = true;
    let server = McpServer::connect(fs).await.unwrap();
    let tools = server.tools();
    let read = tool(&tools, "fs__read_text_file");
    assert_eq!(read.spec().input_schema["type"], "object");
    assert!(!read.spec().mutating, "read_text_file says it is read-only");
    assert!(read.spec().idempotent, "and so is safe to run again");
    assert!(tool(&tools, "fs__write_file").spec().mutating);

    let path = dir.join("notes.txt").display().to_string();
    // It answers with structured content (its output schema): that is what the model reads.
    let out = call(read, json!({"path": path})).await.unwrap();
    assert_eq!(
        out.content,
        ToolContent::Json(json!({"content": "alpha\nbeta\n"}))
    );

    let edit = tool(&tools, "fs__edit_file");
    call(
        edit,
        json!({"path": path, "edits": [{"oldText": "beta", "newText": "gamma"}]}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "alpha\ngamma\n"
    );

    // Outside its root: the server answers with an isError result the model reads.
    let (code, message) = recoverable(
        call(read, json!({"path": "/etc/hostname"}))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "mcp.tool_error");
    assert!(
        message.to_lowercase().contains("denied") || message.contains("outside"),
        "{message}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_server_structured_content_is_checked_against_its_output_schema_in_a_run() {
    let server = McpServer::connect(config(
        "time",
        vec![py_bin("mcp-server-time"), "--local-timezone=UTC".into()],
    ))
    .await
    .unwrap();
    assert_eq!(
        server.protocol_version().await.as_deref(),
        Some("2026-07-28")
    );
    let tools = server.tools();
    let now = tool(&tools, "time__get_current_time");
    assert!(
        now.spec().output_schema.is_some(),
        "the time server declares an output schema"
    );
    let out = call(now, json!({"timezone": "Europe/Paris"}))
        .await
        .unwrap();
    let ToolContent::Json(value) = &out.content else {
        panic!("not structured: {:?}", out.content)
    };
    assert_eq!(value["timezone"], "Europe/Paris");

    // Through a run: the core checks the structured content against the output schema.
    let outcome = run_one_call(
        tools.clone(),
        "time__get_current_time",
        r#"{"timezone": "Asia/Tokyo"}"#,
    )
    .await;
    let record = the_only_call_ok(&outcome);
    assert!(record.outcome.content.to_text().contains("Asia/Tokyo"));

    // A server's own error: an unknown timezone.
    let (code, message) = recoverable(
        call(now, json!({"timezone": "Mars/Olympus"}))
            .await
            .unwrap_err(),
    );
    assert!(
        code == "mcp.tool_error" || code == "mcp.error",
        "{code}: {message}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_server_reads_a_loopback_page_of_the_tests_own() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let body = "<html><head><title>Loopback</title></head><body><h1>Hello from loopback</h1><p>The secret word is quokka.</p></body></html>";
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(reply.as_bytes()).await;
            });
        }
    });
    let mut fetcher = config(
        "fetch",
        vec![
            py_bin("mcp-server-fetch"),
            "--allow-private-ips".into(),
            "--ignore-robots-txt".into(),
        ],
    );
    // Unsandboxed: at its first fetch, readabilipy (under mcp-server-fetch) runs `npm install`
    // into its own package folder and the npm cache in the home folder, which no sandbox with a workspace lets it write.
    if let Transport::Stdio { sandbox, .. } = &mut fetcher.transport {
        *sandbox = SandboxPolicy::new(SandboxMode::Off);
    }
    let server = McpServer::connect(fetcher).await.unwrap();
    let tools = server.tools();
    let fetch = tool(&tools, "fetch__fetch");
    let out = call(
        fetch,
        json!({"url": format!("http://127.0.0.1:{port}/page")}),
    )
    .await
    .unwrap();
    assert!(text(&out).contains("quokka"), "{}", text(&out));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_server_over_stdio_echoes_and_honours_list_changed_on_refresh() {
    let mut cfg = everything_stdio("every");
    cfg.prefix = Some("e_".into());
    cfg.rename.insert("get-sum".into(), "add_numbers".into());
    let servers = McpServers::connect([cfg]).await.unwrap();
    // Its SDK does not know server/discover: the client falls back to the handshake.
    assert_eq!(
        servers.servers()[0].protocol_version().await.as_deref(),
        Some("2025-11-25")
    );
    let tools = servers.tools();
    let out = call(tool(&tools, "e_echo"), json!({"message": "hi there"}))
        .await
        .unwrap();
    assert!(text(&out).contains("hi there"), "{}", text(&out));
    let out = call(tool(&tools, "add_numbers"), json!({"a": 2, "b": 3}))
        .await
        .unwrap();
    assert!(text(&out).contains('5'), "{}", text(&out));

    // The server registers more tools once initialized and announces them with
    // tools/list_changed (see `LATE_TOOL`). The announcement marks the list stale when it
    // follows the connection's first tools/list, and a refresh (between runs) lists again; when
    // it reaches us first, that list already holds the late tools and the flag is spent. Both
    // orders happen (a loaded machine gives the second), and either way the tools are listed.
    let server = &servers.servers()[0];
    let late = format!("e_{LATE_TOOL}");
    tool(&tools, &late);
    if server.tools_changed() {
        // The same tools listed again: no change a run would take.
        servers.refresh().await;
        assert!(!server.tools_changed());
    }
    let refreshed = servers.tools();
    assert!(refreshed.len() >= tools.len());
    tool(&refreshed, "e_echo");
    tool(&refreshed, &late);
    assert!(!servers.refresh().await, "nothing changed since");
    servers.shutdown().await;
}

/// A model that answers each request with the next of `answers` (then a text), keeping the names
/// of the tools each request offered.
fn offering_model(answers: Vec<ModelResponse>) -> (FunctionModel, Arc<Mutex<Vec<Vec<String>>>>) {
    let offered = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&offered);
    let model = FunctionModel::new(move |request| {
        let mut seen = seen.lock().unwrap();
        seen.push(request.tools.iter().map(|s| s.name.clone()).collect());
        Ok(answers
            .get(seen.len() - 1)
            .cloned()
            .unwrap_or_else(|| ModelResponse::text("done")))
    });
    (model, offered)
}

/// Collects a run's events.
fn recorder() -> (
    impl Fn(&Event) + Send + Sync + 'static,
    Arc<Mutex<Vec<Event>>>,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&events);
    (
        move |e: &Event| kept.lock().unwrap().push(e.clone()),
        events,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_a_server_adds_during_a_run_is_offered_and_called_in_the_next_turn() {
    let dir = tempfile_dir("grow");
    let script = repo().join("scripts/mcp/growing_server.py");
    let mut cfg = config("grow", vec!["python3".into(), script.display().to_string()]);
    if let Transport::Stdio { cwd, .. } = &mut cfg.transport {
        *cwd = Some(dir.clone());
    }
    let servers = McpServers::connect([cfg]).await.unwrap();
    let (model, offered) = offering_model(vec![
        ModelResponse::tool_calls([("a", "grow__add_tool", "{}")]),
        ModelResponse::tool_calls([("n", "grow__new_tool", "{}")]),
    ]);
    let (sink, events) = recorder();
    let agent = Agent::builder()
        .model(model)
        .tool_source(Arc::new(servers.clone()))
        .sink(sink)
        .build()
        .unwrap();
    let out = agent.run("grow a tool and use it").await;
    assert_eq!(out.stop_reason, agentloop::StopReason::Finished, "{out:?}");
    let offered = offered.lock().unwrap().clone();
    assert_eq!(offered[0], ["grow__add_tool"]);
    // The server announced tools/list_changed during turn 1: turn 2 offers the new tool, and
    // its call reaches the server.
    assert_eq!(offered[1], ["grow__add_tool", "grow__new_tool"]);
    let call = out.tool_calls.iter().find(|r| &*r.call_id == "n").unwrap();
    assert_eq!(call.outcome.status, CallStatus::Ok, "{:?}", call.outcome);
    assert!(dir.join("new_tool.ran").exists());
    let events = events.lock().unwrap().clone();
    assert!(
        events.iter().any(|e| e.turn == 2
            && matches!(&e.kind, EventKind::ToolsChanged { added, .. } if *added == ["grow__new_tool"])),
        "{events:?}"
    );
    // What it said on stderr outside a call is the run's, as an event; inside the call, the
    // call's details keep it.
    let outside: Vec<&String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolSourceOutput { origin, lines } if origin == "grow" => Some(lines),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(outside, ["grow: started"], "{events:?}");
    servers.shutdown().await;
}

/// A run whose model calls `add_tool` of a growing server, then `new_tool`; `offered` holds the
/// tool names of each request.
async fn grow_and_call(
    servers: &McpServers,
    name: &str,
) -> (agentloop::RunOutcome, Vec<Vec<String>>) {
    let (model, offered) = offering_model(vec![
        ModelResponse::tool_calls([("a", format!("{name}__add_tool"), "{}".to_owned())]),
        ModelResponse::tool_calls([("n", format!("{name}__new_tool"), "{}".to_owned())]),
    ]);
    let agent = Agent::builder()
        .model(model)
        .tool_source(Arc::new(servers.clone()))
        .build()
        .unwrap();
    let out = tokio::time::timeout(TIMEOUT, agent.run("grow a tool and use it"))
        .await
        .expect("the run hung");
    let offered = offered.lock().unwrap().clone();
    (out, offered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_an_sdk_server_adds_is_offered_in_the_next_turn_at_2026_07_28_and_at_2025_11_25() {
    // The official Python SDK's server announces a change on the `subscriptions/listen` stream a
    // 2026-07-28 client opened (never on the connection itself), and as
    // `notifications/tools/list_changed` to a client of the handshake.
    for (pinned, spoken) in [(None, "2026-07-28"), (Some("2025-11-25"), "2025-11-25")] {
        let dir = tempfile_dir("grow-sdk");
        let mut cfg = sdk_server(&dir, pinned);
        cfg.name = "grow".into();
        let servers = McpServers::connect([cfg]).await.unwrap();
        let server = &servers.servers()[0];
        assert_eq!(server.protocol_version().await.as_deref(), Some(spoken));
        let (out, offered) = grow_and_call(&servers, "grow").await;
        assert_eq!(
            out.stop_reason,
            agentloop::StopReason::Finished,
            "{spoken}: {out:?}"
        );
        assert!(
            !offered[0].contains(&"grow__new_tool".to_owned()),
            "{spoken}"
        );
        let mut after = offered[0].clone();
        after.push("grow__new_tool".into());
        assert_eq!(offered[1], after, "{spoken}");
        let call = out.tool_calls.iter().find(|r| &*r.call_id == "n").unwrap();
        assert_eq!(
            call.outcome.status,
            CallStatus::Ok,
            "{spoken}: {:?}",
            call.outcome
        );
        assert!(dir.join("new_tool.ran").exists(), "{spoken}");
        servers.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ends_its_session_at_server_discover_is_reached_with_the_handshake() {
    // The Python SDK before 1.10 ends the session at a request it does not know (it stays
    // alive, answering nothing): negotiating starts it again with the handshake alone.
    let dir = tempfile_dir("legacy");
    let python = servers()
        .join("venv-legacy/bin/python")
        .display()
        .to_string();
    let script = repo().join("scripts/mcp/legacy_server.py");
    let mut cfg = working_in(
        config("legacy", vec![python, script.display().to_string()]),
        &dir,
    );
    cfg.timeout = Duration::from_secs(60);
    let server = McpServer::connect(cfg).await.unwrap();
    assert_eq!(
        server.protocol_version().await.as_deref(),
        Some("2025-03-26")
    );
    let tools = server.tools();
    let out = call(tool(&tools, "legacy__add"), json!({"a": 2, "b": 3}))
        .await
        .unwrap();
    assert_eq!(text(&out), "5");
    server.shutdown().await;
}

/// The official Python SDK's server (`scripts/mcp/sdk_server.py`), run in `dir`, at `pinned`.
fn sdk_server(dir: &Path, pinned: Option<&str>) -> ServerConfig {
    let script = repo().join("scripts/mcp/sdk_server.py");
    let mut cfg = working_in(
        config("sdk", vec![py_bin("python"), script.display().to_string()]),
        dir,
    );
    cfg.protocol_version = pinned.map(str::to_owned);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_images_progress_errors_timeouts_and_cancellation_work_at_2026_07_28_and_at_2025_11_25()
 {
    for (pinned, spoken) in [(None, "2026-07-28"), (Some("2025-11-25"), "2025-11-25")] {
        let dir = tempfile_dir("sdk");
        let server = McpServer::connect(sdk_server(&dir, pinned)).await.unwrap();
        assert_eq!(server.protocol_version().await.as_deref(), Some(spoken));
        let tools = server.tools();

        // Progress: each notification under the call's token is one of its events.
        let (sink, events) = recorder();
        let agent = Agent::builder()
            .model(ScriptedModel::new([
                ModelResponse::tool_calls([
                    ("p".to_owned(), "sdk__steps".to_owned(), "{}".to_owned()),
                    ("i".to_owned(), "sdk__picture".to_owned(), "{}".to_owned()),
                    ("f".to_owned(), "sdk__fail".to_owned(), "{}".to_owned()),
                ]),
                ModelResponse::text("done"),
            ]))
            .tools(tools.clone())
            .sink(sink)
            .build()
            .unwrap();
        let out = tokio::time::timeout(TIMEOUT, agent.run("go"))
            .await
            .expect("the run hung");
        let by_id = |id: &str| {
            out.tool_calls
                .iter()
                .find(|r| &*r.call_id == id)
                .unwrap()
                .outcome
                .clone()
        };
        let steps = by_id("p");
        assert_eq!(steps.status, CallStatus::Ok, "{spoken}: {steps:?}");
        assert!(
            steps.content.to_text().contains("three steps done"),
            "{spoken}"
        );
        let progress: Vec<Value> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolProgress { progress, .. } => Some(progress.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            progress
                .iter()
                .map(|p| p["message"].clone())
                .collect::<Vec<_>>(),
            [json!("step 1"), json!("step 2"), json!("step 3")],
            "{spoken}: {progress:?}"
        );
        assert_eq!(progress[2]["total"], 3.0, "{spoken}");
        // An image stays an image.
        let picture = by_id("i");
        assert_eq!(picture.status, CallStatus::Ok, "{spoken}: {picture:?}");
        assert!(
            format!("{:?}", picture.content).contains("image/png"),
            "{spoken}: {:?}",
            picture.content
        );
        // The server's error result is one the model reads.
        let fail = by_id("f");
        assert_eq!(
            fail.code.as_deref(),
            Some("mcp.tool_error"),
            "{spoken}: {fail:?}"
        );
        assert!(
            fail.content.to_text().contains("Error executing tool fail"),
            "{spoken}: {:?}",
            fail.content
        );

        // A call past its timeout is a tool timeout, and the server is told to stop it.
        let sleep = tool(&tools, "sdk__sleep").clone();
        let mut policy = sleep.policy().clone();
        policy.timeout = Some(Duration::from_secs(2));
        let short = sleep.clone().with_policy(policy);
        let outcome = run_one_call(vec![short], "sdk__sleep", r#"{"secs": 600}"#).await;
        assert_eq!(
            outcome.tool_calls[0].outcome.code.as_deref(),
            Some("timeout"),
            "{spoken}: {:?}",
            outcome.tool_calls[0].outcome
        );
        let cancelled = dir.join("sleep.cancelled");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !cancelled.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{spoken}: the server never heard that the timed-out call was cancelled"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::fs::remove_file(&cancelled).unwrap();

        // Cancelling the call's token ends it at once, and the server hears of it too.
        let ctx = ToolContext::detached("c2", sleep.name());
        let cancel = ctx.cancel.clone();
        let call = tokio::spawn(sleep.call(json!({"secs": 600}), ctx));
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
        let result = tokio::time::timeout(TIMEOUT, call)
            .await
            .expect("cancellation hung")
            .unwrap();
        assert_eq!(recoverable(result.unwrap_err()).0, "cancelled", "{spoken}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !cancelled.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{spoken}: the server never heard that the call was cancelled"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_protocol_version_is_spoken_or_the_server_does_not_start() {
    // The time server speaks every version: the pinned one is the one spoken.
    for version in ["2026-07-28", "2025-11-25", "2025-06-18"] {
        let mut cfg = config(
            "time",
            vec![py_bin("mcp-server-time"), "--local-timezone=UTC".into()],
        );
        cfg.protocol_version = Some(version.to_owned());
        let server = McpServer::connect(cfg).await.unwrap();
        assert_eq!(server.protocol_version().await.as_deref(), Some(version));
        let out = call(
            tool(&server.tools(), "time__get_current_time"),
            json!({"timezone": "UTC"}),
        )
        .await
        .unwrap();
        assert!(text(&out).contains("UTC"), "{version}: {}", text(&out));
        server.shutdown().await;
    }
    // A server of the handshake only cannot speak a pinned 2026-07-28: no fallback.
    let mut cfg = everything_stdio("every");
    cfg.protocol_version = Some("2026-07-28".into());
    let err = McpServer::connect(cfg).await.unwrap_err();
    assert_eq!(err.code(), "mcp.start", "{err}");
    // A version the client does not know is refused before anything starts.
    let mut cfg = everything_stdio("every");
    cfg.protocol_version = Some("2027-01-01".into());
    let err = McpServer::connect(cfg).await.unwrap_err();
    assert_eq!(err.code(), "mcp.config", "{err}");
    assert!(err.to_string().contains("2026-07-28"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everythings_list_changed_before_a_run_is_honoured_at_its_first_turn() {
    let servers = McpServers::connect([everything_stdio("every")])
        .await
        .unwrap();
    // The server's announcement of its late tools came either after the connection's first
    // list (the flag is set, and the run's first turn lists again) or before it (that list holds
    // them): the run's model is offered them either way.
    let server = &servers.servers()[0];
    let (model, offered) = offering_model(vec![ModelResponse::tool_calls([(
        "e",
        "every__echo",
        r#"{"message": "after the change"}"#,
    )])]);
    let agent = Agent::builder()
        .model(model)
        .tool_source(Arc::new(servers.clone()))
        .build()
        .unwrap();
    let out = agent.run("echo").await;
    assert_eq!(out.stop_reason, agentloop::StopReason::Finished, "{out:?}");
    // The model was offered the server's list as it is after the change, and no notification
    // is left unspent (the run's first turn listed again if one was pending).
    assert!(!server.tools_changed());
    let now: Vec<String> = servers
        .tools()
        .iter()
        .map(|t| t.name().to_owned())
        .collect();
    assert_eq!(offered.lock().unwrap()[0], now);
    assert!(now.contains(&format!("every__{LATE_TOOL}")), "{now:?}");
    let echo = &out.tool_calls[0];
    assert_eq!(echo.outcome.status, CallStatus::Ok, "{:?}", echo.outcome);
    assert!(echo.outcome.content.to_text().contains("after the change"));
    servers.shutdown().await;
}

/// server-everything over streamable HTTP, kept on 127.0.0.1 by a preload; its port from stderr.
struct HttpEverything {
    child: tokio::process::Child,
    url: String,
}

async fn start_http_everything() -> HttpEverything {
    let mut child = tokio::process::Command::new(npm_bin("mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", "0")
        .env(
            "NODE_OPTIONS",
            format!(
                "--require {}",
                repo().join("scripts/mcp/loopback.cjs").display()
            ),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = tokio::time::timeout(TIMEOUT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("agentloop-listening ") {
                let (host, port) = rest.split_once(' ').unwrap();
                assert_eq!(host, "127.0.0.1", "the server must listen on loopback only");
                return port.parse::<u16>().unwrap();
            }
        }
        panic!("server-everything ended before it listened")
    })
    .await
    .expect("server-everything did not listen in time");
    // Keep reading its stderr so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    HttpEverything {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_server_over_streamable_http_lists_and_calls_with_headers_from_the_environment()
{
    let mut http = start_http_everything().await;
    let mut cfg = ServerConfig::http("web", http.url.clone());
    cfg.timeout = TIMEOUT;
    // A header from the environment (PATH is always set): the template is expanded at start.
    if let Transport::Http { headers, .. } = &mut cfg.transport {
        headers.insert("X-Test-Token".into(), "token ${PATH}".into());
    }
    let server = McpServer::connect(cfg).await.unwrap();
    assert_eq!(
        server.protocol_version().await.as_deref(),
        Some("2025-11-25")
    );
    let tools = server.tools();
    let out = call(tool(&tools, "web__echo"), json!({"message": "over http"}))
        .await
        .unwrap();
    assert!(text(&out).contains("over http"));
    let out = call(
        tool(&tools, "web__get-structured-content"),
        json!({"location": "New York"}),
    )
    .await
    .unwrap();
    assert!(
        matches!(out.content, ToolContent::Json(_)),
        "{:?}",
        out.content
    );
    server.shutdown().await;
    http.child.kill().await.unwrap();
}

/// Starts server-everything through a shell that records its pid, so the test can kill it.
fn killable_everything(name: &str, pid_file: &Path) -> ServerConfig {
    let dir = pid_file.parent().unwrap_or(Path::new("."));
    let server = config(
        name,
        vec![
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "echo $$ > '{}'; exec '{}' stdio",
                pid_file.display(),
                npm_bin("mcp-server-everything")
            ),
        ],
    );
    working_in(server, dir)
}

async fn kill_from(pid_file: &Path) {
    let pid = std::fs::read_to_string(pid_file).unwrap();
    let status = tokio::process::Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_fails_the_call_and_is_started_again_on_failure() {
    let dir = tempfile_dir("kill");
    let pid_file = dir.join("pid");
    let mut cfg = killable_everything("k", &pid_file);
    cfg.restart = Restart::OnFailure;
    let server = McpServer::connect(cfg).await.unwrap();
    let tools = server.tools();
    let long = tool(&tools, "k__trigger-long-running-operation").clone();
    let in_flight =
        tokio::spawn(async move { call(&long, json!({"duration": 600, "steps": 2})).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    kill_from(&pid_file).await;
    let result = tokio::time::timeout(TIMEOUT, in_flight)
        .await
        .expect("the call hung")
        .unwrap();
    let (code, message) = recoverable(result.unwrap_err());
    assert_eq!(code, "mcp.server_exited", "{message}");
    assert!(message.contains("started again"), "{message}");

    // The next call starts it again.
    let out = call(tool(&tools, "k__echo"), json!({"message": "back"}))
        .await
        .unwrap();
    assert!(text(&out).contains("back"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_under_restart_never_answers_each_call_with_an_error() {
    let dir = tempfile_dir("never");
    let pid_file = dir.join("pid");
    let server = McpServer::connect(killable_everything("n", &pid_file))
        .await
        .unwrap();
    let tools = server.tools();
    kill_from(&pid_file).await;
    // Whether the exit is seen before or during the call, the call fails without hanging.
    let first = tokio::time::timeout(
        TIMEOUT,
        call(tool(&tools, "n__echo"), json!({"message": "x"})),
    )
    .await
    .expect("the call hung");
    let (code, _) = recoverable(first.unwrap_err());
    assert!(
        code == "mcp.server_exited" || code == "mcp.server_down",
        "{code}"
    );
    let (code, message) = recoverable(
        call(tool(&tools, "n__echo"), json!({"message": "x"}))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "mcp.server_down", "{message}");
    assert!(message.contains("never"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_timeout_is_a_tool_timeout_and_cancellation_ends_a_call() {
    let server = McpServer::connect(everything_stdio("slow")).await.unwrap();
    let long = tool(&server.tools(), "slow__trigger-long-running-operation").clone();
    assert_eq!(
        long.policy().timeout,
        Some(TIMEOUT),
        "the server's timeout is the tool's"
    );
    let mut policy = long.policy().clone();
    policy.timeout = Some(Duration::from_secs(3));
    let long = long.with_policy(policy);
    let outcome = run_one_call(
        vec![long.clone()],
        "slow__trigger-long-running-operation",
        r#"{"duration": 600, "steps": 2}"#,
    )
    .await;
    let record = &outcome.tool_calls[0];
    assert_eq!(
        record.outcome.code.as_deref(),
        Some("timeout"),
        "{:?}",
        record.outcome
    );

    // Cancellation: the call's token ends it at once.
    let ctx = ToolContext::detached("c2", long.name());
    let cancel = ctx.cancel.clone();
    let call = tokio::spawn(long.call(json!({"duration": 600, "steps": 2}), ctx));
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    let result = tokio::time::timeout(TIMEOUT, call)
        .await
        .expect("cancellation hung")
        .unwrap();
    assert_eq!(recoverable(result.unwrap_err()).0, "cancelled");
    // The server is still fine after both.
    let out = call_echo(&server).await;
    assert!(out.contains("still"));
    server.shutdown().await;
}

async fn call_echo(server: &McpServer) -> String {
    let tools = server.tools();
    text(
        &call(tool(&tools, "slow__echo"), json!({"message": "still here"}))
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_writes_garbage_or_never_answers_fails_to_start_without_hanging() {
    let garbage = config(
        "junk",
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo 'not json'; echo oops >&2; exec sleep 600".into(),
        ],
    );
    let garbage = ServerConfig {
        timeout: Duration::from_secs(3),
        ..garbage
    };
    let err = tokio::time::timeout(TIMEOUT, McpServer::connect(garbage))
        .await
        .expect("hung")
        .unwrap_err();
    assert!(
        err.code() == "mcp.timeout" || err.code() == "mcp.start",
        "{err}"
    );

    let crash = config(
        "crash",
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo 'it broke' >&2; exit 3".into(),
        ],
    );
    let err = tokio::time::timeout(TIMEOUT, McpServer::connect(crash))
        .await
        .expect("hung")
        .unwrap_err();
    assert_eq!(err.code(), "mcp.start", "{err}");
    assert!(
        err.to_string().contains("it broke"),
        "the stderr tail explains it: {err}"
    );

    let missing = config("missing", vec!["/nonexistent/mcp-server".into()]);
    assert_eq!(
        McpServer::connect(missing).await.unwrap_err().code(),
        "mcp.start"
    );

    let mut secret = everything_stdio("sec");
    if let Transport::Stdio { env, .. } = &mut secret.transport {
        env.insert(
            "TOKEN".into(),
            "${AGENTLOOP_MCP_TEST_UNSET_VARIABLE}".into(),
        );
    }
    let err = McpServer::connect(secret).await.unwrap_err();
    assert_eq!(err.code(), "mcp.missing_env");
}

fn tempfile_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "agentloop-mcp-{tag}-{}-{}",
        std::process::id(),
        unique()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_be_started_again_answers_its_calls_with_an_error() {
    let dir = tempfile_dir("once");
    let pid_file = dir.join("pid");
    let started = dir.join("started");
    // Starts once; every later start fails at once, with a line on stderr.
    let mut cfg = working_in(
        config(
            "once",
            vec![
                "/bin/sh".into(),
                "-c".into(),
                format!(
                    "if [ -e '{started}' ]; then echo 'no second start' >&2; exit 1; fi; touch '{started}'; echo $$ > '{pid}'; exec '{server}' stdio",
                    started = started.display(),
                    pid = pid_file.display(),
                    server = npm_bin("mcp-server-everything"),
                ),
            ],
        ),
        &dir,
    );
    cfg.restart = Restart::OnFailure;
    let server = McpServer::connect(cfg).await.unwrap();
    let tools = server.tools();
    kill_from(&pid_file).await;
    for _ in 0..2 {
        let result = tokio::time::timeout(
            TIMEOUT,
            call(tool(&tools, "once__echo"), json!({"message": "x"})),
        )
        .await
        .expect("the call hung");
        let (code, message) = recoverable(result.unwrap_err());
        assert!(
            ["mcp.server_exited", "mcp.start"].contains(&code.as_str()),
            "{code}: {message}"
        );
        // The stderr of the failed start is the operator's, not the model's.
        assert!(!message.contains("no second start"), "{message}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_progress_notifications_become_the_calls_progress_events() {
    let server = McpServer::connect(everything_stdio("p")).await.unwrap();
    let long = tool(&server.tools(), "p__trigger-long-running-operation").clone();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let seen = events.clone();
    let agent = Agent::builder()
        .model(ScriptedModel::new([
            ModelResponse::tool_calls([(
                "c1".to_owned(),
                "p__trigger-long-running-operation".to_owned(),
                r#"{"duration": 1, "steps": 2}"#.to_owned(),
            )]),
            ModelResponse::text("done"),
        ]))
        .tool(long)
        .sink(move |e: &agentloop::Event| {
            if let agentloop::EventKind::ToolProgress { progress, .. } = &e.kind {
                seen.lock().unwrap().push(progress.clone());
            }
        })
        .build()
        .unwrap();
    let outcome = tokio::time::timeout(TIMEOUT, agent.run("go"))
        .await
        .expect("the run hung");
    assert_eq!(outcome.tool_calls[0].outcome.status, CallStatus::Ok);
    let events = events.lock().unwrap().clone();
    assert!(!events.is_empty(), "no progress event");
    assert_eq!(events[0]["total"], 2.0, "{events:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_reaches_the_runs_record_cut_to_the_servers_bound() {
    // server-everything's echo answers `Echo: <message>`: a message of 200 000 bytes is an answer
    // that large, which the server's bound of 8 KiB cuts, keeping its head and tail.
    const BOUND: usize = 8 * 1024;
    let message = format!("HEAD-{}-TAIL", "é".repeat(100_000));
    let mut cfg = everything_stdio("big");
    cfg.max_output_bytes = BOUND;
    let server = McpServer::connect(cfg).await.unwrap();
    let outcome = run_one_call(
        server.tools(),
        "big__echo",
        &json!({ "message": message }).to_string(),
    )
    .await;
    let record = the_only_call_ok(&outcome);
    let shown = record.outcome.content.to_text();
    assert!(shown.len() <= BOUND, "{} bytes", shown.len());
    assert!(shown.starts_with("Echo: HEAD-é"), "{}", &shown[..40]);
    assert!(shown.ends_with("é-TAIL"));
    let total = "Echo: ".len() + message.len();
    assert!(
        shown.contains(&format!("bytes cut from the middle ({total} bytes in all)")),
        "no note of the cut"
    );
    server.shutdown().await;

    // A bound of 0 could read nothing: refused before the server starts.
    let mut zero = everything_stdio("zero");
    zero.max_output_bytes = 0;
    let err = McpServer::connect(zero).await.unwrap_err();
    assert_eq!(err.code(), "mcp.config", "{err}");
    assert!(err.to_string().contains("max_output_bytes"), "{err}");
}

/// A stdio server deaf to the end of its input, which only SIGTERM stops (it writes `termed`
/// then): it lists no tool, starts `sleep 60` in its group ignoring SIGTERM, and writes its own
/// pid and that child's to `pids`.
const DEAF_SERVER: &str = r#"import json, os, signal, subprocess, sys, time
def term(*_):
    open("termed", "w").write("yes")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
left = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"])
open("pids", "w").write(f"{os.getpid()} {left.pid}")
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("id") is None:
        continue
    if msg.get("method") == "initialize":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "deaf", "version": "1"}}})
    elif msg.get("method") == "tools/list":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": []}})
    else:
        send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no"}})
while True:
    time.sleep(1)
"#;

/// True once no live process (a zombie is dead) has this id, within `within`.
async fn gone_within(pid: &str, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let dead = stat
            .rfind(')')
            .is_none_or(|at| stat[at + 1..].trim_start().starts_with('Z'));
        if dead {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_asks_the_server_to_stop_and_leaves_nothing_of_its_group() {
    // The server runs under the supervisor that makes it die with this process: its stop is
    // still the protocol's (its input closed, then SIGTERM to its group), and what it left in
    // its group goes with it.
    let dir = tempfile_dir("deaf");
    std::fs::write(dir.join("deaf.py"), DEAF_SERVER).unwrap();
    let server = McpServer::connect(working_in(
        config("deaf", vec!["python3".into(), "deaf.py".into()]),
        &dir,
    ))
    .await
    .unwrap();
    assert!(server.tools().is_empty());
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap();
    let pids: Vec<&str> = pids.split_whitespace().collect();
    let [server_pid, left] = pids[..] else {
        panic!("pids: {pids:?}")
    };
    server.shutdown().await;
    let server_gone = gone_within(server_pid, TIMEOUT).await;
    let left_gone = gone_within(left, Duration::from_secs(2)).await;
    for pid in [server_pid, left] {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .status();
    }
    assert!(server_gone, "the server outlived its shutdown");
    assert!(
        dir.join("termed").exists(),
        "the server was killed without being sent SIGTERM first"
    );
    assert!(left_gone, "what the server left in its group outlived it");
}
