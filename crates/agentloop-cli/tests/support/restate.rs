//! A Restate server of a test's own (`scripts/restate/`, started on loopback with a fresh data
//! dir) and worker processes of `agentloop serve` against it.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::crash::cli;
use super::{AgentDir, repo, stderr, stdout_json};

/// A Restate server of the test's own, stopped (by PID) when dropped.
pub(crate) struct Server {
    dir: tempfile::TempDir,
    pub ingress: String,
    pub admin: String,
}

pub(crate) fn restate_script(name: &str) -> PathBuf {
    repo().join("scripts/restate").join(name)
}

impl Server {
    pub(crate) fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server with these variables for `start.sh`.
    pub(crate) fn start_with(env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(restate_script("start.sh"))
            .arg(dir.path())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the Restate server did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("start.sh printed no {key}: {text}"))
                .to_owned()
        };
        Server {
            ingress: field("ingress"),
            admin: field("admin"),
            dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(restate_script("stop.sh"))
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .output();
    }
}

/// A worker process (`agentloop serve`), killed with SIGKILL when dropped, and what it writes on
/// stderr after it started.
pub(crate) struct Worker(pub Child, pub std::sync::mpsc::Receiver<String>);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Starts a worker at `addr`, registered with the server when `register`; `crash_after` makes it
/// stop a run right after that step is journaled (it says so on stderr) for the test to kill it.
pub(crate) fn worker(
    dir: &AgentDir,
    server: &Server,
    addr: SocketAddr,
    register: bool,
    crash_after: Option<u64>,
) -> Worker {
    worker_with(dir, server, addr, register, crash_after, &[], &[])
}

/// [`worker`] with more arguments for `serve`, and these environment variables (a test fault).
pub(crate) fn worker_with(
    dir: &AgentDir,
    server: &Server,
    addr: SocketAddr,
    register: bool,
    crash_after: Option<u64>,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Worker {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args(["serve", dir.agent().to_str().unwrap()])
        .args(extra)
        .envs(env.iter().copied())
        .args(["--restate-endpoint", &addr.to_string()])
        .args(["--restate", &server.ingress])
        .current_dir(dir.path("."))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if register {
        cmd.args(["--register", &server.admin]);
    }
    if let Some(n) = crash_after {
        cmd.env("AGENTLOOP_TEST_RESTATE_CRASH_AFTER_STEP", n.to_string());
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    // Its stderr is read to the end, so that it never blocks on a full pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    if register {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with("registered ") => break,
                Ok(_) => {}
                Err(e) => panic!("the worker did not register: {e}"),
            }
        }
    } else {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "the worker does not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Worker(child, rx)
}

pub(crate) fn submit(dir: &AgentDir, server: &Server, session: &str, extra: &[&str]) -> Value {
    let agent = dir.agent();
    let mut args = vec![
        "submit",
        agent.to_str().unwrap(),
        "--input",
        "go",
        "--session",
        session,
        "--restate",
        &server.ingress,
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = cli(dir, &args);
    assert_eq!(out.status.code(), Some(0), "submit: {}", stderr(&out));
    stdout_json(&out)
}

/// Submits a run on session `session`; its id.
pub(crate) fn submit_id(dir: &AgentDir, server: &Server, session: &str) -> String {
    submit(dir, server, session, &[])["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub(crate) fn attach_cmd(dir: &AgentDir, server: &Server, id: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args(["attach", id, "--restate", &server.ingress, "--json"])
        .current_dir(dir.path("."))
        .stdin(Stdio::null());
    cmd
}

/// `attach --json` of run `id`, running, its output piped.
pub(crate) fn watch(dir: &AgentDir, server: &Server, id: &str) -> Child {
    attach_cmd(dir, server, id)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub(crate) fn attach(dir: &AgentDir, server: &Server, id: &str) -> Value {
    let out = attach_cmd(dir, server, id).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "attach: {}", stderr(&out));
    stdout_json(&out)
}

/// Run `id`'s news from the start, as `attach` reads it (`{"events", "next", "approvals"}`).
pub(crate) fn news(server: &Server, id: &str) -> Value {
    let code = format!(
        "import json, urllib.request\n\
         r = urllib.request.Request('{}/AgentRuns/{id}/read', data=b'0', headers={{'content-type': 'application/json'}})\n\
         print(json.dumps(json.load(urllib.request.urlopen(r))))",
        server.ingress.trim_end_matches('/')
    );
    let out = Command::new("python3")
        .args(["-c", &code])
        .output()
        .unwrap();
    if !out.status.success() {
        return Value::Null;
    }
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Rejects an awakeable through Restate's own API (as an operator would, not through agentloop).
pub(crate) fn reject(server: &Server, awakeable: &str) {
    let code = format!(
        "import urllib.request\n\
         urllib.request.urlopen(urllib.request.Request('{}/restate/awakeables/{awakeable}/reject', data=b'no', method='POST'))",
        server.ingress.trim_end_matches('/')
    );
    let out = Command::new("python3")
        .args(["-c", &code])
        .output()
        .unwrap();
    assert!(out.status.success(), "reject: {}", stderr(&out));
}

/// What run `id` waits on, through `agentloop questions|approvals list --restate URL --run ID`.
pub(crate) fn listed(dir: &AgentDir, server: &Server, what: &str, id: &str) -> Vec<Value> {
    let out = cli(
        dir,
        &[
            what,
            "list",
            "--restate",
            &server.ingress,
            "--run",
            id,
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{what} list: {}", stderr(&out));
    stdout_json(&out).as_array().unwrap().clone()
}
