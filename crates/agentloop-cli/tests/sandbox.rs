#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The sandbox of the processes tools start, end to end through `agentloop run --json` with a
//! scripted model: each escape attempt fails while a control inside the sandbox succeeds. A
//! write outside the root, a TCP connection to the test's own loopback server, reading the
//! agentloop process's environment and memory (also with `sandbox = "off"`, and as root on CI),
//! and a `setsid` or double-forked child outliving the call's timeout.

mod support;

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A fake credential in the agentloop process's own environment.
const PROC_SECRET: &str = "sk-proc-secret-4711";

/// An agent with a shell rooted in `work/` (plus `tools`), run on `script.json`.
fn agent(tools: &str) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "s"
[model]
provider = "scripted"
script = "script.json"
[limits]
max_turns = 8
{tools}
"#
    ));
    std::fs::create_dir(dir.path("work")).unwrap();
    dir
}

const SHELL: &str = r#"
[[tools]]
builtin = "shell"
root = "work"
timeout_secs = 20
[permissions]
allow = ["shell"]
"#;

/// One shell call per command, then a final answer.
fn shell_script(dir: &AgentDir, tool: &str, commands: &[&str]) {
    let mut steps: Vec<Value> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"tool_calls": [{"id": format!("c{i}"), "name": tool, "arguments": {"command": c}}]}))
        .collect();
    steps.push(json!({"text": "done"}));
    dir.write("script.json", &Value::Array(steps).to_string());
}

/// Runs the agent with a fake key in agentloop's environment; the output of each call, by id.
async fn run(dir: &AgentDir) -> Vec<(String, bool, String)> {
    let out = agentloop_env(
        args(&[
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "go",
            "--json",
        ]),
        vec![
            ("OPENAI_API_KEY", PROC_SECRET),
            ("GITHUB_TOKEN", PROC_SECRET),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = c["output"]
                .as_str()
                .or_else(|| c["error"]["message"].as_str())
                .map_or_else(|| c.to_string(), str::to_owned);
            (
                c["id"].as_str().unwrap_or_default().to_owned(),
                c["ok"] == true,
                text,
            )
        })
        .collect()
}

fn output<'a>(calls: &'a [(String, bool, String)], id: &str) -> &'a str {
    &calls.iter().find(|(i, _, _)| i == id).unwrap().2
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shell_writes_inside_its_root_and_not_outside() {
    let dir = agent(SHELL);
    let outside = tempfile::tempdir().unwrap();
    let escape = outside.path().join("escaped.txt");
    let beside = dir.path("beside-the-root.txt");
    let commands = [
        "echo in > inside.txt && mkdir -p sub && echo in > sub/deeper.txt && echo wrote".to_owned(),
        format!("echo out > {}; echo status $?", escape.display()),
        format!("echo out > {}; echo status $?", beside.display()),
        "echo tmp > \"$TMPDIR/scratch\" && cat \"$TMPDIR/scratch\" && echo x > /dev/null && echo devnull".to_owned(),
    ];
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    shell_script(&dir, "shell", &commands);
    let calls = run(&dir).await;
    assert!(output(&calls, "c0").contains("wrote"), "{calls:?}");
    assert_eq!(
        std::fs::read_to_string(dir.path("work/sub/deeper.txt")).unwrap(),
        "in\n"
    );
    for (id, path) in [("c1", &escape), ("c2", &beside)] {
        let out = output(&calls, id);
        assert!(out.contains("status 2"), "{id}: {out}");
        // Refused by the read-only view first where the system gives one, else by Landlock.
        assert!(
            out.contains("Read-only file system") || out.contains("Permission denied"),
            "{id}: {out}"
        );
        assert!(!path.exists(), "{} was written", path.display());
    }
    let tmp = output(&calls, "c3");
    assert!(tmp.contains("tmp\ndevnull"), "{tmp}");
}

/// A loopback server of the test's own that counts the connections it accepts.
fn listener() -> (u16, Arc<AtomicUsize>) {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in server.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 16];
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = stream.read(&mut buf);
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, accepted)
}

#[tokio::test(flavor = "multi_thread")]
async fn no_network_unless_the_entry_says_network_true() {
    let (port, accepted) = listener();
    let connect = format!(
        "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=5); s.sendall(b'hi'); print('connected')\" 2>&1 | tail -n 1; \
         python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port})); print('udp sent')\" 2>&1 | tail -n 1"
    );
    let closed = agent(SHELL);
    shell_script(&closed, "shell", &[&connect]);
    let calls = run(&closed).await;
    let out = output(&calls, "c0");
    assert!(!out.contains("connected"), "{out}");
    assert!(!out.contains("udp sent"), "{out}");
    assert!(out.contains("PermissionError"), "{out}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);

    let open = agent(&SHELL.replace("timeout_secs = 20", "timeout_secs = 20\nnetwork = true"));
    shell_script(&open, "shell", &[&connect]);
    let calls = run(&open).await;
    let out = output(&calls, "c0");
    assert!(out.contains("connected"), "{out}");
    assert!(out.contains("udp sent"), "{out}");
    for _ in 0..100 {
        if accepted.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// Reads its parent's (agentloop's) environ and mem, and its own as the control.
const PROBE: &str = r#"
import os, sys
parent = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
for what in ("environ", "mem"):
    try:
        with open(f"/proc/{parent}/{what}", "rb") as f:
            data = f.read(65536) if what == "environ" else b""
        print(f"parent {what}: READ", "sk-proc-secret" in data.decode("latin-1"))
    except OSError as e:
        print(f"parent {what}: DENIED errno {e.errno}")
own = open("/proc/self/environ", "rb").read()
print("own environ:", b"PATH=" in own)
start = int(open("/proc/self/maps").readline().split("-")[0], 16)
with open("/proc/self/mem", "rb") as f:
    f.seek(start)
    print("own mem:", len(f.read(16)))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn no_tool_reads_the_agentloop_process_environment_or_memory_even_unsandboxed() {
    let dir = agent(
        &format!(
            r#"{SHELL}
[[tools]]
name = "probe_off"
command = ["python3", "probe.py"]
sandbox = "off"

[[tools]]
name = "shell_off"
builtin = "shell"
root = "work"
sandbox = "off"
"#
        )
        .replace("allow = [\"shell\"]", "allow = [\"shell\", \"shell_off\"]"),
    );
    dir.write("probe.py", PROBE);
    let probe = format!("python3 {} $PPID", dir.path("probe.py").display());
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                {"id": "sandboxed", "name": "shell", "arguments": {"command": probe}},
                {"id": "command_off", "name": "probe_off", "arguments": {}},
                {"id": "shell_off", "name": "shell_off", "arguments": {"command": probe}},
                {"id": "cat_off", "name": "shell_off", "arguments": {"command": "tr '\\0' '\\n' < /proc/$PPID/environ; echo status $?"}}
            ]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let calls = run(&dir).await;
    for id in ["sandboxed", "command_off", "shell_off"] {
        let out = output(&calls, id);
        assert!(out.contains("parent environ: DENIED"), "{id}: {out}");
        assert!(out.contains("parent mem: DENIED"), "{id}: {out}");
        assert!(out.contains("own environ: True"), "{id}: {out}");
        assert!(out.contains("own mem: 16"), "{id}: {out}");
        assert!(!out.contains(PROC_SECRET), "{id}: {out}");
    }
    let cat = output(&calls, "cat_off");
    assert!(!cat.contains(PROC_SECRET), "{cat}");
    assert!(cat.contains("Permission denied"), "{cat}");
}

/// As an ordinary user (CI runs as root, where the dropped capabilities alone already keep a
/// child out of its root parent), only the agentloop process's non-dumpable flag keeps its
/// environment and memory from its tools: the run as `nobody` checks that flag end to end.
#[tokio::test(flavor = "multi_thread")]
async fn as_an_ordinary_user_the_agentloop_process_is_out_of_its_tools_reach_too() {
    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" || !setpriv.exists() {
        // Not root: the test above already runs as an ordinary user.
        return;
    }
    let dir = agent(&format!(
        "{SHELL}\n[[tools]]\nname = \"shell_off\"\nbuiltin = \"shell\"\nroot = \"work\"\nsandbox = \"off\"\n"
    ).replace("allow = [\"shell\"]", "allow = [\"shell\", \"shell_off\"]"));
    let probe = "tr '\\0' '\\n' < /proc/$PPID/environ; echo environ $?; \
                 head -c 1 /proc/$PPID/mem > /dev/null; echo mem $?; \
                 tr '\\0' '\\n' < /proc/$$/environ | grep -c '^PATH='";
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                {"id": "sandboxed", "name": "shell", "arguments": {"command": probe}},
                {"id": "off", "name": "shell_off", "arguments": {"command": probe}}
            ]},
            {"text": "done"}
        ])
        .to_string(),
    );
    use std::os::unix::fs::PermissionsExt;
    for path in [dir.dir.path().to_path_buf(), dir.path("work")] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for file in ["agent.toml", "script.json"] {
        std::fs::set_permissions(dir.path(file), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let agent_file = dir.agent();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_agentloop"))
            .args([
                "run",
                agent_file.to_str().unwrap(),
                "--input",
                "go",
                "--json",
            ])
            .env("OPENAI_API_KEY", PROC_SECRET)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    for id in ["sandboxed", "off"] {
        let call = v["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap();
        let said = call["output"].as_str().unwrap_or_default();
        assert!(!said.contains(PROC_SECRET), "{id}: {said}");
        assert!(!said.contains("environ 0"), "{id}: {said}");
        assert!(said.contains("mem 1"), "{id}: {said}");
        assert!(said.contains("Permission denied"), "{id}: {said}");
        // The control: the child reads its own environment.
        assert!(
            said.contains("\n1\n") || said.contains("---\n1"),
            "{id}: {said}"
        );
    }
}

/// True once no live (non-zombie) process has this pid.
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_gone(pid: &str) -> bool {
    for _ in 0..150 {
        if gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Starts a `setsid` child, a double-forked daemon that tries to leave the session and a plain
/// background child, records their pids, then outlives its timeout.
const ESCAPE: &str = r#"
setsid sleep 37 &
echo $! > setsid.pid
python3 -c '
import os, time
if os.fork() == 0:
    try:
        os.setsid()
    except OSError as e:
        print("setsid refused", e.errno, flush=True)
    if os.fork() == 0:
        open("daemon.pid", "w").write(str(os.getpid()))
        time.sleep(37)
    os._exit(0)
'
sleep 37 &
echo $! > plain.pid
sleep 2
echo "started"
sleep 37
"#;

fn escaping_tool(sandbox: &str) -> AgentDir {
    let dir = agent(&format!(
        r#"
[[tools]]
name = "escape"
command = ["sh", "escape.sh"]
timeout_secs = 4
sandbox = "{sandbox}"
"#
    ));
    dir.write("escape.sh", ESCAPE);
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "e", "name": "escape", "arguments": {}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    dir
}

async fn pid_of(dir: &AgentDir, file: &str) -> String {
    for _ in 0..100 {
        if let Ok(pid) = std::fs::read_to_string(dir.path(file))
            && !pid.trim().is_empty()
        {
            return pid.trim().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{file} was never written");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_child_of_a_timed_out_call_survives_it_setsid_and_daemons_included() {
    let dir = escaping_tool("workspace-write");
    let calls = run(&dir).await;
    let (_, ok, text) = &calls[0];
    assert!(!ok, "{text}");
    assert!(text.contains("did not finish within 4.0 s"), "{text}");
    for file in ["setsid.pid", "daemon.pid", "plain.pid"] {
        let pid = pid_of(&dir, file).await;
        assert!(
            wait_gone(&pid).await,
            "{file}: process {pid} survived the call"
        );
    }

    // The control: unsandboxed, a `setsid` child leaves the group and outlives the call (the
    // test then ends it), while the plain background child is killed with the group.
    let off = escaping_tool("off");
    let _ = run(&off).await;
    let plain = pid_of(&off, "plain.pid").await;
    assert!(wait_gone(&plain).await, "the plain child {plain} survived");
    let escaped = pid_of(&off, "setsid.pid").await;
    let survived = !gone(&escaped);
    if let Ok(pid) = escaped.parse::<i32>() {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    if let Ok(daemon) = std::fs::read_to_string(off.path("daemon.pid")) {
        let _ = std::process::Command::new("kill")
            .args(["-9", daemon.trim()])
            .status();
    }
    assert!(
        survived,
        "unsandboxed, the setsid child should have escaped"
    );
}

/// A daemon's UNIX socket outside the shell's root (as Docker's or an SSH agent's): refused by
/// default, reached with `unix_sockets = true`; the daemon counts what reached it.
#[tokio::test(flavor = "multi_thread")]
async fn the_system_s_unix_sockets_are_out_of_reach_unless_the_entry_says_so() {
    let outside = tempfile::tempdir().unwrap();
    let socket = outside.path().join("daemon.sock");
    let daemon = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in daemon.incoming().flatten() {
            drop(stream);
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    let connect = format!(
        "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}'); print('connected')\" 2>&1 | tail -n 1",
        socket.display()
    );
    let closed = agent(SHELL);
    shell_script(&closed, "shell", &[&connect]);
    let calls = run(&closed).await;
    let out = output(&calls, "c0");
    assert!(!out.contains("connected"), "{out}");
    assert!(out.contains("PermissionError"), "{out}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);

    let open = agent(&SHELL.replace(
        "timeout_secs = 20",
        "timeout_secs = 20\nunix_sockets = true",
    ));
    shell_script(&open, "shell", &[&connect]);
    let calls = run(&open).await;
    assert!(output(&calls, "c0").contains("connected"), "{calls:?}");
    for _ in 0..100 {
        if accepted.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// `resources` bounds each process the shell starts: a file past `file_size_mb` is cut off and
/// an allocation past `memory_mb` fails, while the same commands under no limit succeed.
#[tokio::test(flavor = "multi_thread")]
async fn resources_bound_what_each_process_may_use() {
    let commands = [
        "python3 -c \"open('big', 'wb').write(b'x' * 3_000_000)\" 2>&1; echo status $?; wc -c < big",
        "python3 -c \"b = bytearray(600 * 1024 * 1024); print('allocated')\" 2>&1 | tail -n 1",
    ];
    let bounded = agent(&SHELL.replace(
        "timeout_secs = 20",
        "timeout_secs = 20\nresources = { memory_mb = 256, file_size_mb = 1 }",
    ));
    shell_script(&bounded, "shell", &commands);
    let calls = run(&bounded).await;
    let file = output(&calls, "c0");
    assert!(file.contains("File too large"), "{file}");
    assert!(!file.contains("\nstatus 0"), "{file}");
    assert!(file.trim_end().ends_with("1048576"), "{file}");
    assert!(output(&calls, "c1").contains("MemoryError"), "{calls:?}");

    let free = agent(SHELL);
    shell_script(&free, "shell", &commands);
    let calls = run(&free).await;
    let file = output(&calls, "c0");
    assert!(file.contains("\nstatus 0"), "{file}");
    assert!(file.trim_end().ends_with("3000000"), "{file}");
    assert!(output(&calls, "c1").contains("allocated"), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_shows_each_process_tool_s_sandbox_and_bad_keys_are_located() {
    let dir = agent(
        r#"sandbox = "read-only"
[[tools]]
builtin = "shell"
root = "work"
sandbox = "workspace-write"
network = true
[[tools]]
name = "probe"
command = ["python3", "tool.py"]
unix_sockets = true
resources = { memory_mb = 256, open_files = 128 }
[[tools]]
builtin = "read_file"
[[mcp]]
name = "notes"
command = ["python3", "tool.py"]
sandbox = "best-effort"
"#
        .replace("sandbox = \"read-only\"\n", "")
        .as_str(),
    );
    // The agent-wide default goes at the top of the file.
    let text = std::fs::read_to_string(dir.agent()).unwrap();
    dir.write("agent.toml", &format!("sandbox = \"read-only\"\n{text}"));
    dir.write("script.json", r#"[{"text": "hi"}]"#);
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let plan = stdout_json(&out);
    let tools = plan["tools"].as_array().unwrap();
    let work = std::fs::canonicalize(dir.path("work")).unwrap();
    assert_eq!(
        tools[0]["sandbox"],
        json!({"mode": "workspace-write", "network": true, "unix_sockets": false,
               "resources": {}, "writable": [work]})
    );
    assert_eq!(
        tools[1]["sandbox"],
        json!({"mode": "read-only", "network": false, "unix_sockets": true,
               "resources": {"memory_bytes": 268435456, "open_files": 128}, "writable": []})
    );
    assert_eq!(tools[2]["sandbox"], Value::Null);
    assert_eq!(
        plan["mcp"][0]["transport"]["sandbox"],
        json!({"mode": "best-effort", "network": false, "unix_sockets": false, "resources": {}})
    );
    let text = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    let text = stdout(&text);
    assert!(
        text.contains(&format!(
            "sandbox: workspace-write, network, writes {}",
            work.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("sandbox: read-only, no network, the system's UNIX sockets, at most 256 MiB of memory, 128 open files"),
        "{text}"
    );

    let bad = agent(
        r#"
[[tools]]
builtin = "read_file"
network = true
[[tools]]
name = "c"
command = ["python3", "tool.py"]
sandbox = "none"
[[tools]]
name = "d"
command = ["python3", "tool.py"]
sandbox = "off"
network = true
env = ["GITHUB_TOKEN"]
[[tools]]
builtin = "read_file"
unix_sockets = true
resources = { memory_mb = 0 }
"#,
    );
    bad.write("script.json", r#"[{"text": "hi"}]"#);
    let out = agentloop(args(&["plan", bad.agent().to_str().unwrap()])).await;
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    for expected in [
        "agent.toml:9:11: tools[0].network: `network` does not apply to the built-in tool read_file",
        "agent.toml:14:11: tools[1].sandbox: unknown variant `none`, expected one of `workspace-write`",
        "agent.toml:19:11: tools[2].network: `network` has no effect with sandbox = \"off\"",
        "agent.toml:20:8: tools[2].env[0]: GITHUB_TOKEN looks like a secret",
        "tools[3].unix_sockets: `unix_sockets` does not apply to the built-in tool read_file",
        "tools[3].resources.memory_mb: `memory_mb` must be at least 1",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}

#[path = "../../agentloop-sandbox/tests/metadata/mod.rs"]
mod metadata;

/// Under `workspace-write` a shell call cannot change a file outside its root: not its mode
/// (`chmod 666`, a set-user-ID bit on a copy of a shell), owner, times or extended attributes,
/// which Landlock does not cover; the read-only view of the file system refuses them
/// (`EROFS`), while inside the root `chmod +x`, creating, renaming and deleting work. Run as
/// root (as here), where a set-user-ID shell or a writable `/etc/passwd` would be a way to root.
#[tokio::test(flavor = "multi_thread")]
async fn the_shell_changes_no_file_s_metadata_outside_its_root() {
    let dir = agent(SHELL);
    let outside = tempfile::tempdir().unwrap();
    let files = metadata::Outside::new(outside.path());
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(outside.path()).unwrap());
    let script = metadata::script(&files, (uid == 0).then_some(65534));
    shell_script(&dir, "shell", &[&script]);
    let calls = run(&dir).await;
    let said = output(&calls, "c0");
    metadata::assert_refused_outside_and_done_inside(
        &format!("{said}\n"),
        &files,
        &dir.path("work"),
    );
}

/// The shell leaves no set-user-ID or set-group-ID program in its root, for someone to run later
/// outside the sandbox: `chmod u+s`, `chmod g+s` and `install -m 4755` are refused, where a
/// plain `chmod` works.
#[tokio::test(flavor = "multi_thread")]
async fn the_shell_leaves_no_set_user_id_program_in_its_root() {
    if !sandbox_modes_here().contains(&"workspace-write") {
        eprintln!("skipped: workspace-write cannot be enforced on this system");
        return;
    }
    let dir = agent(SHELL);
    shell_script(
        &dir,
        "shell",
        &[
            "cp /bin/true prog; chmod u+s prog; echo suid $?; chmod g+s prog; echo sgid $?; \
           install -m 4755 /bin/true prog2; echo install $?; chmod 700 prog; echo plain $?",
        ],
    );
    let calls = run(&dir).await;
    let said = output(&calls, "c0");
    for name in ["suid", "sgid", "install"] {
        assert!(said.contains(&format!("{name} 1")), "{name}: {said}");
    }
    assert!(said.contains("plain 0"), "{said}");
    assert!(said.contains("Operation not permitted"), "{said}");
    for file in ["prog", "prog2"] {
        let mode = std::fs::metadata(dir.path("work").join(file))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
            .unwrap_or(0);
        assert_eq!(mode & 0o6000, 0, "{file}: {mode:o}");
    }
}

/// The shell cannot give a file outside its root a second name inside it (a hard link, which
/// the file tools would then read and path rules judge by that name, `docs/security.md`): the
/// link is refused across the folders it may not write (`EXDEV`), a file beside the agent or
/// anywhere else alike, while a link within its root works.
#[tokio::test(flavor = "multi_thread")]
async fn the_shell_cannot_hard_link_a_file_outside_its_root_into_it() {
    if !sandbox_modes_here().contains(&"workspace-write") {
        eprintln!("skipped: workspace-write cannot be enforced on this system");
        return;
    }
    let dir = agent(SHELL);
    dir.write("beside.txt", "secret\n");
    let outside = tempfile::tempdir().unwrap();
    let far = outside.path().join("far.txt");
    std::fs::write(&far, "secret\n").unwrap();
    // The agent's folder is the shell's root; the file beside it is one level up.
    let beside = Path::new("..").join("beside.txt");
    let command = format!(
        "ln {} a; echo beside $?; ln {} b; echo far $?; echo x > own; ln own c; echo inside $?",
        beside.display(),
        far.display()
    );
    shell_script(&dir, "shell", &[&command]);
    let calls = run(&dir).await;
    let said = output(&calls, "c0");
    for name in ["beside", "far"] {
        assert!(said.contains(&format!("{name} 1")), "{name}: {said}");
    }
    assert!(said.contains("cross-device link"), "{said}");
    assert!(said.contains("inside 0"), "{said}");
    assert!(
        !dir.path("work/a").exists() && !dir.path("work/b").exists(),
        "{said}"
    );
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(std::fs::metadata(&far).unwrap().nlink(), 1);
}

/// The same, run by an ordinary user (the agentloop process without `CAP_SYS_ADMIN`), whose
/// tools get the view from a user namespace where the kernel allows one; where it does not,
/// each result says what is not enforced.
#[tokio::test(flavor = "multi_thread")]
async fn as_an_ordinary_user_the_shell_changes_no_file_s_metadata_outside_its_root() {
    const USER: u32 = 4242;
    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" || !setpriv.exists() {
        // Not root: the test above already runs as an ordinary user.
        return;
    }
    let dir = agent(SHELL);
    let outside = tempfile::tempdir().unwrap();
    let files = metadata::Outside::new(outside.path()).owned_by(USER);
    shell_script(&dir, "shell", &[&metadata::script(&files, None)]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(dir.path("work"), Some(USER), Some(USER)).unwrap();
    for file in ["agent.toml", "script.json"] {
        std::fs::set_permissions(dir.path(file), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let agent_file = dir.agent();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("/usr/bin/setpriv")
            .args([
                &format!("--reuid={USER}"),
                &format!("--regid={USER}"),
                "--clear-groups",
            ])
            .arg(env!("CARGO_BIN_EXE_agentloop"))
            .args([
                "run",
                agent_file.to_str().unwrap(),
                "--input",
                "go",
                "--json",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    let said = v["tool_calls"][0]["output"].as_str().unwrap_or_default();
    if said.contains("not enforced on this system: read-only mounts") {
        // No user namespace for an ordinary user here: said, not hidden.
        return;
    }
    metadata::assert_refused_outside_and_done_inside(
        &format!("{said}\n"),
        &files,
        &dir.path("work"),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agentloop_run_inside_a_sandbox_starts_its_own_tools() {
    // The sandbox lets no process leave a call's group (seccomp refuses setpgid), so an
    // agentloop started from a sandboxed tool (or served as a sandboxed MCP server) could start
    // none of its own tools, each of which led a group of its own ("permission denied (is it
    // executable?)"). Its tools now start in the group they are in, still confined.
    if !sandbox_modes_here().contains(&"workspace-write") {
        eprintln!("skipped: this machine has no sandbox");
        return;
    }
    let dir = agent(SHELL);
    dir.write(
        "work/inner.toml",
        r#"name = "inner"
[model]
provider = "scripted"
script = "inner.json"
[[tools]]
name = "hello"
command = ["sh", "-c", "echo hello from inside > out/inner.out; echo said hello"]
input_schema = { type = "object", properties = {} }
root = "out"
"#,
    );
    // A root apart from the inner agent's files: inside a sandbox no view can keep them
    // read-only for its tool, so its folder as root would be refused at load.
    std::fs::create_dir(dir.path("work/out")).unwrap();
    dir.write(
        "work/inner.json",
        &json!([
            {"tool_calls": [{"id": "h1", "name": "hello", "arguments": {}}]},
            {"text": "inner done"}
        ])
        .to_string(),
    );
    let inner = format!("{} run inner.toml --input go --json", bin());
    shell_script(&dir, "shell", &[&inner]);
    let calls = run(&dir).await;
    let out = output(&calls, "c0");
    let json_start = out.find('{').unwrap_or_else(|| panic!("no JSON in {out}"));
    let inner: Value = serde_json::Deserializer::from_str(&out[json_start..])
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(inner["output"], "inner done", "{out}");
    assert_eq!(inner["tool_calls"][0]["ok"], true, "{out}");
    assert!(
        inner["tool_calls"][0]["output"]
            .as_str()
            .unwrap_or_default()
            .contains("said hello"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("work/out/inner.out")).unwrap(),
        "hello from inside\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agentloop_run_inside_a_sandbox_starts_its_own_stdio_mcp_servers() {
    // A stdio MCP server led a process group of its own, which the outer sandbox refuses
    // (seccomp, `setpgid`: EPERM): an agentloop run from a sandboxed tool (or served as a
    // sandboxed MCP server) could start none. It now starts in the group it is in, still
    // confined and supervised: its tools answer, and what it left running dies when it exits,
    // not only with the outer call.
    if !sandbox_modes_here().contains(&"workspace-write") {
        eprintln!("skipped: this machine has no sandbox");
        return;
    }
    let dir = agent(SHELL);
    // Inside a sandbox no view can keep the inner agent's files read-only for its processes, so
    // a process whose folder holds them is refused at load: the inner server runs unconfined
    // (still inside the outer call's sandbox: what this test is about is its process group),
    // the inner tool with a root apart.
    std::fs::create_dir_all(dir.path("work/out")).unwrap();
    let server = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/mcp/growing_server.py");
    dir.write(
        "work/inner.toml",
        r#"name = "inner"
[model]
provider = "scripted"
script = "inner.json"
[[mcp]]
name = "grow"
command = ["sh", "server.sh"]
sandbox = "off"
"#,
    );
    // The server leaves a child running in the background, then becomes the growing server.
    dir.write(
        "work/server.sh",
        &format!(
            "sleep 60 </dev/null >/dev/null 2>&1 &\necho $! > left.pid\nexec python3 {:?}\n",
            server.display().to_string()
        ),
    );
    dir.write(
        "work/inner.json",
        &json!([
            {"tool_calls": [{"id": "a", "name": "grow__add_tool", "arguments": {}}]},
            {"tool_calls": [{"id": "n", "name": "grow__new_tool", "arguments": {}}]},
            {"text": "inner done"}
        ])
        .to_string(),
    );
    // After the inner run, still inside the outer call: is the server's child alive?
    let inner = format!(
        "{} run inner.toml --input go --json; sleep 0.5; \
         left=$(cat left.pid) && state=$(cut -d' ' -f3 /proc/$left/stat 2>/dev/null); \
         echo \"left: ${{state:-gone}}\"",
        bin()
    );
    // And a run SIGKILLed while it waits in a command tool, its server started: the server's
    // tree dies with it, though it is in no group of its own.
    dir.write(
        "work/killed.toml",
        r#"name = "killed"
[model]
provider = "scripted"
script = "killed.json"
[[mcp]]
name = "grow"
command = ["sh", "server.sh"]
sandbox = "off"
[[tools]]
name = "wait"
command = ["sh", "-c", "echo start > out/side.log; sleep 30"]
input_schema = { type = "object", properties = {} }
root = "out"
"#,
    );
    dir.write(
        "work/killed.json",
        &json!([
            {"tool_calls": [{"id": "a", "name": "grow__add_tool", "arguments": {}}]},
            {"tool_calls": [{"id": "w", "name": "wait", "arguments": {}}]},
            {"text": "never"}
        ])
        .to_string(),
    );
    let killed = format!(
        "rm -f left.pid; {} run killed.toml --input go >/dev/null 2>&1 & run=$!; i=0; \
         while [ ! -e out/side.log ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; \
         kill -9 $run; sleep 1; left=$(cat left.pid) && state=$(cut -d' ' -f3 /proc/$left/stat 2>/dev/null); \
         echo \"left: ${{state:-gone}}\"",
        bin()
    );
    shell_script(&dir, "shell", &[&inner, &killed]);
    let calls = run(&dir).await;
    let out = output(&calls, "c1");
    assert!(
        dir.path("work/out/side.log").exists(),
        "the killed run did not reach its wait tool: {out}"
    );
    assert!(
        out.contains("left: gone") || out.contains("left: Z"),
        "the killed run's server's background child outlived it: {out}"
    );
    let out = output(&calls, "c0");
    let json_start = out.find('{').unwrap_or_else(|| panic!("no JSON in {out}"));
    let inner: Value = serde_json::Deserializer::from_str(&out[json_start..])
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(inner["output"], "inner done", "{out}");
    assert_eq!(inner["tool_calls"][0]["ok"], true, "{out}");
    assert_eq!(inner["tool_calls"][1]["ok"], true, "{out}");
    assert!(
        inner["tool_calls"][1]["output"]
            .to_string()
            .contains("new_tool ran"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("work/new_tool.ran")).unwrap(),
        "yes"
    );
    // Gone, or dead and not yet reaped by the outer call's supervisor.
    assert!(
        out.contains("left: gone") || out.contains("left: Z"),
        "the server's background child outlived it: {out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agentloop_inside_a_sandbox_runs_tools_beside_files_the_sandbox_shows_it_read_only() {
    // Inside a sandbox an agentloop cannot make the view that keeps its own files read-only for
    // the processes it starts, so it refused an agent file whose command tool writes the folder
    // holding them. Where the outer sandbox already shows that folder read-only (outside the
    // outer roots), no process can rewrite them: the file loads and its tool runs, and still
    // cannot write the agent file.
    if !sandbox_modes_here().contains(&"workspace-write") {
        eprintln!("skipped: this machine has no sandbox");
        return;
    }
    let dir = agent(SHELL);
    let apart = tempfile::tempdir().unwrap();
    let inner_file = apart.path().join("inner.toml");
    std::fs::write(
        &inner_file,
        r#"name = "inner"
[model]
provider = "scripted"
script = "inner.json"
[[tools]]
name = "hello"
command = ["sh", "-c", "echo '[[tools]]' >> inner.toml; echo \"said hello, append $?\""]
input_schema = { type = "object", properties = {} }
"#,
    )
    .unwrap();
    std::fs::write(
        apart.path().join("inner.json"),
        json!([
            {"tool_calls": [{"id": "h1", "name": "hello", "arguments": {}}]},
            {"text": "inner done"}
        ])
        .to_string(),
    )
    .unwrap();
    let inner = format!(
        "{} run {} --input go --json 2>&1",
        bin(),
        inner_file.display()
    );
    shell_script(&dir, "shell", &[&inner]);
    let calls = run(&dir).await;
    let out = output(&calls, "c0");
    let json_start = out
        .find('{')
        .unwrap_or_else(|| panic!("the inner run did not start: {out}"));
    let inner: Value = serde_json::Deserializer::from_str(&out[json_start..])
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(inner["output"], "inner done", "{out}");
    assert_eq!(inner["tool_calls"][0]["ok"], true, "{out}");
    let said = inner["tool_calls"][0]["output"]
        .as_str()
        .unwrap_or_default();
    assert!(said.contains("said hello, append"), "{out}");
    assert!(
        !said.contains("append 0"),
        "the inner tool wrote its agent file: {out}"
    );
    assert!(
        !std::fs::read_to_string(&inner_file)
            .unwrap()
            .ends_with("[[tools]]\n"),
        "the inner tool wrote its agent file"
    );
}

/// `reboot(2)` with a wrong magic number: it reboots nothing, answers `EINVAL` (22) to a caller
/// the kernel lets reboot and `EPERM` (1) to one it does not.
const REBOOT_PROBE: &str = "python3 -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); \
     nr = {'x86_64': 169, 'aarch64': 142, 'riscv64': 142}[os.uname().machine]; \
     r = libc.syscall(nr, 0, 0, 0, None); print('reboot', r, ctypes.get_errno())\"";

/// Raising the open-files limit above its hard limit (256, from the entry's `resources`).
const RAISE_PROBE: &str = "python3 -c \"import resource as r; \
     r.setrlimit(r.RLIMIT_NOFILE, (256, 257)); print('raised')\" 2>&1 | tail -n 1";

/// Run as root, a sandboxed shell cannot change the machine: it makes no block device (which
/// would let it write the disk beneath the sandbox), cannot reboot, raise its resource limits
/// back or set the clock; while git, python3 and `mkfifo` work as before. A shell with
/// `sandbox = "off"` (root's capabilities but those that read memory) reaches reboot's magic
/// number check and raises the limit (where root may): the probes can tell.
#[tokio::test(flavor = "multi_thread")]
async fn as_root_a_sandboxed_shell_cannot_make_devices_reboot_or_set_the_clock() {
    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0"
        || !sandbox_modes_here().contains(&"workspace-write")
    {
        eprintln!("skipped: not root, or no sandbox here");
        return;
    }
    let limited = "timeout_secs = 20\nresources = { open_files = 256 }";
    let dir = agent(
        &format!(
            "{SHELL}\n[[tools]]\nname = \"shell_off\"\nbuiltin = \"shell\"\nroot = \"work\"\n\
             sandbox = \"off\"\n{limited}\n"
        )
        .replacen("timeout_secs = 20", limited, 1)
        .replace("allow = [\"shell\"]", "allow = [\"shell\", \"shell_off\"]"),
    );
    let work = "git init -q repo && cd repo && echo a > a && git add a && \
        git -c user.name=t -c user.email=t@t commit -q -m a && git log --oneline | wc -l && \
        python3 -c \"open('py.txt', 'w').write('py')\" && mkfifo fifo && test -p fifo && \
        echo work-ok";
    let calls: Vec<Value> = [
        ("mknod", "shell", "mknod disk b 8 0; echo status $?"),
        ("reboot", "shell", REBOOT_PROBE),
        ("raise", "shell", RAISE_PROBE),
        ("date", "shell", "date -s @$(date +%s); echo status $?"),
        ("work", "shell", work),
        ("reboot_off", "shell_off", REBOOT_PROBE),
        ("raise_off", "shell_off", RAISE_PROBE),
    ]
    .into_iter()
    .map(|(id, tool, c)| json!({"id": id, "name": tool, "arguments": {"command": c}}))
    .collect();
    dir.write(
        "script.json",
        &json!([{"tool_calls": calls}, {"text": "done"}]).to_string(),
    );
    let calls = run(&dir).await;
    let mknod = output(&calls, "mknod");
    assert!(mknod.contains("Operation not permitted"), "{mknod}");
    assert!(mknod.contains("status 1"), "{mknod}");
    assert!(!dir.path("work/disk").exists());
    assert!(
        output(&calls, "reboot").contains("reboot -1 1"),
        "{calls:?}"
    );
    let raise = output(&calls, "raise");
    assert!(
        raise.contains("not allowed to raise maximum limit"),
        "{raise}"
    );
    let date = output(&calls, "date");
    assert!(date.contains("Operation not permitted"), "{date}");
    assert!(date.contains("status 1"), "{date}");
    let work = output(&calls, "work");
    assert!(work.contains("1\nwork-ok"), "{work}");
    assert_eq!(
        std::fs::read_to_string(dir.path("work/repo/py.txt")).unwrap(),
        "py"
    );
    assert!(
        output(&calls, "reboot_off").contains("reboot -1 22"),
        "{calls:?}"
    );
    // A container's root may lack CAP_SYS_RESOURCE itself (this machine's does).
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    if effective & (1 << 24) != 0 {
        assert!(output(&calls, "raise_off").contains("raised"), "{calls:?}");
    }
}

/// On a file system that ignores case through FUSE (FAT in `fusefat`, as sshfs or rclone over
/// such a disk), each spelling of a name is a path of its own to the kernel. A command tool
/// whose root is written `work` for a folder that lists itself as `Work` writes in both
/// spellings: as its agent file names it and as a listing shows it (`ls`, a program that walks
/// its folder). It still writes nowhere else: not beside its root, not through another
/// spelling of the agent's folder. Skipped, saying why, where FUSE, root or fusefat is missing.
#[tokio::test(flavor = "multi_thread")]
async fn on_a_fuse_file_system_that_ignores_case_a_root_is_writable_as_written_and_as_listed() {
    let mount = match support::fat::FatMount::new() {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("skipped: no FUSE file system that ignores case here: {why}");
            return;
        }
    };
    let command = "exec 2>&1; cat > /dev/null; ls; \
        echo a > work/given.txt; echo given $?; \
        echo b > Work/listed.txt; echo listed $?; \
        mkdir Work/sub && echo c > Work/sub/deeper.txt; echo deeper $?; \
        echo d > beside.txt; echo beside $?; \
        echo e > WORK/third.txt; echo third $?";
    let agent = format!(
        "name = \"w\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\
         [[tools]]\nname = \"write\"\nroot = \"work\"\ncommand = [\"sh\", \"-c\", {}]\n",
        json!(command)
    );
    let dir = AgentDir::new_in(&mount.path(), &agent);
    std::fs::create_dir(dir.path("Work")).unwrap();
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "w", "name": "write", "arguments": {}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let calls = run(&dir).await;
    let out = output(&calls, "w");
    assert!(
        out.starts_with("Work\n"),
        "the folder lists itself as Work: {out}"
    );
    for wrote in ["given 0", "listed 0", "deeper 0"] {
        assert!(out.contains(wrote), "{wrote}: {out}");
    }
    for (file, text) in [
        ("Work/given.txt", "a\n"),
        ("Work/listed.txt", "b\n"),
        ("Work/sub/deeper.txt", "c\n"),
    ] {
        assert_eq!(std::fs::read_to_string(dir.path(file)).unwrap(), text);
    }
    // Outside the root, and a spelling neither written nor listed: refused, as before.
    for refused in ["beside 2", "third 2"] {
        assert!(out.contains(refused), "{refused}: {out}");
    }
    assert!(!dir.path("beside.txt").exists());
    assert!(!dir.path("Work/third.txt").exists());
}
