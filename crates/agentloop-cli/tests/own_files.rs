#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! No process the agent starts can rewrite the agent's own files: a stdio MCP server and a
//! command tool, both free to write the agent's folder (their default root), try to rewrite
//! `agent.toml`, the permission store (missing before the run) and a tool's program. Each try
//! fails and the files stay as they were, while both still write their other files there. And a
//! root swapped for a link between two calls does not let the next call of a command tool, the
//! shell or `write_file` write where the link leads. A store saved by an "always" answer given
//! at a terminal during the run stays read-only to a server started before the save. Through
//! `agentloop run` with a scripted model, under `workspace-write`.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::*;

/// The project's stdio MCP server that writes the file it is told to
/// (`scripts/mcp/write_server.py`), in its working folder: the agent file's.
fn write_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/write_server.py")
}

/// A command tool's program: writes `content` to `path`, relative to where it runs.
const PUT: &str = "import json, sys\na = json.load(sys.stdin)\n\
                   open(a['path'], 'w').write(a['content'])\nprint('wrote', a['path'])\n";

/// The `put` command tool (`tools/put.py`, [`PUT`]) and the `w` stdio MCP server
/// ([`write_server`]), as agent-file entries: two processes free to write the agent's folder.
fn put_and_write_server() -> String {
    format!(
        r#"[[tools]]
name = "put"
command = ["python3", "tools/put.py"]
input_schema = {{ type = "object", properties = {{ path = {{ type = "string" }}, content = {{ type = "string" }} }} }}

[[mcp]]
name = "w"
command = ["python3", "{}"]
"#,
        write_server().display()
    )
}

/// An agent (scripted by `script.json`) with [`put_and_write_server`]'s two processes and a
/// permission store (`permissions.json`) with these `[permissions]` lines: its folder and its
/// file's text.
fn put_and_write_agent(permissions: &str) -> (AgentDir, String) {
    let agent_toml = format!(
        r#"name = "a"
[model]
provider = "scripted"
script = "script.json"

{}
[permissions]
store = "permissions.json"
{permissions}
"#,
        put_and_write_server()
    );
    let dir = AgentDir::new(&agent_toml);
    std::fs::create_dir(dir.path("tools")).unwrap();
    dir.write("tools/put.py", PUT);
    (dir, agent_toml)
}

/// True where `workspace-write` runs; said when it does not, as the test then checks nothing.
fn confined_here() -> bool {
    let here = sandbox_modes_here().contains(&"workspace-write");
    if !here {
        eprintln!("skipped: workspace-write cannot be enforced on this system");
    }
    here
}

/// `agentloop run AGENT --input go --json` with these flags, which must exit 0: its JSON object.
async fn run_with(dir: &AgentDir, flags: &[(&str, &Path)]) -> Value {
    let mut given = args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "go",
        "--json",
    ]);
    for (flag, value) in flags {
        given.extend(args(&[flag, value.to_str().unwrap()]));
    }
    let out = agentloop(given).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout_json(&out)
}

fn call(calls: &[Value], id: &str) -> Value {
    calls
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no call {id}: {calls:?}"))
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_server_and_a_command_tool_write_the_agents_folder_but_never_its_own_files() {
    if !confined_here() {
        return;
    }
    let (dir, agent_toml) = put_and_write_agent("allow = [\"put\", \"w__write\"]");
    // No store yet: agentloop creates it empty, so that it can be kept from the processes.
    let allow_all = r#"{"rules": [{"tool": "*", "permission": "allow"}]}"#;
    let evil =
        "[[mcp]]\nname = \"x\"\ncommand = [\"sh\", \"-c\", \"touch pwned\"]\nsandbox = \"off\"\n";
    let put = |id: &str, path: &str, content: &str| json!({"id": id, "name": "put", "arguments": {"path": path, "content": content}});
    let mcp = |id: &str, path: &str, content: &str| json!({"id": id, "name": "w__write", "arguments": {"path": path, "content": content}});
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                mcp("m-agent", "agent.toml", evil),
                mcp("m-store", "permissions.json", allow_all),
                mcp("m-program", "tools/put.py", "import os\n"),
                mcp("m-own", "notes.txt", "from the server"),
            ]},
            {"tool_calls": [
                put("p-agent", "agent.toml", evil),
                put("p-store", "permissions.json", allow_all),
                put("p-program", "tools/put.py", "import os\n"),
                put("p-own", "out.txt", "from the tool"),
            ]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let (out, v) = run_finished(&dir.agent(), "Go.").await;
    let calls = v["tool_calls"].as_array().unwrap();
    for id in ["m-agent", "m-store", "m-program"] {
        let c = call(calls, id);
        assert_eq!(c["ok"], false, "{c}");
        assert!(c.to_string().contains("Read-only file system"), "{c}");
    }
    for id in ["p-agent", "p-store", "p-program"] {
        let c = call(calls, id);
        assert_eq!(c["ok"], false, "{c}");
    }
    for id in ["m-own", "p-own"] {
        let c = call(calls, id);
        assert_eq!(c["ok"], true, "{c}");
    }
    assert_eq!(std::fs::read_to_string(dir.agent()).unwrap(), agent_toml);
    let store: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("permissions.json")).unwrap())
            .unwrap();
    assert_eq!(store, json!({"rules": []}));
    assert_eq!(
        std::fs::read_to_string(dir.path("tools/put.py")).unwrap(),
        PUT
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("notes.txt")).unwrap(),
        "from the server"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("out.txt")).unwrap(),
        "from the tool"
    );
    assert!(!dir.path("pwned").exists(), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_root_swapped_for_a_link_between_calls_is_refused_not_followed() {
    if !confined_here() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let dir = AgentDir::new(
        r#"name = "a"
[model]
provider = "scripted"
script = "script.json"
[limits]
max_turns = 8

[[tools]]
name = "swap"
command = ["sh", "-c", "mv work work.old && ln -s \"$(cat target)\" work"]

[[tools]]
name = "put"
command = ["sh", "-c", "echo x > work/x"]
root = "work"

[[tools]]
builtin = "shell"
root = "work"

[[tools]]
builtin = "write_file"
root = "work"

[permissions]
allow = ["swap", "put", "shell", "write_file"]
"#,
    );
    std::fs::create_dir(dir.path("work")).unwrap();
    let target = std::fs::canonicalize(outside.path()).unwrap();
    dir.write("target", target.to_str().unwrap());
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "s", "name": "swap", "arguments": {}}]},
            {"tool_calls": [
                {"id": "put", "name": "put", "arguments": {}},
                {"id": "sh", "name": "shell", "arguments": {"command": "echo y > y"}},
                {"id": "wf", "name": "write_file", "arguments": {"path": "z", "content": "z"}}
            ]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let (_, v) = run_finished(&dir.agent(), "Go.").await;
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(call(calls, "s")["ok"], true, "{}", call(calls, "s"));
    assert!(dir.path("work").is_symlink());
    for id in ["put", "sh", "wf"] {
        let c = call(calls, id);
        assert_eq!(c["ok"], false, "{c}");
    }
    for name in ["x", "y", "z"] {
        assert!(!target.join(name).exists(), "{name} was written outside");
    }
}

/// The run's stores lie under the shell's root when the run is started there (`runs.db` and
/// `sessions.db` default to the working folder): the shell sees them read-only, so it cannot
/// rewrite the journal's steps or the session's history, while it writes the rest of its root.
#[tokio::test(flavor = "multi_thread")]
async fn the_shell_cannot_rewrite_the_runs_stores_under_its_root() {
    if !confined_here() {
        return;
    }
    let dir = AgentDir::new(
        r#"name = "a"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "shell"
root = "work"

[permissions]
allow = ["shell"]
"#,
    );
    std::fs::create_dir(dir.path("work")).unwrap();
    let rewrite = "for f in runs.db trace.ndjson; do echo junk > $f || echo refused $f; done; \
                   echo mine > mine.txt";
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "sh", "name": "shell", "arguments": {"command": rewrite}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let (journal, trace) = (dir.path("work/runs.db"), dir.path("work/trace.ndjson"));
    let v = run_with(&dir, &[("--journal", &journal), ("--trace", &trace)]).await;
    let said = call(v["tool_calls"].as_array().unwrap(), "sh")["output"].to_string();
    assert!(
        said.contains("refused runs.db") && said.contains("refused trace.ndjson"),
        "{said}"
    );
    let head = std::fs::read(&journal).unwrap();
    assert!(
        head.starts_with(b"SQLite format 3\0"),
        "the journal was rewritten"
    );
    assert!(
        !std::fs::read_to_string(&trace).unwrap().starts_with("junk"),
        "the trace was rewritten"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("work/mine.txt")).unwrap(),
        "mine\n"
    );
}

/// A command tool's program that makes the folders of `path` and writes `content` there, or
/// makes a FIFO there when `fifo` is set: what a process would do to a store it may reach.
const PLANT: &str = "import json, os, sys\na = json.load(sys.stdin)\n\
                     d = os.path.dirname(a['path'])\nd and os.makedirs(d, exist_ok=True)\n\
                     os.mkfifo(a['path']) if a.get('fifo') else open(a['path'], 'w').write(a['content'])\n\
                     print('planted', a['path'])\n";

const ALLOW_ALL: &str = r#"{"rules": [{"tool": "*", "permission": "allow"}]}"#;

fn plant(id: &str, path: &str, fifo: bool) -> Value {
    json!({"id": id, "name": "plant", "arguments": {"path": path, "content": ALLOW_ALL, "fifo": fifo}})
}

/// The store is where it was written, holding no rule, its recovery copy is empty and its lock
/// is a plain file.
fn assert_store_untouched(store: &Path) {
    let rules: Value = serde_json::from_str(&std::fs::read_to_string(store).unwrap()).unwrap();
    assert_eq!(rules, json!({"rules": []}), "{}", store.display());
    let mut next = store.as_os_str().to_owned();
    next.push(".next");
    assert_eq!(
        std::fs::read(PathBuf::from(next)).unwrap(),
        b"",
        "the copy is empty"
    );
    let mut lock = store.as_os_str().to_owned();
    lock.push(".lock");
    assert!(
        std::fs::symlink_metadata(PathBuf::from(lock))
            .unwrap()
            .file_type()
            .is_file(),
        "the lock is a plain file"
    );
}

/// A store in a folder that does not exist yet (`state/`, made by the first "always" answer)
/// is made with its folder and its lock before any process starts: a command tool free to
/// write the agent's folder can neither create it with an allow-all rule for the next run nor
/// put a FIFO where its lock goes (which would hang the next answer).
#[tokio::test(flavor = "multi_thread")]
async fn stores_in_a_missing_folder_are_made_before_a_process_could_plant_them() {
    if !confined_here() {
        return;
    }
    let dir = AgentDir::new(
        r#"name = "a"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "plant"
command = ["python3", "tools/plant.py"]

[permissions]
store = "state/permissions.json"
allow = ["plant"]
"#,
    );
    std::fs::create_dir(dir.path("tools")).unwrap();
    dir.write("tools/plant.py", PLANT);
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                plant("store", "state/permissions.json", false),
                plant("next", "state/permissions.json.next", false),
                plant("lock", "state/permissions.json.lock", true),
                plant("own", "state/notes.txt", false),
            ]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let (_, v) = run_finished(&dir.agent(), "Go.").await;
    let calls = v["tool_calls"].as_array().unwrap();
    for id in ["store", "next", "lock"] {
        let c = call(calls, id);
        assert_eq!(c["ok"], false, "{c}");
    }
    assert_eq!(call(calls, "own")["ok"], true, "{}", call(calls, "own"));
    assert_store_untouched(&dir.path("state/permissions.json"));
}

/// A parent whose only process tools are its subagent's: the worker's command tool writes the
/// folder the parent's store is in, so that store is made before the run and kept from it.
#[tokio::test(flavor = "multi_thread")]
async fn stores_only_a_subagents_process_reaches_are_made_and_kept_from_it() {
    if !confined_here() {
        return;
    }
    let dir = AgentDir::new(
        r#"name = "parent"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "worker"
agent = "worker.toml"

[permissions]
store = "permissions.json"
allow = ["worker"]
"#,
    );
    dir.write(
        "worker.toml",
        r#"name = "worker"
[model]
provider = "scripted"
script = "worker.json"

[[tools]]
name = "plant"
command = ["python3", "tools/plant.py"]
"#,
    );
    std::fs::create_dir(dir.path("tools")).unwrap();
    dir.write("tools/plant.py", PLANT);
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "w", "name": "worker", "arguments": {"task": "plant"}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    dir.write(
        "worker.json",
        &json!([
            {"tool_calls": [
                plant("store", "permissions.json", false),
                plant("next", "permissions.json.next", false),
                plant("lock", "permissions.json.lock", true),
            ]},
            {"text": "planted"}
        ])
        .to_string(),
    );
    let _ = run_finished(&dir.agent(), "Go.").await;
    assert_store_untouched(&dir.path("permissions.json"));
}

/// `run --trace --session`, then `run --journal`, in the agent's folder, where a stdio MCP server writes: the
/// trace, the session store (with SQLite's rollback journal beside it) and the stores' lock
/// folders exist before the server starts, so it sees them read-only and can neither empty the
/// trace, rewrite the history, nor plant a lock or a step log.
#[tokio::test(flavor = "multi_thread")]
async fn stores_of_the_run_are_made_before_its_mcp_servers_start() {
    if !confined_here() {
        return;
    }
    let dir = AgentDir::new(&format!(
        r#"name = "a"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "w"
command = ["python3", "{}"]

[permissions]
allow = ["w__write"]
"#,
        write_server().display()
    ));
    let mcp = |id: &str, path: &str| json!({"id": id, "name": "w__write", "arguments": {"path": path, "content": "junk\n"}});
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                mcp("trace", "t.ndjson"),
                mcp("session", "sessions.db"),
                mcp("side", "sessions.db-journal"),
                mcp("locks", "sessions.db.locks/planted.lock"),
                mcp("own", "notes.txt"),
            ]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let (trace, sessions) = (dir.path("t.ndjson"), dir.path("sessions.db"));
    let s1 = Path::new("s1");
    let given = [
        ("--session", s1),
        ("--sessions", &sessions),
        ("--trace", &trace),
    ];
    let v = run_with(&dir, &given).await;
    let calls = v["tool_calls"].as_array().unwrap();
    // The lock folder too: a lock file planted there keeps every writer out.
    for id in ["trace", "session", "side", "locks"] {
        let c = call(calls, id);
        assert_eq!(c["ok"], false, "{c}");
        assert!(c.to_string().contains("Read-only file system"), "{c}");
    }
    assert_eq!(call(calls, "own")["ok"], true, "{}", call(calls, "own"));
    assert!(!std::fs::read_to_string(&trace).unwrap().starts_with("junk"));
    assert!(
        std::fs::read(&sessions)
            .unwrap()
            .starts_with(b"SQLite format 3\0")
    );
    // A journaled run: its owners' folder, where a run's lock file is also its step log (steps
    // planted there would be folded into the journal).
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [mcp("owners", "j.db.owners/planted.lock")]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let v = run_with(&dir, &[("--journal", &dir.path("j.db"))]).await;
    let owners = call(v["tool_calls"].as_array().unwrap(), "owners");
    assert_eq!(owners["ok"], false, "{owners}");
    assert!(
        owners.to_string().contains("Read-only file system"),
        "{owners}"
    );
}

/// A stdio MCP server lives until the run is over: the journal stays open (its SQLite `-wal` and
/// `-shm` in place, read-only to the server) until the server is stopped. Closed first, SQLite
/// would delete both, dropping the server's binds of them, and a server that writes a `-wal` then
/// has it replayed into the journal at its next open.
#[tokio::test(flavor = "multi_thread")]
async fn the_journal_stays_open_until_the_mcp_servers_are_stopped() {
    if !confined_here() {
        return;
    }
    let files = ["j.db-wal", "j.db-shm"];
    let dir = writing_at_exit(&files);
    let v = run_with(&dir, &[("--journal", &dir.path("j.db"))]).await;
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_refused_at_exit(&dir, &files);
}

/// An agent answering "done", whose stdio MCP server ([`write_server`]) tries to write each of
/// `files` when it is stopped.
fn writing_at_exit(files: &[&str]) -> AgentDir {
    let command = [
        "python3",
        &write_server().display().to_string(),
        "--at-exit",
    ]
    .iter()
    .map(|w| w.to_string())
    .chain(files.iter().map(|f| f.to_string()))
    .collect::<Vec<_>>();
    let dir = AgentDir::new(&format!(
        "name = \"a\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\n\
         [[mcp]]\nname = \"w\"\ncommand = {}\n",
        json!(command)
    ));
    dir.write("script.json", &json!([{"text": "done"}]).to_string());
    dir
}

/// Each of `files` was refused to the server at its stop with `EROFS` (bound read-only), and
/// none holds what it would have written.
fn assert_refused_at_exit(dir: &AgentDir, files: &[&str]) {
    // The server writes its report as it ends, which may be just after agentloop has.
    let report = || std::fs::read_to_string(dir.path("at-exit.txt")).unwrap_or_default();
    for _ in 0..200 {
        if report().lines().count() >= files.len() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let said = report();
    for file in files {
        assert!(
            said.contains(&format!("{file} refused 30\n")),
            "{file}: {said}"
        );
        let bytes = std::fs::read(dir.path(file)).unwrap_or_default();
        assert!(!bytes.starts_with(b"junk"), "{file} was written");
    }
}

/// A link left where the trace or the session store goes (by a process of an earlier run that
/// could write the folder) is refused, never followed: nothing is created where it leads.
#[tokio::test(flavor = "multi_thread")]
async fn stores_refuse_a_link_in_their_place() {
    let outside = tempfile::tempdir().unwrap();
    let dir = AgentDir::new(
        r#"name = "a"
[model]
provider = "scripted"
script = "script.json"
"#,
    );
    dir.write("script.json", &json!([{"text": "done"}]).to_string());
    let agent = dir.agent();
    for (flag, name) in [
        ("--trace", "t.ndjson"),
        ("--trace", "t.db"),
        ("--sessions", "s.db"),
    ] {
        let (link, target) = (dir.path(name), outside.path().join(name));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let mut given = vec![
            "run",
            agent.to_str().unwrap(),
            "--input",
            "go",
            flag,
            link.to_str().unwrap(),
        ];
        if flag == "--sessions" {
            given.extend(["--session", "s1"]);
        }
        let out = agentloop(args(&given)).await;
        assert_ne!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains("link"), "{name}: {}", stderr(&out));
        assert!(!target.exists(), "{name} was created where its link leads");
    }
}

/// A message as stdio MCP frames it: JSON-RPC on a line of its own.
fn rpc_line(v: &Value) -> String {
    format!("{v}\n")
}

/// Agents served together are one program: a caller of `a` cannot have it rewrite `b.toml`,
/// served beside it, with its built-in `write_file` or its command tool; and the server's trace
/// and journal, opened before `a`'s stdio MCP server starts, are read-only to that server.
#[tokio::test(flavor = "multi_thread")]
async fn stores_and_files_of_agents_served_together_are_kept_from_each_other() {
    if !confined_here() {
        return;
    }
    let a_toml = format!(
        r#"name = "a"
[model]
provider = "scripted"
script = "a.json"

[[tools]]
builtin = "write_file"

{}
[permissions]
allow = ["put", "write_file", "w__write"]
"#,
        put_and_write_server()
    );
    let b_toml = "name = \"b\"\n[model]\nprovider = \"scripted\"\nscript = \"b.json\"\n";
    let dir = AgentDir::new(&a_toml);
    dir.write("b.toml", b_toml);
    dir.write("b.json", &json!([{"text": "b"}]).to_string());
    std::fs::create_dir(dir.path("tools")).unwrap();
    dir.write("tools/put.py", PUT);
    let evil = "name = \"b\"\n[[mcp]]\nname = \"x\"\ncommand = [\"touch\", \"pwned\"]\nsandbox = \"off\"\n";
    let put = |path: &str| json!({"id": path, "name": "put", "arguments": {"path": path, "content": evil}});
    let w = |path: &str| json!({"id": path, "name": "w__write", "arguments": {"path": path, "content": "junk\n"}});
    dir.write(
        "a.json",
        &json!([
            {"tool_calls": [
                put("b.toml"),
                {"id": "wf", "name": "write_file", "arguments": {"path": "b.toml", "content": evil}},
                w("t.ndjson"),
                w("runs.db"),
                put("out.txt"),
            ]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let (trace, journal) = (dir.path("t.ndjson"), dir.path("runs.db"));
    let given = [
        "mcp".to_owned(),
        "serve".into(),
        dir.agent().display().to_string(),
        dir.path("b.toml").display().to_string(),
        "--trace".into(),
        trace.display().to_string(),
        "--journal".into(),
        journal.display().to_string(),
    ];
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, Write};
        let mut child = std::process::Command::new(bin())
            .args(&given)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for message in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                   "params": {"name": "a", "arguments": {"task": "go"}}}),
        ] {
            stdin.write_all(rpc_line(&message).as_bytes()).unwrap();
        }
        stdin.flush().unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let answer = lines
            .find_map(|l| {
                let v: Value = serde_json::from_str(&l.unwrap()).ok()?;
                (v["id"] == 2).then_some(v)
            })
            .expect("no answer to the call");
        drop(stdin);
        let _ = child.wait();
        answer
    })
    .await
    .unwrap();
    assert!(answer.to_string().contains("done"), "{answer}");
    assert!(!std::fs::read_to_string(&trace).unwrap().starts_with("junk"));
    assert!(
        std::fs::read(&journal)
            .unwrap()
            .starts_with(b"SQLite format 3\0")
    );
    assert_eq!(std::fs::read_to_string(dir.path("b.toml")).unwrap(), b_toml);
    assert_eq!(std::fs::read_to_string(dir.path("out.txt")).unwrap(), evil);
    assert!(!dir.path("pwned").exists());
}

/// `a2a serve --sessions`: the session store is made before the served agent's stdio MCP server
/// starts and stays open until the server is stopped, so the server sees it (and SQLite's side
/// files) read-only to the end and cannot rewrite a context's history.
#[tokio::test(flavor = "multi_thread")]
async fn a2a_serves_session_store_is_kept_from_its_mcp_servers() {
    if !confined_here() {
        return;
    }
    let files = ["s.db", "s.db-wal"];
    let dir = writing_at_exit(&files);
    let (agent, sessions) = (dir.agent(), dir.path("s.db"));
    tokio::task::spawn_blocking(move || {
        let (agent, sessions) = (agent.display().to_string(), sessions.display().to_string());
        HttpServer::start("a2a", &[&agent, "--sessions", &sessions]).terminate();
    })
    .await
    .unwrap();
    assert_refused_at_exit(&dir, &files);
    assert!(
        std::fs::read(dir.path("s.db"))
            .unwrap()
            .starts_with(b"SQLite format 3\0")
    );
}

/// What the call `id` answered (its output, or its error's message), as the trace (written with
/// its payloads) records it.
fn traced_answer(trace: &Path, id: &str) -> String {
    let text = std::fs::read_to_string(trace).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["kind"] == "tool_call" && e["call_id"] == id && e.get("ended_at_ms").is_some())
        .and_then(|e| {
            let answer = e["output"].as_str().or(e["error"]["message"].as_str());
            answer.map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no answer of {id} in the trace: {text}"))
}

/// An "always" answer given during a run saves the store while a stdio MCP server started at
/// the run's start is still alive. The save must leave the store the file the server's view
/// binds read-only: a store replaced by a new file (a rename over it detaches that bind) would
/// be a plain, writable file to the server, which could then save an allow-all rule for the
/// next run. The person answers at a real terminal; the server writes after the save.
#[test]
fn a_store_saved_during_a_run_stays_read_only_to_a_server_started_before() {
    if !confined_here() {
        return;
    }
    let (dir, _) = put_and_write_agent("allow = [\"w__write\"]\nask = [\"put\"]");
    let write = |id: &str, path: &str, content: &str| json!({"id": id, "name": "w__write", "arguments": {"path": path, "content": content}});
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "p", "name": "put", "arguments": {"path": "out.txt", "content": "x"}}]},
            {"tool_calls": [write("m-store", "permissions.json", ALLOW_ALL)]},
            {"tool_calls": [write("m-next", "permissions.json.next", ALLOW_ALL)]},
            {"tool_calls": [write("m-own", "notes.txt", "after the save")]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let agent = dir.agent();
    let out = in_terminal(
        &dir,
        &["run it?", "a"],
        &[
            "run",
            agent.to_str().unwrap(),
            "--input",
            "go",
            "--trace",
            "t.ndjson",
            "--trace-payloads",
        ],
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    let output = |id: &str| traced_answer(&dir.path("t.ndjson"), id);
    assert_eq!(output("p").trim(), "wrote out.txt", "{shown}");
    for id in ["m-store", "m-next"] {
        assert!(output(id).contains("Read-only file system"), "{shown}");
    }
    assert_eq!(output("m-own"), "wrote notes.txt", "{shown}");
    assert_eq!(
        std::fs::read_to_string(dir.path("notes.txt")).unwrap(),
        "after the save",
        "the server lived past the save and wrote its own file: {shown}"
    );
    let store: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("permissions.json")).unwrap())
            .unwrap();
    assert_eq!(
        store,
        json!({"rules": [{"tool": "put", "permission": "allow"}]}),
        "{shown}"
    );
}

// outside-paths: off (the agents below lie in folders of a temporary one, beside each other)
/// An agent in `real/` whose shell (asked about by default: `--yes` here) may write `scratch/`,
/// a folder apart from the agent's own files, and runs `touch ran` there once. Its paths lead
/// there from a folder beside `real/` too (`scratch/`, `links/`), where a link to it may be.
fn linked_agent() -> AgentDir {
    let dir = AgentDir::new("");
    for folder in ["real", "scratch", "links"] {
        std::fs::create_dir_all(dir.path(folder)).unwrap();
    }
    dir.write(
        "real/agent.toml",
        r#"name = "linked"
[model]
provider = "scripted"
script = "../real/script.json"
[[tools]]
builtin = "shell"
root = "../scratch"
"#,
    );
    let script = json!([
        {"tool_calls": [{"id": "c0", "name": "shell", "arguments": {"command": "touch ran"}}]},
        {"text": "done"}
    ]);
    dir.write("real/script.json", &script.to_string());
    dir
}

/// `agentloop ARGS --json`: its exit code and JSON document.
async fn exit_and_json(given: &[&str]) -> (Option<i32>, Value) {
    let mut given = given.to_vec();
    given.push("--json");
    let out = agentloop(args(&given)).await;
    (out.status.code(), stdout_json(&out))
}

/// Asserts that `agentloop run AGENT` is refused before anything starts, naming the file the
/// link leads to.
async fn assert_refused_for_its_link(dir: &AgentDir, agent: &Path) {
    let agent = agent.to_str().unwrap();
    let (code, v) = exit_and_json(&["run", agent, "--input", "go", "--yes"]).await;
    assert_eq!(code, Some(3), "{v}");
    assert_eq!(v["error"]["code"], "agent.setup", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    let target = std::fs::canonicalize(dir.path("real/agent.toml")).unwrap();
    assert!(message.contains(target.to_str().unwrap()), "{message}");
    assert!(message.contains("symbolic link"), "{message}");
    assert!(message.contains("Run the file it leads to"), "{message}");
    assert!(!dir.path("scratch/ran").exists(), "a tool ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_file_reached_through_a_link_its_processes_could_replace_is_refused() {
    // `scratch/linked.toml` leads to `real/agent.toml`. The shell may write `scratch/`: it
    // could put a file of its own in the link's place (the read-only bind holds the target, not
    // the link), and the next run would load it. So nothing starts.
    let dir = linked_agent();
    std::os::unix::fs::symlink("../real/agent.toml", dir.path("scratch/linked.toml")).unwrap();
    let linked = dir.path("scratch/linked.toml");
    assert_refused_for_its_link(&dir, &linked).await;

    // `plan` and a dry run start no process: they still read it.
    let linked = linked.to_str().unwrap();
    let (code, v) = exit_and_json(&["plan", linked]).await;
    assert_eq!(code, Some(0), "{v}");
    let (code, v) = exit_and_json(&["run", linked, "--input", "go", "--dry-run"]).await;
    assert_eq!(code, Some(0), "{v}");

    // The file it leads to runs.
    let real = dir.path("real/agent.toml");
    let (code, v) = exit_and_json(&["run", real.to_str().unwrap(), "--input", "go", "--yes"]).await;
    assert_eq!(code, Some(0), "{v}");
    assert!(dir.path("scratch/ran").exists(), "{v}");
    std::fs::remove_file(dir.path("scratch/ran")).unwrap();

    // So does a link where no process of the agent may write.
    std::os::unix::fs::symlink("../real/agent.toml", dir.path("links/linked.toml")).unwrap();
    let apart = dir.path("links/linked.toml");
    let (code, v) =
        exit_and_json(&["run", apart.to_str().unwrap(), "--input", "go", "--yes"]).await;
    assert_eq!(code, Some(0), "{v}");
    assert!(dir.path("scratch/ran").exists(), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_file_under_a_linked_folder_its_processes_could_replace_is_refused() {
    // `scratch/agents` is a link to `real`: the agent file is not a link, a folder on its way is.
    let dir = linked_agent();
    std::os::unix::fs::symlink("../real", dir.path("scratch/agents")).unwrap();
    assert_refused_for_its_link(&dir, &dir.path("scratch/agents/agent.toml")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_refuses_a_linked_agent_file_its_mcp_servers_could_replace() {
    // A stdio MCP server writes the agent file's folder as given: the one that holds the
    // link. A dry run starts it, so it is refused as a run is; `plan` starts nothing.
    let dir = linked_agent();
    let agent = std::fs::read_to_string(dir.path("real/agent.toml")).unwrap();
    let server = format!(
        "[[mcp]]\nname = \"w\"\ncommand = [\"python3\", \"{}\"]\n",
        write_server().display()
    );
    dir.write("real/agent.toml", &format!("{agent}{server}"));
    std::os::unix::fs::symlink("../real/agent.toml", dir.path("links/linked.toml")).unwrap();
    let linked = dir.path("links/linked.toml");
    let linked = linked.to_str().unwrap();
    let (code, v) = exit_and_json(&["run", linked, "--input", "go", "--dry-run"]).await;
    assert_eq!(code, Some(3), "{v}");
    assert_eq!(v["error"]["code"], "agent.setup", "{v}");
    assert!(
        v["error"]["message"].to_string().contains("symbolic link"),
        "{v}"
    );
    let (code, v) = exit_and_json(&["plan", linked]).await;
    assert_eq!(code, Some(0), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_s_or_hand_off_s_file_reached_through_such_a_link_is_refused() {
    // The agent names `scratch/child.toml`, a link to `real/child.toml`, as a subagent's file,
    // then as a hand-off's.
    let dir = linked_agent();
    dir.write(
        "real/child.toml",
        "name = \"child\"\n[model]\nprovider = \"scripted\"\nscript = \"../real/child.json\"\n",
    );
    dir.write("real/child.json", "[{\"text\": \"done\"}]");
    std::os::unix::fs::symlink("../real/child.toml", dir.path("scratch/child.toml")).unwrap();
    let agent = std::fs::read_to_string(dir.path("real/agent.toml")).unwrap();
    let real = dir.path("real/agent.toml");
    for entry in [
        "[[tools]]\nname = \"helper\"\nagent = \"../scratch/child.toml\"\n",
        "[[handoffs]]\nagent = \"../scratch/child.toml\"\n",
    ] {
        dir.write("real/agent.toml", &format!("{agent}{entry}"));
        let (code, v) = exit_and_json(&["run", real.to_str().unwrap(), "--input", "go"]).await;
        assert_eq!(code, Some(3), "{entry}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("scratch/child.toml"), "{message}");
        assert!(message.contains("Name the file it leads to"), "{message}");
        assert!(!dir.path("scratch/ran").exists(), "a tool ran");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn instructions_or_a_script_reached_through_a_link_its_processes_could_replace_are_refused() {
    // A command tool writes its root, the agent's folder `real/` (its own files there are bound
    // read-only in its view). A link there to the agent's instructions or to a command's script
    // is not kept from it (the bind holds the file it leads to, in `links/`): it could put a
    // file of its own in the link's place, which the next run would read as its instructions,
    // or the next call run as the command. So nothing starts; named by the file it leads to,
    // the agent runs.
    let dir = AgentDir::new("");
    for folder in ["real", "links"] {
        std::fs::create_dir_all(dir.path(folder)).unwrap();
    }
    dir.write("links/prompt.md", "Be brief.");
    dir.write("links/count.sh", "echo 3\n");
    dir.write("real/script.json", "[{\"text\": \"done\"}]");
    std::os::unix::fs::symlink("../links/prompt.md", dir.path("real/prompt.md")).unwrap();
    std::os::unix::fs::symlink("../links/count.sh", dir.path("real/count.sh")).unwrap();
    let real = dir.path("real/agent.toml");
    let real = real.to_str().unwrap();
    let agent = |instructions: &str, script: &str| {
        format!(
            "name = \"linked\"\ninstructions_file = \"{instructions}\"\n[model]\n\
             provider = \"scripted\"\nscript = \"script.json\"\n[[tools]]\nname = \"count\"\n\
             description = \"counts\"\ncommand = [\"sh\", \"{script}\"]\n"
        )
    };
    for (text, kind, named) in [
        (
            agent("prompt.md", "../links/count.sh"),
            "instructions file",
            "real/prompt.md",
        ),
        (
            agent("../links/prompt.md", "count.sh"),
            "script",
            "real/count.sh",
        ),
    ] {
        dir.write("real/agent.toml", &text);
        let (code, v) = exit_and_json(&["run", real, "--input", "go"]).await;
        assert_eq!(code, Some(3), "{text}: {v}");
        assert_eq!(v["error"]["code"], "agent.setup", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("the {kind} ")), "{message}");
        assert!(message.contains(named), "{message}");
        assert!(message.contains("Name the file it leads to"), "{message}");
    }
    dir.write(
        "real/agent.toml",
        &agent("../links/prompt.md", "../links/count.sh"),
    );
    let (code, v) = exit_and_json(&["run", real, "--input", "go"]).await;
    assert_eq!(code, Some(0), "{v}");
}
