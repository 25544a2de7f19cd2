//! Broken and hostile MCP servers (`scripts/mcp/hostile_server.py`, plain Python, over stdio and
//! streamable HTTP on loopback): the client holds up against each, and a healthy server is not
//! taken down by one failed request.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::sync::{Arc, Mutex};

use agentloop::testing::ScriptedModel;
use agentloop::{Agent, Event, EventKind, ModelResponse, Tool, ToolContext, ToolError, ToolOutput};
use agentloop_mcp::{McpServer, Restart, ServerConfig, Transport};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const TIMEOUT: Duration = Duration::from_secs(30);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/hostile_server.py")
}

/// The hostile server over stdio with `flags`, run in `dir`.
fn stdio(name: &str, dir: &Path, flags: &[&str]) -> ServerConfig {
    let mut command = vec!["python3".to_owned(), script().display().to_string()];
    command.extend(flags.iter().map(|f| (*f).to_owned()));
    let mut c = ServerConfig::stdio(name, command);
    c.timeout = TIMEOUT;
    if let Transport::Stdio { cwd, .. } = &mut c.transport {
        *cwd = Some(dir.to_path_buf());
    }
    c
}

/// The hostile server over HTTP with `flags`; killed when dropped.
struct Http {
    _child: tokio::process::Child,
    url: String,
}

async fn http(flags: &[&str]) -> Http {
    let mut child = tokio::process::Command::new("python3")
        .arg(script())
        .arg("--http")
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = tokio::time::timeout(TIMEOUT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("agentloop-listening 127.0.0.1 ") {
                return rest.parse::<u16>().unwrap();
            }
        }
        panic!("the hostile server ended before it listened")
    })
    .await
    .expect("the hostile server did not listen in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Http {
        _child: child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

fn tool<'a>(tools: &'a [Tool], name: &str) -> &'a Tool {
    tools.iter().find(|t| t.name() == name).unwrap_or_else(|| {
        let names: Vec<_> = tools.iter().map(Tool::name).collect();
        panic!("no tool {name} among {names:?}")
    })
}

async fn call(tool: &Tool, args: Value) -> Result<ToolOutput, ToolError> {
    tokio::time::timeout(
        TIMEOUT,
        tool.call(args, ToolContext::detached("c1", tool.name())),
    )
    .await
    .expect("the call hung")
}

fn code(e: ToolError) -> (String, String) {
    match e {
        ToolError::Recoverable { code, message, .. } => (code, message),
        ToolError::Fatal { message } => panic!("fatal: {message}"),
    }
}

fn tempdir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "agentloop-mcp-hostile-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

mod mcpfix {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_failed_http_request_fails_that_call_alone_and_the_server_stays_up() {
        // The second tools/call is answered 502 (a proxy's blip); the server is healthy.
        let server = http(&["--fail-call", "2"]).await;
        let mut cfg = ServerConfig::http("h", server.url.clone());
        cfg.timeout = TIMEOUT;
        // The default policy, `never`: a server taken for dead would be down for good.
        let mcp = McpServer::connect(cfg).await.unwrap();
        let tools = mcp.tools();
        let slow = tool(&tools, "h__slow").clone();
        let in_flight = tokio::spawn(async move { call(&slow, json!({"secs": 2})).await });
        tokio::time::sleep(Duration::from_millis(500)).await;

        let (code, message) = code(
            call(tool(&tools, "h__echo"), json!({"message": "blip"}))
                .await
                .unwrap_err(),
        );
        assert_eq!(code, "mcp.request", "{message}");
        assert!(message.contains("502"), "{message}");

        // The call beside it is answered, and later calls are too.
        let slept = in_flight.await.unwrap().unwrap();
        assert_eq!(slept.content.to_text(), "slept");
        let out = call(tool(&tools, "h__echo"), json!({"message": "after"}))
            .await
            .unwrap();
        assert_eq!(out.content.to_text(), "after");
        mcp.shutdown().await;
    }

    async fn pid_of(tools: &[Tool], name: &str) -> String {
        call(tool(tools, name), json!({}))
            .await
            .unwrap()
            .content
            .to_text()
    }

    async fn kill(pid: &str) {
        let status = tokio::process::Command::new("kill")
            .args(["-9", pid])
            .status()
            .await
            .unwrap();
        assert!(status.success());
    }

    /// Restarts the server behind `tools` (killed, then called again) and says what it speaks.
    async fn restarted(mcp: &McpServer, tools: &[Tool], whoami: &str) -> String {
        kill(&pid_of(tools, whoami).await).await;
        // The call that finds it dead (or sees it die) fails; the next starts it again.
        let _ = call(tool(tools, whoami), json!({})).await;
        pid_of(tools, whoami).await;
        mcp.protocol_version().await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_at_the_first_start_does_not_hold_later_starts_to_the_handshake() {
        let dir = tempdir("crash");
        let marker = dir.join("crashed").display().to_string();
        let mut cfg = stdio("c", &dir, &["--modern", "--crash-first", &marker]);
        cfg.restart = Restart::OnFailure;
        // The first process crashes at the offer: this start gets the handshake alone.
        let mcp = McpServer::connect(cfg).await.unwrap();
        assert_eq!(mcp.protocol_version().await.as_deref(), Some("2025-06-18"));
        // Started again, it negotiates, and speaks 2026-07-28.
        assert_eq!(
            restarted(&mcp, &mcp.tools(), "c__whoami").await,
            "2026-07-28"
        );
        mcp.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_slower_than_the_discover_wait_starts_once_and_negotiates_later() {
        // It reads nothing for 12 s (a first `npx -y` download), past rmcp's 10 s wait for the
        // answer to server/discover, then answers it late, and the handshake after it.
        let dir = tempdir("slow");
        let marker = dir.join("started").display().to_string();
        let mut cfg = stdio(
            "s",
            &dir,
            &["--modern", "--log-starts", "--slow-start", "12", &marker],
        );
        cfg.restart = Restart::OnFailure;
        let mcp = McpServer::connect(cfg).await.unwrap();
        assert_eq!(mcp.protocol_version().await.as_deref(), Some("2025-06-18"));
        let starts = std::fs::read_to_string(dir.join("starts")).unwrap();
        assert_eq!(starts.lines().count(), 1, "started once: {starts}");
        assert_eq!(
            restarted(&mcp, &mcp.tools(), "s__whoami").await,
            "2026-07-28"
        );
        mcp.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tool_list_that_pages_forever_or_repeats_a_cursor_or_a_huge_tool_is_bounded() {
        let dir = tempdir("pages");
        let short = |mut c: ServerConfig| {
            // Unbounded, the listing would run until the start's timeout.
            c.timeout = Duration::from_secs(10);
            c
        };
        // A cursor that comes back: the listing ends there, each tool once.
        let mcp = McpServer::connect(short(stdio("cyc", &dir, &["--pages", "2", "--cycle"])))
            .await
            .unwrap();
        let names: Vec<String> = mcp.tools().iter().map(|t| t.name().to_owned()).collect();
        assert_eq!(names, ["cyc__tool_0"]);
        mcp.shutdown().await;

        // Pages without end: the first 100 are listed.
        let mcp = McpServer::connect(short(stdio("many", &dir, &["--pages", "100000"])))
            .await
            .unwrap();
        assert_eq!(mcp.tools().len(), 100);
        mcp.shutdown().await;

        // A description of 2 MB is cut (head and tail kept); a schema of 1 MB leaves its tool out.
        let mcp = McpServer::connect(short(stdio("big", &dir, &["--huge", "2000000"])))
            .await
            .unwrap();
        let tools = mcp.tools();
        let huge = tool(&tools, "big__huge").spec().description.clone();
        assert!(huge.len() <= 16 * 1024, "{}", huge.len());
        assert!(huge.starts_with("xxx") && huge.ends_with("xxx"));
        mcp.shutdown().await;
        let mcp = McpServer::connect(short(stdio("wide", &dir, &["--huge-schema", "1000000"])))
            .await
            .unwrap();
        let tools = mcp.tools();
        assert!(tools.iter().all(|t| t.name() != "wide__huge"));
        tool(&tools, "wide__echo");
        mcp.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_refresh_keeps_the_change_for_the_next_one() {
        // Its second tools/list (the refresh after the change) fails.
        let dir = tempdir("relist");
        let mcp = McpServer::connect(stdio("r", &dir, &["--list-fails", "2"]))
            .await
            .unwrap();
        call(tool(&mcp.tools(), "r__change"), json!({}))
            .await
            .unwrap();
        assert!(mcp.tools_changed());
        let err = mcp.refresh().await.unwrap_err();
        assert_eq!(err.code(), "mcp.request", "{err}");
        assert!(mcp.tools_changed(), "the change is still to be listed");
        assert!(mcp.refresh().await.unwrap());
        tool(&mcp.tools(), "r__added");
        mcp.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn progress_a_dead_connection_was_sent_never_reaches_a_call_of_the_next() {
        let dir = tempdir("stray");
        let mut cfg = stdio("p", &dir, &["--stray", "50"]);
        cfg.restart = Restart::OnFailure;
        let mcp = McpServer::connect(cfg).await.unwrap();
        // Progress under the tokens 0..49, which no call holds (but one): it waits for a route.
        call(tool(&mcp.tools(), "p__stray"), json!({}))
            .await
            .unwrap();
        restarted(&mcp, &mcp.tools(), "p__whoami").await;

        // Calls on the new connection, whose tokens the old one's progress was sent under.
        let seen = Arc::new(Mutex::new(Vec::<Value>::new()));
        let kept = seen.clone();
        let agent = Agent::builder()
            .model(ScriptedModel::new([
                // Several, so that some hold tokens the old connection's progress waits under.
                ModelResponse::tool_calls((0..5).map(|n| {
                    (
                        format!("c{n}"),
                        "p__echo".to_owned(),
                        r#"{"message": "fresh"}"#.to_owned(),
                    )
                })),
                ModelResponse::text("done"),
            ]))
            .tools(mcp.tools())
            .sink(move |e: &Event| {
                if let EventKind::ToolProgress { progress, .. } = &e.kind {
                    kept.lock().unwrap().push(progress.clone());
                }
            })
            .build()
            .unwrap();
        let outcome = tokio::time::timeout(TIMEOUT, agent.run("go"))
            .await
            .unwrap();
        assert_eq!(outcome.tool_calls.len(), 5);
        for call in &outcome.tool_calls {
            assert_eq!(call.outcome.content.to_text(), "fresh");
        }
        let seen = seen.lock().unwrap().clone();
        assert!(seen.is_empty(), "stale progress reached the call: {seen:?}");
        mcp.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subscription_that_ends_at_once_is_opened_again_ever_more_slowly() {
        // At 2026-07-28 it acknowledges subscriptions/listen, then ends the stream at once.
        let dir = tempdir("listen");
        let mcp = McpServer::connect(stdio("l", &dir, &["--modern", "--listen-ends"]))
            .await
            .unwrap();
        assert_eq!(mcp.protocol_version().await.as_deref(), Some("2026-07-28"));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let listens = std::fs::read_to_string(dir.join("listens")).unwrap_or_default();
        // 0, 0.2, 0.6, 1.4 s and 3.0 s: not every 100 ms (some 25 times).
        assert!(
            listens.lines().count() <= 6,
            "{} listens in 3 s",
            listens.lines().count()
        );
        // Each reopening marks the list stale, but the same tools listed again are no change.
        assert!(mcp.tools_changed());
        assert!(!mcp.refresh().await.unwrap());
        assert!(!mcp.tools_changed());
        mcp.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stdio_servers_env_secrets_never_reach_its_start_error_or_a_calls_details() {
        // A variable cargo sets for the test, read by the server's env template.
        let secret = std::env::var("CARGO_MANIFEST_DIR").unwrap();
        let with_token = |mut c: ServerConfig| {
            if let Transport::Stdio { env, .. } = &mut c.transport {
                env.insert("TOKEN".into(), "${CARGO_MANIFEST_DIR}".into());
            }
            c
        };
        let dir = tempdir("secret");
        let err = McpServer::connect(with_token(stdio("s", &dir, &["--stderr-env", "TOKEN"])))
            .await
            .unwrap_err();
        let err = err.to_string();
        assert!(err.contains("cannot start with token [redacted]"), "{err}");
        assert!(!err.contains(&secret), "{err}");

        let mcp = McpServer::connect(with_token(stdio("s", &dir, &["--echo-env", "TOKEN"])))
            .await
            .unwrap();
        let out = call(tool(&mcp.tools(), "s__echo"), json!({"message": "m"}))
            .await
            .unwrap();
        let details = out.details.unwrap().to_string();
        assert!(details.contains("echo with token [redacted]"), "{details}");
        assert!(!details.contains(&secret), "{details}");
        mcp.shutdown().await;
    }

    /// Past the bound on a message (16 MiB by default): a line or a body of 17 MB.
    const PAST_THE_BOUND: &str = "17000000";

    /// A config whose own timeout is past `call`'s: a call that waited for it would hang.
    fn patient(mut c: ServerConfig) -> ServerConfig {
        c.timeout = TIMEOUT * 4;
        c
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stdio_answer_past_the_bound_ends_the_connection_not_the_process() {
        assert!(PAST_THE_BOUND.parse::<usize>().unwrap() > agentloop_mcp::MIN_MESSAGE_BYTES);
        let dir = tempdir("flood");
        for flags in [&["--flood", PAST_THE_BOUND][..], &["--flood-endless"][..]] {
            let mut cfg = patient(stdio("f", &dir, flags));
            cfg.restart = Restart::OnFailure;
            let mcp = McpServer::connect(cfg).await.unwrap();
            let tools = mcp.tools();
            let (code, message) =
                code(call(tool(&tools, "f__flood"), json!({})).await.unwrap_err());
            assert_eq!(code, "mcp.message_too_large", "{flags:?}: {message}");
            assert!(message.contains("16777216 bytes"), "{message}");
            // Its connection ended with it; the next call starts the server again.
            let out = call(tool(&tools, "f__echo"), json!({"message": "again"}))
                .await
                .unwrap();
            assert_eq!(out.content.to_text(), "again");
            mcp.shutdown().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_http_answer_past_the_bound_fails_its_call_and_the_session_lives() {
        // A JSON answer's refusal names the bound. An event of a stream past it ends the stream,
        // which rmcp tells the call only as its end: a failed request.
        for (flags, want) in [
            (&["--flood", PAST_THE_BOUND][..], "mcp.message_too_large"),
            (&["--flood-endless"][..], "mcp.message_too_large"),
            (
                &["--flood-sse", "--flood", PAST_THE_BOUND][..],
                "mcp.request",
            ),
            (&["--flood-sse", "--flood-endless"][..], "mcp.request"),
        ] {
            let server = http(flags).await;
            let mcp = McpServer::connect(patient(ServerConfig::http("h", server.url.clone())))
                .await
                .unwrap();
            let tools = mcp.tools();
            let (code, message) =
                code(call(tool(&tools, "h__flood"), json!({})).await.unwrap_err());
            assert_eq!(code, want, "{flags:?}: {message}");
            // Under the default policy (`never`), a server taken for dead would be down for good.
            let out = call(tool(&tools, "h__echo"), json!({"message": "after"}))
                .await
                .unwrap();
            assert_eq!(out.content.to_text(), "after");
            mcp.shutdown().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_servers_result_that_names_a_secret_of_its_declaration_reaches_the_model_redacted() {
        // The token the entry's `env` hands the server, named in a result that is no error: in
        // its text, and as a value and a key of its structured content.
        let secret = std::env::var("CARGO_MANIFEST_DIR").unwrap();
        let dir = tempdir("reveal");
        let mut cfg = stdio("g", &dir, &["--refuse-env", "TOKEN"]);
        if let Transport::Stdio { env, .. } = &mut cfg.transport {
            env.insert("TOKEN".into(), "${CARGO_MANIFEST_DIR}".into());
        }
        let mcp = McpServer::connect(cfg).await.unwrap();
        let tools = mcp.tools();
        let out = call(tool(&tools, "g__reveal"), json!({})).await.unwrap();
        assert_eq!(out.content.to_text(), "your token is [redacted]");
        let out = call(tool(&tools, "g__reveal"), json!({"structured": true}))
            .await
            .unwrap();
        assert_eq!(
            out.content,
            agentloop::message::ToolContent::Json(json!({
                "token": "[redacted]",
                "[redacted]": "as a key",
            })),
        );
        assert!(!format!("{out:?}").contains(&secret));
        mcp.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_servers_error_that_echoes_a_secret_reaches_the_model_redacted() {
        let secret = std::env::var("CARGO_MANIFEST_DIR").unwrap();
        let dir = tempdir("refuse");
        let mut cfg = stdio("g", &dir, &["--refuse-env", "TOKEN"]);
        if let Transport::Stdio { env, .. } = &mut cfg.transport {
            env.insert("TOKEN".into(), "${CARGO_MANIFEST_DIR}".into());
        }
        let mcp = McpServer::connect(cfg).await.unwrap();
        let tools = mcp.tools();
        // A JSON-RPC error, and an `isError` result: both are the client's errors.
        for (name, want) in [("g__refuse", "mcp.error"), ("g__fail", "mcp.tool_error")] {
            let (code, message) = code(call(tool(&tools, name), json!({})).await.unwrap_err());
            assert_eq!(code, want, "{message}");
            assert!(message.contains("token"), "{message}");
            assert!(message.contains("[redacted]"), "{message}");
            assert!(!message.contains(&secret), "{message}");
        }
        mcp.shutdown().await;
    }
}
