//! The writer thread: it takes every write that is ready together into one group, applies each
//! in a savepoint of its own, commits the group once (at `power`, with one fsync) and only then
//! answers each; it keeps each run's tail, stamps the runs' rows and checkpoints the WAL. Apart
//! from the handle, which queues writes to it or commits a group itself under the same lock.

use std::collections::HashMap;
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use agentloop::journal::JournalError;
use rusqlite::{Connection, params};

use crate::journal::log::Logged;
use crate::journal::{io, now_ms};

use super::rows::{Tail, fork, insert_run, insert_step, tail};
use super::{Command, Done, Durability, Fault, Job, MAX_GROUP, Queued, Shared, hang};

/// How long the row of a run whose steps this writer appends may go unwritten: its
/// `updated_ms` is at most this much older than its last step. Writing the row with every
/// commit would add a page to each (the `runs` table's), and its copy at the next checkpoint.
const STAMP_EVERY_MS: i64 = 1000;

/// What the writes of one group did, kept apart until its commit holds them.
#[derive(Default)]
struct Group {
    /// The tails the group moved.
    moved: HashMap<String, Tail>,
    /// The steps it appended (their numbers, and their places among all the writer's
    /// appends, for the crash tests' faults).
    appended: Vec<(u64, u64)>,
    /// The runs whose last write in the group is a step: marked running at its end.
    running: std::collections::BTreeSet<String>,
    /// The runs whose row the group wrote: when, if it wrote them running (`None`: suspended
    /// or finished).
    stamped: HashMap<String, Option<i64>>,
}

pub(super) struct Writer {
    /// Each run's last committed step.
    pub(super) last: HashMap<String, Tail>,
    /// When this writer last wrote each run's row as running, for the runs it has not written
    /// otherwise since. One owner per run, so no other writer changes these rows meanwhile.
    pub(super) stamped: HashMap<String, i64>,
    pub(super) fault: Option<Fault>,
    /// How many steps this writer committed, over every run.
    pub(super) written: u64,
    /// How many suspensions it committed, over every run (for the crash tests' faults).
    pub(super) suspensions: u64,
    /// The `synchronous` level the connection is at.
    pub(super) synchronous: Option<Durability>,
    /// Commits since the last checkpoint.
    pub(super) uncheckpointed: u32,
    /// An appender asked the writer thread for a checkpoint it has not run yet.
    pub(super) checkpoint_asked: bool,
}

/// How many commits the WAL takes before the writer copies it back into the file: about
/// SQLite's own default of 1,000 pages, at one to two pages a commit.
const CHECKPOINT_EVERY: u32 = 512;

/// How long the writer thread waits for another process's write lock, as every connection of
/// this crate does; an appender committing itself never waits (it queues its write instead).
const BUSY_TIMEOUT: Duration = crate::BUSY_WAIT;

pub(super) fn serve(shared: &Mutex<Shared>, rx: &mpsc::Receiver<Queued>) {
    let take = |group: &mut Vec<Job>, forgotten: &mut Vec<String>, queued: Queued| match queued {
        Queued::One(job) => group.push(job),
        Queued::Many(jobs) => group.extend(jobs),
        Queued::Checkpoint => {}
        Queued::Forget(run_id) => forgotten.push(run_id),
        Queued::Stop => {}
    };
    let mut stopping = false;
    while !stopping && let Ok(first) = rx.recv() {
        let mut group = Vec::new();
        let mut forgotten = Vec::new();
        stopping = matches!(first, Queued::Stop);
        take(&mut group, &mut forgotten, first);
        while !stopping && group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(queued) => {
                    stopping = matches!(queued, Queued::Stop);
                    take(&mut group, &mut forgotten, queued);
                }
                Err(_) => break,
            }
        }
        let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
        let Shared { conn, writer } = &mut *guard;
        if !group.is_empty() {
            writer.commit(conn, group);
        }
        for run_id in forgotten {
            writer.forget(&run_id);
        }
        if writer.checkpoint_due() {
            // A checkpoint that cannot finish now (a reader holds old pages) is retried after
            // the next commits; the WAL keeps every commit meanwhile.
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
            writer.uncheckpointed = 0;
        }
        writer.checkpoint_asked = false;
    }
}

/// Runs a statement of the writer's transactions (`BEGIN IMMEDIATE`, `COMMIT`, savepoints),
/// prepared once for the connection: `rusqlite::Transaction` parses them anew each time, a
/// cost every commit would pay.
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Ends the open transaction, undoing it; an error is not reported, as with a dropped
/// `rusqlite::Transaction` (the connection is left out of the transaction either way).
fn roll_back(conn: &Connection) {
    if !conn.is_autocommit() {
        let _ = exec(conn, "ROLLBACK");
    }
}

impl Writer {
    pub(super) fn forget(&mut self, run_id: &str) {
        self.last.remove(run_id);
        self.stamped.remove(run_id);
    }

    pub(super) fn checkpoint_due(&self) -> bool {
        self.uncheckpointed >= CHECKPOINT_EVERY
    }

    /// Sets the connection's `synchronous` level for a commit at `level`.
    fn set_level(&mut self, conn: &Connection, level: Durability) -> rusqlite::Result<()> {
        if self.synchronous != Some(level) {
            conn.pragma_update(None, "synchronous", level.synchronous())?;
            self.synchronous = Some(level);
        }
        Ok(())
    }

    /// Opens a transaction at `level` without waiting for another process's write lock: false
    /// (and nothing open) when it cannot be had at once.
    pub(super) fn begin_now(&mut self, conn: &Connection, level: Durability) -> bool {
        if self.set_level(conn, level).is_err() || conn.busy_timeout(Duration::ZERO).is_err() {
            return false;
        }
        let began = exec(conn, "BEGIN IMMEDIATE").is_ok();
        if conn.busy_timeout(BUSY_TIMEOUT).is_err() {
            roll_back(conn);
            return false;
        }
        began
    }

    /// Writes a group in one transaction, commits it once at the strongest level any of its
    /// writes asked for, then answers each.
    pub(super) fn commit(&mut self, conn: &mut Connection, group: Vec<Job>) {
        let level = if group.iter().any(|j| j.durability == Durability::Power) {
            Durability::Power
        } else {
            Durability::Process
        };
        if let Err(e) = self.set_level(conn, level) {
            return answer_all(group, &io(e));
        }
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
            return answer_all(group, &io(e));
        }
        self.commit_begun(conn, group);
    }

    /// [`Writer::commit`] once its transaction is open.
    pub(super) fn commit_begun(&mut self, conn: &Connection, group: Vec<Job>) {
        let mut state = Group::default();
        let mut results = Vec::with_capacity(group.len());
        let mut replies = Vec::with_capacity(group.len());
        // A write alone in its transaction needs no savepoint: its failure rolls all back.
        let alone = group.len() == 1;
        let mut suspensions = 0;
        for job in group {
            let suspension = matches!(job.command, Command::Suspend { .. });
            let result = if alone {
                self.apply(conn, job.command, &mut state)
            } else {
                self.apply_undoable(conn, job.command, &mut state)
            };
            suspensions += u64::from(suspension && result.is_ok());
            results.push(result);
            replies.push(job.reply);
        }
        if alone && results.iter().any(Result::is_err) {
            roll_back(conn);
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
            return;
        }
        let marked = self.mark_running(conn, &mut state);
        if let Err(e) = marked.and_then(|()| exec(conn, "COMMIT")) {
            roll_back(conn);
            let e = io(format!("the commit failed: {e}"));
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result.and(Err(e.clone())));
            }
            return;
        }
        self.last.extend(state.moved);
        for (run_id, stamp) in state.stamped {
            match stamp {
                Some(at) => self.stamped.insert(run_id, at),
                None => self.stamped.remove(&run_id),
            };
        }
        self.written += state.appended.len() as u64;
        let suspended = self.suspensions..self.suspensions + suspensions;
        self.suspensions += suspensions;
        self.uncheckpointed = self.uncheckpointed.saturating_add(1);
        match self.fault {
            Some(Fault::AfterSuspend(n)) if suspended.contains(&n) => {
                hang(&format!("after suspension {n}"))
            }
            Some(Fault::AfterStep(n)) if state.appended.iter().any(|a| a.0 == n) => {
                hang(&format!("after step {n}"))
            }
            Some(Fault::AfterWrite(n)) if state.appended.iter().any(|a| a.1 == n) => {
                hang(&format!("after write {n}"))
            }
            _ => {}
        }
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result);
        }
    }

    /// [`Writer::apply`] inside a savepoint of its own: a write that fails is undone alone.
    fn apply_undoable(
        &self,
        conn: &Connection,
        command: Command,
        group: &mut Group,
    ) -> Result<Done, JournalError> {
        exec(conn, "SAVEPOINT write").map_err(io)?;
        // What the group knew of the write's run before it, put back with the rows when the
        // write is undone: a tail moved by a write that is rolled back would be wrong.
        let run_id = command.run_id().to_owned();
        let before = (
            group.moved.get(&run_id).cloned(),
            group.appended.len(),
            group.running.contains(&run_id),
            group.stamped.get(&run_id).copied(),
        );
        match self.apply(conn, command, group) {
            Ok(done) => exec(conn, "RELEASE write").map(|()| done).map_err(io),
            Err(e) => {
                let _ = exec(conn, "ROLLBACK TO write").and_then(|()| exec(conn, "RELEASE write"));
                let (moved, appended, running, stamped) = before;
                match moved {
                    Some(tail) => group.moved.insert(run_id.clone(), tail),
                    None => group.moved.remove(&run_id),
                };
                group.appended.truncate(appended);
                if !running {
                    group.running.remove(&run_id);
                }
                match stamped {
                    Some(stamp) => group.stamped.insert(run_id, stamp),
                    None => group.stamped.remove(&run_id),
                };
                Err(e)
            }
        }
    }

    /// Marks running each run a step was appended to (a suspended run goes on), once a group
    /// rather than once a step, and only where its row says otherwise or was written more
    /// than [`STAMP_EVERY_MS`] ago.
    fn mark_running(&self, conn: &Connection, state: &mut Group) -> rusqlite::Result<()> {
        let now = now_ms();
        for run_id in &state.running {
            let stamp = match state.stamped.get(run_id) {
                Some(stamp) => *stamp,
                None => self.stamped.get(run_id).copied(),
            };
            if stamp.is_some_and(|at| at <= now && now - at < STAMP_EVERY_MS) {
                continue;
            }
            conn.prepare_cached(
                "UPDATE runs SET status = 'running', updated_ms = ?2 WHERE run_id = ?1",
            )?
            .execute(params![run_id, now])?;
            state.stamped.insert(run_id.clone(), Some(now));
        }
        Ok(())
    }

    fn tail(
        &self,
        conn: &Connection,
        moved: &HashMap<String, Tail>,
        run_id: &str,
    ) -> Result<Tail, JournalError> {
        match moved.get(run_id).or_else(|| self.last.get(run_id)) {
            Some(t) => Ok(t.clone()),
            None => tail(conn, run_id),
        }
    }

    /// Appends step `seq` of run `run_id`, chained to the run's last one.
    fn append(
        &self,
        conn: &Connection,
        run_id: String,
        seq: u64,
        step: &str,
        group: &mut Group,
    ) -> Result<(), JournalError> {
        let last = self.tail(conn, &group.moved, &run_id)?;
        let expected = last.seq.map_or(0, |s| s + 1);
        if seq != expected {
            return Err(io(format!(
                "run {run_id}: step {seq} written out of order (expected step {expected})"
            )));
        }
        let sum = insert_step(conn, last.run_no, seq, step, &last.sum)?;
        let nth = self.written + group.appended.len() as u64;
        if self.fault == Some(Fault::InStep(seq)) {
            hang(&format!("in the write of step {seq}"));
        }
        if self.fault == Some(Fault::InWrite(nth)) {
            hang(&format!("in write {nth}"));
        }
        group.appended.push((seq, nth));
        group.running.insert(run_id.clone());
        group.moved.insert(
            run_id,
            Tail {
                seq: Some(seq),
                sum,
                ..last
            },
        );
        Ok(())
    }

    /// Writes the steps of run `run_id`'s log that follow the file's last one, chained on from
    /// it (steps the file holds already, folded before a crash cut the log's removal short,
    /// are passed over). Not counted among the writer's appends: the crash tests' faults saw
    /// them when they were logged.
    fn fold(
        &self,
        conn: &Connection,
        run_id: String,
        logged: Logged,
        group: &mut Group,
    ) -> Result<(), JournalError> {
        if logged.is_empty() {
            return Ok(());
        }
        let mut last = self.tail(conn, &group.moved, &run_id)?;
        let mut folded = false;
        for (seq, step) in logged {
            let expected = last.seq.map_or(0, |s| s + 1);
            if last.seq.is_some_and(|s| seq <= s) {
                continue;
            }
            if seq != expected {
                return Err(JournalError::Damaged {
                    run_id,
                    step: Some(expected),
                    reason: format!("its step log goes on from step {seq}, not {expected}"),
                });
            }
            last.sum = insert_step(conn, last.run_no, seq, &step, &last.sum)?;
            last.seq = Some(seq);
            folded = true;
        }
        if folded {
            group.running.insert(run_id.clone());
            group.moved.insert(run_id, last);
        }
        Ok(())
    }

    fn apply(
        &self,
        conn: &Connection,
        command: Command,
        group: &mut Group,
    ) -> Result<Done, JournalError> {
        match command {
            Command::Begin {
                run_id,
                agent,
                fingerprint,
                header,
            } => {
                let now = now_ms();
                let tail = insert_run(conn, &run_id, &agent, &fingerprint, &header, now)?;
                group.stamped.insert(run_id.clone(), Some(now));
                group.moved.insert(run_id, tail);
            }
            Command::Append { run_id, seq, step } => {
                self.append(conn, run_id, seq, &step, group)?;
            }
            Command::Fold { run_id, logged } => {
                self.fold(conn, run_id, logged, group)?;
            }
            Command::GoOn { run_id } => {
                let now = now_ms();
                conn.execute(
                    "UPDATE runs SET status = 'running', updated_ms = ?2 \
                     WHERE run_id = ?1 AND status = 'suspended'",
                    params![run_id, now],
                )
                .map_err(io)?;
                group.stamped.insert(run_id, Some(now));
            }
            Command::Suspend {
                run_id,
                logged,
                rows,
            } => {
                self.fold(conn, run_id.clone(), logged, group)?;
                group.running.remove(&run_id);
                group.stamped.insert(run_id.clone(), None);
                for (call_id, request) in rows {
                    // A new request under a recorded call id asks afresh: an answer is for the
                    // request it was given for, never for another one that took its id.
                    conn.execute(
                        "INSERT INTO approvals (run_id, call_id, request) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (run_id, call_id) DO UPDATE SET request = excluded.request, \
                         answer = NULL",
                        params![run_id, call_id, request],
                    )
                    .map_err(io)?;
                }
                conn.execute(
                    "UPDATE runs SET status = 'suspended', updated_ms = ?2 WHERE run_id = ?1",
                    params![run_id, now_ms()],
                )
                .map_err(io)?;
            }
            Command::Finish {
                run_id,
                stop_reason,
                logged,
                last,
            } => {
                self.fold(conn, run_id.clone(), logged, group)?;
                if let Some((seq, step)) = last {
                    self.append(conn, run_id.clone(), seq, &step, group)?;
                }
                group.running.remove(&run_id);
                group.stamped.insert(run_id.clone(), None);
                // Cached, as every run ends with it (parsing it was 2% of a run's CPU).
                conn.prepare_cached(
                    "UPDATE runs SET status = 'finished', stop_reason = ?2, updated_ms = ?3 \
                     WHERE run_id = ?1",
                )
                .and_then(|mut end| end.execute(params![run_id, stop_reason, now_ms()]))
                .map_err(io)?;
            }
            Command::Fork {
                from,
                at,
                run_id,
                definition,
                logged,
            } => {
                let now = now_ms();
                let (run, tail) = fork(conn, &from, at, &run_id, definition, &logged, now)?;
                group.stamped.insert(run_id.clone(), Some(now));
                group.moved.insert(run_id, tail);
                return Ok(Done::Forked(Box::new(run)));
            }
        }
        Ok(Done::Written)
    }
}

fn answer_all(group: Vec<Job>, e: &JournalError) {
    for job in group {
        let _ = job.reply.send(Err(e.clone()));
    }
}
