#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Processes that open one store file at the same instant: every one of them opens it and
//! writes, none is turned away with SQLite's "database is locked". The processes are this test
//! binary run again (one test as a child, told by `AGENTLOOP_TEST_OPEN_CHILD`), started together
//! and held at a barrier on the clock so that their opens overlap.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentloop_store::{
    SqliteJournal, SqliteResponseCache, SqliteSessions, TraceOptions, TraceSink,
};

const CHILD: &str = "AGENTLOOP_TEST_OPEN_CHILD";

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// In a child: waits for the start time, opens the store of `kind` at `path` and writes to it.
fn open_and_write(kind: &str, path: &Path, start_ms: u128) -> Result<(), String> {
    while now_ms() < start_ms {
        std::hint::spin_loop();
    }
    match kind {
        "trace" => {
            // As `run --trace` opens it; the flush writes (a checkpoint of the log).
            let sink = TraceSink::open(path, TraceOptions::default()).map_err(|e| e.to_string())?;
            sink.finish().map_err(|e| e.to_string())
        }
        "sessions" => SqliteSessions::open(path)
            .map(drop)
            .map_err(|e| e.to_string()),
        "cache" => {
            use agentloop::model::cache::ResponseCache;
            let cache = SqliteResponseCache::open(path)?;
            let answer = agentloop::ModelResponse::text("cached");
            cache.put(
                &format!("key-{}", std::process::id()),
                &answer,
                Duration::from_secs(60),
            )
        }
        "journal" => SqliteJournal::open(path)
            .map(drop)
            .map_err(|e| e.to_string()),
        other => Err(format!("no store kind {other}")),
    }
}

/// Starts `processes` children that open a new file of `kind` at once, `rounds` times, and
/// returns what the ones that failed said.
fn open_at_once(kind: &str, processes: usize, rounds: usize) -> Vec<String> {
    let dir = support::temp_dir(&format!("open-at-once-{kind}"));
    let exe = std::env::current_exe().unwrap();
    let mut failures = Vec::new();
    for round in 0..rounds {
        let path = dir.join(format!("{kind}-{round}.db"));
        // Late enough that every child is started and spinning.
        let start = now_ms() + 400;
        let children: Vec<_> = (0..processes)
            .map(|_| {
                Command::new(&exe)
                    .args(["--exact", "child_opens_the_store_it_is_told", "--nocapture"])
                    .env(CHILD, format!("{kind}\t{}\t{start}", path.display()))
                    .output_spawned()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if !out.status.success() || !text.contains("opened and written") {
                failures.push(format!(
                    "round {round}: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    failures
}

trait SpawnPiped {
    fn output_spawned(&mut self) -> std::process::Child;
}

impl SpawnPiped for Command {
    fn output_spawned(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// Not a test of its own: what each child process runs (it passes at once in the parent).
#[test]
fn child_opens_the_store_it_is_told() {
    let Ok(told) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = told.split('\t');
    let (kind, path, start) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap().parse().unwrap(),
    );
    match open_and_write(kind, Path::new(path), start) {
        Ok(()) => println!("opened and written"),
        Err(e) => panic!("{kind}: {e}"),
    }
}

#[test]
fn processes_that_open_one_new_sqlite_trace_at_once_all_open_and_write_it() {
    // Before the switch to WAL was tried again, about one open in a hundred failed here: 640
    // opens leave that unnoticed once in several hundred runs.
    let failures = open_at_once("trace", 16, 40);
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn processes_that_open_one_new_session_store_cache_or_journal_at_once_all_open_it() {
    for kind in ["sessions", "cache", "journal"] {
        let failures = open_at_once(kind, 8, 8);
        assert!(failures.is_empty(), "{kind}: {failures:#?}");
    }
}
