#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Credentials stay where they belong: a provider's key is never sent to another host on a
//! redirect; the files a run writes (journal, sessions, response cache, trace) are readable by
//! their owner only; a credential inside a tool's arguments is redacted in a trace with payloads;
//! a provider's error that quotes the key (a 401's body, an error event in a stream) shows it
//! nowhere.

mod support;

use std::os::unix::fs::PermissionsExt;

use serde_json::json;
use support::*;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_key_is_never_sent_to_another_host_on_a_redirect() {
    let elsewhere = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_string("{}"))
        .mount(&elsewhere)
        .await;
    let provider = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(307)
                .insert_header("location", format!("{}/v1/messages", elsewhere.uri())),
        )
        .mount(&provider)
        .await;
    for agent in [
        anthropic_agent(&provider.uri(), "tool"),
        openai_agent(&provider.uri(), ""),
    ] {
        let dir = AgentDir::new(&agent);
        let out = run_agent_json(&dir.agent(), "hi").await;
        assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
        let v = stdout_json(&out);
        assert_eq!(v["stop_reason"], "failed", "{v}");
    }
    assert!(
        !provider.received_requests().await.unwrap().is_empty(),
        "the provider was asked"
    );
    let sent = elsewhere.received_requests().await.unwrap();
    assert!(
        sent.is_empty(),
        "a request followed the redirect to another host: {:?}",
        sent.iter().map(|r| &r.headers).collect::<Vec<_>>()
    );
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread")]
async fn the_files_a_run_writes_are_readable_by_their_owner_only_and_payloads_are_redacted() {
    let dir = AgentDir::new(
        r#"name = "private"
[model]
provider = "scripted"
script = "script.json"
cache = true
[[tools]]
name = "deploy"
command = ["python3", "tool.py"]
input_schema = { type = "object", properties = { command = { type = "string" } } }
"#,
    );
    let token = "ghp_0123456789abcdefghijABCDEFGHIJ";
    let command = format!("cd site && GH_PAT={token} ./publish --verbose");
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "d", "name": "deploy", "arguments": {"command": command}}]},
            {"text": format!("Deployed with key sk-proj-AbCdEfGhIjKlMnOpQrSt{}", "uvwx")}
        ])
        .to_string(),
    );
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();
    let (out, journal, trace) = recorded_run(&dir, agent, "deploy").await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (sessions, sqlite_trace) = (dir.path("s.db"), dir.path("t.sqlite"));
    let out = agentloop(args(&[
        "run",
        agent,
        "--input",
        "deploy",
        "--json",
        "--session",
        "one",
        "--sessions",
        sessions.to_str().unwrap(),
        "--trace",
        sqlite_trace.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for path in [
        &journal,
        &trace,
        &sessions,
        &sqlite_trace,
        &dir.path("responses.db"),
    ] {
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }
    let recorded = std::fs::read_to_string(&trace).unwrap();
    assert!(recorded.contains("./publish"), "{recorded}");
    assert!(!recorded.contains(token), "{recorded}");
    assert!(!recorded.contains("sk-proj-"), "{recorded}");
}

/// The credentials the URLs of these tests carry, each distinctive: none may be found in what a
/// run prints or writes.
const URL_PASSWORD: &str = "LEAKPASS-5150";
const URL_QUERY_KEY: &str = "LEAKQUERY-8086";

/// A URL at `uri` with a user and password and a key in its query.
fn credentialed(uri: &str, path: &str) -> String {
    let host = uri.strip_prefix("http://").unwrap();
    format!("http://leakuser:{URL_PASSWORD}@{host}{path}?key={URL_QUERY_KEY}")
}

/// A server that refuses every request with 401 and quotes it whole in its error message, as
/// some gateways do: its URL (query and all) and its headers (the key).
struct Echo401;

impl wiremock::Respond for Echo401 {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let headers: Vec<String> = request
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or_default()))
            .collect();
        let message = format!(
            "Incorrect API key provided: {} sent to {}",
            headers.join("; "),
            request.url
        );
        ResponseTemplate::new(401).set_body_json(json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "code": "invalid_api_key",
            "param": request.url.to_string(),
        }}))
    }
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [TEST_KEY, URL_PASSWORD, URL_QUERY_KEY] {
        assert!(!text.contains(secret), "{what} holds {secret}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_401_that_echoes_the_base_urls_key_reaches_no_error_or_record() {
    let provider = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(Echo401)
        .mount(&provider)
        .await;
    let dir = AgentDir::new(&openai_agent(&provider.uri(), "stream = false"));
    let agent = std::fs::read_to_string(dir.agent()).unwrap().replace(
        &format!("base_url = \"{}/v1\"", provider.uri()),
        &format!("base_url = \"{}\"", credentialed(&provider.uri(), "/v1")),
    );
    dir.write("agent.toml", &agent);
    let (out, journal, trace) = recorded_run(&dir, dir.agent().to_str().unwrap(), "hi").await;
    let v = stdout_json(&out);
    assert_eq!(v["error"]["code"], "model.authentication", "{v}");
    // The server did quote them: the message says so, with the credentials cut out.
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("key=[redacted]"), "{message}");
    assert!(message.contains("Bearer [redacted]"), "{message}");
    assert_no_secret("stdout", &stdout(&out));
    assert_no_secret("stderr", &stderr(&out));
    assert_no_secret("the trace", &std::fs::read_to_string(&trace).unwrap());
    assert_no_secret("the journal", &journal_text(&journal));
}

/// A server that refuses every request with 400 and quotes its `Authorization` header in the
/// body, as a gateway's "bad credentials" page may.
struct EchoAuthorization;

impl wiremock::Respond for EchoAuthorization {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let auth = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("(none)");
        ResponseTemplate::new(400).set_body_json(json!({"error": {
            "message": format!("cannot use Authorization: {auth}"),
            "type": "invalid_request_error",
        }}))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_basic_credentials_made_of_a_base_urls_user_info_are_not_shown_when_echoed() {
    let provider = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(EchoAuthorization)
        .mount(&provider)
        .await;
    // No `api_key_env`: a compatible server gets no key, so the client sends the user info as
    // `Authorization: Basic base64(user:password)`.
    let agent = openai_agent(&provider.uri(), "stream = false")
        .replace("api_key_env = \"AGENTLOOP_TEST_KEY\"\n", "")
        .replace(
            &format!("base_url = \"{}/v1\"", provider.uri()),
            &format!("base_url = \"{}\"", credentialed(&provider.uri(), "/v1")),
        );
    let dir = AgentDir::new(&agent);
    let (out, journal, trace) = recorded_run(&dir, dir.agent().to_str().unwrap(), "hi").await;
    // base64("leakuser:LEAKPASS-5150"): the server's log below shows it is what was sent.
    let basic = "bGVha3VzZXI6TEVBS1BBU1MtNTE1MA==";
    let sent: Vec<String> = provider
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter_map(|r| {
            r.headers
                .get("authorization")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .collect();
    assert!(
        sent.iter().any(|h| *h == format!("Basic {basic}")),
        "the client sent the user info as Basic credentials: {sent:?}"
    );
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "failed", "{v}");
    // The server did quote them: the message says so, with the credentials cut out.
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("Basic [redacted]"), "{message}");
    let unpadded = basic.trim_end_matches('=');
    for (what, text) in [
        ("stdout", stdout(&out)),
        ("stderr", stderr(&out)),
        ("the trace", std::fs::read_to_string(&trace).unwrap()),
        ("the journal", journal_text(&journal)),
    ] {
        assert_no_secret(what, &text);
        assert!(!text.contains(unpadded), "{what} holds {unpadded}: {text}");
    }
}

/// A server that answers every request with a 200 event stream in the dialect of `api` (`chat`,
/// `anthropic`, `responses`) whose error event quotes the request's headers, the key among them:
/// what a gateway relaying its upstream's failure into the stream may send.
struct EchoInStream(&'static str);

impl wiremock::Respond for EchoInStream {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let headers: Vec<String> = request
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or_default()))
            .collect();
        let message = format!("Incorrect API key provided: {}", headers.join("; "));
        let events = match self.0 {
            "chat" => vec![
                json!({"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}}]}),
                json!({"error": {"message": message, "type": "invalid_request_error",
                    "code": "invalid_api_key"}}),
            ],
            "anthropic" => vec![
                json!({"type": "message_start", "message": {"id": "m"}}),
                json!({"type": "error", "error": {"type": "authentication_error",
                    "message": message}}),
            ],
            _ => vec![json!({"type": "error", "code": "invalid_api_key", "message": message})],
        };
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_event_that_echoes_the_key_in_a_stream_reaches_no_error_or_record() {
    for api in ["chat", "anthropic", "responses"] {
        let provider = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(EchoInStream(api))
            .mount(&provider)
            .await;
        let agent = match api {
            "chat" => openai_agent(&provider.uri(), ""),
            "anthropic" => anthropic_agent(&provider.uri(), "tool"),
            _ => openai_agent(&provider.uri(), "")
                .replace("provider = \"openai\"", "provider = \"openai-responses\""),
        };
        let dir = AgentDir::new(&agent);
        let (out, journal, trace) = recorded_run(&dir, dir.agent().to_str().unwrap(), "hi").await;
        let v = stdout_json(&out);
        assert_eq!(v["stop_reason"], "failed", "{api}: {v}");
        // The server did quote the key: the message says so, with the key cut out.
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("[redacted]"), "{api}: {message}");
        assert_no_secret(api, &stdout(&out));
        assert_no_secret(api, &stderr(&out));
        assert_no_secret(api, &std::fs::read_to_string(&trace).unwrap());
        assert_no_secret(api, &journal_text(&journal));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_dry_run_and_the_journal_show_urls_without_their_credentials() {
    let provider = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(Replies {
            bodies: vec![completion(json!({"role": "assistant", "content": "done"}))],
            next: Default::default(),
        })
        .mount(&provider)
        .await;
    let mcp = credentialed(&provider.uri(), "/mcp");
    let dir = AgentDir::new(&format!(
        r#"name = "urls"
[model]
provider = "openai"
name = "gpt-4o"
base_url = "{}"
api_key_env = "AGENTLOOP_TEST_KEY"
stream = false
[[mcp]]
name = "tracker"
url = "{mcp}"
"#,
        credentialed(&provider.uri(), "/v1")
    ));
    let plain = AgentDir::new(&format!(
        r#"name = "urls"
[model]
provider = "openai"
name = "gpt-4o"
base_url = "{}"
api_key_env = "AGENTLOOP_TEST_KEY"
stream = false
"#,
        credentialed(&provider.uri(), "/v1")
    ));
    let (agent, plain_agent) = (dir.agent(), plain.agent());
    let (agent, plain_agent) = (agent.to_str().unwrap(), plain_agent.to_str().unwrap());
    for command in [
        vec!["plan", agent, "--json"],
        vec!["plan", agent],
        vec!["run", plain_agent, "--input", "hi", "--dry-run"],
    ] {
        let out = agentloop(args(&command)).await;
        assert_eq!(out.status.code(), Some(0), "{command:?}: {}", stderr(&out));
        assert!(stdout(&out).contains("[redacted]"), "{}", stdout(&out));
        assert_no_secret(&format!("{command:?}"), &stdout(&out));
        assert_no_secret(&format!("{command:?}"), &stderr(&out));
    }
    // A journaled run keeps the agent's definition: the servers, not their credentials.
    let journal = dir.path("run.db");
    let out = agentloop(args(&[
        "run",
        plain_agent,
        "--input",
        "hi",
        "--json",
        "--journal",
        journal.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let written = journal_text(&journal);
    assert!(written.contains("key=[redacted]"), "the definition is kept");
    assert_no_secret("the journal", &written);
}

/// What a journal holds on disk, its write-ahead log included: a process that ended before
/// SQLite moved the log into the file leaves its last steps there (they are the journal's all
/// the same, and must hold no secret either).
fn journal_text(journal: &std::path::Path) -> String {
    let mut bytes = std::fs::read(journal).unwrap();
    let mut wal = journal.as_os_str().to_owned();
    wal.push("-wal");
    if let Ok(log) = std::fs::read(&wal) {
        bytes.extend_from_slice(&log);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An agent whose tool `remote` is the A2A agent at `uri`'s `/a2a`, by a URL with credentials;
/// its model's script is to be written.
fn a2a_caller(uri: &str) -> AgentDir {
    AgentDir::new(&format!(
        r#"name = "caller"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "remote"
a2a = "{}"
"#,
        credentialed(uri, "/a2a")
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_remote_a2a_agents_url_token_reaches_neither_its_error_nor_the_models_tools() {
    let remote = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(Echo401)
        .mount(&remote)
        .await;
    let dir = a2a_caller(&remote.uri());
    dir.write("script.json", r#"[{"text": "done"}]"#);
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();
    let out = agentloop(args(&["run", agent, "--input", "hi", "--json"])).await;
    let v = stdout_json(&out);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("a2a.card"),
        "{v}"
    );
    assert_no_secret("the error", &stdout(&out));
    assert_no_secret("stderr", &stderr(&out));
    // The description the model would read names the agent by its URL without the token.
    let out = agentloop(args(&["plan", agent, "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("key=[redacted]"), "{}", stdout(&out));
    assert_no_secret("plan", &stdout(&out));
}

/// A remote A2A agent whose card is good and whose every JSON-RPC answer quotes the request's
/// URL, with the key in its query, and its `Authorization` (the URL's user info): the first as
/// an error, the next as the agent's answer, as a gateway or a careless agent may.
struct EchoingA2a {
    /// The mock server's own address (a request's URL names `localhost`, without the port).
    uri: String,
    answers: std::sync::atomic::AtomicUsize,
}

impl wiremock::Respond for EchoingA2a {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        if request.method == wiremock::http::Method::GET {
            return ResponseTemplate::new(200).set_body_json(json!({
                "name": "remote",
                "supportedInterfaces": [{"url": format!("{}/a2a", self.uri), "protocolBinding": "JSONRPC"}],
            }));
        }
        let auth = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("(none)");
        let quoted = format!("{} with Authorization: {auth}", request.url);
        let n = self
            .answers
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ResponseTemplate::new(200).set_body_json(if n == 0 {
            json!({"jsonrpc": "2.0", "id": "1", "error": {"code": -32001,
                "message": format!("refused {quoted}")}})
        } else {
            json!({"jsonrpc": "2.0", "id": "2", "result": {"message": {"messageId": "m",
                "role": "ROLE_AGENT", "parts": [{"text": format!("you called {quoted}")}]}}})
        })
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_remote_a2a_agent_that_echoes_its_urls_credentials_shows_them_to_nobody() {
    let remote = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(EchoingA2a {
            uri: remote.uri(),
            answers: Default::default(),
        })
        .mount(&remote)
        .await;
    let dir = a2a_caller(&remote.uri());
    let call = |id: &str| json!({"tool_calls": [{"id": id, "name": "remote", "arguments": {"task": "hi"}}]});
    dir.write(
        "script.json",
        &json!([call("c1"), call("c2"), {"text": "done"}]).to_string(),
    );
    let (out, journal, trace) = recorded_run(&dir, dir.agent().to_str().unwrap(), "hi").await;
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    // The remote did quote them (the calls reached it with the credentials, and it answered).
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["error"]["code"], "a2a.remote_error", "{v}");
    assert!(
        calls[1]["output"]
            .as_str()
            .unwrap()
            .contains("key=[redacted]"),
        "{v}"
    );
    assert_no_secret("stdout", &stdout(&out));
    assert_no_secret("stderr", &stderr(&out));
    assert_no_secret("the trace", &std::fs::read_to_string(&trace).unwrap());
    assert_no_secret("the journal", &journal_text(&journal));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_servers_url_token_reaches_no_error_when_it_cannot_be_reached() {
    let url = credentialed(&format!("http://127.0.0.1:{}", closed_port()), "/mcp");
    let dir = AgentDir::new(&format!(
        r#"name = "caller"
[model]
provider = "scripted"
script = "script.json"
[[mcp]]
name = "tracker"
url = "{url}"
timeout_secs = 10
"#
    ));
    dir.write("script.json", r#"[{"text": "done"}]"#);
    let agent = dir.agent();
    let agent = agent.to_str().unwrap();
    for command in [
        vec!["run", agent, "--input", "hi", "--json"],
        vec!["mcp", "list", agent],
    ] {
        let out = agentloop(args(&command)).await;
        assert_ne!(out.status.code(), Some(0), "{command:?}: {}", stdout(&out));
        let shown = format!("{}{}", stdout(&out), stderr(&out));
        assert!(shown.contains("mcp.start"), "{command:?}: {shown}");
        assert_no_secret(&format!("{command:?}"), &shown);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restate_ingress_url_token_reaches_no_error_the_cli_prints() {
    // An ingress that refuses and quotes the request (query and all), and one nothing answers.
    let ingress = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(Echo401)
        .mount(&ingress)
        .await;
    let closed = format!("http://127.0.0.1:{}", closed_port());
    for uri in [ingress.uri(), closed] {
        let url = credentialed(&uri, "/");
        let out = agentloop(args(&[
            "approvals",
            "list",
            "--restate",
            &url,
            "--run",
            "run-1",
        ]))
        .await;
        assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
        let err = stderr(&out);
        assert!(err.contains("Restate ingress"), "{err}");
        assert!(
            err.contains("key=[redacted]"),
            "the ingress is named: {err}"
        );
        assert!(
            err.contains("carries credentials in the command line"),
            "a URL with credentials in the arguments is warned of: {err}"
        );
        assert_no_secret("stderr", &err);
        // The same ingress from the variable, `--restate` given without a URL: no warning, and
        // that ingress is the one asked.
        let url: &'static str = Box::leak(url.into_boxed_str());
        let out = agentloop_env(
            args(&["approvals", "list", "--restate", "--run", "run-1"]),
            vec![("AGENTLOOP_RESTATE", url)],
        )
        .await;
        assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
        let err = stderr(&out);
        assert!(err.contains("key=[redacted]"), "{err}");
        assert!(!err.contains("carries credentials"), "{err}");
        assert_no_secret("stderr", &err);
    }
}

/// `agentloop run AGENT --input INPUT --json`, journaled (`run.db`) and traced with payloads
/// (`run.ndjson`) in `dir`: every place a secret could be written. The output, and the two paths.
async fn recorded_run(
    dir: &AgentDir,
    agent: &str,
    input: &str,
) -> (std::process::Output, std::path::PathBuf, std::path::PathBuf) {
    let (journal, trace) = (dir.path("run.db"), dir.path("run.ndjson"));
    let out = agentloop(args(&[
        "run",
        agent,
        "--input",
        input,
        "--json",
        "--journal",
        journal.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--trace-payloads",
    ]))
    .await;
    (out, journal, trace)
}
