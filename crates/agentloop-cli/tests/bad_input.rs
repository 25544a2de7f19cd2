#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Bad input of any kind gets a clear error and loses no data: it never crashes, hangs or grows
//! the process without bound. Each test gives `agentloop` one kind of bad input and holds it to a
//! prompt end with a documented exit code and a message, never a panic or an abort. The process
//! runs under a time limit (a hang fails the test instead of hanging it) and a memory limit.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::bin;

/// Runs `agentloop ARGS` in `dir` with stdin from `stdin` (or nothing), under `ulimit -v` (3 GiB)
/// and killed after `limit`: `None` when it was still running then.
fn bounded(dir: &Path, args: &[&str], stdin: Option<&Path>, limit: Duration) -> Option<Output> {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 3145728; exec \"$0\" \"$@\"")
        .arg(bin())
        .args(args)
        .current_dir(dir)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).unwrap()),
        None => cmd.stdin(Stdio::null()),
    };
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Some(Output {
        status: child.wait().unwrap(),
        stdout,
        stderr,
    })
}

/// [`bounded`], which must end within 20 s with `code`, no panic, and stderr naming `says`.
fn ends_with(dir: &Path, args: &[&str], stdin: Option<&Path>, code: i32, says: &str) -> String {
    let out = bounded(dir, args, stdin, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("agentloop {args:?} did not end within 20 s"));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: stderr: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(
        err.contains(says),
        "{args:?}: stderr does not say {says:?}: {err}"
    );
    err
}

fn mkfifo(path: &Path) -> bool {
    Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

const SCRIPTED: &str = "name = \"a\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n";

fn scripted_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agent.toml"), SCRIPTED).unwrap();
    std::fs::write(dir.path().join("s.json"), r#"[{"text": "hi"}]"#).unwrap();
    dir
}

#[test]
fn agent_files_that_are_fifos_devices_or_huge_are_refused_without_reading_them() {
    let dir = scripted_dir();
    let d = dir.path();
    assert!(mkfifo(&d.join("fifo.toml")), "mkfifo");
    // A FIFO nobody writes would block the open forever; /dev/zero would be read forever.
    for (file, says) in [
        ("fifo.toml", "FIFO"),
        ("/dev/zero", "character device"),
        (".", "folder"),
    ] {
        ends_with(d, &["plan", file], None, 3, says);
    }
    let huge = d.join("huge.toml");
    let mut text = SCRIPTED.to_owned();
    text.push_str(&format!("# {}\n", "x".repeat(17 * 1024 * 1024)));
    std::fs::write(&huge, text).unwrap();
    ends_with(d, &["plan", "huge.toml"], None, 3, "larger than");
    // The files the agent file names are read the same way: every one is a problem at its key.
    std::fs::write(
        d.join("named.toml"),
        "name = \"a\"\ninstructions_file = \"/dev/zero\"\n[model]\nprovider = \"scripted\"\n\
         script = \"fifo.toml\"\n[permissions]\nstore = \"/dev/urandom\"\n",
    )
    .unwrap();
    let err = ends_with(d, &["plan", "named.toml"], None, 3, "3 problems");
    for key in ["instructions_file", "model.script", "permissions.store"] {
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn an_input_that_never_ends_stops_at_the_bound() {
    let dir = scripted_dir();
    let d = dir.path();
    let zero = Path::new("/dev/zero");
    ends_with(
        d,
        &["run", "agent.toml", "--input-file", "/dev/zero"],
        None,
        1,
        "larger than",
    );
    ends_with(d, &["run", "agent.toml"], Some(zero), 1, "larger than");
    ends_with(
        d,
        &["run", "agent.toml", "--input-file", "."],
        None,
        1,
        "folder",
    );
}

/// Writes `n` agent files, `d0.toml` … `d{n-1}.toml`, each running the next as a subagent.
/// `plan d0.toml` and `run d0.toml` in `dir` both end with exit 3, saying `says`.
fn refused_by_plan_and_run(dir: &Path, says: &str) {
    ends_with(dir, &["plan", "d0.toml"], None, 3, says);
    ends_with(dir, &["run", "d0.toml", "--input", "hi"], None, 3, says);
}

/// `plan d0.toml` in `dir` succeeds, within a generous bound.
fn plans_within_30_s(dir: &Path) {
    let out = bounded(dir, &["plan", "d0.toml"], None, Duration::from_secs(30))
        .expect("plan did not end within 30 s");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn chain_of_subagents(dir: &Path, n: usize) {
    tree_of_subagents(dir, n, 1);
}

/// `n` files, each but the last naming the next from `width` tools.
fn tree_of_subagents(dir: &Path, n: usize, width: usize) {
    std::fs::write(dir.join("s.json"), r#"[{"text": "hi"}]"#).unwrap();
    for i in 0..n {
        let mut text = format!(
            "name = \"d{i}\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\
             [limits]\nmax_depth = 32\n"
        );
        for t in (0..width).filter(|_| i + 1 < n) {
            text.push_str(&format!(
                "[[tools]]\nname = \"sub{t}\"\nagent = \"d{}.toml\"\n",
                i + 1
            ));
        }
        std::fs::write(dir.join(format!("d{i}.toml")), text).unwrap();
    }
}

#[test]
fn a_deep_chain_of_subagent_files_is_planned_promptly_and_a_deeper_one_refused() {
    // 33 files: the top agent and 32 levels of subagents, as deep as `max_depth` goes. Each
    // file's fingerprint holds its subagent's, and was computed twice per level (2^32 builds).
    let deep = tempfile::tempdir().unwrap();
    chain_of_subagents(deep.path(), 33);
    plans_within_30_s(deep.path());
    // 3000 files overflowed the stack while loading them (an abort): now refused at the line
    // that goes past the bound.
    let deeper = tempfile::tempdir().unwrap();
    chain_of_subagents(deeper.path(), 3000);
    refused_by_plan_and_run(
        deeper.path(),
        "tools[0].agent: subagent files nest more than 32 deep",
    );
}

#[test]
fn a_diamond_of_subagent_files_is_refused_promptly_not_loaded_once_a_path() {
    // Each of 21 files names the next twice: 2^20 paths, each loaded (a hang), and a tree of a
    // million agents to assemble. Each file is read once; the tree is refused where it passes
    // 256 agents. A small diamond plans.
    let wide = tempfile::tempdir().unwrap();
    tree_of_subagents(wide.path(), 21, 2);
    refused_by_plan_and_run(
        wide.path(),
        "tools[1].agent: the tree of subagents grows past 256 agents here",
    );
    let small = tempfile::tempdir().unwrap();
    tree_of_subagents(small.path(), 4, 2);
    plans_within_30_s(small.path());
}

#[test]
fn a_max_depth_past_the_bound_is_refused_before_agents_hand_off_into_a_stack_overflow() {
    // Two agents that hand the conversation back and forth, each hand-off a level deeper: under
    // `max_depth = 1000` the run overflowed the stack and aborted after about a hundred.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (me, other) in [("a", "b"), ("b", "a")] {
        let calls: Vec<serde_json::Value> = (0..400)
            .map(|i| {
                serde_json::json!({"tool_calls": [
                    {"id": format!("c{i}"), "name": format!("transfer_to_{other}"), "arguments": {}}
                ]})
            })
            .collect();
        std::fs::write(
            d.join(format!("{me}.json")),
            serde_json::to_string(&calls).unwrap(),
        )
        .unwrap();
        std::fs::write(
            d.join(format!("{me}.toml")),
            format!(
                "name = \"{me}\"\n[model]\nprovider = \"scripted\"\nscript = \"{me}.json\"\n\
                 [limits]\nmax_depth = 1000\nmax_turns = 0\nmax_model_calls = 0\n\
                 max_tool_calls = 0\n[[handoffs]]\nagent = \"{other}.toml\"\n"
            ),
        )
        .unwrap();
    }
    let err = ends_with(
        d,
        &["run", "a.toml", "--input", "hi"],
        None,
        3,
        "max_depth is at most 32",
    );
    assert!(err.contains("limits.max_depth"), "{err}");
    // At the bound, the hand-offs run until the depth stops them: an error, not an abort.
    for me in ["a", "b"] {
        let path = d.join(format!("{me}.toml"));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("max_depth = 1000", "max_depth = 32")).unwrap();
    }
    let out = bounded(
        d,
        &["run", "a.toml", "--input", "hi", "--json"],
        None,
        Duration::from_secs(60),
    )
    .expect("the run did not end within 60 s");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(1..=13)),
        "{:?}: {err}",
        out.status
    );
    assert!(!err.contains("overflow"), "{err}");
}

#[test]
fn a_glob_too_large_to_compile_is_refused_at_its_line_before_the_run() {
    // It parsed, so the file was accepted, and matching a call panicked inside the permissions
    // gate (exit 7 with the whole regex in the message).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("s.json"),
        r#"[{"tool_calls": [{"id": "c1", "name": "t", "arguments": {"path": "a.txt"}}]}, {"text": "done"}]"#,
    )
    .unwrap();
    std::fs::write(
        d.join("agent.toml"),
        format!(
            "name = \"a\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\
             [[tools]]\nname = \"t\"\ncommand = [\"true\"]\n\
             input_schema = {{ type = \"object\", properties = {{ path = {{ type = \"string\" }} }} }}\n\
             [[permissions.rules]]\ntool = \"t\"\npermission = \"deny\"\n\
             path_glob = {{ field = \"path\", glob = \"{}\" }}\n",
            "*a".repeat(500_000)
        ),
    )
    .unwrap();
    let err = ends_with(
        d,
        &["run", "agent.toml", "--input", "hi"],
        None,
        3,
        "permissions.rules[0].path_glob.glob: not a valid glob",
    );
    assert!(
        err.len() < 2000,
        "the message is short: {} bytes",
        err.len()
    );
}

/// The tables of the SQLite file at `path`, sorted, and its journal mode.
fn sqlite_shape(path: &Path) -> (Vec<String>, String) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    tables.sort();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    (tables, mode)
}

#[test]
fn a_trace_is_never_written_into_another_sqlite_database() {
    let dir = scripted_dir();
    let d = dir.path();
    // Another program's database, and a session store of agentloop's own.
    let other = d.join("app.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('keep me');")
        .unwrap();
    let out = bounded(
        d,
        &[
            "run",
            "agent.toml",
            "--input",
            "hi",
            "--session",
            "s",
            "--sessions",
            "sessions.db",
        ],
        None,
        Duration::from_secs(20),
    )
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in ["app.db", "sessions.db"] {
        let before = sqlite_shape(&d.join(file));
        // Its tables were created beside the file's own (`IF NOT EXISTS`), and the run went on.
        ends_with(
            d,
            &["run", "agent.toml", "--input", "hi", "--trace", file],
            None,
            1,
            "is not an agentloop trace",
        );
        assert_eq!(sqlite_shape(&d.join(file)), before, "{file} was changed");
    }
    // A new file, or a trace, is written as before.
    for _ in 0..2 {
        let out = bounded(
            d,
            &["run", "agent.toml", "--input", "hi", "--trace", "t.db"],
            None,
            Duration::from_secs(20),
        )
        .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn an_ndjson_trace_is_never_appended_to_a_file_that_holds_something_else() {
    let dir = scripted_dir();
    let d = dir.path();
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    std::fs::write(d.join("photo.ndjson"), &png).unwrap();
    std::fs::write(d.join("server.ndjson"), "2026-12-05 started\n").unwrap();
    for file in ["photo.ndjson", "server.ndjson"] {
        ends_with(
            d,
            &["run", "agent.toml", "--input", "hi", "--trace", file],
            None,
            1,
            "is not an agentloop trace",
        );
    }
    assert_eq!(std::fs::read(d.join("photo.ndjson")).unwrap(), png);
    assert_eq!(
        std::fs::read_to_string(d.join("server.ndjson")).unwrap(),
        "2026-12-05 started\n"
    );
    // A named pipe is refused at once, by `run` and by `trace show`, rather than waited on.
    if mkfifo(&d.join("pipe.ndjson")) {
        for args in [
            &[
                "run",
                "agent.toml",
                "--input",
                "hi",
                "--trace",
                "pipe.ndjson",
            ][..],
            &["trace", "show", "pipe.ndjson"][..],
        ] {
            ends_with(d, args, None, 1, "not a regular file");
        }
    }
}

#[test]
fn an_eval_dataset_that_is_a_pipe_or_a_device_is_refused_at_once() {
    let dir = scripted_dir();
    let d = dir.path();
    let mut cases = vec!["/dev/zero".to_owned()];
    if mkfifo(&d.join("cases.toml")) {
        cases.push("cases.toml".to_owned());
    }
    for path in &cases {
        ends_with(
            d,
            &["eval", "agent.toml", "--cases", path],
            None,
            3,
            "not a regular file",
        );
    }
}

/// A file's bytes and modification time, and the names in its folder: what a command that
/// refuses the file must leave as it was.
fn untouched(path: &Path) -> (Vec<u8>, std::time::SystemTime, Vec<std::ffi::OsString>) {
    let mut names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    (std::fs::read(path).unwrap(), modified, names)
}

#[test]
fn a_file_that_is_no_journal_is_refused_by_every_journal_command_and_left_unchanged() {
    let dir = scripted_dir();
    let d = dir.path();
    // An empty file, a text file, and another program's SQLite database with no tables yet.
    std::fs::write(d.join("empty.db"), b"").unwrap();
    std::fs::write(d.join("notes.db"), "my notes\n").unwrap();
    rusqlite::Connection::open(d.join("app.db"))
        .unwrap()
        .execute_batch("PRAGMA user_version = 7;")
        .unwrap();
    for file in ["empty.db", "notes.db", "app.db"] {
        let reading: [&[&str]; 8] = [
            &["journal", "list", "--journal", file],
            &["journal", "list", "--json", "--journal", file],
            &["journal", "show", "r1", "--journal", file],
            &["approvals", "list", "--journal", file],
            &["questions", "list", "--journal", file],
            &["resume", "r1", "--journal", file],
            &["journal", "fork", "r1", "--at", "0", "--journal", file],
            &[
                "approve",
                "r1",
                "--call",
                "c1",
                "--allow",
                "--journal",
                file,
            ],
        ];
        for args in reading {
            let before = untouched(&d.join(file));
            // The mtime has a resolution: a write within it would not show.
            std::thread::sleep(Duration::from_millis(20));
            ends_with(d, args, None, 9, "is not an agentloop journal");
            assert!(
                untouched(&d.join(file)) == before,
                "{args:?} changed {file}"
            );
        }
    }
    // A run may make a new (or empty) file its journal, never a file that holds something else.
    for file in ["notes.db", "app.db"] {
        let before = untouched(&d.join(file));
        std::thread::sleep(Duration::from_millis(20));
        ends_with(
            d,
            &["run", "agent.toml", "--input", "hi", "--journal", file],
            None,
            9,
            "is not an agentloop journal",
        );
        assert!(untouched(&d.join(file)) == before, "run changed {file}");
    }
    for file in ["empty.db", "new.db"] {
        let out = bounded(
            d,
            &["run", "agent.toml", "--input", "hi", "--journal", file],
            None,
            Duration::from_secs(20),
        )
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{file}: {err}");
        let out = bounded(
            d,
            &["journal", "list", "--journal", file],
            None,
            Duration::from_secs(20),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{file}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("finished"));
    }
}

/// A file name that sets a terminal's window title when printed raw (OSC 0, ended by BEL).
const PWNED: &str = "x\u{1b}]0;pwned\u{7}";

#[test]
fn a_path_holding_terminal_escapes_is_shown_escaped_in_every_message() {
    let dir = scripted_dir();
    let d = dir.path();
    let named = |ext: &str| format!("{PWNED}.{ext}");
    // An agent file by that name with a problem in it, an empty "journal", and names of files
    // that do not exist.
    std::fs::write(
        d.join(named("toml")),
        format!("{SCRIPTED}unknown_key = 1\n"),
    )
    .unwrap();
    std::fs::write(d.join(named("db")), b"").unwrap();
    let (toml, db, missing) = (named("toml"), named("db"), format!("missing-{PWNED}.txt"));
    let commands: [(&[&str], i32); 7] = [
        (&["plan", &toml], 3),
        (&["plan", &missing], 3),
        (&["run", "agent.toml", "--input-file", &missing], 1),
        (&["journal", "list", "--journal", &db], 9),
        (&["trace", "show", &missing], 1),
        (&["eval", "agent.toml", "--cases", &missing], 3),
        (
            &[
                "run",
                "agent.toml",
                "--input",
                "hi",
                "--trace",
                &format!("{missing}/t.ndjson"),
            ],
            1,
        ),
    ];
    for (args, code) in commands {
        let out = bounded(d, args, None, Duration::from_secs(20)).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err:?}");
        assert!(
            !err.contains('\u{1b}') && !err.contains('\u{7}'),
            "{args:?} printed the escape raw: {err:?}"
        );
        assert!(
            err.contains("x\\u{1b}]0;pwned\\u{7}"),
            "{args:?} does not name the file: {err:?}"
        );
    }
    // A line break in a path the command was given forges no line of its message either.
    let forged = "a\nagentloop: all is well.toml";
    let out = bounded(d, &["plan", forged], None, Duration::from_secs(20)).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err:?}");
    assert!(
        err.contains("a\\u{a}agentloop: all is well.toml"),
        "{err:?}"
    );
    assert!(!err.contains("\nagentloop: all is well"), "{err:?}");
}

#[test]
fn a_line_break_in_a_path_forges_no_line_of_the_stores_or_evals_errors() {
    // The store and eval name the file in their own errors and warnings, which the command
    // prints after its own words: they show the path as the command does, escaped.
    let dir = scripted_dir();
    let d = dir.path();
    let forged = |stem: &str, ext: &str| format!("{stem}\nagentloop: all is well.{ext}");
    let (db, missing, cases, baseline, trace, lines) = (
        forged("empty", "db"),
        forged("missing", "db"),
        forged("cases", "toml"),
        forged("baseline", "json"),
        forged("folder", "ndjson"),
        forged("lines", "ndjson"),
    );
    std::fs::write(d.join(&db), b"").unwrap();
    std::fs::write(d.join(&cases), "cases = 1\n").unwrap();
    std::fs::write(
        d.join("cases.toml"),
        "[[cases]]\nname = \"c\"\ninput = \"hi\"\n",
    )
    .unwrap();
    std::fs::write(d.join(&baseline), "not json").unwrap();
    std::fs::create_dir(d.join(&trace)).unwrap();
    std::fs::write(d.join(&lines), "not a record\n").unwrap();
    let missing_cases = forged("missing", "toml");
    let commands: [(&[&str], i32); 8] = [
        (&["journal", "list", "--journal", &db], 9),
        (&["journal", "list", "--journal", &missing], 9),
        (&["journal", "show", "r1", "--journal", &db], 9),
        (&["trace", "show", &trace], 1),
        (&["trace", "list", &lines], 0),
        (&["eval", "agent.toml", "--cases", &cases], 3),
        (&["eval", "agent.toml", "--cases", &missing_cases], 3),
        (
            &[
                "eval",
                "agent.toml",
                "--cases",
                "cases.toml",
                "--baseline",
                &baseline,
            ],
            3,
        ),
    ];
    for (args, code) in commands {
        let out = bounded(d, args, None, Duration::from_secs(20)).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err:?}");
        assert!(
            err.contains("\\u{a}agentloop: all is well"),
            "{args:?} does not name the file: {err:?}"
        );
        assert!(
            !err.contains("\nagentloop: all is well"),
            "{args:?} printed the line break raw: {err:?}"
        );
    }
}
