//! The SQLite journal of durable runs: [`SqliteJournal`] writes (an [`agentloop::journal::Journal`]),
//! [`JournalReader`] reads, lists and records approval answers; [`SqliteJournal::fork`] starts a
//! new run from a step of another.
//!
//! The file is in WAL mode. A step is committed before the run moves on, and a write cut short
//! by a crash is rolled back whole; what a commit survives is the journal's [`Durability`]:
//! `process` (any kill of the process: a run's steps go to its step log beside the file, one
//! `write` a commit, and into the file when it finishes or suspends, or when the next owner
//! takes it after a crash; every reader reads the log on from the file) or `power` (a power
//! cut: each commit fsync'd, the default). Each step row carries a SHA-256 chained over the run's header and every step
//! before it: a changed, missing or reordered row is reported with its run and step, and the
//! steps before it stay readable ([`JournalReader::load_intact`]). A file that is not a journal
//! is refused before anything is written to it; a new one is made in one transaction, so that a
//! making cut short (a full disk, a kill) leaves it empty, for the next writer to make anew.
//!
//! The tables (format version [`JOURNAL_VERSION`]): `runs` (a row a run: its number `run_no`,
//! id, header and the header's sum as hex text, status), `step_log` (a row a step, appended in
//! commit order: `run_no`, `seq`, the step's JSON, its chained sum as 32 bytes; a run's steps are
//! read through the `(run_no, seq)` index), and `approvals`. The `steps` view shows the steps as
//! version 1's table held them (`run_id`, `seq`, `step`, `sum` as hex text); it does not show the
//! steps still in step logs. An older file is brought up to version 3 when this crate first
//! opens it; a program of an older version then refuses it as newer.
//!
//! Each file has one writer in a process, on a thread of its own that shares the connection
//! with the appenders behind a lock: it commits every write that is ready together (the steps of
//! concurrent runs sharing the file) in one transaction and, at `power`, one fsync. Nothing that
//! waits runs on the async workers: only `process` commits that can take the file's write lock
//! at once are made by their appenders (no fsync, no checkpoint; the writes of runs that are
//! ready together in one), to save the two thread hops. A step log's write is a `write` to a
//! file only its run's owner writes, on the appender's thread.
//!
//! The module's files: this one holds [`SqliteJournal`] and its [`Journal`] writes; `schema`
//! the tables, their migrations and the checked open every file of this crate goes through;
//! `sum` the rows' chained sums; `owner` a run's ownership (its lock file) and, at `process`,
//! its step log's writes and folds; `log` the step log's format; `writer` the file's writer
//! thread and its group commit; `reader` [`JournalReader`] and the checked read of a run's steps.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use agentloop::RunOutcome;
use agentloop::journal::{Definition, Journal, JournalError, JournalHeader, JournaledRun};
use agentloop::machine::Step;
use agentloop::permissions::ApprovalRequest;
use futures::future::BoxFuture;

mod log;
mod owner;
mod reader;
mod schema;
mod sum;
mod writer;

pub(crate) use owner::{is_at, lock_name};
pub use reader::{JournalReader, RunEntry, WaitingCall};
pub(crate) use schema::{Access, FileKind, open_kind};
pub use schema::{JOURNAL_FORMAT, JOURNAL_VERSION};
pub use writer::Durability;

use owner::{Owned, sweep};
use schema::open_checked;
use writer::Fault;
use writer::{Command, Done, Job, WriterHandle};

pub(crate) fn io(e: impl std::fmt::Display) -> JournalError {
    JournalError::Io {
        message: e.to_string(),
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The writing side of a journal file: a handle on the file's writer thread (one per file in a
/// process, shared by every handle of it; see [`Durability`] for what a commit survives).
pub struct SqliteJournal {
    path: PathBuf,
    writer: Arc<WriterHandle>,
    durability: Durability,
    /// The runs this journal drives, each with the lock that says so to other processes (and,
    /// at `process`, its step log).
    owned: Mutex<HashMap<String, Arc<Owned>>>,
    /// This handle made (or found) the owners' folder, and has not seen it go since.
    folder_made: AtomicBool,
    /// Lock files of runs let go, emptied, still locked and renamed out of the way
    /// (`.pool-<unique id>.lock`), for the next runs to take: making a file a run cost more than
    /// all of a `process` run's other writes together (ext4 looks for a free inode that was not
    /// deleted lately, and a journal of runs back to back deletes one a run).
    pool: Mutex<Vec<(PathBuf, std::fs::File)>>,
    /// The crash tests' fault, seen by the step logs' writes as by the writer's.
    fault: Option<Fault>,
}

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        let runs: Vec<String> = self
            .owned
            .get_mut()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        for run_id in runs {
            // A run let go unfinished (its future dropped, a child cut off by its parent's
            // grace period) keeps its logged steps: `release` folds them into the file, or,
            // when that fails, leaves them in its log for the next owner.
            self.release(&run_id);
        }
        for (at, file) in self.pool.get_mut().map(std::mem::take).unwrap_or_default() {
            let _ = std::fs::remove_file(at);
            drop(file);
        }
        // The owners' folder stays, empty, as the session store's `.locks` does: another
        // process's handle may have made it at its open and counts on it being there when its
        // tools' processes start (their view keeps it read-only only if it exists then; one made
        // again at that handle's first lock would be theirs to write).
    }
}

impl std::fmt::Debug for SqliteJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteJournal")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteJournal {
    /// Opens (or creates) the journal at `path`, at [`Durability::Power`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path = path.as_ref().to_path_buf();
        let fault = Fault::from_env();
        let writer = writer::writer_for(&path, fault, || open_checked(&path, Access::Create))?;
        let journal = SqliteJournal {
            path,
            writer,
            durability: Durability::default(),
            owned: Mutex::new(HashMap::new()),
            folder_made: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
            fault,
        };
        journal.make_owners_folder()?;
        Ok(journal)
    }

    /// Makes the owners' folder now rather than at the first run owned: the processes a run's
    /// tools start before that (stdio MCP servers, at the run's start) see only what exists
    /// then read-only, and a folder made later would be theirs to write, where a lock file
    /// is also a run's step log (steps planted there would be folded into the journal).
    fn make_owners_folder(&self) -> Result<(), JournalError> {
        let folder = log::folder(&self.path);
        std::fs::create_dir_all(&folder).map_err(|e| {
            // Named: "File exists" alone does not say that a file is where the folder goes.
            io(format!(
                "cannot make the folder of the journal's run locks {}: {e}",
                agentloop::printable::path(&folder)
            ))
        })?;
        self.folder_made.store(true, Ordering::Relaxed);
        sweep(&folder);
        Ok(())
    }

    /// What this handle's writes survive (see [`Durability`]). Handles of one file at
    /// different levels share its writer: a commit holding a `power` write is fsync'd.
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The level this handle writes at.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Asks for `command`, committed here or queued (see the writer's doc); its answer. Not
    /// boxed: the journal's methods box it once, with what they do after it.
    fn write(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Done, JournalError>> + Send + 'static {
        let (reply, done) = tokio::sync::oneshot::channel();
        let job = Job {
            command,
            durability: self.durability,
            reply,
        };
        let jobs = [job];
        let (sent, gather) = if WriterHandle::committed_here(&jobs) {
            let gather = Arc::clone(&self.writer).gather(jobs.into());
            (Ok(()), Some(gather))
        } else {
            let [job] = jobs;
            (self.writer.send(job), None)
        };
        async move {
            sent?;
            if let Some(gather) = gather {
                gather.await?;
            }
            done.await
                .map_err(|_| io("the journal's writer thread is gone"))?
        }
    }

    /// Hands `commands` to the writer in one piece, so that it takes them in one group: one
    /// transaction and, at `power`, one fsync; it keeps their order. Answers once each is
    /// written, or with the first that was not (its place, and why).
    fn write_together(
        &self,
        commands: Vec<Command>,
    ) -> impl Future<Output = Result<(), (usize, JournalError)>> + Send + 'static {
        let mut jobs = Vec::with_capacity(commands.len());
        let mut answers = Vec::with_capacity(commands.len());
        for command in commands {
            let (reply, done) = tokio::sync::oneshot::channel();
            jobs.push(Job {
                command,
                durability: self.durability,
                reply,
            });
            answers.push(done);
        }
        let (sent, gather) = if jobs.is_empty() {
            (Ok(()), None)
        } else if WriterHandle::committed_here(&jobs) {
            (Ok(()), Some(Arc::clone(&self.writer).gather(jobs)))
        } else {
            (self.writer.send_all(jobs), None)
        };
        async move {
            sent.map_err(|e| (0, e))?;
            if let Some(gather) = gather {
                gather.await.map_err(|e| (0, e))?;
            }
            for (i, done) in answers.into_iter().enumerate() {
                done.await
                    .map_err(|_| (i, io("the journal's writer thread is gone")))?
                    .map_err(|e| (i, e))?;
            }
            Ok(())
        }
    }

    fn send(&self, command: Command) -> BoxFuture<'_, Result<(), JournalError>> {
        let written = self.write(command);
        Box::pin(async move { written.await.map(drop) })
    }

    /// Starts run `run_id` from the state after step `at` of run `from` (a different answer to
    /// try from there, or a changed tool): its header is `from`'s, naming its origin
    /// ([`ForkOrigin`], in [`RunEntry::forked_from`]), with `definition` when the agent it goes
    /// on with is another; its steps are `from`'s up to `at`, checked as they are copied.
    /// `from` is only read. The new run is owned by this journal, and is resumed like any run
    /// ([`agentloop::Agent::resume`]): calls in flight at `at` follow the restart rule.
    pub async fn fork(
        &self,
        from: &str,
        at: u64,
        run_id: &str,
        definition: Option<Definition>,
    ) -> Result<JournaledRun, JournalError> {
        self.own(run_id)?;
        // The log first, then the file: a fold between the two reads loses no step.
        // Steps past damage in the log are missing, and a fork from them is refused as such.
        let (logged, _) = log::read_run(&self.path, from);
        match self
            .write(Command::Fork {
                from: from.to_owned(),
                at,
                run_id: run_id.to_owned(),
                definition,
                logged,
            })
            .await?
        {
            Done::Forked(run) => Ok(*run),
            Done::Written => Err(io("the journal's writer answered a fork with no run")),
        }
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, JournalError> {
    serde_json::to_string(value).map_err(io)
}

impl Journal for SqliteJournal {
    fn holds_children(&self) -> bool {
        true
    }

    fn load<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<JournaledRun>, JournalError>> {
        let (path, run_id) = (self.path.clone(), run_id.to_owned());
        Box::pin(async move {
            let read = tokio::task::spawn_blocking(move || {
                match JournalReader::open(&path)?.load(&run_id) {
                    Ok(run) => Ok(Some(run)),
                    Err(JournalError::UnknownRun { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            });
            read.await
                .map_err(|e| io(format!("reading the journal failed: {e}")))?
        })
    }

    fn begin<'a>(&'a self, header: &'a JournalHeader) -> BoxFuture<'a, Result<(), JournalError>> {
        if let Err(e) = self.own(&header.run_id) {
            return Box::pin(async move { Err(e) });
        }
        match to_json(header) {
            Ok(text) => self.send(Command::Begin {
                run_id: header.run_id.clone(),
                agent: header.agent.clone(),
                fingerprint: header.fingerprint.clone(),
                header: text,
            }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn append<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        step: &'a Step,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        // A run is written by its owner only: a run not begun here (a resumed subagent's) is
        // taken first, and what a dead owner's log holds goes into the file before it.
        if let Err(e) = self.own(run_id) {
            return Box::pin(async move { Err(e) });
        }
        match to_json(step) {
            Ok(text) if self.durability == Durability::Process => {
                let logged = self.log(run_id, seq, std::slice::from_ref(&text));
                Box::pin(async move { logged })
            }
            Ok(text) => self.send(Command::Append {
                run_id: run_id.to_owned(),
                seq,
                step: text,
            }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn append_batch<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        steps: &'a [Step],
    ) -> BoxFuture<'a, Result<(), (usize, JournalError)>> {
        if let Err(e) = self.own(run_id) {
            return Box::pin(async move { Err((0, e)) });
        }
        // A step that cannot be serialized ends the batch there; the ones before it are
        // written.
        let mut texts = Vec::with_capacity(steps.len());
        let mut unwritable = None;
        for (i, step) in steps.iter().enumerate() {
            match to_json(step) {
                Ok(text) => texts.push(text),
                Err(e) => {
                    unwritable = Some((i, e));
                    break;
                }
            }
        }
        if self.durability == Durability::Process {
            let logged = if texts.is_empty() {
                Ok(())
            } else {
                self.log(run_id, seq, &texts).map_err(|e| (0, e))
            };
            return Box::pin(async move {
                logged?;
                unwritable.map_or(Ok(()), Err)
            });
        }
        let commands = (seq..)
            .zip(texts)
            .map(|(seq, step)| Command::Append {
                run_id: run_id.to_owned(),
                seq,
                step,
            })
            .collect();
        let written = self.write_together(commands);
        Box::pin(async move {
            written.await?;
            unwritable.map_or(Ok(()), Err)
        })
    }

    fn append_and_finish<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        step: &'a Step,
        outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        match to_json(step) {
            Ok(text) => self.end_run(run_id, outcome, Some((seq, text))),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn suspend<'a>(
        &'a self,
        run_id: &'a str,
        pending: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        let rows: Result<Vec<(String, String)>, JournalError> = pending
            .iter()
            .map(|r| Ok((r.call_id.clone(), to_json(r)?)))
            .collect();
        match rows.and_then(|rows| Ok((rows, self.logged(run_id)?))) {
            Ok((rows, logged)) => self.then_release(
                run_id,
                self.send(Command::Suspend {
                    run_id: run_id.to_owned(),
                    logged,
                    rows,
                }),
            ),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn finish<'a>(
        &'a self,
        run_id: &'a str,
        outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        self.end_run(run_id, outcome, None)
    }
}

/// Where a forked run came from: the run, and the step after which it went its own way.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ForkOrigin {
    /// The run it was forked from.
    pub run_id: String,
    /// The last step it shares with that run.
    pub step: u64,
}
