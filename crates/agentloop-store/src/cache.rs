//! The SQLite response cache ([`SqliteResponseCache`], an
//! [`agentloop::model::cache::ResponseCache`]): answers kept by request key with a time to live.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use agentloop::ModelResponse;
use agentloop::model::cache::ResponseCache;
use rusqlite::{Connection, OptionalExtension, params};

use crate::journal::{Access, FileKind, now_ms, open_kind};

/// The `format` a response cache's meta table names.
pub const CACHE_FORMAT: &str = "agentloop-response-cache";

const SCHEMA: &str = "
CREATE TABLE agentloop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE responses (
    key TEXT PRIMARY KEY,
    response TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
";

const KIND: FileKind = FileKind {
    format: CACHE_FORMAT,
    version: 1,
    schema: SCHEMA,
    migrations: &[],
    page_size: None,
    must_write: false,
};

/// Model answers in a SQLite file, each until its time to live runs out.
pub struct SqliteResponseCache {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteResponseCache")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteResponseCache {
    /// Opens (or creates) the cache at `path`; a file that is not a response cache is refused.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, String> {
        let path = path.as_ref().to_path_buf();
        let conn = open_kind(&path, Access::Create, &KIND).map_err(|e| match e {
            agentloop::journal::JournalError::Foreign { path, reason } => {
                format!("{path} is not an agentloop response cache: {reason}")
            }
            other => other.to_string(),
        })?;
        Ok(SqliteResponseCache {
            path,
            conn: Mutex::new(conn),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ResponseCache for SqliteResponseCache {
    fn get(&self, key: &str) -> Result<Option<ModelResponse>, String> {
        Ok(self.get_paid(key)?.map(|(response, _)| response))
    }

    fn put(&self, key: &str, response: &ModelResponse, ttl: Duration) -> Result<(), String> {
        self.put_paid(key, response, None, ttl)
    }

    /// The model call that paid for the answer is a `paid_by` key beside the response's own in
    /// the row's JSON: a row written before it was kept has none, and a reader that does not
    /// know it reads the response alone.
    fn get_paid(&self, key: &str) -> Result<Option<(ModelResponse, Option<String>)>, String> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let row: Option<String> = conn
            .query_row(
                "SELECT response FROM responses WHERE key = ?1 AND expires_ms > ?2",
                params![key, now_ms()],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        // A row that cannot be read is a miss: the model answers again and the row is replaced.
        Ok(row.and_then(|text| {
            let mut value: serde_json::Value = serde_json::from_str(&text).ok()?;
            let paid_by = value
                .as_object_mut()
                .and_then(|o| o.remove(PAID_BY))
                .and_then(|p| p.as_str().map(str::to_owned));
            Some((serde_json::from_value(value).ok()?, paid_by))
        }))
    }

    fn put_paid(
        &self,
        key: &str,
        response: &ModelResponse,
        paid_by: Option<&str>,
        ttl: Duration,
    ) -> Result<(), String> {
        let mut value = serde_json::to_value(response).map_err(|e| e.to_string())?;
        if let (Some(paid_by), Some(o)) = (paid_by, value.as_object_mut()) {
            o.insert(PAID_BY.to_owned(), paid_by.into());
        }
        let text = value.to_string();
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.execute(
            "INSERT INTO responses (key, response, expires_ms) VALUES (?1, ?2, ?3) \
             ON CONFLICT (key) DO UPDATE SET response = excluded.response, \
             expires_ms = excluded.expires_ms",
            params![key, text, now.saturating_add(ttl_ms)],
        )
        .map_err(|e| e.to_string())?;
        // Expired answers are dropped as new ones come in.
        conn.execute("DELETE FROM responses WHERE expires_ms <= ?1", [now])
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The key of a row's JSON that names the model call that paid for its answer.
const PAID_BY: &str = "paid_by";
