#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! The `process` level's commits made by the appender itself: a step is still never answered
//! before its commit, even when another process holds the file's write lock (the step waits in
//! the writer's queue instead of blocking the appender's thread), and the writer thread keeps
//! the WAL from growing without bound (it checkpoints; the appenders' commits never do).

mod support;

use std::task::Poll;

use agentloop::journal::Journal;
use agentloop_store::{Durability, JournalReader, SqliteJournal};
use support::{header, step, temp_dir};

fn process_journal(path: &std::path::Path) -> SqliteJournal {
    SqliteJournal::open(path)
        .unwrap()
        .with_durability(Durability::Process)
}

#[test]
fn a_step_waits_for_another_processes_write_lock_without_being_answered() {
    let dir = temp_dir("process-locked");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    futures::executor::block_on(async {
        journal.begin(&header("a")).await.unwrap();
        journal.append("a", 0, &step(0)).await.unwrap();
        // Another connection (as another process would) takes the file's write lock.
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let s1 = step(1);
        let mut pending = journal.append("a", 1, &s1);
        // Asked for while the lock is held, the step is not committed here and not answered
        // (the first poll lets other runs add their steps; the next ones find the lock taken
        // and hand the step to the writer thread, which waits for it).
        for _ in 0..3 {
            assert!(matches!(futures::poll!(&mut pending), Poll::Pending));
        }
        other.execute_batch("COMMIT").unwrap();
        // The writer thread commits it once the lock is free.
        pending.await.unwrap();
        // And the next step, with the file free, commits as before.
        journal.append("a", 2, &step(2)).await.unwrap();
    });
    let run = JournalReader::open(&path).unwrap().load("a").unwrap();
    assert_eq!(run.steps, vec![step(0), step(1), step(2)]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_wal_is_checkpointed_while_a_run_commits_at_process() {
    const STEPS: u64 = 4000;
    let dir = temp_dir("process-checkpoint");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    futures::executor::block_on(async {
        journal.begin(&header("a")).await.unwrap();
        for n in 0..STEPS {
            journal.append("a", n, &step(n)).await.unwrap();
        }
    });
    // Each commit appends at least one page to the WAL: with no checkpoint it would hold
    // `STEPS` pages or more. The writer copies it back every few hundred commits, and the WAL
    // starts over from its beginning after each.
    let page: u64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal_pages = std::fs::metadata(&wal).unwrap().len() / page;
    assert!(
        wal_pages < STEPS / 2,
        "the WAL holds {wal_pages} pages after {STEPS} commits"
    );
    let run = JournalReader::open(&path).unwrap().load("a").unwrap();
    assert_eq!(run.steps.len() as u64, STEPS);
    drop(journal);
    let _ = std::fs::remove_dir_all(&dir);
}
