#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! What a hostile model's tool calls reach on the host beyond the command gate, through the
//! `agentloop` binary with a scripted model: descriptors the agentloop process inherited from
//! whoever started it.

mod support;

use serde_json::{Value, json};
use support::*;

/// An agent whose shell is rooted in `work/` under `sandbox`, running `commands` one per call.
fn shell_agent(sandbox: &str, commands: &[&str]) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "host-walls"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "shell"
root = "work"
timeout_secs = 20
sandbox = "{sandbox}"

[permissions]
allow = ["shell"]
"#
    ));
    std::fs::create_dir(dir.path("work")).unwrap();
    one_call_a_turn(
        &dir,
        "shell",
        commands.iter().map(|c| json!({"command": c})),
    );
    dir
}

/// Writes the scripted model's `script.json`: a call of `tool` a turn, with each of
/// `arguments` in order (ids `c0`, `c1`, ...), then a final answer.
fn one_call_a_turn(dir: &AgentDir, tool: &str, arguments: impl Iterator<Item = Value>) {
    let mut steps: Vec<Value> = arguments
        .enumerate()
        .map(
            |(i, a)| json!({"tool_calls": [{"id": format!("c{i}"), "name": tool, "arguments": a}]}),
        )
        .collect();
    steps.push(json!({"text": "done"}));
    dir.write("script.json", &Value::Array(steps).to_string());
}

/// `agentloop run AGENT --input go --json`, to be given more and started.
fn agentloop_run(dir: &AgentDir) -> std::process::Command {
    let mut command = std::process::Command::new(bin());
    command.args([
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "go",
        "--json",
    ]);
    command
}

/// The output of each call of a finished `--json` run, in order.
fn outputs(out: &std::process::Output) -> Vec<String> {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(out));
    let v = stdout_json(out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["output"]
                .as_str()
                .map_or_else(|| c.to_string(), str::to_owned)
        })
        .collect()
}

#[test]
fn a_descriptor_agentloop_inherited_open_on_an_outside_file_does_not_reach_the_shell() {
    // A script that holds a file open without close-on-exec (`exec 9>lock` for `flock`, a log)
    // and then runs agentloop: the descriptor is open in agentloop, and was passed on to every
    // tool process, where neither Landlock nor the read-only view refuses a write through a
    // descriptor already open. The model wrote outside the root through it, in every mode.
    let mut modes = sandbox_modes_here();
    if modes.contains(&"workspace-write") {
        modes.push("read-only");
    }
    for mode in modes {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim.log");
        std::fs::write(&victim, "before\n").unwrap();
        let dir = shell_agent(
            mode,
            &["if [ -e /proc/self/fd/7 ]; then echo fd7-open; fi; echo written >&7; echo wrote=$?"],
        );
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                r#"exec 7>>"$1"; exec "$2" run "$3" --input go --json"#,
                "sh",
            ])
            .arg(&victim)
            .arg(bin())
            .arg(dir.agent())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let calls = outputs(&out);
        assert!(!calls[0].contains("fd7-open"), "{mode}: {}", calls[0]);
        assert!(!calls[0].contains("wrote=0"), "{mode}: {}", calls[0]);
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "before\n",
            "{mode}"
        );
    }
}

#[test]
fn the_file_tools_never_read_the_agentloop_process_s_own_proc_files() {
    // The file tools run inside the agentloop process, where being non-dumpable does not help:
    // its own `/proc/self/environ` holds the provider's key. Links the model's shell made in the
    // root lead there by every road; the key reaches no result, output or trace.
    let key = "sk-walls-never-shown-0042";
    let dir = AgentDir::new(
        r#"name = "host-walls"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "shell"
root = "work"
[[tools]]
builtin = "read_file"
root = "work"
[[tools]]
builtin = "grep"
root = "work"
[[tools]]
builtin = "list_dir"
root = "work"

[permissions]
allow = ["shell", "read_file", "grep", "list_dir"]
"#,
    );
    std::fs::create_dir(dir.path("work")).unwrap();
    let links = "ln -s /proc/self/environ env; ln -s /proc proc; ln -s /proc/self self; \
                 ln -s /proc/self/fd fds; ln -s /proc/self/root root; ln -s /proc/self/cwd cwd; \
                 ln -s env again; echo made";
    let read = |id: &str, path: &str| json!({"tool_calls": [{"id": id, "name": "read_file", "arguments": {"path": path}}]});
    let mut steps = vec![
        json!({"tool_calls": [{"id": "ln", "name": "shell", "arguments": {"command": links}}]}),
    ];
    for (i, path) in [
        "env",
        "again",
        "proc/self/environ",
        "self/environ",
        "root/proc/self/environ",
        "cwd/env",
        "fds/0",
        "/proc/self/environ",
        // Climbing: as many `..` as it takes to reach `/`, and more.
        &format!("{}proc/self/environ", "../".repeat(12)),
    ]
    .iter()
    .enumerate()
    {
        steps.push(read(&format!("r{i}"), path));
    }
    steps.push(json!({"tool_calls": [
        {"id": "g", "name": "grep", "arguments": {"pattern": "OPENAI_API_K[E]Y|nev[e]r-shown"}},
        {"id": "l", "name": "list_dir", "arguments": {"path": "self"}}
    ]}));
    steps.push(json!({"text": "done"}));
    dir.write("script.json", &Value::Array(steps).to_string());
    let trace = dir.path("trace.ndjson");
    let out = agentloop_run(&dir)
        .arg("--trace")
        .arg(&trace)
        .arg("--trace-payloads")
        // The tools' root as the working folder: `/proc/self/cwd` leads into the root.
        .current_dir(dir.path("work"))
        .env("OPENAI_API_KEY", key)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    let calls = v["tool_calls"].as_array().unwrap();
    assert!(calls[0]["output"].as_str().unwrap().contains("made"), "{v}");
    for call in &calls[1..] {
        if call["tool"] == "read_file" {
            assert_eq!(call["ok"], false, "{call}");
        }
    }
    let trace = std::fs::read_to_string(&trace).unwrap();
    assert!(trace.contains("read_file"), "{trace}");
    for (what, text) in [
        ("stdout", stdout(&out)),
        ("stderr", stderr(&out)),
        ("trace", trace),
    ] {
        assert!(!text.contains(key), "the key is in {what}: {text}");
        assert!(
            !text.contains("walls-never"),
            "the key is in {what}: {text}"
        );
    }
}

/// System V IPC from Python (`ctypes`): `make KEY` makes a 4 KiB shared memory segment and
/// prints its id; `write ID TEXT` writes TEXT at its start ("attach failed" when it cannot);
/// `read ID` prints its first bytes; `remove ID` removes it; `queue KEY` makes a message queue,
/// `unqueue KEY` removes it.
const SYSV: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
what = sys.argv[1]
if what == "make":
    print(libc.shmget(int(sys.argv[2]), 4096, 0o1600))
elif what == "queue":
    print("queue", libc.msgget(int(sys.argv[2]), 0o1600))
elif what == "remove":
    libc.shmctl(int(sys.argv[2]), 0, None)
elif what == "unqueue":
    libc.msgctl(libc.msgget(int(sys.argv[2]), 0), 0, None)
else:
    addr = libc.shmat(int(sys.argv[2]), None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        print("attach failed")
    elif what == "write":
        ctypes.memmove(addr, sys.argv[3].encode(), len(sys.argv[3]))
        print("attached and wrote")
    else:
        print(ctypes.string_at(addr, 32).split(b"\0")[0].decode())
"#;

#[test]
fn a_confined_process_reaches_no_system_v_ipc_object_of_the_host() {
    // Shared memory segments and message queues are reached by number, not path: neither
    // Landlock nor the read-only view stood in the way, so a confined tool wrote another
    // process's shared memory and left a queue behind that outlived the run. The call's own IPC
    // namespace (made with the view) keeps both from it.
    if agentloop_sandbox::Support::current()
        .read_only_mounts
        .is_none()
    {
        eprintln!("skipped: no read-only view (no mount namespace) on this system");
        return;
    }
    let helper = tempfile::tempdir().unwrap();
    let sysv = helper.path().join("sysv.py");
    std::fs::write(&sysv, SYSV).unwrap();
    let py = |args: &[&str]| {
        let out = std::process::Command::new("python3")
            .arg(&sysv)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // Keys of this test's own (the pid keeps two runs apart): the queue's is looked for below.
    let key = 0x4838_0000 + i64::from(std::process::id() % 0xffff);
    let segment = py(&["make", &key.to_string()]);
    assert!(segment.parse::<i64>().is_ok_and(|id| id >= 0), "{segment}");
    py(&["write", &segment, "host's own"]);
    let queue_key = (key + 0x1_0000).to_string();
    let mut wrong = Vec::new();
    for mode in ["workspace-write", "read-only"] {
        let sysv = sysv.display();
        let dir = shell_agent(
            mode,
            &[&format!(
                "python3 {sysv} write {segment} model-was-here; python3 {sysv} queue {queue_key}"
            )],
        );
        let out = agentloop_run(&dir)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let calls = outputs(&out);
        if !calls[0].contains("attach failed") || calls[0].contains("queue -1") {
            wrong.push(format!("{mode}: {}", calls[0]));
        }
        let queues = std::fs::read_to_string("/proc/sysvipc/msg").unwrap();
        if queues
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(queue_key.as_str()))
        {
            wrong.push(format!(
                "{mode}: the tool's queue outlived the run:\n{queues}"
            ));
        }
    }
    // The host's segment is removed before anything is asserted, so that a failure leaves none.
    let seen = py(&["read", &segment]);
    py(&["remove", &segment]);
    py(&["unqueue", &queue_key]);
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(seen, "host's own");
}

/// A loopback HTTP server on `ip` that counts the connections it accepts and answers each with
/// `answer` (its port given), for ever: its port and the count.
fn counting_server(
    ip: &str,
    answer: impl Fn(u16) -> String + Send + 'static,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for mut socket in listener.incoming().flatten() {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut head = [0u8; 4096];
            let _ = socket.read(&mut head);
            let _ = socket.write_all(answer(port).as_bytes());
        }
    });
    (port, count)
}

#[test]
fn web_fetch_reaches_no_loopback_address_however_it_is_spelled_or_redirected() {
    // A server that listens on 127.0.0.1, so that a fetch let through would connect and count.
    let (port, reached) = counting_server("127.0.0.1", |_| {
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 7\r\n\r\nreached".into()
    });
    // An allowed server (127.0.0.2, by `allow_private`) whose answer redirects to it.
    let (allowed, _) = counting_server("127.0.0.2", move |_| {
        format!(
            "HTTP/1.1 302 Found\r\nlocation: http://127.1:{port}/from-redirect\r\n\
             content-length: 0\r\n\r\n"
        )
    });
    let urls: Vec<String> = [
        "127.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "0.0.0.0",
        "0",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",
        "localhost",
        "localhost.",
        "%31%32%37.0.0.1",
    ]
    .iter()
    .map(|host| format!("http://{host}:{port}/"))
    .chain([format!("http://127.0.0.2:{allowed}/redirect")])
    .collect();
    let dir = AgentDir::new(
        r#"name = "host-walls"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "web_fetch"
allow_private = ["127.0.0.2"]
timeout_secs = 10
"#,
    );
    one_call_a_turn(
        &dir,
        "web_fetch",
        urls.iter().map(|url| json!({"url": url})),
    );
    let out = agentloop_run(&dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    for (call, url) in v["tool_calls"].as_array().unwrap().iter().zip(&urls) {
        assert_eq!(call["ok"], false, "{url}: {call}");
        // `localhost.` does not resolve on every system; where it does, it is refused.
        let code = call["error"]["code"].as_str().unwrap_or_default();
        assert!(
            code == "address_refused" || (url.contains("localhost.") && code == "dns_failed"),
            "{url}: {call}"
        );
    }
    assert_eq!(v["tool_calls"].as_array().unwrap().len(), urls.len(), "{v}");
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
}
