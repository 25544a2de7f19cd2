#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! The `process` level: a run's steps go to its step log (one `write` a commit) and into the
//! file when it ends, suspends, or is taken by the next owner after a crash; every reader reads
//! a log on from the file, a frame cut short is dropped whole. Writes to the file itself made by
//! the appender are never answered before their commit, even when another process holds the
//! file's write lock (they wait in the writer's queue instead of blocking the appender's
//! thread), and the writer thread keeps the WAL from growing without bound.

mod support;

use std::task::Poll;

use agentloop::journal::{Journal, JournalError};
use agentloop_store::{Durability, JournalReader, SqliteJournal};
use support::{header, step, temp_dir};

fn process_journal(path: &std::path::Path) -> SqliteJournal {
    SqliteJournal::open(path)
        .unwrap()
        .with_durability(Durability::Process)
}

/// How many steps of run `id` the file itself holds (the step logs' are not counted).
fn rows_in_file(path: &std::path::Path, id: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM step_log s JOIN runs r USING (run_no) WHERE r.run_id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap()
}

/// The step log of run `id` (its owner's lock file).
fn log_file(path: &std::path::Path, id: &str) -> std::path::PathBuf {
    let mut folder = path.as_os_str().to_owned();
    folder.push(".owners");
    std::path::PathBuf::from(folder).join(format!("{id}.lock"))
}

/// Begins run `id` and appends its first `steps` steps, one commit each.
fn begun(journal: &SqliteJournal, id: &str, steps: u64) {
    futures::executor::block_on(async {
        journal.begin(&header(id)).await.unwrap();
        for n in 0..steps {
            journal.append(id, n, &step(n)).await.unwrap();
        }
    });
}

/// What a kill of the process driving the runs of `dir/runs.db` would leave on disk now: the
/// file, its WAL and the runs' logs, copied to `dir/dead` while they live; the copy's path.
fn killed(dir: &std::path::Path) -> std::path::PathBuf {
    let dead = dir.join("dead");
    std::fs::create_dir_all(dead.join("runs.db.owners")).unwrap();
    for name in ["runs.db", "runs.db-wal"] {
        std::fs::copy(dir.join(name), dead.join(name)).unwrap();
    }
    for entry in std::fs::read_dir(dir.join("runs.db.owners")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dead.join("runs.db.owners").join(entry.file_name()),
        )
        .unwrap();
    }
    dead.join("runs.db")
}

/// A finished run's outcome, for the journal's end.
fn outcome() -> agentloop::RunOutcome {
    let answer = agentloop::Agent::builder()
        .model(agentloop::testing::FunctionModel::new(
            |_: &agentloop::model::ModelRequest<'_>| Ok(agentloop::ModelResponse::text("done")),
        ))
        .build()
        .unwrap();
    futures::executor::block_on(answer.run("go"))
}

#[test]
fn steps_at_process_go_to_the_step_log_and_every_reader_reads_them_on_from_the_file() {
    let dir = temp_dir("process-log");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    futures::executor::block_on(async {
        journal.begin(&header("a")).await.unwrap();
        journal.append("a", 0, &step(0)).await.unwrap();
        journal
            .append_batch("a", 1, &[step(1), step(2)])
            .await
            .unwrap();
    });
    // In the run's log, not in the file yet; a reader (of this process or another) reads them
    // on from the file's.
    assert_eq!(rows_in_file(&path, "a"), 0);
    assert!(std::fs::metadata(log_file(&path, "a")).unwrap().len() > 0);
    let reader = JournalReader::open(&path).unwrap();
    let run = reader.load("a").unwrap();
    assert_eq!(run.steps, vec![step(0), step(1), step(2)]);
    let listed = reader.runs().unwrap();
    assert_eq!((listed[0].steps, listed[0].status.as_str()), (3, "running"));
    // Any run id: a subagent's holds the model's call id, newlines and all.
    let odd = "lead.call\n7 é";
    begun(&journal, odd, 2);
    assert_eq!(reader.load(odd).unwrap().steps, vec![step(0), step(1)]);
    // A step out of order is refused, as the file refuses it.
    let wrong = futures::executor::block_on(journal.append("a", 5, &step(5)));
    assert!(wrong.is_err());
    // The run's end folds them into the file, with the last step, in one commit; the log goes.
    futures::executor::block_on(journal.append_and_finish("a", 3, &step(3), &outcome())).unwrap();
    assert_eq!(rows_in_file(&path, "a"), 4);
    assert!(!log_file(&path, "a").exists());
    let run = reader.load("a").unwrap();
    assert_eq!(run.steps, vec![step(0), step(1), step(2), step(3)]);
    assert_eq!(reader.runs().unwrap()[0].status, "finished");
    drop(journal);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_step_is_not_held_by_another_processes_write_lock_and_the_runs_end_waits_for_it() {
    let dir = temp_dir("process-locked");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    let end = outcome();
    futures::executor::block_on(async {
        journal.begin(&header("a")).await.unwrap();
        journal.append("a", 0, &step(0)).await.unwrap();
        // Another connection (as another process would) takes the file's write lock.
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        // A step goes to the run's log: the file's lock does not hold it up.
        journal.append("a", 1, &step(1)).await.unwrap();
        // The run's end is written to the file: asked for while the lock is held, it is not
        // committed here and not answered (the first poll lets other runs add theirs; the next
        // ones find the lock taken and hand it to the writer thread, which waits for it).
        let mut pending = journal.finish("a", &end);
        for _ in 0..3 {
            assert!(matches!(futures::poll!(&mut pending), Poll::Pending));
        }
        other.execute_batch("COMMIT").unwrap();
        pending.await.unwrap();
    });
    assert_eq!(rows_in_file(&path, "a"), 2);
    let run = JournalReader::open(&path).unwrap().load("a").unwrap();
    assert_eq!(run.steps, vec![step(0), step(1)]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dead_owners_step_log_is_read_and_folded_by_the_next_owner_and_a_torn_frame_is_dropped() {
    let dir = temp_dir("process-dead");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    begun(&journal, "a", 3);
    let dead = killed(&dir);
    let whole = std::fs::read(log_file(&path, "a")).unwrap();
    // And a write of step 3 cut short by the kill.
    let mut logged = whole.clone();
    logged.extend_from_slice(&[40, 0, 0, 0, 1, 2, 3]);
    std::fs::write(log_file(&dead, "a"), &logged).unwrap();
    drop(journal);

    let path = dead;
    let reader = JournalReader::open(&path).unwrap();
    assert_eq!(rows_in_file(&path, "a"), 0);
    assert_eq!(reader.load("a").unwrap().steps.len(), 3);
    assert_eq!(reader.runs().unwrap()[0].steps, 3);
    // The next owner folds the log into the file before it goes on, and goes on from there.
    let next = process_journal(&path);
    next.own("a").unwrap();
    assert_eq!(rows_in_file(&path, "a"), 3);
    assert_eq!(reader.load("a").unwrap().steps.len(), 3);
    let end = outcome();
    futures::executor::block_on(async {
        next.append("a", 3, &step(3)).await.unwrap();
        next.finish("a", &end).await.unwrap();
    });
    assert_eq!(
        reader.load("a").unwrap().steps,
        vec![step(0), step(1), step(2), step(3)]
    );
    drop(next);
    // A log whose steps the file already holds (a kill between the fold and the log's
    // removal) adds none, to readers or to the next owner.
    std::fs::create_dir_all(dir.join("dead/runs.db.owners")).unwrap();
    std::fs::write(log_file(&path, "a"), &whole).unwrap();
    assert_eq!(reader.runs().unwrap()[0].steps, 4);
    assert_eq!(reader.load("a").unwrap().steps.len(), 4);
    let again = process_journal(&path);
    again.own("a").unwrap();
    assert_eq!(rows_in_file(&path, "a"), 4);
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_left_in_a_step_log_goes_on_at_power_and_a_run_not_taken_first_is_taken_by_its_write() {
    let dir = temp_dir("process-then-power");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    futures::executor::block_on(async {
        for id in ["a", "b"] {
            journal.begin(&header(id)).await.unwrap();
            journal
                .append_batch(id, 0, &[step(0), step(1)])
                .await
                .unwrap();
        }
    });
    // A kill leaves both runs' steps in their logs.
    let path = killed(&dir);
    drop(journal);
    // Taken at `power`: the logs go into the file first, and the runs go on there, whether
    // taken by `own` or (a resumed subagent's run) by their next write.
    let power = SqliteJournal::open(&path).unwrap();
    power.own("a").unwrap();
    let end = outcome();
    futures::executor::block_on(async {
        power.append("a", 2, &step(2)).await.unwrap();
        power.append_batch("b", 2, &[step(2)]).await.unwrap();
        power.finish("a", &end).await.unwrap();
        power
            .append_and_finish("b", 3, &step(3), &end)
            .await
            .unwrap();
    });
    assert_eq!(rows_in_file(&path, "a"), 3);
    assert_eq!(rows_in_file(&path, "b"), 4);
    // And another process's handle cannot take a run this one holds.
    power.own("c").ok();
    let other = process_journal(&path);
    let busy = futures::executor::block_on(other.append("c", 0, &step(0)));
    assert!(
        matches!(busy, Err(agentloop::journal::JournalError::Busy { .. })),
        "{busy:?}"
    );
    drop((power, other));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_let_go_unfinished_or_by_hand_keeps_its_logged_steps_in_the_file() {
    let dir = temp_dir("process-dropped");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    begun(&journal, "a", 1);
    // The handle goes while the run is unfinished (its future dropped): its steps stay.
    drop(journal);
    assert_eq!(rows_in_file(&path, "a"), 1);
    assert!(!log_file(&path, "a").exists());
    // So do those of a run let go by hand, which another handle then takes and goes on with.
    let journal = process_journal(&path);
    futures::executor::block_on(journal.append("a", 1, &step(1))).unwrap();
    journal.release("a");
    assert_eq!(rows_in_file(&path, "a"), 2);
    let other = process_journal(&path);
    futures::executor::block_on(other.append("a", 2, &step(2))).unwrap();
    drop((journal, other));
    assert_eq!(rows_in_file(&path, "a"), 3);
    assert!(!log_file(&path, "a").exists());
    let run = JournalReader::open(&path).unwrap().load("a").unwrap();
    assert_eq!(run.steps, vec![step(0), step(1), step(2)]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_wal_is_checkpointed_while_runs_commit_at_process() {
    const RUNS: u64 = 2000;
    let dir = temp_dir("process-checkpoint");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    let end = outcome();
    // Two commits a run: its beginning, and its steps with its end.
    futures::executor::block_on(async {
        for n in 0..RUNS {
            let id = format!("r{n}");
            journal.begin(&header(&id)).await.unwrap();
            journal.append(&id, 0, &step(n)).await.unwrap();
            journal.finish(&id, &end).await.unwrap();
        }
    });
    // Each commit appends at least one page to the WAL: with no checkpoint it would hold
    // `2 * RUNS` pages or more. The writer copies it back every few hundred commits, and the
    // WAL starts over from its beginning after each.
    let page: u64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal_pages = std::fs::metadata(&wal).unwrap().len() / page;
    assert!(
        wal_pages < RUNS,
        "the WAL holds {wal_pages} pages after {} commits",
        2 * RUNS
    );
    let reader = JournalReader::open(&path).unwrap();
    assert_eq!(reader.runs().unwrap().len() as u64, RUNS);
    assert_eq!(reader.load("r1999").unwrap().steps, vec![step(1999)]);
    drop(journal);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runs_whose_ids_differ_only_in_unsafe_characters_or_run_long_keep_logs_of_their_own() {
    let dir = temp_dir("process-names");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    // A subagent's id is its parent's and the model's call id: any text, and longer with each
    // level; the file system takes at most 255 bytes a name.
    let long = format!("{}.{}", "r".repeat(40), "call_".repeat(60));
    let ids = ["p.c1", "p:c1", "p_c1", "p/c1", long.as_str()];
    for (n, id) in ids.iter().enumerate() {
        begun(&journal, id, n as u64 + 1);
    }
    let reader = JournalReader::open(&path).unwrap();
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(reader.load(id).unwrap().steps.len(), n + 1, "{id}");
        assert_eq!(rows_in_file(&path, id), 0, "{id}");
    }
    // Killed: each run's next owner folds its own steps, and only its own.
    let dead = killed(&dir);
    drop(journal);
    let next = process_journal(&dead);
    for (n, id) in ids.iter().enumerate() {
        next.own(id).unwrap();
        assert_eq!(rows_in_file(&dead, id), n as i64 + 1, "{id}");
    }
    drop(next);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_log_under_the_former_name_of_its_run_is_read_and_taken_by_the_next_owner() {
    let dir = temp_dir("process-former");
    let path = dir.join("runs.db");
    let journal = process_journal(&path);
    begun(&journal, "p.c1", 2);
    let dead = killed(&dir);
    drop(journal);
    // Where the version before digested names kept it: its id made safe.
    let owners = dir.join("dead/runs.db.owners");
    let former = owners.join("p_c1.lock");
    let logs: Vec<_> = std::fs::read_dir(&owners)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_ne!(logs[0], former);
    std::fs::rename(&logs[0], &former).unwrap();
    let reader = JournalReader::open(&dead).unwrap();
    assert_eq!(reader.load("p.c1").unwrap().steps, vec![step(0), step(1)]);

    // Held by a live owner of that version, the run is that owner's.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(&former)
        .unwrap();
    assert!(fs4::fs_std::FileExt::try_lock_exclusive(&held).unwrap());
    let next = process_journal(&dead);
    let busy = next.own("p.c1");
    assert!(matches!(busy, Err(JournalError::Busy { .. })), "{busy:?}");
    drop(held);
    // Let go (its owner died), the next owner folds it, deletes it and goes on.
    next.own("p.c1").unwrap();
    assert_eq!(rows_in_file(&dead, "p.c1"), 2);
    assert!(!former.exists());
    futures::executor::block_on(next.append("p.c1", 2, &step(2))).unwrap();
    next.release("p.c1");
    assert_eq!(
        reader.load("p.c1").unwrap().steps,
        vec![step(0), step(1), step(2)]
    );
    // Another run's live file at that name is left alone.
    begun(&next, "p_c1", 1);
    next.own("p.c1").unwrap();
    assert_eq!(reader.load("p_c1").unwrap().steps, vec![step(0)]);
    drop(next);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_suspended_run_goes_on_at_process_running_from_its_first_step_and_takes_no_more_answers() {
    use agentloop::journal::RunStatus;
    use agentloop::permissions::{Answer, ApprovalRequest};
    let dir = temp_dir("process-goes-on");
    let path = dir.join("runs.db");
    let request = ApprovalRequest {
        call_id: "c1".into(),
        tool: "shell".into(),
        arguments: serde_json::json!({ "command": "ls" }),
        agent: String::new(),
        question: None,
    };
    {
        let journal = process_journal(&path);
        begun(&journal, "r1", 1);
        futures::executor::block_on(journal.suspend("r1", std::slice::from_ref(&request))).unwrap();
    }
    let reader = JournalReader::open(&path).unwrap();
    reader.answer("r1", "c1", Answer::AllowOnce).unwrap();
    let status = |reader: &JournalReader| {
        let runs = reader.runs().unwrap();
        runs.iter()
            .find(|r| r.run_id == "r1")
            .unwrap()
            .status
            .clone()
    };

    // Taken for its resume: still waiting until it goes on (a resume may yet be refused).
    let journal = process_journal(&path);
    journal.own("r1").unwrap();
    let run = reader.load("r1").unwrap();
    assert_eq!(run.status, RunStatus::Suspended);
    assert!(reader.waited(&run).is_some());
    assert_eq!(status(&reader), "suspended");

    // Its first step marks it running, as a commit of a step does at `power`: it is no longer
    // listed as waiting, and its answers are no longer open to change.
    futures::executor::block_on(journal.append("r1", 1, &step(1))).unwrap();
    assert_eq!(status(&reader), "running");
    assert!(reader.pending().unwrap().is_empty());
    let refused = reader.answer("r1", "c1", Answer::DenyOnce).unwrap_err();
    assert_eq!(refused.code(), "journal.not_resumable", "{refused}");
    assert_eq!(
        reader.load("r1").unwrap().approvals[0].answer,
        Some(Answer::AllowOnce)
    );
    futures::executor::block_on(journal.append("r1", 2, &step(2))).unwrap();
    assert_eq!(reader.load("r1").unwrap().steps.len(), 3);
}
