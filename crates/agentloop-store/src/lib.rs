//! Traces of agentloop runs: record what runs did, read it back, and show it.
//!
//! - [`TraceSink`] is an [`agentloop::EventSink`] that turns a run's events into span records
//!   ([`TraceRecord`]: runs, turns, model calls, tool calls, linked by ids and parent ids) and
//!   writes them as they happen. [`TraceSink::open`] picks the format from the extension:
//!   `.ndjson` (one JSON record per line, appended) or `.sqlite`/`.db` (SQLite, schema created and
//!   migrated on open). Payloads are recorded only with [`TraceOptions::payloads`]; JSON payloads
//!   have credential-like keys redacted.
//! - [`read_trace`] reads either format into the same records; [`convert`] writes one format into
//!   the other.
//! - [`render_list`] and [`render_run`] (and their JSON variants) are the `trace list` and
//!   `trace show` views.
//! - [`SqliteJournal`] is the journal of durable runs (an [`agentloop::journal::Journal`]), and
//!   [`JournalReader`] reads it back checked, lists runs and pending approvals, and records
//!   answers (see [`journal`]).
//! - [`SqliteSessions`] keeps conversations by id across processes, one writer at a time (an
//!   [`agentloop::session::SessionStore`]; see [`sessions`]).
//! - [`SqliteResponseCache`] keeps model answers by request, with a time to live (see [`cache`]).
//!
//! ```no_run
//! # async fn demo(agent: agentloop::Agent) -> Result<(), agentloop_store::TraceError> {
//! use std::sync::Arc;
//! use agentloop_store::{TraceOptions, TraceSink, read_trace, render_list};
//!
//! let sink = Arc::new(TraceSink::open("runs.ndjson", TraceOptions { payloads: false })?);
//! let options = agentloop::RunOptions { sinks: vec![sink.clone()], ..Default::default() };
//! let _outcome = agent.run_with(Vec::new(), Some(agentloop::Message::user("hi")), options).await;
//! sink.finish()?;
//! print!("{}", render_list(&read_trace("runs.ndjson")?.records));
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod cache;
pub mod error;
pub mod format;
pub mod journal;
pub mod ndjson;
pub mod record;
pub mod sessions;
pub mod sink;
pub mod sqlite;
pub mod trace;
pub mod view;

/// The mode of every file the store creates (journals, sessions, caches, traces): readable and
/// writable by its owner only, as they hold whole prompts, tool outputs and approvals.
pub const PRIVATE_MODE: u32 = 0o600;

/// Creates `path` empty with [`PRIVATE_MODE`] unless it exists (then it is left as it is: its
/// owner chose its mode). SQLite gives its `-wal`, `-shm` and `-journal` files the mode of the
/// database, so they are private too. A link at `path` is refused, never followed: a process
/// that may write the folder (a tool's, a stdio MCP server's) could have put one there for the
/// store to be created, or an empty file it leads to made a database, wherever it leads.
pub(crate) fn create_private(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_MODE)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
                return Err(std::io::Error::other(
                    "it is a symbolic link, which a store never follows",
                ));
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Puts the SQLite file `conn` has open in WAL mode (a no-op once it is). Switching needs the
/// file to itself, and SQLite answers "busy" at once, without calling the busy handler as for a
/// write, while another connection reads it: as processes that open one new file at once do
/// (two runs on a new journal, trace or session store). So it is tried again for as long as a
/// write would wait.
pub(crate) fn wal_mode(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + BUSY_WAIT;
    loop {
        match conn.execute_batch("PRAGMA journal_mode = WAL") {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// True when SQLite opened the file read-only although it was asked for writing, as it does,
/// without an error, with a file it may not write. Asked before the first read: that read makes
/// the `-wal` and `-shm` of a file in WAL mode, which a read-only connection leaves behind, and
/// the first write would fail only later (a journal's run then failed at its first step).
pub(crate) fn opened_read_only(conn: &rusqlite::Connection) -> bool {
    conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false)
}

/// Opens the SQLite file of a store at `path` to read it only (`journal list`, `sessions list`,
/// `trace show`): it sees what a running writer has committed, writes nothing, and leaves the
/// folder as it found it, whether this process may write there or not.
///
/// - A `-wal` beside the file means a connection has it open (a writer runs) or the last one
///   ended without folding it into the file: the file is opened read-only, on the `-wal` and
///   `-shm` that are there, which it leaves as they are.
/// - Without one, every commit is in the file and no connection has it open. Where this process
///   may write the file and its folder, the file is opened read-write with writes refused
///   (`query_only`): closing last, the connection removes the `-wal` and `-shm` its reading
///   made, which a read-only one leaves behind. Where it may not (a read-only file, folder or
///   mount), SQLite opens it read-only without a word and leaves both, or cannot make them and
///   fails to read at all: the file is read `immutable` then, as it is, without a log or locks.
///   No writer has it open; one that started in the moment of the read, which takes another
///   user's access to the folder, could fold its log into the file under the reader, whose
///   read then fails rather than shows what was never committed.
pub(crate) fn open_for_reading(path: &std::path::Path) -> rusqlite::Result<rusqlite::Connection> {
    use rusqlite::{Connection, OpenFlags};
    let conn = if wal_beside(path) {
        Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?
    } else {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_WAIT)?;
        if opened_read_only(&conn) || cannot_make_its_log(&conn) {
            drop(conn);
            open_immutable(path)?
        } else {
            conn
        }
    };
    conn.busy_timeout(BUSY_WAIT)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// True when the write-ahead log of the SQLite file at `path` is there: a connection has it
/// open, or the last one ended without moving it into the file.
pub(crate) fn wal_beside(path: &std::path::Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::path::Path::new(&wal).exists()
}

/// True when the first read of `conn` fails because SQLite may not make the `-wal` and `-shm`
/// of a file in WAL mode (its folder is read-only). Any other failure is left to the caller's
/// own first read, which reports it.
fn cannot_make_its_log(conn: &rusqlite::Connection) -> bool {
    match conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    }) {
        Err(rusqlite::Error::SqliteFailure(e, _)) => matches!(
            e.code,
            rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen
        ),
        _ => false,
    }
}

/// Opens the SQLite file at `path` read-only as `immutable` (see [`open_for_reading`]): its
/// path as a URI, each byte that is not plain percent-encoded, so no name is read as a query.
fn open_immutable(path: &std::path::Path) -> rusqlite::Result<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    use std::fmt::Write as _;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(char::from(b));
        } else {
            let _ = write!(uri, "%{b:02X}");
        }
    }
    uri.push_str("?immutable=1");
    rusqlite::Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
}

/// How long a store's connection waits for another process's lock before it answers "busy".
pub(crate) const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Puts an empty `<path>-journal` beside the SQLite file at `path` (open in WAL mode, which
/// never writes one) unless something is there: SQLite rolls a non-empty one back into the file
/// at its next open, so a process that may write the folder could otherwise plant one with
/// pages of its own. Existing, it is kept read-only for such a process with the file; empty, it
/// is no hot journal and SQLite leaves it be.
pub(crate) fn pin_rollback_journal(path: &std::path::Path) -> std::io::Result<()> {
    let mut journal = path.as_os_str().to_owned();
    journal.push("-journal");
    create_private(std::path::Path::new(&journal))
}

pub use cache::SqliteResponseCache;
pub use error::TraceError;
pub use format::{TraceFormat, TraceWriter};
pub use journal::{Durability, ForkOrigin, JournalReader, RunEntry, SqliteJournal, WaitingCall};
pub use ndjson::NdjsonWriter;
pub use record::{
    CompactionSpan, ErrorInfo, ModelCallSpan, RunSpan, Span, Status, ToolCallSpan, ToolsChange,
    TraceRecord, TurnSpan, format_rfc3339,
};
// The redactor (the module `redact` and its two functions) lives in `agentloop-observe`, so that
// exporters without SQLite share it; its paths here stay as they were.
pub use agentloop_observe::{redact, redact_text};
pub use sessions::SqliteSessions;
pub use sink::{Clock, SUPERSEDED, TraceOptions, TraceSink};
pub use sqlite::{SCHEMA_VERSION, SqliteWriter};
pub use trace::{Trace, convert, latest_versions, open_writer, read_trace};
pub use view::{
    RunSummary, RunTree, TurnNode, find_run, render_list, render_list_json, render_run,
    render_run_json, render_run_tree, run_tree, summarize_runs,
};
