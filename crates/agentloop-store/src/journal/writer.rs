//! The journal's writer: one thread per journal file in a process, and the file's connection
//! behind a lock. Appenders queue their write and await its answer; the writer takes everything
//! queued into one transaction (group commit), commits it once, and only then answers each. A
//! step is never answered, and so never fed to a machine, before the commit that holds it.
//!
//! `process` writes (no fsync) are committed by their appenders themselves when the connection
//! is free and no other process holds the file's write lock: the writes asked for while the
//! scheduler's turn comes round once are committed together by the first of their appenders to
//! resume (group commit with no thread hop). Such a commit is a few writes to the operating
//! system's cache, cheaper than the two thread hops of the queue (a wake of the writer, then one
//! of the appender). Anything that could wait (an fsync, another process's lock, the WAL
//! checkpoints, which this connection never runs on its own) stays on the writer thread.
//!
//! Each write in a group has a savepoint of its own: a write that fails (a step out of order, a
//! run that is not there) is undone alone and answered with its error, and the others commit.
//!
//! This file holds the handle appenders write through ([`WriterHandle`]: the queue, the
//! commits an appender makes itself, one writer a file in a process), the writes it carries
//! ([`Command`]) and the levels ([`Durability`]) and crash tests' faults ([`Fault`]) they obey;
//! `commit` the writer thread and its group commit; `rows` the rows each write touches.

mod commit;
mod rows;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak, mpsc};

use agentloop::journal::{Definition, JournalError, JournaledRun};
use rusqlite::{Connection, OptionalExtension};

use super::io;
use super::log::Logged;

use commit::{Writer, serve};
use rows::tail;

/// What a journal's commits survive. Either way a commit is whole or absent after a crash (a
/// torn write rolls back), and a step is committed before the run is told so.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Survives any kill of the process (`kill -9`, a panic, an out-of-memory kill): each commit
    /// is in the operating system's hands before the run moves on, with no fsync. A run's steps
    /// go to its step log beside the file (one `write` a commit, in the `<journal>.owners`
    /// folder) and into the file (WAL, `synchronous = NORMAL`) when the run finishes or
    /// suspends, when its journal handle is dropped, or when the next owner takes it after a
    /// crash; readers read the log on from the file. A power cut or a crash of the operating
    /// system may lose the last commits, never tear one (a frame cut short is dropped whole).
    Process,
    /// Also survives a power cut or a crash of the operating system: each commit is fsync'd
    /// before the run moves on (WAL, `synchronous = FULL`). Steps that are ready together (of
    /// concurrent runs sharing the file) share one transaction and one fsync.
    #[default]
    Power,
}

impl Durability {
    /// `process` or `power`, as agent files and `--durability` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Process => "process",
            Durability::Power => "power",
        }
    }

    /// The SQLite `synchronous` level that keeps the promise in WAL mode.
    fn synchronous(self) -> &'static str {
        match self {
            Durability::Process => "NORMAL",
            Durability::Power => "FULL",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "process" => Ok(Durability::Process),
            "power" => Ok(Durability::Power),
            other => Err(format!(
                "unknown durability {other:?}: `process` (survives a killed process) or `power` \
                 (survives a power cut)"
            )),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a test makes the writer stop as if the process were killed there: it prints a line on
/// stderr and waits forever, and the test kills the process. Only a build with the
/// `test-faults` feature ever sets one (see [`Fault::from_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-faults"), allow(dead_code))]
pub(crate) enum Fault {
    /// After step `n` is committed.
    AfterStep(u64),
    /// Inside the transaction of step `n`, before its commit.
    InStep(u64),
    /// After the `n`th step this writer appends (counted from 0 over every run of the file: a
    /// tree's parent and children alike) is committed.
    AfterWrite(u64),
    /// Inside the transaction of the `n`th step this writer appends, before its commit.
    InWrite(u64),
    /// After the `n`th suspension this writer commits (counted from 0 over every run of the
    /// file): a child's, whose parent has not suspended yet.
    AfterSuspend(u64),
}

impl Fault {
    /// The crash tests' fault, from `AGENTLOOP_TEST_JOURNAL_FAULT`: none unless this crate is
    /// built with the `test-faults` feature, so no shipped binary can be made to hang by its
    /// environment.
    pub(crate) fn from_env() -> Option<Fault> {
        #[cfg(feature = "test-faults")]
        {
            std::env::var(FAULT_ENV).ok().and_then(|f| Fault::parse(&f))
        }
        #[cfg(not(feature = "test-faults"))]
        {
            None
        }
    }

    /// Reads `after-step:N`, `in-step:N`, `after-write:N`, `in-write:N` or `after-suspend:N`.
    #[cfg(feature = "test-faults")]
    fn parse(text: &str) -> Option<Fault> {
        let (kind, n) = text.trim().split_once(':')?;
        let n = n.trim().parse().ok()?;
        match kind.trim() {
            "after-step" => Some(Fault::AfterStep(n)),
            "in-step" => Some(Fault::InStep(n)),
            "after-write" => Some(Fault::AfterWrite(n)),
            "in-write" => Some(Fault::InWrite(n)),
            "after-suspend" => Some(Fault::AfterSuspend(n)),
            _ => None,
        }
    }
}

/// The variable the crash tests set (only read with the `test-faults` feature).
#[cfg(feature = "test-faults")]
const FAULT_ENV: &str = "AGENTLOOP_TEST_JOURNAL_FAULT";

pub(super) fn hang(what: &str) -> ! {
    eprintln!("agentloop: fault: paused {what}");
    loop {
        std::thread::park();
    }
}

/// One write the writer is asked for.
pub(super) enum Command {
    Begin {
        run_id: String,
        agent: String,
        fingerprint: String,
        header: String,
    },
    Append {
        run_id: String,
        seq: u64,
        step: String,
    },
    /// The steps of the run's step log that the file does not hold yet go into it (see the
    /// `log` module): after a crash, by the run's next owner.
    Fold { run_id: String, logged: Logged },
    /// A suspended run goes on: marked running (at `process`, before the first step its new
    /// owner logs, as a commit of a step marks it at `power`).
    GoOn { run_id: String },
    /// The run waits for answers: its logged steps, then its approvals' rows and its status.
    Suspend {
        run_id: String,
        logged: Logged,
        rows: Vec<(String, String)>,
    },
    /// The run ended: its logged steps, its last step when it is written together with the
    /// end (`seq`, the step), and the end, all or nothing.
    Finish {
        run_id: String,
        stop_reason: String,
        logged: Logged,
        last: Option<(u64, String)>,
    },
    /// A new run from step `at` of run `from`, whose logged steps (read before the file, so
    /// that a fold between the two reads loses none) are `logged`.
    Fork {
        from: String,
        at: u64,
        run_id: String,
        definition: Option<Definition>,
        logged: Logged,
    },
}

impl Command {
    /// The run the write is about (a fork's new run).
    fn run_id(&self) -> &str {
        match self {
            Command::Begin { run_id, .. }
            | Command::Append { run_id, .. }
            | Command::Fold { run_id, .. }
            | Command::GoOn { run_id }
            | Command::Suspend { run_id, .. }
            | Command::Finish { run_id, .. }
            | Command::Fork { run_id, .. } => run_id,
        }
    }
}

/// What a write gave back.
pub(super) enum Done {
    Written,
    Forked(Box<JournaledRun>),
}

pub(super) type Reply = tokio::sync::oneshot::Sender<Result<Done, JournalError>>;

/// A write, the level it asks for, and where its answer goes.
pub(super) struct Job {
    pub(super) command: Command,
    pub(super) durability: Durability,
    pub(super) reply: Reply,
}

/// The most writes one transaction takes: a bound on how long the first of them waits.
const MAX_GROUP: usize = 1024;

/// What goes through a writer's queue: one write, or writes that must reach the writer
/// together (a run's steps that are ready at once), so that the writer, which may wake on the
/// first of them while the rest are still being queued, takes them in one group.
pub(super) enum Queued {
    One(Job),
    Many(Vec<Job>),
    /// Commits made by appenders have filled the WAL: the writer checkpoints it.
    Checkpoint,
    /// A run let go: the writer forgets what it knew of it.
    Forget(String),
    /// The last handle is gone: the writer commits what came before and ends.
    Stop,
}

/// The file's connection and what its writer knows, used by one committer at a time.
struct Shared {
    conn: Connection,
    writer: Writer,
}

/// The queue of a file's writer thread, and its connection. The thread ends when the last
/// handle is dropped.
pub(super) struct WriterHandle {
    tx: mpsc::Sender<Queued>,
    shared: Arc<Mutex<Shared>>,
    /// `process` writes waiting for the scheduler's turn to come round (see
    /// [`WriterHandle::gather`]).
    gathered: Mutex<Vec<Job>>,
    /// How many gathered commits were asked for, and how many writes the last one held.
    asked: AtomicUsize,
    last_group: AtomicUsize,
    /// The writer thread, joined when the handle goes.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The writer's last commits are waited for, so that the connection closes here, before the
/// process can end: closing it is what moves the WAL back into the file and removes it. A
/// process that ended first (the CLI's `main` returned while the thread still ran) left its
/// last steps in `FILE-wal`, where a copy of the file alone would miss them.
impl Drop for WriterHandle {
    fn drop(&mut self) {
        let jobs = std::mem::take(&mut *lock(&self.gathered));
        if !jobs.is_empty() {
            let _ = self.tx.send(Queued::Many(jobs));
        }
        let _ = self.tx.send(Queued::Stop);
        // Never on the writer's own thread (a job holding the last handle): it would wait on
        // itself.
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// How often a write that would commit alone still waits a pass of the scheduler for others.
const PROBE_EVERY: usize = 16;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WriterHandle {
    pub(super) fn send(&self, job: Job) -> Result<(), JournalError> {
        self.queue(Queued::One(job))
    }

    /// Queues `jobs` at once: they are committed in the same group.
    pub(super) fn send_all(&self, jobs: Vec<Job>) -> Result<(), JournalError> {
        self.queue(Queued::Many(jobs))
    }

    /// True when `jobs` may be committed by their appender (see the module's doc).
    pub(super) fn committed_here(jobs: &[Job]) -> bool {
        jobs.iter().all(|j| {
            j.durability == Durability::Process && !matches!(j.command, Command::Fork { .. })
        })
    }

    /// Commits `process` writes with the ones other runs of this process ask for meanwhile:
    /// they wait for the scheduler's turn to come round once (the runs that are ready add
    /// theirs), then the first of them to resume commits all in one transaction here, or, when
    /// the connection or the file's write lock is busy, hands them to the writer thread.
    pub(super) async fn gather(self: Arc<Self>, jobs: Vec<Job>) -> Result<(), JournalError> {
        let first = {
            let mut gathered = lock(&self.gathered);
            let first = gathered.is_empty();
            gathered.extend(jobs);
            first
        };
        // A run that commits alone does not wait for company that never comes (the yield costs
        // a pass of the scheduler); it looks for it now and then.
        let probe = self
            .asked
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(PROBE_EVERY);
        if !first || probe || self.last_group.load(Ordering::Relaxed) > 1 {
            tokio::task::yield_now().await;
        }
        let Ok(mut guard) = self.shared.try_lock() else {
            return self.hand_over();
        };
        let jobs = std::mem::take(&mut *lock(&self.gathered));
        if jobs.is_empty() {
            // Another run committed them.
            return Ok(());
        }
        let Shared { conn, writer } = &mut *guard;
        // The writer thread was asked for a checkpoint and has not had the connection since:
        // the mutex is not fair, so a stream of commits made here could keep it away while the
        // WAL grows. This commit goes to it, and the checkpoint follows.
        if writer.checkpoint_asked || !writer.begin_now(conn, Durability::Process) {
            return self.queue(Queued::Many(jobs));
        }
        self.last_group.store(jobs.len(), Ordering::Relaxed);
        writer.commit_begun(conn, jobs);
        if writer.checkpoint_due() && !writer.checkpoint_asked {
            // A writer thread that is gone leaves the checkpoint to the file's next opener (and
            // the commits to their appenders).
            writer.checkpoint_asked = self.tx.send(Queued::Checkpoint).is_ok();
        }
        Ok(())
    }

    /// Commits `job` on this thread, waiting for the connection and for another process's
    /// write lock as the writer thread does: for the rare writes that cannot wait for an
    /// answer (a dead owner's step log folded when its run is taken).
    pub(super) fn commit_now(
        &self,
        command: Command,
        durability: Durability,
    ) -> Result<(), JournalError> {
        let (reply, mut done) = tokio::sync::oneshot::channel();
        let job = Job {
            command,
            durability,
            reply,
        };
        {
            let mut guard = lock(&self.shared);
            let Shared { conn, writer } = &mut *guard;
            writer.commit(conn, vec![job]);
        }
        match done.try_recv() {
            Ok(result) => result.map(drop),
            Err(_) => Err(io("the journal's writer answered no write")),
        }
    }

    /// How many steps the file holds of run `run_id`, read on the writer's connection.
    pub(super) fn stored(&self, run_id: &str) -> Result<u64, JournalError> {
        let guard = lock(&self.shared);
        Ok(tail(&guard.conn, run_id)?.seq.map_or(0, |s| s + 1))
    }

    /// The sequence number run `run_id`'s next step takes, by the file (the steps a log holds
    /// are not counted), for the first step this process logs for it (at
    /// `process`, where steps go to the run's step log and no commit marks it running): a run
    /// this writer neither began nor wrote since it was let go, and that is suspended, is marked
    /// running first, in a commit of its own. Otherwise a resumed run stayed `suspended` in
    /// the file while it ran: listed as waiting, its answers open to change under it.
    pub(super) fn take_on(
        &self,
        run_id: &str,
        durability: Durability,
    ) -> Result<u64, JournalError> {
        let mut guard = lock(&self.shared);
        let Shared { conn, writer } = &mut *guard;
        if let Some(known) = writer.last.get(run_id) {
            return Ok(known.seq.map_or(0, |s| s + 1));
        }
        let next = tail(conn, run_id)?.seq.map_or(0, |s| s + 1);
        let suspended: Option<bool> = conn
            .query_row(
                "SELECT status = 'suspended' FROM runs WHERE run_id = ?1",
                [run_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(io)?;
        if suspended == Some(true) {
            let (reply, mut done) = tokio::sync::oneshot::channel();
            let job = Job {
                command: Command::GoOn {
                    run_id: run_id.to_owned(),
                },
                durability,
                reply,
            };
            writer.commit(conn, vec![job]);
            match done.try_recv() {
                Ok(result) => result.map(drop)?,
                Err(_) => return Err(io("the journal's writer answered no write")),
            }
        }
        Ok(next)
    }

    /// Forgets what this writer knows of run `run_id` (its last step, when its row was last
    /// written): once let go, the run may be moved on by another process.
    pub(super) fn forget(&self, run_id: &str) {
        // Never waits on an async worker: when the connection is busy (an fsync, say), the
        // writer thread forgets it after what it is doing.
        match self.shared.try_lock() {
            Ok(mut guard) => guard.writer.forget(run_id),
            Err(_) => {
                let _ = self.tx.send(Queued::Forget(run_id.to_owned()));
            }
        }
    }

    /// Counts `n` steps written to a step log among this writer's appends, for the crash
    /// tests' faults: the place of the first of them.
    pub(super) fn count_logged(&self, n: u64) -> u64 {
        let mut guard = lock(&self.shared);
        let first = guard.writer.written;
        guard.writer.written += n;
        first
    }

    /// Hands the gathered writes to the writer thread, in the order they were asked for.
    fn hand_over(&self) -> Result<(), JournalError> {
        let jobs = std::mem::take(&mut *lock(&self.gathered));
        if jobs.is_empty() {
            return Ok(());
        }
        self.queue(Queued::Many(jobs))
    }

    fn queue(&self, queued: Queued) -> Result<(), JournalError> {
        self.tx
            .send(queued)
            .map_err(|_| io("the journal's writer thread is gone"))
    }
}

/// The writer of each journal file open in this process, by its canonical path: the runs of
/// one process that share a file share its writer, and so its commits.
static WRITERS: LazyLock<Mutex<HashMap<PathBuf, Weak<WriterHandle>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The writer of the journal at `path`, started when none runs (the file is opened, and
/// created, with `open`). A writer with a test fault is never shared.
pub(super) fn writer_for(
    path: &std::path::Path,
    fault: Option<Fault>,
    open: impl FnOnce() -> Result<Connection, JournalError>,
) -> Result<std::sync::Arc<WriterHandle>, JournalError> {
    let mut writers = WRITERS.lock().unwrap_or_else(|p| p.into_inner());
    writers.retain(|_, w| w.strong_count() > 0);
    let key = std::fs::canonicalize(path).ok();
    if fault.is_none()
        && let Some(live) = key.as_ref().and_then(|k| writers.get(k)?.upgrade())
    {
        return Ok(live);
    }
    let conn = open()?;
    // The writer decides when the WAL is copied back (see `Writer::checkpoint_due`), so that
    // no commit made by an appender ever runs a checkpoint and its fsyncs.
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(io)?;
    let shared = Arc::new(Mutex::new(Shared {
        conn,
        writer: Writer {
            last: HashMap::new(),
            stamped: HashMap::new(),
            fault,
            written: 0,
            suspensions: 0,
            synchronous: None,
            uncheckpointed: 0,
            checkpoint_asked: false,
        },
    }));
    let (tx, rx) = mpsc::channel::<Queued>();
    let serving = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("agentloop-journal".into())
        .spawn(move || serve(&serving, &rx))
        .map_err(io)?;
    let handle = std::sync::Arc::new(WriterHandle {
        tx,
        shared,
        gathered: Mutex::new(Vec::new()),
        asked: AtomicUsize::new(0),
        last_group: AtomicUsize::new(0),
        thread: Some(thread),
    });
    if fault.is_none()
        && let Some(key) = key.or_else(|| std::fs::canonicalize(path).ok())
    {
        writers.insert(key, std::sync::Arc::downgrade(&handle));
    }
    Ok(handle)
}
