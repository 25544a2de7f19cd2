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

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use agentloop::RunOutcome;
use agentloop::journal::{
    Definition, Journal, JournalError, JournalHeader, JournaledRun, PendingApproval, RunStatus,
};
use agentloop::machine::Step;
use agentloop::permissions::{Answer, ApprovalRequest};
use futures::future::BoxFuture;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde_json::Value;
use sha2::{Digest, Sha256};

mod log;
mod writer;

pub use writer::Durability;
use writer::{Command, Done, Job, WriterHandle};
use writer::{Fault, hang};

/// The `format` a journal's meta table names.
pub const JOURNAL_FORMAT: &str = "agentloop-journal";
/// The journal format's version. Version 2 keeps the steps in insertion order (see the module's
/// `SCHEMA`); version 3 has the same tables, and a run's latest steps may be in its step log
/// beside the file (see the `log` module), which a program of version 2 would not read: it
/// refuses the file as newer. An older file is brought up to it when opened.
pub const JOURNAL_VERSION: i64 = 3;

/// The `runs` table: a run's number (`run_no`, given in the order runs begin and never reused)
/// is what its steps are keyed by, a few bytes where the id is tens.
macro_rules! runs_table {
    () => {
        "
CREATE TABLE runs (
    run_no INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    header TEXT NOT NULL,
    header_sum TEXT NOT NULL,
    status TEXT NOT NULL,
    stop_reason TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
"
    };
}

/// A text sum (64 hex digits, as version 1 and the `steps` view show it) as the 32 bytes
/// `step_log` holds; any other text kept as its bytes, so that it still fails the check.
macro_rules! sum_bytes {
    ($text:literal) => {
        concat!(
            "CASE WHEN length(",
            $text,
            ") = 64 AND ",
            $text,
            " = lower(",
            $text,
            ") THEN coalesce(unhex(",
            $text,
            "), CAST(",
            $text,
            " AS BLOB)) ELSE CAST(",
            $text,
            " AS BLOB) END"
        )
    };
}

/// The steps: `step_log` is appended in the order steps are committed, so the steps of runs
/// that go on at once share its last pages, and a commit of several runs' steps writes a few
/// pages rather than one a run (keyed by `(run_id, seq)`, as in version 1, each run's steps had
/// pages of their own). Its `(run_no, seq)` index, a few bytes an entry, is how a run's steps
/// are read; `sum` is the chained SHA-256 as 32 bytes. The `steps` view shows them as version 1
/// had them (`run_id`, `seq`, `step`, `sum` as hex text) and takes updates, deletes and inserts
/// in that shape, so that queries written against version 1 go on working.
macro_rules! step_tables {
    () => {
        concat!(
            "
CREATE TABLE step_log (
    run_no INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    step TEXT NOT NULL,
    sum BLOB NOT NULL
);
CREATE UNIQUE INDEX step_log_run ON step_log (run_no, seq);
CREATE VIEW steps (run_id, seq, step, sum) AS
    SELECT r.run_id, s.seq, s.step, lower(hex(s.sum)) FROM step_log s JOIN runs r USING (run_no);
CREATE TRIGGER steps_update INSTEAD OF UPDATE ON steps BEGIN
    UPDATE step_log SET seq = NEW.seq, step = NEW.step, sum = ",
            sum_bytes!("NEW.sum"),
            "
    WHERE run_no = (SELECT run_no FROM runs WHERE run_id = OLD.run_id) AND seq = OLD.seq;
END;
CREATE TRIGGER steps_delete INSTEAD OF DELETE ON steps BEGIN
    DELETE FROM step_log
    WHERE run_no = (SELECT run_no FROM runs WHERE run_id = OLD.run_id) AND seq = OLD.seq;
END;
CREATE TRIGGER steps_insert INSTEAD OF INSERT ON steps BEGIN
    INSERT INTO step_log (run_no, seq, step, sum)
    SELECT run_no, NEW.seq, NEW.step, ",
            sum_bytes!("NEW.sum"),
            " FROM runs WHERE run_id = NEW.run_id;
END;
"
        )
    };
}

/// A new journal's tables.
const SCHEMA: &str = concat!(
    "CREATE TABLE agentloop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    runs_table!(),
    step_tables!(),
    "
CREATE TABLE approvals (
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    request TEXT NOT NULL,
    answer TEXT,
    PRIMARY KEY (run_id, call_id)
);
"
);

/// Version 1 to 2: the runs get their numbers in the order of their rows, and their steps move
/// to `step_log` in each run's order, their text and sums unchanged (a sum that is not 64 hex
/// digits is kept as its bytes, and still fails the check). Steps with no run row (no reader of
/// version 1 could reach them) are not carried over. Approvals are untouched.
const TO_V2: &str = concat!(
    "
ALTER TABLE runs RENAME TO runs_v1;
ALTER TABLE steps RENAME TO steps_v1;
",
    runs_table!(),
    step_tables!(),
    "
INSERT INTO runs (run_id, agent, fingerprint, header, header_sum, status, stop_reason,
                  created_ms, updated_ms)
    SELECT run_id, agent, fingerprint, header, header_sum, status, stop_reason, created_ms,
           updated_ms
    FROM runs_v1 ORDER BY rowid;
INSERT INTO step_log (run_no, seq, step, sum)
    SELECT r.run_no, s.seq, s.step, ",
    sum_bytes!("s.sum"),
    "
    FROM steps_v1 s JOIN runs r USING (run_id) ORDER BY r.run_no, s.seq;
DROP TABLE steps_v1;
DROP TABLE runs_v1;
"
);

/// Version 2 to 3: no table changes; the version says that steps may be in step logs.
const TO_V3: &str =
    "CREATE TABLE IF NOT EXISTS agentloop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);";

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

/// A chained SHA-256 sum, as `step_log` holds it.
pub(crate) type Sum = [u8; 32];

/// The header's sum: `runs.header_sum` holds its hex text, which the first step chains from.
fn header_sum(header: &str) -> Sum {
    Sha256::digest(header.as_bytes()).into()
}

/// A sum as lowercase hex digits, without allocating.
pub(crate) fn hex(sum: &Sum) -> [u8; 64] {
    let digit = |n: u8| if n < 10 { b'0' + n } else { b'a' + n - 10 };
    let mut out = [0u8; 64];
    for (pair, byte) in out.chunks_exact_mut(2).zip(sum) {
        if let [high, low] = pair {
            *high = digit(byte >> 4);
            *low = digit(byte & 0x0f);
        }
    }
    out
}

/// A sum's hex text, as `runs.header_sum` holds it.
fn hex_text(sum: &Sum) -> String {
    hex(sum).iter().map(|&b| char::from(b)).collect()
}

/// The sum whose hex text is `text` (64 lowercase digits), if it is one.
pub(crate) fn parse_sum(text: &str) -> Option<Sum> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut sum = [0u8; 32];
    for (out, pair) in sum.iter_mut().zip(bytes.chunks_exact(2)) {
        let [high, low] = pair else { return None };
        *out = (digit(*high)? << 4) | digit(*low)?;
    }
    Some(sum)
}

/// The sum of a run's header, when `stored` (its `header_sum`) is that sum's hex text.
pub(crate) fn checked_header(header: &str, stored: &str) -> Option<Sum> {
    let sum = header_sum(header);
    (hex(&sum).as_slice() == stored.as_bytes()).then_some(sum)
}

/// The chained sum of a step: over the previous sum's hex text (as version 1 chained it, so
/// that its sums hold as they are), the sequence number and the step's text.
fn step_sum(previous: &Sum, seq: u64, step: &str) -> Sum {
    let mut h = Sha256::new();
    h.update(hex(previous));
    h.update(seq.to_le_bytes());
    h.update(step.as_bytes());
    h.finalize().into()
}

/// A kind of SQLite file this crate keeps: the `format` and `version` its meta table names, and
/// the schema a new file gets.
pub(crate) struct FileKind {
    pub(crate) format: &'static str,
    pub(crate) version: i64,
    pub(crate) schema: &'static str,
    /// The SQL that takes a file of version `n` to `n + 1`, at index `n - 1`: a file older than
    /// `version` is brought up to it when opened.
    pub(crate) migrations: &'static [&'static str],
    /// The page size a new file gets (SQLite's own, 4096, when `None`); a file keeps the one it
    /// was made with.
    pub(crate) page_size: Option<u32>,
    /// Whether a writer ([`Access::Create`]) that may not write the file is refused at once:
    /// a run must not start on a journal or session store it cannot keep, while a response
    /// cache that cannot keep answers still gives the ones it has.
    pub(crate) must_write: bool,
}

const JOURNAL: FileKind = FileKind {
    format: JOURNAL_FORMAT,
    version: JOURNAL_VERSION,
    schema: SCHEMA,
    migrations: &[TO_V2, TO_V3],
    // Every WAL frame is a whole page, written and checksummed: a commit of a step or a few
    // writes two to three pages (the step log's last leaf, its index's, now and then the run's
    // row), so a smaller page is less to write per commit. 2048 bytes took 7-15% off a
    // `process` step's CPU with steps of 150 bytes (median) and 9% with 2 KB tool results, and
    // was within noise at 8 KB (agentloop-bench journal, BENCHMARKS.md); 1024 was no better.
    page_size: Some(2048),
    must_write: true,
};

/// How a file of this crate is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// For writing, made when it does not exist or is empty: a writer's (`run --journal`).
    Create,
    /// For writing, only when it is a file of the kind already (recording an answer).
    Write,
    /// For reading only (listing, showing, loading): the file is never changed, unless it is
    /// one of the kind in an older format, which is brought up to this one first; and the
    /// folder is left as it was found (no `-wal` or `-shm` left beside the file).
    Read,
}

/// Opens a journal file (see [`open_kind`]).
fn open_checked(path: &Path, access: Access) -> Result<Connection, JournalError> {
    open_kind(path, access, &JOURNAL)
}

/// Opens a file of `kind`, refusing a file that is something else, before anything is written
/// to it: whatever does not hold the kind's meta table, an empty file included, unless `access`
/// may create one and the file is new or empty (then its schema is made). Errors are a
/// journal's: the sessions store and the cache map them.
pub(crate) fn open_kind(
    path: &Path,
    access: Access,
    kind: &FileKind,
) -> Result<Connection, JournalError> {
    let shown = agentloop::printable::path(path);
    let foreign = |reason: String| JournalError::Foreign {
        path: shown.clone(),
        reason,
    };
    // No SQLite mutex on the connection: a `Connection` is used by one thread at a time (it is
    // not `Sync`; the writer's is behind a lock), so SQLite's own locking of each call (as
    // rusqlite's default flags also leave out) would only cost every step a few lock pairs.
    let flags = match access {
        Access::Create => {
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
        }
        // A reader's is opened by `open_for_reading`, so that it leaves nothing beside the file.
        Access::Write | Access::Read => {
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX
        }
    };
    if access != Access::Create && !path.exists() {
        return Err(io(format!("no journal at {shown}")));
    }
    if access == Access::Create {
        crate::create_private(path).map_err(|e| io(format!("cannot create {shown}: {e}")))?;
    }
    let conn = if access == Access::Read {
        crate::open_for_reading(path)
    } else {
        Connection::open_with_flags(path, flags)
    }
    .map_err(|e| io(format!("cannot open {shown}: {e}")))?;
    // A writer's (a run's) only: one that reads or answers a read-only file (`sessions list`)
    // still may.
    if access == Access::Create && kind.must_write && crate::opened_read_only(&conn) {
        return Err(io(format!("cannot write {shown}: it is read-only")));
    }
    conn.busy_timeout(crate::BUSY_WAIT).map_err(io)?;
    // Reading the schema is the first thing that touches the file: a file that is not SQLite
    // fails here. Every entry counts (a view, a trigger): a database of anything is no new file.
    let (tables, entries): (Vec<String>, usize) = conn
        .prepare("SELECT type, name FROM sqlite_master")
        .and_then(|mut s| {
            let rows: Vec<(String, String)> = s
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            let n = rows.len();
            let tables = rows
                .into_iter()
                .filter(|(t, _)| t == "table")
                .map(|(_, name)| name)
                .collect();
            Ok((tables, n))
        })
        .map_err(|e| foreign(format!("it cannot be read as SQLite ({e})")))?;
    if entries == 0 {
        // No page at all: an empty file, which only a writer may make its own. A database of
        // pages but no schema is another program's (its settings made, its tables to come).
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(|e| foreign(format!("it cannot be read as SQLite ({e})")))?;
        if pages > 0 {
            // Made by another process between the two reads (a journal's first use by two
            // runs at once): opened as the one it made.
            let now: i64 = conn
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(|e| foreign(format!("it cannot be read as SQLite ({e})")))?;
            if now > 0 {
                drop(conn);
                return open_kind(path, access, kind);
            }
            return Err(foreign(
                "it is an SQLite database without the tables of one".into(),
            ));
        }
        if access != Access::Create {
            return Err(foreign("it is empty".into()));
        }
        if let Some(size) = kind.page_size {
            // Before the first write, which fixes the page size of a new file.
            conn.pragma_update(None, "page_size", size).map_err(io)?;
        }
        // The tables are made in one rollback-journal transaction, and WAL mode is set after
        // it: switching to WAL first writes the file's first page at once, and a creation cut
        // short after it (a full disk, a kill) left a database without the tables of one,
        // refused as another program's from then on. Rolled back, the file is empty again.
        let made = (|| {
            conn.execute_batch("PRAGMA synchronous = FULL; BEGIN IMMEDIATE;")?;
            // Another process that found the file empty too (two runs on a journal's first
            // use) may have made it while this one waited for the lock: then it is opened as
            // the one that process made.
            let entries: i64 =
                conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
            if entries > 0 {
                conn.execute_batch("ROLLBACK")?;
                return Ok(false);
            }
            conn.execute_batch(kind.schema)?;
            conn.execute(
                "INSERT INTO agentloop_meta (key, value) VALUES ('format', ?1), ('version', ?2)",
                params![kind.format, kind.version.to_string()],
            )?;
            conn.execute_batch("COMMIT").map(|()| true)
        })();
        match made {
            Ok(true) => {}
            Ok(false) => {
                drop(conn);
                return open_kind(path, access, kind);
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(io(format!("cannot create {shown}: {e}")));
            }
        }
        crate::wal_mode(&conn).map_err(io)?;
        // The switch alone makes no `-wal` and `-shm`; a read does. They exist from the start,
        // as when the tables were made in WAL mode: the processes a run's tools start see what
        // exists then read-only, and could otherwise write a `-wal` the next open replays.
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(io)?;
        crate::pin_rollback_journal(path)
            .map_err(|e| io(format!("cannot create {shown}-journal: {e}")))?;
        return Ok(conn);
    }
    if !tables.iter().any(|t| t == "agentloop_meta") {
        return Err(foreign(format!(
            "it is an SQLite database with other tables ({})",
            tables.join(", ")
        )));
    }
    let meta = |key: &str| -> Result<Option<String>, JournalError> {
        conn.query_row(
            "SELECT value FROM agentloop_meta WHERE key = ?1",
            [key],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| foreign(format!("its meta table cannot be read ({e})")))
    };
    if meta("format")?.as_deref() != Some(kind.format) {
        return Err(foreign(format!("its format is not {}", kind.format)));
    }
    let version: i64 = meta("version")?
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| foreign("its version is missing".into()))?;
    if version > kind.version {
        return Err(foreign(format!(
            "its format version {version} is newer than this program's ({})",
            kind.version
        )));
    }
    if access == Access::Read {
        if version < kind.version {
            // An older file is brought up to this format by whoever opens it first, as it
            // would be by a writer: then read.
            drop(conn);
            return open_kind(path, Access::Write, kind)
                .and_then(|_| open_kind(path, Access::Read, kind));
        }
        return Ok(conn);
    }
    crate::wal_mode(&conn).map_err(io)?;
    conn.execute_batch("PRAGMA synchronous = FULL;")
        .map_err(io)?;
    if version < kind.version {
        migrate(&conn, kind, version)?;
    }
    if access == Access::Create {
        crate::pin_rollback_journal(path)
            .map_err(|e| io(format!("cannot create {shown}-journal: {e}")))?;
    }
    Ok(conn)
}

/// Brings a file of an older version up to `kind`'s, in one transaction.
fn migrate(conn: &Connection, kind: &FileKind, from: i64) -> Result<(), JournalError> {
    conn.execute_batch("BEGIN IMMEDIATE;").map_err(io)?;
    let result = (|| {
        // Another process may have migrated it meanwhile.
        let now: i64 = conn
            .query_row(
                "SELECT value FROM agentloop_meta WHERE key = 'version'",
                [],
                |r| r.get::<_, String>(0),
            )
            .map_err(io)?
            .parse()
            .unwrap_or(from);
        for v in now..kind.version {
            let sql = usize::try_from(v - 1)
                .ok()
                .and_then(|i| kind.migrations.get(i))
                .ok_or_else(|| io(format!("no way from format version {v} to {}", v + 1)))?;
            conn.execute_batch(sql).map_err(io)?;
        }
        conn.execute(
            "UPDATE agentloop_meta SET value = ?1 WHERE key = 'version'",
            [kind.version.to_string()],
        )
        .map_err(io)
    })();
    match result {
        Ok(_) => conn.execute_batch("COMMIT;").map_err(io),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK;");
            Err(e)
        }
    }
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

/// A run this journal drives: its lock file, locked, which is also its step log at `process`.
struct Owned {
    file: std::fs::File,
    log: Mutex<LogState>,
}

/// How far a run's step log has come.
#[derive(Default)]
struct LogState {
    /// Bytes written (none yet: the first write puts the header first).
    len: u64,
    /// The sequence number the next step must have, once known.
    next: Option<u64>,
    /// It holds steps the file does not.
    steps: bool,
}

impl SqliteJournal {
    /// Takes the run for this process: while this journal lives, another process's
    /// [`SqliteJournal::own`] of the same run fails with [`JournalError::Busy`] instead of
    /// racing it step for step. The lock is the operating system's (an advisory lock on a file
    /// in the `<journal>.owners` folder), so an owner that died leaves nothing that blocks the
    /// next one; the steps its step log holds (at `process`) are folded into the file first. A
    /// new run is owned when it begins; a resumed one must be owned first.
    pub fn own(&self, run_id: &str) -> Result<(), JournalError> {
        self.owned_run(run_id).map(drop)
    }

    /// [`SqliteJournal::own`], and the run's lock and log.
    fn owned_run(&self, run_id: &str) -> Result<Arc<Owned>, JournalError> {
        let mut owned = lock(&self.owned);
        if let Some(run) = owned.get(run_id) {
            return Ok(Arc::clone(run));
        }
        let path = log::file_of(&self.path, run_id);
        // A pooled file goes to the run's place when nothing is there (a hard link fails on an
        // existing name: never over a live owner's file or a dead one's log).
        let pooled = lock(&self.pool).pop();
        if let Some((at, file)) = pooled {
            match std::fs::hard_link(&at, &path) {
                // Linked from the file this handle holds (not one that took its name since).
                Ok(()) if is_at(&file, &path) => {
                    let _ = std::fs::remove_file(&at);
                    let run = Arc::new(Owned {
                        file,
                        log: Mutex::new(LogState::default()),
                    });
                    owned.insert(run_id.to_owned(), Arc::clone(&run));
                    return Ok(run);
                }
                // Another owner's file is at the run's place: the pooled one waits for the next.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    lock(&self.pool).push((at, file));
                }
                // Linked from another file at the pooled name: the link goes, and so does the
                // pooled file, whose name is no longer its own.
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                }
                // Gone (its folder deleted under this handle, say): it is let go.
                Err(_) => {}
            }
        }
        // An owner that lets a run go deletes its file while still holding the lock; whoever
        // opened that file before and locks it after holds a lock on a file no longer there,
        // and must take the one at the path instead. A few rounds settle any such race.
        for _ in 0..32 {
            if !self.folder_made.load(Ordering::Relaxed)
                && let Some(folder) = path.parent()
            {
                match std::fs::create_dir_all(folder) {
                    Ok(()) => {
                        self.folder_made.store(true, Ordering::Relaxed);
                        sweep(folder);
                    }
                    // Made and removed again between two looks (a file there is another
                    // matter: said with its name).
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AlreadyExists && !folder.is_file() =>
                    {
                        continue;
                    }
                    Err(e) => {
                        return Err(io(format!(
                            "cannot make the folder of the journal's run locks {}: {e}",
                            agentloop::printable::path(folder)
                        )));
                    }
                }
            }
            let file = {
                use std::os::unix::fs::OpenOptionsExt;
                match std::fs::OpenOptions::new()
                    .create(true)
                    .read(true)
                    .append(true)
                    .mode(crate::PRIVATE_MODE)
                    .open(&path)
                {
                    Ok(file) => file,
                    // The folder was deleted under this handle (by a person, or by an older
                    // agentloop with its last file): make it again.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        self.folder_made.store(false, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => return Err(io(e)),
                }
            };
            match fs4::fs_std::FileExt::try_lock_exclusive(&file) {
                Ok(true) if is_at(&file, &path) => {
                    self.take_over(&file, run_id)?;
                    if let Err(e) = self.take_over_former(run_id) {
                        // Not this handle's run after all: its file goes, as on release.
                        let _ = std::fs::remove_file(&path);
                        return Err(e);
                    }
                    let run = Arc::new(Owned {
                        file,
                        log: Mutex::new(LogState::default()),
                    });
                    owned.insert(run_id.to_owned(), Arc::clone(&run));
                    return Ok(run);
                }
                // Locked by an owner that has let the run go since this opened it (its file
                // was deleted or pooled): the file at the path now is the one to take.
                Ok(true) => continue,
                Ok(false) if !is_at(&file, &path) => continue,
                Ok(false) => {
                    return Err(JournalError::Busy {
                        run_id: run_id.to_owned(),
                    });
                }
                Err(e) => return Err(io(e)),
            }
        }
        Err(io(format!(
            "{} kept changing while it was being locked",
            agentloop::printable::path(&path)
        )))
    }

    /// Folds what a dead owner's step log holds (the run it names may be another whose id
    /// shares the file's name) into the file, then empties the log for this owner. Waits for
    /// the file as the writer thread does: this only happens to a run taken after a crash.
    ///
    /// A log damaged after it was written (a frame that fails its check with more after it, or
    /// bytes that are no log) is refused as [`JournalError::Damaged`] and left as it is: taking
    /// its intact part as the whole would run the lost steps' tool calls again.
    fn take_over(&self, file: &std::fs::File, run_id: &str) -> Result<(), JournalError> {
        let bytes = read_log(file, None)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let shown = || agentloop::printable::path(&log::file_of(&self.path, run_id));
        match log::parse(&bytes) {
            Some(log::Read {
                run_id: logged_run,
                steps,
                damage: Some(damage),
            }) => {
                // Only to number the first lost step: a file that cannot say counts none.
                let stored = self.writer.stored(&logged_run).unwrap_or(0);
                return Err(JournalError::Damaged {
                    step: Some(log::count(stored, &steps)),
                    run_id: logged_run,
                    reason: format!(
                        "its step log {} is damaged ({damage}): the steps from there on cannot \
                         be read; the log is left as it was",
                        shown()
                    ),
                });
            }
            Some(read) => self.fold(read.run_id, read.steps)?,
            None if log::is_foreign(&bytes) => {
                let what = if log::is_other_version(&bytes) {
                    "a step log in a format this version does not read (a newer agentloop's)"
                        .to_owned()
                } else {
                    format!("{} bytes that are no step log", bytes.len())
                };
                return Err(JournalError::Damaged {
                    run_id: run_id.to_owned(),
                    step: None,
                    reason: format!(
                        "its lock file {} holds {what}; it is left as it was",
                        shown()
                    ),
                });
            }
            None => {}
        }
        file.set_len(0).map_err(io)
    }

    /// Takes the log the version before digested file names left for run `run_id` under its
    /// former name ([`log::former_file_of`]), as a dead owner's is taken: folded, then deleted
    /// while locked. A live owner of the same run there (that version, still running it) makes
    /// the run [`JournalError::Busy`]; another run's file, live, is left alone.
    fn take_over_former(&self, run_id: &str) -> Result<(), JournalError> {
        let Some(former) = log::former_file_of(&self.path, run_id) else {
            return Ok(());
        };
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(&former)
        else {
            return Ok(());
        };
        match fs4::fs_std::FileExt::try_lock_exclusive(&file) {
            Ok(true) if is_at(&file, &former) => {
                self.take_over(&file, run_id)?;
                let _ = std::fs::remove_file(&former);
                Ok(())
            }
            Ok(false) if log::run_of(&former).as_deref() == Some(run_id) => {
                Err(JournalError::Busy {
                    run_id: run_id.to_owned(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Lets run `run_id` go (done by itself when the run finishes or suspends): the steps its
    /// step log holds that the file does not are folded into the file first (when that fails,
    /// they stay in the log, which is unlocked for the next owner); then its lock file is
    /// deleted, then unlocked, so that a journal of many runs leaves no file per run behind.
    /// The owners' folder stays (the next run's lock goes in it; making and removing it with
    /// each run was 7% of a journaled run's CPU), also after the handle is dropped.
    ///
    /// The file is kept for the next run this handle takes instead when it can be: emptied,
    /// still locked, and renamed out of the run's place (see the `pool` field).
    pub fn release(&self, run_id: &str) {
        let unfolded = lock(&self.owned)
            .get(run_id)
            .is_some_and(|run| lock(&run.log).steps);
        if unfolded && self.fold_now(run_id).is_err() {
            drop(lock(&self.owned).remove(run_id));
            return;
        }
        let Some(run) = lock(&self.owned).remove(run_id) else {
            return;
        };
        // Another process may take the run on from here: what the writer knew of it is stale.
        self.writer.forget(run_id);
        let path = log::file_of(&self.path, run_id);
        if let Ok(run) = Arc::try_unwrap(run) {
            let written = lock(&run.log).len;
            let mut pool = lock(&self.pool);
            if pool.len() < POOL_MOST && (written == 0 || run.file.set_len(0).is_ok()) {
                let at = pool_name(&self.path);
                if std::fs::rename(&path, &at).is_ok() {
                    pool.push((at, run.file));
                    return;
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    }

    /// Writes `steps` (numbered from `seq`) to run `run_id`'s step log in one frame: one
    /// `write`, after which a kill of the process loses none of them (the `process` level).
    fn log(&self, run_id: &str, seq: u64, steps: &[String]) -> Result<(), JournalError> {
        let run = self.owned_run(run_id)?;
        let mut state = lock(&run.log);
        let expected = match state.next {
            Some(next) => next,
            None => self.writer.take_on(run_id, self.durability)?,
        };
        if seq != expected {
            return Err(io(format!(
                "run {run_id}: step {seq} written out of order (expected step {expected})"
            )));
        }
        let mut bytes = Vec::with_capacity(64 + steps.iter().map(|s| s.len() + 12).sum::<usize>());
        if state.len == 0 {
            log::header(run_id, &mut bytes).map_err(io)?;
        }
        let mut cuts = Vec::new();
        log::frame(
            (seq..).zip(steps.iter().map(String::as_str)),
            &mut bytes,
            self.fault.is_some().then_some(&mut cuts),
        )
        .map_err(io)?;
        // The steps' places among the writer's appends, taken at once (runs log from several
        // threads).
        let nth = self
            .fault
            .map(|_| self.writer.count_logged(steps.len() as u64));
        if let Some(nth) = nth {
            self.fault_in(seq, nth, &run.file, &bytes, &cuts);
        }
        if let Err(e) = (&run.file).write_all(&bytes) {
            // A write cut short (a full disk) leaves no torn frame for the next one to follow.
            let _ = run.file.set_len(state.len);
            return Err(io(e));
        }
        state.len += bytes.len() as u64;
        state.next = Some(seq + steps.len() as u64);
        state.steps = true;
        if let (Some(fault), Some(nth)) = (self.fault, nth) {
            for i in 0..steps.len() as u64 {
                match fault {
                    Fault::AfterStep(n) if n == seq + i => hang(&format!("after step {n}")),
                    Fault::AfterWrite(n) if n == nth + i => hang(&format!("after write {n}")),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The crash tests' faults inside a step log's write: the frame is cut short inside the
    /// step, and the process waits to be killed.
    fn fault_in(&self, seq: u64, nth: u64, file: &std::fs::File, bytes: &[u8], cuts: &[usize]) {
        for (i, cut) in (0u64..).zip(cuts) {
            let inside = match self.fault {
                Some(Fault::InStep(s)) => s == seq + i,
                Some(Fault::InWrite(w)) => w == nth + i,
                _ => false,
            };
            if inside {
                let _ = (&*file).write_all(bytes.get(..cut + 6).unwrap_or(bytes));
                hang(&format!("in the write of step {}", seq + i));
            }
        }
    }

    /// The steps run `run_id`'s step log holds that the file may not, for the write that folds
    /// them in.
    /// The run is taken first when it is not this journal's yet (see [`Journal::append`]).
    fn logged(&self, run_id: &str) -> Result<log::Logged, JournalError> {
        let run = self.owned_run(run_id)?;
        let state = lock(&run.log);
        if !state.steps {
            return Ok(Vec::new());
        }
        let bytes = read_log(&run.file, Some(state.len))?;
        Ok(log::parse(&bytes).map(|r| r.steps).unwrap_or_default())
    }

    /// Runs `done` (a write that ends this process's part in run `run_id`, with the steps of
    /// its step log), then lets the run go when it was written.
    fn then_release<'a>(
        &'a self,
        run_id: &'a str,
        done: BoxFuture<'a, Result<(), JournalError>>,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        Box::pin(async move {
            done.await?;
            if let Some(run) = lock(&self.owned).get(run_id) {
                lock(&run.log).steps = false;
            }
            self.release(run_id);
            Ok(())
        })
    }

    /// Ends run `run_id` with `outcome` in one write: its logged steps, `last` (the step that
    /// ended it, when one did) and the end are committed all or none; then the run is let go.
    fn end_run<'a>(
        &'a self,
        run_id: &'a str,
        outcome: &'a RunOutcome,
        last: Option<(u64, String)>,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        let logged = match self.logged(run_id) {
            Ok(logged) => logged,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        self.then_release(
            run_id,
            self.send(Command::Finish {
                run_id: run_id.to_owned(),
                stop_reason: outcome.stop_reason.as_str().to_owned(),
                logged,
                last,
            }),
        )
    }

    /// Folds the steps of run `run_id`'s step log into the file now, on this thread (waiting
    /// for the file as the writer thread does): for a run let go unfinished.
    fn fold_now(&self, run_id: &str) -> Result<(), JournalError> {
        self.fold(run_id.to_owned(), self.logged(run_id)?)?;
        if let Some(run) = lock(&self.owned).get(run_id) {
            lock(&run.log).steps = false;
        }
        Ok(())
    }

    /// Commits `logged`, steps of run `run_id` read from a step log, into the file on this
    /// thread: waiting for the file as the writer thread does (a fold answers no run's step).
    fn fold(&self, run_id: String, logged: log::Logged) -> Result<(), JournalError> {
        if logged.is_empty() {
            return Ok(());
        }
        self.writer
            .commit_now(Command::Fold { run_id, logged }, self.durability)
    }
}

/// The most lock files a handle keeps for runs to come: as many as the runs it drives at once,
/// within reason.
const POOL_MOST: usize = 256;

/// A new name for a pooled lock file in the owners' folder of the journal at `journal`: unique
/// in the process, and never a run's (run files' names have no leading dot).
fn pool_name(journal: &Path) -> PathBuf {
    // Unique across processes too: two of them may share a process id (containers sharing the
    // journal's volume), and a rename onto another's pooled file would take its name.
    log::folder(journal).join(format!(".pool-{}.lock", agentloop::ids::run_id()))
}

/// Deletes the pooled lock files that no live handle holds (a process that died with some).
fn sweep(folder: &Path) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_name().to_string_lossy().starts_with(".pool-") {
            continue;
        }
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path)
            && matches!(fs4::fs_std::FileExt::try_lock_exclusive(&file), Ok(true))
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A step log's bytes (its first `len`, when known).
fn read_log(file: &std::fs::File, len: Option<u64>) -> Result<Vec<u8>, JournalError> {
    use std::os::unix::fs::FileExt;
    let len = match len {
        Some(len) => len,
        None => file.metadata().map_err(io)?.len(),
    };
    let mut bytes = vec![0; usize::try_from(len).map_err(io)?];
    file.read_exact_at(&mut bytes, 0).map_err(io)?;
    Ok(bytes)
}

/// The name of the lock file of `id` (a run's, a session's): the id itself when it is safe in
/// a file name, else a bounded digest of it.
pub(crate) fn lock_name(id: &str) -> String {
    log::name_of(id)
}

/// True when `file` is the file at `path` now (not one deleted or replaced since it was opened).
pub(crate) fn is_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(there)) => open.dev() == there.dev() && open.ino() == there.ino(),
        _ => false,
    }
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

/// The steps of run number `run_no` in order, each checked against the chain from its header's
/// sum, up to step `upto` (all without it), into `steps` (and their text into `texts`): the
/// file's, then those of its step log `logged` that follow on from them without a gap; the
/// damage that ends them, if any.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_steps(
    conn: &Connection,
    run_no: i64,
    header_sum: &Sum,
    upto: Option<u64>,
    logged: &[(u64, String)],
    steps: &mut Vec<Step>,
    texts: &mut Vec<String>,
    damaged: impl Fn(Option<u64>, String) -> JournalError,
) -> Result<Option<JournalError>, JournalError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, step, sum FROM step_log WHERE run_no = ?1 AND seq <= ?2 ORDER BY seq",
        )
        .map_err(io)?;
    let last = upto.map_or(i64::MAX, |u| i64::try_from(u).unwrap_or(i64::MAX));
    let mut rows = stmt.query(params![run_no, last]).map_err(io)?;
    let mut previous = *header_sum;
    let mut expected: u64 = 0;
    // Takes step `expected`'s text, checked against `sum` when the file holds one.
    let mut take = |text: String, sum: Option<&[u8]>, expected: &mut u64| {
        let computed = step_sum(&previous, *expected, &text);
        if sum.is_some_and(|sum| computed.as_slice() != sum) {
            return Some(damaged(
                Some(*expected),
                "its checksum does not match (the row was changed or torn)".into(),
            ));
        }
        match serde_json::from_str::<Step>(&text) {
            Ok(step) => steps.push(step),
            Err(e) => {
                return Some(damaged(
                    Some(*expected),
                    format!("it cannot be parsed ({e})"),
                ));
            }
        }
        texts.push(text);
        previous = computed;
        *expected += 1;
        None
    };
    loop {
        let row = match rows.next() {
            Ok(Some(row)) => row,
            Ok(None) => break,
            Err(e) => {
                return Ok(Some(damaged(
                    Some(expected),
                    format!("the row cannot be read ({e})"),
                )));
            }
        };
        let read: Result<(i64, String, &[u8]), _> = (|| {
            let sum = row.get_ref(2)?.as_bytes().map_err(rusqlite::Error::from)?;
            Ok::<_, rusqlite::Error>((row.get(0)?, row.get(1)?, sum))
        })();
        let (seq, text, sum) = match read {
            Ok(r) => r,
            Err(e) => {
                return Ok(Some(damaged(
                    Some(expected),
                    format!("the row cannot be read ({e})"),
                )));
            }
        };
        if u64::try_from(seq).ok() != Some(expected) {
            return Ok(Some(damaged(
                Some(expected),
                format!("the step is missing (the next row is step {seq})"),
            )));
        }
        if let Some(damage) = take(text, Some(sum), &mut expected) {
            return Ok(Some(damage));
        }
    }
    // The step log's frames were checked as they were read; its steps are chained on here.
    for (seq, text) in logged {
        if *seq < expected {
            continue;
        }
        if *seq != expected || upto.is_some_and(|u| *seq > u) {
            break;
        }
        if let Some(damage) = take(text.clone(), None, &mut expected) {
            return Ok(Some(damage));
        }
    }
    Ok(None)
}

/// One run of a journal, as [`JournalReader::runs`] lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunEntry {
    /// The run's id.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// `running`, `suspended` or `finished`.
    pub status: String,
    /// Its stop reason, once finished.
    pub stop_reason: Option<String>,
    /// How many steps are journaled.
    pub steps: u64,
    /// Its definition's fingerprint.
    pub fingerprint: String,
    /// When it started and was last written (ms since the Unix epoch).
    pub created_ms: i64,
    /// When it was last written: exact for the write that began, suspended or finished it;
    /// while it runs, at most a second before its last step (its row is not rewritten with
    /// every step).
    pub updated_ms: i64,
    /// The run and step it was forked from ([`SqliteJournal::fork`]), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
    /// For a subagent's run (a child journal), its parent run: the parent is the one resumed,
    /// and the one whose approvals hold the child's questions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// A call a suspended run waits on, as [`JournalReader::pending`] lists it. Its JSON has one
/// `agent`: the call's place in the tree (`lead/helper`) when a subagent asks, else the run's
/// agent.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingCall {
    /// The run.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// The call.
    pub request: ApprovalRequest,
    /// The answer, once recorded (a question's is `allow_once`, with its `reply`).
    pub answer: Option<Answer>,
    /// The answer to a question, once recorded.
    pub reply: Option<Value>,
}

impl serde::Serialize for WaitingCall {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            run_id: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            agent: &'a str,
            #[serde(flatten)]
            request: &'a ApprovalRequest,
            answer: &'a Option<Answer>,
            #[serde(skip_serializing_if = "Option::is_none")]
            reply: &'a Option<Value>,
        }
        // The request names its place in the tree when a subagent asks: written twice, the key
        // would leave the reader to pick one.
        let agent = if self.request.agent.is_empty() {
            self.agent.as_str()
        } else {
            ""
        };
        Out {
            run_id: &self.run_id,
            agent,
            request: &self.request,
            answer: &self.answer,
            reply: &self.reply,
        }
        .serialize(serializer)
    }
}

/// What the `answer` column of an approval holds: an approval's answer (`"allow_once"`, ...),
/// or a question's reply (`{"reply": ...}`).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum StoredAnswer {
    Approval(Answer),
    Reply { reply: Value },
}

/// The reading side of a journal file: runs, their steps (checked), approvals, and answers.
pub struct JournalReader {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for JournalReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalReader").finish_non_exhaustive()
    }
}

impl JournalReader {
    /// Opens an existing journal, to read it and record answers in it. A file that is not a
    /// journal (an empty one included) is refused, and left as it is.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Ok(JournalReader {
            conn: open_checked(path.as_ref(), Access::Write)?,
            path: path.as_ref().to_path_buf(),
        })
    }

    /// Opens an existing journal to read it only ([`JournalReader::answer`] and
    /// [`JournalReader::reply`] then fail): a file that is not a journal is refused, and
    /// nothing of it is changed. A journal in an older format is brought up to this one first.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Ok(JournalReader {
            conn: open_checked(path.as_ref(), Access::Read)?,
            path: path.as_ref().to_path_buf(),
        })
    }

    /// Every run, oldest first. A run that goes on at `process` (or whose process died) counts
    /// the steps of its step log too, and was last written when its log was.
    pub fn runs(&self) -> Result<Vec<RunEntry>, JournalError> {
        // The logs first, then the file: a fold between the two reads loses no step.
        let logs = log::read_all(&self.path);
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.run_id, r.agent, r.status, r.stop_reason, r.fingerprint, r.created_ms, \
                 r.updated_ms, (SELECT COUNT(*) FROM step_log s WHERE s.run_no = r.run_no), \
                 json_extract(r.header, '$.forked_from.run_id'), \
                 json_extract(r.header, '$.forked_from.step'), \
                 json_extract(r.header, '$.parent.run_id') \
                 FROM runs r ORDER BY r.created_ms, r.run_id",
            )
            .map_err(io)?;
        let rows = stmt
            .query_map([], |r| {
                Ok(RunEntry {
                    run_id: r.get(0)?,
                    agent: r.get(1)?,
                    status: r.get(2)?,
                    stop_reason: r.get(3)?,
                    fingerprint: r.get(4)?,
                    created_ms: r.get(5)?,
                    updated_ms: r.get(6)?,
                    steps: u64::try_from(r.get::<_, i64>(7)?).unwrap_or(0),
                    forked_from: match (r.get::<_, Option<String>>(8)?, r.get::<_, Option<i64>>(9)?)
                    {
                        (Some(run_id), Some(step)) => Some(ForkOrigin {
                            run_id,
                            step: u64::try_from(step).unwrap_or(0),
                        }),
                        _ => None,
                    },
                    parent: r.get(10)?,
                })
            })
            .map_err(io)?;
        let mut runs: Vec<RunEntry> = rows.collect::<Result<_, _>>().map_err(io)?;
        for run in &mut runs {
            if let Some((logged, written)) = logs.get(&run.run_id) {
                run.steps = log::count(run.steps, logged);
                run.updated_ms = run.updated_ms.max(*written);
            }
        }
        Ok(runs)
    }

    /// The run whose id is `id`, or starts with it when only one does.
    pub fn find(&self, id: &str) -> Result<String, JournalError> {
        let unknown = || JournalError::UnknownRun {
            run_id: id.to_owned(),
        };
        let ids: Vec<String> = self
            .runs()?
            .into_iter()
            .map(|r| r.run_id)
            .filter(|r| r.starts_with(id))
            .collect();
        if ids.iter().any(|r| r == id) {
            return Ok(id.to_owned());
        }
        match ids.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(unknown()),
        }
    }

    /// A run, whole and checked: any damage is an error naming the run and step.
    pub fn load(&self, run_id: &str) -> Result<JournaledRun, JournalError> {
        let (run, damage) = self.load_intact(run_id)?;
        match damage {
            Some(e) => Err(e),
            None => Ok(run),
        }
    }

    /// The clock a suspended run `run` (as [`JournalReader::load`] read it) goes on with: the
    /// time to its suspension and the wall-clock time it has waited since, which counts toward
    /// its deadline (give it to [`agentloop::Agent::resume_at`]), as it does on Restate. `None`
    /// for a run that did not suspend: the time between a crash and its resume is not the
    /// run's. Read before the resumed run writes its first step, which marks it running.
    pub fn waited(&self, run: &JournaledRun) -> Option<std::time::Duration> {
        if run.status != RunStatus::Suspended {
            return None;
        }
        let since: i64 = self
            .conn
            .query_row(
                "SELECT updated_ms FROM runs WHERE run_id = ?1 AND status = 'suspended'",
                [&run.header.run_id],
                |r| r.get(0),
            )
            .ok()?;
        let waited = u64::try_from(now_ms().saturating_sub(since)).unwrap_or(0);
        let at = run.steps.last().map_or(std::time::Duration::ZERO, |s| s.at);
        Some(at + std::time::Duration::from_millis(waited))
    }

    /// A run's intact part, and the damage that ends it, if any: the steps before a damaged row
    /// are returned, none after it.
    pub fn load_intact(
        &self,
        run_id: &str,
    ) -> Result<(JournaledRun, Option<JournalError>), JournalError> {
        let damaged = |step: Option<u64>, reason: String| JournalError::Damaged {
            run_id: run_id.to_owned(),
            step,
            reason,
        };
        // The log first, then the file: a fold between the two reads loses no step.
        let (logged, log_damage) = log::read_run(&self.path, run_id);
        type Row = (i64, String, String, String, Option<String>);
        let row: Option<Row> = self
            .conn
            .query_row(
                "SELECT run_no, header, header_sum, status, stop_reason FROM runs \
                 WHERE run_id = ?1",
                [run_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()
            .map_err(|e| damaged(None, format!("its row cannot be read ({e})")))?;
        let Some((run_no, header_text, stored, status, stop_reason)) = row else {
            return Err(JournalError::UnknownRun {
                run_id: run_id.to_owned(),
            });
        };
        let Some(sum) = checked_header(&header_text, &stored) else {
            return Err(damaged(None, "its checksum does not match".into()));
        };
        let header: JournalHeader = serde_json::from_str(&header_text)
            .map_err(|e| damaged(None, format!("it cannot be parsed ({e})")))?;
        let status = match status.as_str() {
            "running" => RunStatus::Running,
            "suspended" => RunStatus::Suspended,
            "finished" => RunStatus::Finished {
                stop_reason: stop_reason.unwrap_or_default(),
            },
            other => return Err(damaged(None, format!("unknown status {other:?}"))),
        };
        let approvals = self.approvals(run_id)?;
        let mut run = JournaledRun {
            header,
            steps: Vec::new(),
            status,
            approvals,
        };
        let damage = read_steps(
            &self.conn,
            run_no,
            &sum,
            None,
            &logged,
            &mut run.steps,
            &mut Vec::new(),
            damaged,
        )?;
        // The log's damage ends the run where its intact frames do.
        let damage = damage
            .or_else(|| log_damage.map(|reason| damaged(Some(run.steps.len() as u64), reason)));
        Ok((run, damage))
    }

    fn approvals(&self, run_id: &str) -> Result<Vec<PendingApproval>, JournalError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT call_id, request, answer FROM approvals WHERE run_id = ?1 ORDER BY rowid",
            )
            .map_err(io)?;
        let rows = stmt
            .query_map([run_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            })
            .map_err(io)?;
        let mut out = Vec::new();
        for row in rows {
            let (call_id, request, answer) = row.map_err(io)?;
            let damaged = |what: &str, e: serde_json::Error| JournalError::Damaged {
                run_id: run_id.to_owned(),
                step: None,
                reason: format!(
                    "the approval of call {call_id}: its {what} cannot be parsed ({e})"
                ),
            };
            let request: ApprovalRequest =
                serde_json::from_str(&request).map_err(|e| damaged("request", e))?;
            let (answer, reply) = match answer {
                Some(a) => {
                    let stored: StoredAnswer =
                        serde_json::from_str(&a).map_err(|e| damaged("answer", e))?;
                    match stored {
                        StoredAnswer::Approval(a) => (Some(a), None),
                        StoredAnswer::Reply { reply } => (Some(Answer::AllowOnce), Some(reply)),
                    }
                }
                None => (None, None),
            };
            out.push(PendingApproval {
                request,
                answer,
                reply,
            });
        }
        Ok(out)
    }

    /// The calls suspended runs wait on (answered or not), in run order. A subagent's question
    /// is listed once, on the top run of its tree (its call id prefixed with the calls that led
    /// to it, its agent the subagent's path), where it is answered.
    pub fn pending(&self) -> Result<Vec<WaitingCall>, JournalError> {
        let mut out = Vec::new();
        for run in self.runs()? {
            if run.status != "suspended" || run.parent.is_some() {
                continue;
            }
            for a in self.approvals(&run.run_id)? {
                out.push(WaitingCall {
                    run_id: run.run_id.clone(),
                    agent: run.agent.clone(),
                    request: a.request,
                    answer: a.answer,
                    reply: a.reply,
                });
            }
        }
        Ok(out)
    }

    /// Records a human's answer about a call a suspended run waits on.
    pub fn answer(&self, run_id: &str, call_id: &str, answer: Answer) -> Result<(), JournalError> {
        let text = serde_json::to_string(&answer).map_err(io)?;
        self.record(run_id, call_id, &text)
    }

    /// Records the user's answer to a question a suspended run waits on. The caller checks it
    /// against the question's schema first (`agentloop::ask::check_answer`).
    pub fn reply(&self, run_id: &str, call_id: &str, reply: &Value) -> Result<(), JournalError> {
        let text = serde_json::to_string(&StoredAnswer::Reply {
            reply: reply.clone(),
        })
        .map_err(io)?;
        self.record(run_id, call_id, &text)
    }

    fn record(&self, run_id: &str, call_id: &str, text: &str) -> Result<(), JournalError> {
        let status: Option<String> = self
            .conn
            .query_row("SELECT status FROM runs WHERE run_id = ?1", [run_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(io)?;
        let not = |reason: String| JournalError::NotResumable {
            run_id: run_id.to_owned(),
            reason,
        };
        match status.as_deref() {
            None => {
                return Err(JournalError::UnknownRun {
                    run_id: run_id.to_owned(),
                });
            }
            Some("suspended") => {}
            Some(other) => return Err(not(format!("it is {other}, not waiting for approval"))),
        }
        let changed = self
            .conn
            .execute(
                "UPDATE approvals SET answer = ?3 WHERE run_id = ?1 AND call_id = ?2",
                params![run_id, call_id, text],
            )
            .map_err(io)?;
        if changed == 0 {
            return Err(not(format!("it does not wait on a call {call_id}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_waiting_calls_json_has_one_agent_its_place_in_the_tree_when_a_subagent_asks() {
        let request = |agent: &str| ApprovalRequest {
            call_id: "c1".into(),
            tool: "shell".into(),
            arguments: serde_json::json!({}),
            agent: agent.into(),
            question: None,
        };
        let waiting = |agent: &str| WaitingCall {
            run_id: "r".into(),
            agent: "lead".into(),
            request: request(agent),
            answer: None,
            reply: None,
        };
        for (place, agent) in [("", "lead"), ("lead/helper", "lead/helper")] {
            let text = serde_json::to_string(&waiting(place)).unwrap();
            assert_eq!(text.matches("\"agent\"").count(), 1, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["agent"], agent);
            assert_eq!(v["call_id"], "c1");
            assert!(v.get("reply").is_none(), "{text}");
        }
    }
}
