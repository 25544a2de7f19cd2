//! The SQLite session store ([`SqliteSessions`], an [`agentloop::session::SessionStore`]):
//! conversations kept by id across processes, one writer at a time.
//!
//! A session's lock is a row naming its holder (a unique owner, its process id, since when); a
//! second writer is refused while the holder's process lives. A lock whose process has died (on
//! systems with `/proc`) is taken over, so a crashed writer never leaves a session locked.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agentloop::journal::JournalError;
use agentloop::session::{
    SessionError, SessionLock, SessionStore, SessionSummary, StoredSession, check_transcript,
};
use rusqlite::{Connection, OptionalExtension, params};

use crate::journal::{Access, FileKind, now_ms, open_kind};

/// The `format` a session store's meta table names.
pub const SESSIONS_FORMAT: &str = "agentloop-sessions";

const SCHEMA: &str = "
CREATE TABLE agentloop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    messages TEXT NOT NULL,
    history TEXT,
    usage TEXT NOT NULL,
    cost_usd REAL NOT NULL,
    runs INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE session_locks (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    pid INTEGER NOT NULL,
    acquired_ms INTEGER NOT NULL
);
";

const KIND: FileKind = FileKind {
    format: SESSIONS_FORMAT,
    version: 2,
    schema: SCHEMA,
    // 2: the full history beside the (compacted) transcript; NULL when they are the same.
    migrations: &["ALTER TABLE sessions ADD COLUMN history TEXT;"],
    page_size: None,
    must_write: true,
};

fn io(e: impl std::fmt::Display) -> SessionError {
    SessionError::Io {
        message: e.to_string(),
    }
}

fn from_journal(e: JournalError) -> SessionError {
    let message = match e {
        JournalError::Foreign { path, reason } => {
            format!("{path} is not an agentloop session store: {reason}")
        }
        JournalError::Io { message } => message,
        other => other.to_string(),
    };
    SessionError::Io { message }
}

/// Conversations in a SQLite file.
#[derive(Clone)]
pub struct SqliteSessions {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteSessions")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteSessions {
    /// Opens (or creates) the store at `path`; a file that is not a session store is refused.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SessionError> {
        let path = path.as_ref().to_path_buf();
        let conn = open_kind(&path, Access::Create, &KIND).map_err(from_journal)?;
        // The lock files' folder exists from the start: processes a run's tools start before a
        // session is first locked (stdio MCP servers) see only what exists then read-only, and
        // could otherwise plant a lock that keeps every writer out.
        let folder = lock_folder(&path);
        std::fs::create_dir_all(&folder).map_err(|e| SessionError::Io {
            message: format!("{}: {e}", agentloop::printable::path(&folder)),
        })?;
        Ok(SqliteSessions {
            path,
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Opens the store at `path` only if it is one already: a path where there is nothing, or
    /// an empty file, is refused and left as it is (a mistyped path to `agentloop sessions`
    /// must not become a new store).
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Self, SessionError> {
        Self::open_there(path.as_ref(), Access::Write)
    }

    /// Opens the store at `path` to read it only (`sessions list`, `sessions show`): as
    /// [`SqliteSessions::open_existing`], but nothing of it is changed, nothing is left beside
    /// it, and a store in a read-only file or folder is read all the same. Saving or deleting a
    /// session through it fails.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, SessionError> {
        Self::open_there(path.as_ref(), Access::Read)
    }

    /// Opens the store at `path` for `access` only if it is one already.
    fn open_there(path: &Path, access: Access) -> Result<Self, SessionError> {
        if !path.exists() {
            return Err(SessionError::Io {
                message: format!("no session store at {}", agentloop::printable::path(path)),
            });
        }
        let conn = open_kind(path, access, &KIND).map_err(from_journal)?;
        Ok(SqliteSessions {
            path: path.to_path_buf(),
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, SessionError>,
    ) -> Result<T, SessionError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn)
    }
}

/// A listed session, as far as its row can be read: a column that cannot be read is named in
/// its `damage` and left at its default, so that a damaged row is listed (and can be deleted)
/// beside the others rather than failing the list.
fn summary_of(r: &rusqlite::Row<'_>) -> SessionSummary {
    let mut damage: Vec<String> = Vec::new();
    let mut column = |what: &str, value: rusqlite::Result<Option<String>>| match value {
        Ok(v) => v,
        Err(e) => {
            damage.push(format!("its {what} cannot be read ({e})"));
            None
        }
    };
    let id = column("id", r.get(0)).unwrap_or_default();
    let agent = column("agent", r.get(1)).unwrap_or_default();
    let usage = column("usage", r.get(4));
    let mut summary = SessionSummary {
        id,
        agent,
        messages: 0,
        runs: 0,
        usage: Default::default(),
        cost_usd: 0.0,
        updated_ms: 0,
        damage: None,
    };
    match r.get::<_, Option<i64>>(2) {
        Ok(Some(n)) => summary.messages = usize::try_from(n).unwrap_or(0),
        _ => damage.push("its transcript cannot be read".into()),
    }
    match usage.map(|u| serde_json::from_str(&u)) {
        Some(Ok(usage)) => summary.usage = usage,
        Some(Err(e)) => damage.push(format!("its usage cannot be read ({e})")),
        None => {}
    }
    let mut number = |what: &str, e: rusqlite::Error| {
        damage.push(format!("its {what} cannot be read ({e})"));
    };
    match r.get(3) {
        Ok(runs) => summary.runs = runs,
        Err(e) => number("run count", e),
    }
    match r.get(5) {
        Ok(cost) => summary.cost_usd = cost,
        Err(e) => number("cost", e),
    }
    match r.get(6) {
        Ok(at) => summary.updated_ms = at,
        Err(e) => number("time", e),
    }
    if !damage.is_empty() {
        summary.damage = Some(damage.join("; "));
    }
    summary
}

fn damaged(id: &str, reason: String) -> SessionError {
    SessionError::Damaged {
        id: id.to_owned(),
        reason,
    }
}

impl SessionStore for SqliteSessions {
    fn load(&self, id: &str) -> Result<Option<StoredSession>, SessionError> {
        type Row = (
            String,
            String,
            Option<String>,
            String,
            f64,
            u32,
            String,
            i64,
            i64,
        );
        let row: Option<Row> = self.with(|c| {
            c.query_row(
                "SELECT agent, messages, history, usage, cost_usd, runs, metadata, created_ms, \
                 updated_ms FROM sessions WHERE id = ?1",
                [id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                    ))
                },
            )
            .optional()
            .map_err(io)
        })?;
        let Some((
            agent,
            messages,
            history,
            usage,
            cost_usd,
            runs,
            metadata,
            created_ms,
            updated_ms,
        )) = row
        else {
            return Ok(None);
        };
        let parse = |what: &str, e: serde_json::Error| {
            damaged(id, format!("its {what} cannot be read ({e})"))
        };
        let messages: Vec<agentloop::Message> =
            serde_json::from_str(&messages).map_err(|e| parse("transcript", e))?;
        check_transcript(&messages).map_err(|reason| damaged(id, reason))?;
        let history = match history {
            Some(h) => serde_json::from_str(&h).map_err(|e| parse("history", e))?,
            None => Vec::new(),
        };
        Ok(Some(StoredSession {
            id: id.to_owned(),
            agent,
            messages,
            history,
            usage: serde_json::from_str(&usage).map_err(|e| parse("usage", e))?,
            cost_usd,
            runs,
            metadata: serde_json::from_str(&metadata).map_err(|e| parse("metadata", e))?,
            created_ms,
            updated_ms,
        }))
    }

    fn save(&self, s: &StoredSession) -> Result<(), SessionError> {
        let messages = serde_json::to_string(&s.messages).map_err(io)?;
        // Stored only once a compaction made it differ from the transcript.
        let history = if s.history.is_empty() {
            None
        } else {
            Some(serde_json::to_string(&s.history).map_err(io)?)
        };
        let usage = serde_json::to_string(&s.usage).map_err(io)?;
        let metadata = serde_json::to_string(&s.metadata).map_err(io)?;
        self.with(|c| {
            c.execute(
                "INSERT INTO sessions (id, agent, messages, history, usage, cost_usd, runs, \
                 metadata, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                 ON CONFLICT (id) DO UPDATE SET agent = excluded.agent, \
                 messages = excluded.messages, history = excluded.history, usage = excluded.usage, \
                 cost_usd = excluded.cost_usd, runs = excluded.runs, \
                 metadata = excluded.metadata, updated_ms = excluded.updated_ms",
                params![
                    s.id,
                    s.agent,
                    messages,
                    history,
                    usage,
                    s.cost_usd,
                    s.runs,
                    metadata,
                    s.created_ms,
                    s.updated_ms
                ],
            )
            .map(drop)
            .map_err(io)
        })
    }

    fn list(&self) -> Result<Vec<SessionSummary>, SessionError> {
        self.with(|c| {
            // `json_valid` first: `json_array_length` of a damaged transcript failed the whole
            // query ("malformed JSON"), so one damaged row hid every session.
            let mut stmt = c
                .prepare(
                    "SELECT id, agent, CASE WHEN json_valid(messages) \
                     THEN json_array_length(messages) END, runs, usage, cost_usd, updated_ms \
                     FROM sessions ORDER BY updated_ms DESC, id",
                )
                .map_err(io)?;
            let rows = stmt.query_map([], |r| Ok(summary_of(r))).map_err(io)?;
            rows.collect::<Result<_, _>>().map_err(io)
        })
    }

    fn delete(&self, id: &str) -> Result<bool, SessionError> {
        self.with(|c| {
            c.execute("DELETE FROM sessions WHERE id = ?1", [id])
                .map(|n| n > 0)
                .map_err(io)
        })
    }

    fn fork(&self, from: &str, to: &str) -> Result<(), SessionError> {
        let Some(mut session) = self.load(from)? else {
            return Err(SessionError::NotFound {
                id: from.to_owned(),
            });
        };
        if self.load(to)?.is_some() {
            return Err(SessionError::Exists { id: to.to_owned() });
        }
        let now = now_ms();
        session.id = to.to_owned();
        session.created_ms = now;
        session.updated_ms = now;
        session.metadata.insert(
            "forked_from".into(),
            serde_json::Value::String(from.to_owned()),
        );
        self.save(&session)
    }

    fn lock(&self, id: &str) -> Result<Box<dyn SessionLock>, SessionError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        // `file-`: a writer that holds the session's lock file (see below).
        let owner = format!(
            "file-{pid}-{}-{}",
            now_ms(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // The writer holds an exclusive lock on a file of the session's own for as long as it
        // writes: the system lets it go when the writer dies, wherever its process id can or
        // cannot be seen (another container, another host on the same file system). The row
        // says who holds it, for the message a second writer reads.
        let path = lock_file(&self.path, id);
        for _ in 0..32 {
            let file = match open_lock_file(&path) {
                Ok(file) => file,
                // A releasing writer removed the folder with its file: make it again.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(e)),
            };
            match fs4::fs_std::FileExt::try_lock_exclusive(&file) {
                Ok(true) if crate::journal::is_at(&file, &path) => {}
                // Locked by a writer that has let the session go since this opened it (its file
                // was deleted): the file at the path now is the one to take.
                Ok(true) => continue,
                Ok(false) if !crate::journal::is_at(&file, &path) => continue,
                Ok(false) => return Err(self.busy(id)),
                Err(e) => return Err(io(e)),
            }
            let row: Option<(String, u32)> = self.with(|c| {
                c.query_row(
                    "SELECT owner, pid FROM session_locks WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(io)
            })?;
            // A writer of the version before these files took no file lock: its row, while its
            // process visibly lives, still holds the session. A row of a writer that held the
            // file is stale now that the file is ours.
            let legacy = row.filter(|(o, p)| !o.starts_with("file-") && *p != pid && alive(*p));
            if let Some((_, holder)) = legacy {
                let _ = std::fs::remove_file(&path);
                return Err(SessionError::Busy {
                    id: id.to_owned(),
                    holder: format!("process {holder}"),
                });
            }
            self.with(|c| {
                c.execute(
                    "INSERT INTO session_locks (id, owner, pid, acquired_ms) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, pid = excluded.pid, \
                     acquired_ms = excluded.acquired_ms",
                    params![id, owner, pid, now_ms()],
                )
                .map_err(io)
            })?;
            return Ok(Box::new(Lock {
                conn: Arc::clone(&self.conn),
                id: id.to_owned(),
                owner,
                path,
                _file: file,
            }));
        }
        Err(SessionError::Busy {
            id: id.to_owned(),
            holder: "another writer".into(),
        })
    }
}

impl SqliteSessions {
    /// Why a session is busy: who holds it, as its row says.
    fn busy(&self, id: &str) -> SessionError {
        let holder: Option<(u32, i64)> = self
            .with(|c| {
                c.query_row(
                    "SELECT pid, acquired_ms FROM session_locks WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(io)
            })
            .ok()
            .flatten();
        SessionError::Busy {
            id: id.to_owned(),
            holder: match holder {
                Some((pid, since)) => {
                    format!("process {pid} (for {} s)", (now_ms() - since).max(0) / 1000)
                }
                None => "another writer".into(),
            },
        }
    }
}

/// The lock file of session `id`: in a folder beside the store, named as a journal names a run's.
fn lock_file(store: &Path, id: &str) -> PathBuf {
    lock_folder(store).join(crate::journal::lock_name(id))
}

/// The folder of a store's lock files: `<store>.locks`.
fn lock_folder(store: &Path) -> PathBuf {
    let mut folder = store.as_os_str().to_owned();
    folder.push(".locks");
    PathBuf::from(folder)
}

fn open_lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(folder) = path.parent() {
        std::fs::create_dir_all(folder)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .mode(crate::PRIVATE_MODE)
        .open(path)
}

/// Whether a process lives; without `/proc`, every process is taken to live.
fn alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

struct Lock {
    conn: Arc<Mutex<Connection>>,
    id: String,
    owner: String,
    /// The lock file, removed on release while still locked (so no file a session is left
    /// behind); the open file holds the lock until it is dropped after that.
    path: PathBuf,
    _file: std::fs::File,
}

impl SessionLock for Lock {}

impl Drop for Lock {
    fn drop(&mut self) {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let _ = conn.execute(
            "DELETE FROM session_locks WHERE id = ?1 AND owner = ?2",
            params![self.id, self.owner],
        );
        let _ = std::fs::remove_file(&self.path);
    }
}
