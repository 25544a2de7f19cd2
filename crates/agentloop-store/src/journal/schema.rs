//! The journal file's format: its tables and their migrations from older versions, and how
//! this crate's SQLite files (the journal, the session store, the response cache) are opened
//! and checked before anything is written to them. Apart from the writing and reading sides,
//! which both open a file through it.

use std::path::Path;

use agentloop::journal::JournalError;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::io;

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
pub(super) fn open_checked(path: &Path, access: Access) -> Result<Connection, JournalError> {
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
