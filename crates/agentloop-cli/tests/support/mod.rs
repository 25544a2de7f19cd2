//! A fake provider on loopback that serves recorded responses turn by turn and records every
//! request, and helpers to write agent files and run the `agentloop` binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub(crate) mod crash;
pub(crate) mod fat;
pub(crate) mod questions;
pub(crate) mod restate;

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// The recorded provider responses (the providers crate's fixture corpus).
pub(crate) const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../agentloop-providers/tests/fixtures"
);

/// The repository's root.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Copies a folder whole (an example, so that its runs write nothing in the repository).
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The API key the tests put in the environment.
pub(crate) const TEST_KEY: &str = "sk-test-secret-4711";

/// One recorded response: its HTTP status and fixture file.
pub(crate) struct Turn {
    pub status: u16,
    pub file: &'static str,
}

pub(crate) fn ok(file: &'static str) -> Turn {
    Turn { status: 200, file }
}

pub(crate) fn status(status: u16, file: &'static str) -> Turn {
    Turn { status, file }
}

/// Serves the turns in order; a request past the last gets a 500 naming the overrun.
struct Sequence {
    turns: Vec<(u16, String, Vec<u8>)>,
    next: Arc<AtomicUsize>,
}

impl Respond for Sequence {
    fn respond(&self, _request: &Request) -> ResponseTemplate {
        let at = self.next.fetch_add(1, Ordering::SeqCst);
        match self.turns.get(at) {
            Some((status, content_type, body)) => {
                ResponseTemplate::new(*status).insert_header("content-type", content_type.as_str()).set_body_bytes(body.clone())
            }
            None => ResponseTemplate::new(500)
                .insert_header("content-type", "application/json")
                .set_body_string(r#"{"error":{"message":"the fake provider has no more recorded turns","type":"server_error"}}"#),
        }
    }
}

/// A fake provider at `uri()`.
pub(crate) struct FakeProvider {
    pub server: MockServer,
}

impl FakeProvider {
    /// Serves `turns` at `route` (`/v1/chat/completions`, `/v1/messages`, `/v1/responses`).
    pub(crate) async fn start(route: &str, turns: Vec<Turn>) -> FakeProvider {
        let server = MockServer::start().await;
        let turns = turns
            .into_iter()
            .map(|t| {
                let body = std::fs::read(Path::new(FIXTURES).join(t.file))
                    .unwrap_or_else(|e| panic!("fixture {}: {e}", t.file));
                let content_type = if t.file.ends_with(".sse") {
                    "text/event-stream"
                } else {
                    "application/json"
                };
                (t.status, content_type.to_owned(), body)
            })
            .collect();
        Mock::given(method("POST"))
            .and(path(route))
            .respond_with(Sequence {
                turns,
                next: Arc::new(AtomicUsize::new(0)),
            })
            .mount(&server)
            .await;
        FakeProvider { server }
    }

    pub(crate) fn uri(&self) -> String {
        self.server.uri()
    }

    /// Every request received, in order.
    pub(crate) async fn requests(&self) -> Vec<Request> {
        self.server.received_requests().await.unwrap_or_default()
    }

    /// The JSON bodies received, in order.
    pub(crate) async fn bodies(&self) -> Vec<Value> {
        self.requests()
            .await
            .iter()
            .map(|r| serde_json::from_slice(&r.body).unwrap())
            .collect()
    }
}

/// A directory holding an agent file and its tools.
pub(crate) struct AgentDir {
    pub dir: tempfile::TempDir,
}

/// A python tool that logs its stdin (one JSON document per line) and its environment's variable
/// names, then prints a fixed answer or fails with a message on stderr.
pub(crate) const LOGGING_TOOL: &str = r#"
import json, os, sys
data = sys.stdin.read()
with open("stdin.log", "a") as f:
    f.write(data + "\n")
with open("env.log", "w") as f:
    f.write("\n".join(f"{k}={v}" for k, v in sorted(os.environ.items())))
args = json.loads(data)
if args.get("fail"):
    print("  the tool failed: " + str(args["fail"]) + "  ", file=sys.stderr)
    sys.exit(3)
print("18 degrees and sunny")
"#;

impl AgentDir {
    pub(crate) fn new(agent_toml: &str) -> AgentDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("agent.toml"), agent_toml).unwrap();
        std::fs::write(dir.path().join("tool.py"), LOGGING_TOOL).unwrap();
        AgentDir { dir }
    }

    /// As [`AgentDir::new`], in a folder made inside `parent` (a file system of a test's own).
    pub(crate) fn new_in(parent: &Path, agent_toml: &str) -> AgentDir {
        let dir = tempfile::tempdir_in(parent).unwrap();
        std::fs::write(dir.path().join("agent.toml"), agent_toml).unwrap();
        std::fs::write(dir.path().join("tool.py"), LOGGING_TOOL).unwrap();
        AgentDir { dir }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The names in the folder, sorted.
    pub(crate) fn file_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path("."))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    pub(crate) fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path(name), text).unwrap();
    }

    pub(crate) fn agent(&self) -> PathBuf {
        self.path("agent.toml")
    }

    /// The JSON documents the tool read on stdin, in order.
    pub(crate) fn tool_inputs(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("stdin.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub(crate) fn tool_env(&self) -> String {
        std::fs::read_to_string(self.path("env.log")).unwrap_or_default()
    }
}

/// A scripted agent named `name` whose one tool, `get_weather`, is the logging tool
/// ([`LOGGING_TOOL`]), and whose model answers `script` (the text of its `script.json`).
pub(crate) fn scripted_weather(name: &str, script: &str) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "{name}"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "get_weather"
command = ["python3", "tool.py"]
"#
    ));
    dir.write("script.json", script);
    dir
}

/// A Chat Completions fake that calls `get_weather` once (Mexico City), then answers.
pub(crate) async fn one_call_then_text() -> FakeProvider {
    FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_s_single_tool_usage.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await
}

/// Runs `agentloop` with args, the test key set in `AGENTLOOP_TEST_KEY` and `OPENAI_API_KEY`,
/// off the async runtime.
pub(crate) async fn agentloop(args: Vec<String>) -> Output {
    agentloop_env(
        args,
        vec![
            ("AGENTLOOP_TEST_KEY", TEST_KEY),
            ("OPENAI_API_KEY", TEST_KEY),
        ],
    )
    .await
}

/// Runs `agentloop` with args and these environment variables.
pub(crate) async fn agentloop_env(
    args: Vec<String>,
    env: Vec<(&'static str, &'static str)>,
) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"));
        cmd.args(&args)
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("AGENTLOOP_TEST_KEY")
            // The log's filter is the test's to set: a developer's own does not change stderr.
            .env_remove("AGENTLOOP_LOG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(std::process::Stdio::null());
        cmd.output().unwrap()
    })
    .await
    .unwrap()
}

pub(crate) fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// `agentloop run AGENT --input INPUT --json` (with the test key), whatever its exit code.
pub(crate) async fn run_agent_json(agent: &Path, input: &str) -> Output {
    run_agent_json_with(agent, input, &[]).await
}

/// `agentloop run AGENT --input INPUT --json` and `extra` (with the test key), whatever its exit
/// code.
pub(crate) async fn run_agent_json_with(agent: &Path, input: &str, extra: &[&str]) -> Output {
    let mut a = vec!["--json"];
    a.extend_from_slice(extra);
    run_agent_with(agent, input, &a).await
}

/// `agentloop run AGENT --input INPUT` and `extra` (with the test key), whatever its exit code:
/// without `--json`, what a person sees on stderr.
pub(crate) async fn run_agent_with(agent: &Path, input: &str, extra: &[&str]) -> Output {
    let mut a = vec!["run", agent.to_str().unwrap(), "--input", input];
    a.extend_from_slice(extra);
    agentloop(args(&a)).await
}

/// `agentloop run AGENT --input INPUT --json`, which must exit 0 and finish: the output and its
/// JSON object.
pub(crate) async fn run_finished(agent: &Path, input: &str) -> (Output, Value) {
    let out = run_agent_json(agent, input).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    (out, v)
}

pub(crate) fn stdout_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An OpenAI agent at the fake provider with one logging tool, `get_weather`; `extra` goes at the
/// end of `[model]` (and may open tables of its own).
pub(crate) fn openai_agent(uri: &str, extra: &str) -> String {
    format!(
        r#"name = "weather"
instructions = "You answer weather questions."

[model]
provider = "openai"
name = "gpt-4o"
base_url = "{uri}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
temperature = 0
seed = 7
{extra}
[[tools]]
name = "get_weather"
description = "The weather of a city."
command = ["python3", "tool.py"]
input_schema = {{ type = "object", properties = {{ city = {{ type = "string" }}, fail = {{ type = "string" }} }} }}
"#
    )
}

/// An Anthropic agent at the fake provider with one logging tool named `tool`.
pub(crate) fn anthropic_agent(uri: &str, tool: &str) -> String {
    format!(
        r#"name = "a"
[model]
provider = "anthropic"
name = "claude-sonnet-4-5"
base_url = "{uri}"
api_key_env = "AGENTLOOP_TEST_KEY"
max_tokens = 512
[[tools]]
name = "{tool}"
command = ["python3", "tool.py"]
"#
    )
}

/// Runs `agentloop chat AGENT` with `input` on stdin and the test key set, off the async runtime.
pub(crate) async fn chat(agent: PathBuf, input: &'static str) -> Output {
    tokio::task::spawn_blocking(move || {
        assert_cmd::Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["chat", agent.to_str().unwrap()])
            .env("AGENTLOOP_TEST_KEY", TEST_KEY)
            .write_stdin(input)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The folder the MCP test servers and clients are installed in by `scripts/mcp/install.sh`
/// (once per test process): `node_modules/.bin/` and `venv/bin/` hold their commands.
pub(crate) fn mcp_installed() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let out = std::process::Command::new(repo().join("scripts/mcp/install.sh"))
            .stderr(std::process::Stdio::inherit())
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

/// The folder `scripts/a2a/install.sh` installed the official A2A SDK in (once per test
/// process): `venv/bin/python` has it.
pub(crate) fn a2a_installed() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let out = std::process::Command::new(repo().join("scripts/a2a/install.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("cannot run scripts/a2a/install.sh (it needs bash and python3)");
        assert!(out.status.success(), "scripts/a2a/install.sh failed");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// Drives a command in a pseudo-terminal: waits for each prompt text, then types its line; reads
/// the rest to the end; prints everything the terminal showed and exits with the command's code.
pub(crate) const PTY_DRIVER: &str = r#"
import os, pty, select, sys
steps = sys.argv[1].split("\x1f")
argv = sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
seen = b""
def more():
    global seen
    r, _, _ = select.select([fd], [], [], 120)
    if not r:
        raise SystemExit("the terminal went quiet; it showed: %r" % seen)
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        chunk = b""
    seen += chunk
    return bool(chunk)
at = 0
for i in range(0, len(steps) - 1, 2):
    prompt, line = steps[i].encode(), steps[i + 1].encode()
    while prompt not in seen[at:]:
        if not more():
            raise SystemExit("the command ended before %r; it showed: %r" % (prompt, seen))
    at = seen.index(prompt, at) + len(prompt)
    os.write(fd, line + b"\n")
while more():
    pass
_, status = os.waitpid(pid, 0)
sys.stdout.write(seen.decode("utf-8", "replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;

/// Runs `agentloop ARGS` in the agent's folder in a pseudo-terminal (python's `pty`, stdin and
/// stderr a terminal, so approvals are asked there): types each `steps` pair's line once its
/// prompt text shows ([`PTY_DRIVER`]). Its stdout is all the terminal showed.
pub(crate) fn in_terminal(dir: &AgentDir, steps: &[&str], args: &[&str]) -> std::process::Output {
    dir.write("pty_driver.py", PTY_DRIVER);
    std::process::Command::new("python3")
        .arg(dir.path("pty_driver.py"))
        .arg(steps.join("\u{1f}"))
        .arg(bin())
        .args(args)
        .current_dir(dir.path("."))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// The `agentloop` binary.
pub(crate) fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_agentloop")
}

/// A forecaster: it calls its `forecast` command tool for Paris and answers JSON that its output
/// schema describes. `slow` starts, writes `started`, and would write `finished` after 8 s.
pub(crate) fn forecaster(permissions: &str) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "forecaster"
description = "Forecasts the weather of a city."
output_schema = {{ type = "object", properties = {{ forecast = {{ type = "string" }} }}, required = ["forecast"] }}

[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "forecast"
description = "The forecast of a city."
command = ["python3", "tool.py"]
input_schema = {{ type = "object", properties = {{ city = {{ type = "string" }} }}, required = ["city"] }}

[[tools]]
name = "slow"
description = "Takes its time."
command = ["python3", "slow.py"]
timeout_secs = 60
{permissions}"#
    ));
    dir.write(
        "script.json",
        &serde_json::json!([
            {"tool_calls": [{"id": "c1", "name": "forecast", "arguments": {"city": "Paris"}}]},
            {"text": "{\"forecast\": \"18 degrees and sunny\"}"}
        ])
        .to_string(),
    );
    dir.write(
        "slow.py",
        "import time\nopen('started', 'w').close()\ntime.sleep(8)\nopen('finished', 'w').close()\n",
    );
    dir
}

/// A scripted agent whose one step calls `slow`.
pub(crate) fn slow_script(dir: &AgentDir) {
    dir.write(
        "script.json",
        &serde_json::json!([
            {"tool_calls": [{"id": "s1", "name": "slow", "arguments": {}}]},
            {"text": "{\"forecast\": \"late\"}"}
        ])
        .to_string(),
    );
}

/// `agentloop mcp serve ... --http 127.0.0.1:0` or `agentloop a2a serve ... --addr 127.0.0.1:0`,
/// its URL read from its stderr, stopped when dropped.
pub(crate) struct HttpServer {
    child: std::process::Child,
    pub url: String,
}

impl HttpServer {
    pub(crate) fn start(protocol: &str, args: &[&str]) -> HttpServer {
        HttpServer::start_at(protocol, "127.0.0.1:0", args)
    }

    /// [`HttpServer::start`] at `at` (`127.0.0.1:PORT`): a server started again where its
    /// clients know it.
    pub(crate) fn start_at(protocol: &str, at: &str, args: &[&str]) -> HttpServer {
        let addr = if protocol == "mcp" {
            "--http"
        } else {
            "--addr"
        };
        let mut child = std::process::Command::new(bin())
            .args([protocol, "serve", addr, at])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the server ended before it printed its address")
                .unwrap();
            if let Some(at) = line.find("http://") {
                break line[at..].trim().to_owned();
            }
        };
        // Keep reading its stderr so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        HttpServer { child, url }
    }

    /// [`HttpServer::terminate`] once `path` exists (at most 30 s): a stop while a run is at a
    /// point that says so. The stop takes less than its 10 s grace.
    pub(crate) fn terminate_once_exists(self, path: &Path) {
        for _ in 0..300 {
            if path.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(path.exists(), "{} never appeared", path.display());
        let stop = std::time::Instant::now();
        self.terminate();
        let took = stop.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }

    /// Stops it as a service manager would (SIGTERM), and waits for it to end: it must end as
    /// a stop ends it, exit 0, however soon after its start the signal came (never killed by
    /// the signal itself, which would leave what it started unstopped).
    pub(crate) fn terminate(mut self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let ended = self.child.wait().unwrap();
        assert_eq!(
            ended.code(),
            Some(0),
            "the server did not stop as a stop ends it: {ended}"
        );
    }
}

/// The status code of one HTTP/1.1 request to `url` (`http://HOST:PORT/PATH`) sent as a web
/// page or a rebound name would send it: its own `Host`, and the `Content-Type` given.
pub(crate) fn http_status(
    url: &str,
    method: &str,
    host: &str,
    content_type: Option<&str>,
    body: &str,
) -> u16 {
    http_answer(url, method, host, content_type, body).0
}

/// [`http_status`], with the answer's body.
pub(crate) fn http_answer(
    url: &str,
    method: &str,
    host: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, String) {
    let headers: Vec<(&str, &str)> = content_type
        .map(|t| ("Content-Type", t))
        .into_iter()
        .collect();
    http_request(url, method, host, &headers, body)
}

/// One HTTP/1.1 request to `url` with its own `Host` and these headers: the answer's status and
/// body.
pub(crate) fn http_request(
    url: &str,
    method: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use std::io::Read;
    let mut stream = send_request(url, method, host, headers, body);
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = status_of(&answer);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The status code of an HTTP/1.1 answer's status line.
fn status_of(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// One HTTP/1.1 request on a fresh connection, written; the connection, to read the answer from.
fn send_request(
    url: &str,
    method: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::net::TcpStream {
    use std::io::Write;
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let mut request = format!(
        "{method} /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// [`http_request`], reading only the answer's head (an event stream may stay open after it):
/// its status and the value of each header, names in lower case.
pub(crate) fn http_head(
    url: &str,
    method: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>) {
    use std::io::Read;
    let mut stream = send_request(url, method, host, headers, body);
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let head = loop {
        let n = stream.read(&mut buf).unwrap();
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, _)) = text.split_once("\r\n\r\n") {
            break head.to_owned();
        }
        assert!(n > 0, "the answer ended before its head did: {text:?}");
    };
    let status = status_of(&head);
    let fields = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    (status, fields)
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a Python client script of the project (`scripts/...`) with `python` and `args`, off the
/// async runtime; it must succeed and print a JSON list: what each of its steps saw.
pub(crate) async fn python_client_steps(
    python: PathBuf,
    script: &str,
    args: Vec<String>,
) -> Vec<Value> {
    let script = repo().join(script);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the client failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Serves OpenAI chat completions (not streamed), the JSON bodies in order; a request past the
/// last gets a 500.
pub(crate) struct Replies {
    pub bodies: Vec<Value>,
    pub next: Arc<AtomicUsize>,
}

impl Respond for Replies {
    fn respond(&self, _request: &Request) -> ResponseTemplate {
        let at = self.next.fetch_add(1, Ordering::SeqCst);
        match self.bodies.get(at) {
            Some(body) => ResponseTemplate::new(200).set_body_json(body),
            None => ResponseTemplate::new(500).set_body_string("no more replies"),
        }
    }
}

/// A chat completion answering with `message`.
pub(crate) fn completion(message: Value) -> Value {
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    serde_json::json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// One tool call of a chat completion's message.
pub(crate) fn chat_call(id: &str, name: &str, arguments: Value) -> Value {
    serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
}

/// The agent file's `sandbox` values this machine runs a tool under: `off`, and
/// `workspace-write` where the sandbox has all it needs.
pub(crate) fn sandbox_modes_here() -> Vec<&'static str> {
    let mut modes = vec!["off"];
    if agentloop_sandbox::Support::missing(agentloop_sandbox::SandboxPolicy::new(
        agentloop_sandbox::SandboxMode::WorkspaceWrite,
    ))
    .is_empty()
    {
        modes.push("workspace-write");
    }
    modes
}

/// Every live process (not a zombie) whose process group is one of `groups`, as `pid (name)`.
pub(crate) fn live_in_groups(groups: &[&str]) -> Vec<String> {
    let mut live = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && groups.contains(&fields[2]) {
            live.push(stat[..=close].to_owned());
        }
    }
    live
}
