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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak, mpsc};
use std::time::Duration;

use agentloop::journal::{Definition, JournalError, JournalHeader, JournaledRun, RunStatus};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::log::Logged;
use super::reader::read_steps;
use super::sum::{Sum, checked_header, header_sum, hex_text, parse_sum, step_sum};
use super::{ForkOrigin, io, now_ms};

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

/// Where a run's next step goes: the run's number, its last step's sequence number (none before
/// the first) and that step's chained sum (the header's before the first).
#[derive(Clone)]
struct Tail {
    run_no: i64,
    seq: Option<u64>,
    sum: Sum,
}

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

struct Writer {
    /// Each run's last committed step.
    last: HashMap<String, Tail>,
    /// When this writer last wrote each run's row as running, for the runs it has not written
    /// otherwise since. One owner per run, so no other writer changes these rows meanwhile.
    stamped: HashMap<String, i64>,
    fault: Option<Fault>,
    /// How many steps this writer committed, over every run.
    written: u64,
    /// How many suspensions it committed, over every run (for the crash tests' faults).
    suspensions: u64,
    /// The `synchronous` level the connection is at.
    synchronous: Option<Durability>,
    /// Commits since the last checkpoint.
    uncheckpointed: u32,
    /// An appender asked the writer thread for a checkpoint it has not run yet.
    checkpoint_asked: bool,
}

/// How many commits the WAL takes before the writer copies it back into the file: about
/// SQLite's own default of 1,000 pages, at one to two pages a commit.
const CHECKPOINT_EVERY: u32 = 512;

/// How long the writer thread waits for another process's write lock, as every connection of
/// this crate does; an appender committing itself never waits (it queues its write instead).
const BUSY_TIMEOUT: Duration = crate::BUSY_WAIT;

fn serve(shared: &Mutex<Shared>, rx: &mpsc::Receiver<Queued>) {
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
    fn forget(&mut self, run_id: &str) {
        self.last.remove(run_id);
        self.stamped.remove(run_id);
    }

    fn checkpoint_due(&self) -> bool {
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
    fn begin_now(&mut self, conn: &Connection, level: Durability) -> bool {
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
    fn commit(&mut self, conn: &mut Connection, group: Vec<Job>) {
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
    fn commit_begun(&mut self, conn: &Connection, group: Vec<Job>) {
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

/// Writes a new run's row, running; where its first step goes.
fn insert_run(
    conn: &Connection,
    run_id: &str,
    agent: &str,
    fingerprint: &str,
    header: &str,
    now: i64,
) -> Result<Tail, JournalError> {
    let sum = header_sum(header);
    conn.prepare_cached(
        "INSERT INTO runs (run_id, agent, fingerprint, header, header_sum, status, \
         created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?6)",
    )
    .and_then(|mut insert| {
        insert.execute(params![
            run_id,
            agent,
            fingerprint,
            header,
            hex_text(&sum),
            now
        ])
    })
    .map_err(|e| io(format!("cannot start run {run_id}: {e}")))?;
    Ok(Tail {
        run_no: conn.last_insert_rowid(),
        seq: None,
        sum,
    })
}

/// Writes step `seq` of run number `run_no`, chained after `previous`; its sum.
fn insert_step(
    conn: &Connection,
    run_no: i64,
    seq: u64,
    step: &str,
    previous: &Sum,
) -> Result<Sum, JournalError> {
    let sum = step_sum(previous, seq, step);
    let seq = i64::try_from(seq).map_err(io)?;
    conn.prepare_cached("INSERT INTO step_log (run_no, seq, step, sum) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut insert| insert.execute(params![run_no, seq, step, sum.as_slice()]))
        .map_err(io)?;
    Ok(sum)
}

fn answer_all(group: Vec<Job>, e: &JournalError) {
    for job in group {
        let _ = job.reply.send(Err(e.clone()));
    }
}

/// Where run `run_id`'s next step goes, from the file: its last step (its number and sum), or
/// its header's sum when it has none.
fn tail(conn: &Connection, run_id: &str) -> Result<Tail, JournalError> {
    let run: Option<(i64, String)> = conn
        .query_row(
            "SELECT run_no, header_sum FROM runs WHERE run_id = ?1",
            [run_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(io)?;
    let Some((run_no, header)) = run else {
        return Err(JournalError::UnknownRun {
            run_id: run_id.to_owned(),
        });
    };
    let damaged = |step: Option<u64>| JournalError::Damaged {
        run_id: run_id.to_owned(),
        step,
        reason: "its checksum cannot be read".into(),
    };
    let last: Option<(i64, Vec<u8>)> = conn
        .query_row(
            "SELECT seq, sum FROM step_log WHERE run_no = ?1 ORDER BY seq DESC LIMIT 1",
            [run_no],
            |r| Ok((r.get(0)?, r.get_ref(1)?.as_bytes()?.to_vec())),
        )
        .optional()
        .map_err(io)?;
    match last {
        Some((seq, sum)) => {
            let seq = u64::try_from(seq).ok();
            Ok(Tail {
                run_no,
                seq,
                sum: Sum::try_from(sum.as_slice()).map_err(|_| damaged(seq))?,
            })
        }
        None => Ok(Tail {
            run_no,
            seq: None,
            sum: parse_sum(&header).ok_or_else(|| damaged(None))?,
        }),
    }
}

/// Writes run `run_id`: run `from`'s header (naming its origin, and with `definition` when
/// given) and its steps up to `at`, each checked on the way and chained anew. `from` is only
/// read.
fn fork(
    conn: &Connection,
    from: &str,
    at: u64,
    run_id: &str,
    definition: Option<Definition>,
    logged: &[(u64, String)],
    now: i64,
) -> Result<(JournaledRun, Tail), JournalError> {
    let damaged = |step: Option<u64>, reason: String| JournalError::Damaged {
        run_id: from.to_owned(),
        step,
        reason,
    };
    let row: Option<(i64, String, String)> = conn
        .query_row(
            "SELECT run_no, header, header_sum FROM runs WHERE run_id = ?1",
            [from],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(io)?;
    let Some((from_no, text, stored)) = row else {
        return Err(JournalError::UnknownRun {
            run_id: from.to_owned(),
        });
    };
    let Some(sum) = checked_header(&text, &stored) else {
        return Err(damaged(None, "its checksum does not match".into()));
    };
    let mut value: Value = serde_json::from_str(&text)
        .map_err(|e| damaged(None, format!("it cannot be parsed ({e})")))?;
    let Some(fields) = value.as_object_mut() else {
        return Err(damaged(None, "it is not an object".into()));
    };
    fields.insert("run_id".into(), Value::String(run_id.to_owned()));
    let origin = ForkOrigin {
        run_id: from.to_owned(),
        step: at,
    };
    fields.insert(
        "forked_from".into(),
        serde_json::to_value(&origin).map_err(io)?,
    );
    if let Some(definition) = definition {
        fields.insert(
            "fingerprint".into(),
            Value::String(definition.fingerprint()),
        );
        fields.insert(
            "definition".into(),
            serde_json::to_value(&definition).map_err(io)?,
        );
    }
    let header: JournalHeader = serde_json::from_value(value.clone())
        .map_err(|e| damaged(None, format!("it cannot be parsed ({e})")))?;
    let text = serde_json::to_string(&value).map_err(io)?;
    let mut steps = Vec::new();
    let mut texts = Vec::new();
    let damage = read_steps(
        conn,
        from_no,
        &sum,
        Some(at),
        logged,
        &mut steps,
        &mut texts,
        damaged,
    )?;
    if let Some(e) = damage {
        return Err(e);
    }
    if (steps.len() as u64) <= at {
        return Err(JournalError::NotResumable {
            run_id: from.to_owned(),
            reason: format!(
                "it has no step {at} to fork at (it has {} step(s))",
                steps.len()
            ),
        });
    }
    let mut tail = insert_run(conn, run_id, &header.agent, &header.fingerprint, &text, now)?;
    for (seq, step) in (0u64..).zip(&texts) {
        tail.sum = insert_step(conn, tail.run_no, seq, step, &tail.sum)?;
        tail.seq = Some(seq);
    }
    let run = JournaledRun {
        header,
        steps,
        status: RunStatus::Running,
        approvals: Vec::new(),
    };
    Ok((run, tail))
}
