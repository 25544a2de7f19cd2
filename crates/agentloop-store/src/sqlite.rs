//! SQLite traces: one table per span kind (`runs`, `turns`, `model_calls`, `tool_calls`), one row
//! per span, inserted when the span starts and updated when it ends. Columns are plain values an
//! operator can query (times in unix ms, tokens, costs, status); payloads are JSON text. `seq`
//! orders spans across tables as they were first written.
//!
//! The schema is created and migrated idempotently when a writer opens the file, under
//! `PRAGMA user_version`; a file from a newer version is refused rather than altered.

use std::path::{Path, PathBuf};

use agentloop::model::Usage;
use rusqlite::types::{Type, Value as Sql};
use rusqlite::{Connection, OptionalExtension, Row};
use serde_json::Value;

use crate::error::TraceError;
use crate::format::TraceWriter;
use crate::record::{
    CompactionSpan, ErrorInfo, ModelCallSpan, RunSpan, Span, Status, ToolCallSpan, TraceRecord,
    TurnSpan,
};

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: i64 = 8;

// One migration per version step, or a file would be stamped with a version it does not have.
const _: () = assert!(MIGRATIONS.len() as i64 == SCHEMA_VERSION);

/// Migration `i` brings a file from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER NOT NULL, id TEXT PRIMARY KEY, parent_id TEXT, run_id TEXT NOT NULL,
    started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER, duration_ms REAL, status TEXT NOT NULL,
    error_code TEXT, error_message TEXT,
    agent TEXT NOT NULL, model TEXT NOT NULL, stop_reason TEXT,
    turns INTEGER, model_calls INTEGER, tool_calls INTEGER,
    input_tokens INTEGER, output_tokens INTEGER, cached_input_tokens INTEGER,
    cache_write_tokens INTEGER, reasoning_tokens INTEGER, cost_usd REAL,
    limit_hit TEXT, input TEXT, output TEXT
);
CREATE TABLE IF NOT EXISTS turns (
    seq INTEGER NOT NULL, id TEXT PRIMARY KEY, parent_id TEXT, run_id TEXT NOT NULL,
    started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER, duration_ms REAL, status TEXT NOT NULL,
    error_code TEXT, error_message TEXT,
    turn INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS model_calls (
    seq INTEGER NOT NULL, id TEXT PRIMARY KEY, parent_id TEXT, run_id TEXT NOT NULL,
    started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER, duration_ms REAL, status TEXT NOT NULL,
    error_code TEXT, error_message TEXT,
    model TEXT NOT NULL, provider TEXT NOT NULL, messages INTEGER NOT NULL,
    input_tokens INTEGER, output_tokens INTEGER, cached_input_tokens INTEGER,
    cache_write_tokens INTEGER, reasoning_tokens INTEGER, cost_usd REAL,
    finish_reason TEXT, tool_calls INTEGER, text TEXT, reasoning TEXT
);
CREATE TABLE IF NOT EXISTS tool_calls (
    seq INTEGER NOT NULL, id TEXT PRIMARY KEY, parent_id TEXT, run_id TEXT NOT NULL,
    started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER, duration_ms REAL, status TEXT NOT NULL,
    error_code TEXT, error_message TEXT,
    call_id TEXT NOT NULL, tool TEXT NOT NULL, arguments TEXT, output TEXT, details TEXT
);
CREATE INDEX IF NOT EXISTS turns_run ON turns (run_id);
CREATE INDEX IF NOT EXISTS model_calls_run ON model_calls (run_id);
CREATE INDEX IF NOT EXISTS tool_calls_run ON tool_calls (run_id);
"#,
    r#"
ALTER TABLE runs ADD COLUMN warnings TEXT;
"#,
    r#"
ALTER TABLE tool_calls ADD COLUMN retries TEXT;
"#,
    r#"
ALTER TABLE runs ADD COLUMN parent_call_id TEXT;
"#,
    r#"
ALTER TABLE model_calls ADD COLUMN cached INTEGER;
"#,
    r#"
CREATE TABLE IF NOT EXISTS compactions (
    seq INTEGER NOT NULL, id TEXT PRIMARY KEY, parent_id TEXT, run_id TEXT NOT NULL,
    started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER, duration_ms REAL, status TEXT NOT NULL,
    error_code TEXT, error_message TEXT,
    policy TEXT NOT NULL, messages_replaced INTEGER NOT NULL, tokens_before INTEGER NOT NULL,
    tokens_after INTEGER NOT NULL,
    input_tokens INTEGER, output_tokens INTEGER, cached_input_tokens INTEGER,
    cache_write_tokens INTEGER, reasoning_tokens INTEGER, cost_usd REAL,
    fallback TEXT, summary TEXT, replaced TEXT
);
CREATE INDEX IF NOT EXISTS compactions_run ON compactions (run_id);
"#,
    r#"
ALTER TABLE turns ADD COLUMN tools_changed TEXT;
ALTER TABLE runs ADD COLUMN tool_output TEXT;
"#,
    r#"
ALTER TABLE runs ADD COLUMN handoff TEXT;
"#,
];

const TABLES: [&str; 5] = ["runs", "turns", "model_calls", "tool_calls", "compactions"];

/// Writes records into a SQLite trace, appending to what it holds.
#[derive(Debug)]
pub struct SqliteWriter {
    path: PathBuf,
    conn: Connection,
    next_seq: i64,
}

impl SqliteWriter {
    /// Opens (or creates) the database, creating or migrating its schema.
    pub fn open(path: &Path) -> Result<SqliteWriter, TraceError> {
        let err = |e| TraceError::sqlite(path, e);
        crate::create_private(path).map_err(|e| TraceError::io(path, e))?;
        let mut conn = Connection::open(path).map_err(err)?;
        if crate::opened_read_only(&conn) {
            return Err(TraceError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, "it is read-only"),
            ));
        }
        conn.busy_timeout(crate::BUSY_WAIT).map_err(err)?;
        refuse_other_databases(&conn, path)?;
        // WAL with NORMAL sync: a commit per record is cheap, and a crash of the process loses
        // nothing committed. The switch is tried again while another process opening the file
        // reads it (runs started at once with one new `--trace`): SQLite answered that one
        // "database is locked" at once.
        crate::wal_mode(&conn).map_err(err)?;
        conn.execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(err)?;
        migrate(&mut conn, path)?;
        crate::pin_rollback_journal(path).map_err(|e| TraceError::io(path, e))?;
        let mut next_seq = 0i64;
        for table in TABLES {
            let max: Option<i64> = conn
                .query_row(&format!("SELECT max(seq) FROM {table}"), [], |r| r.get(0))
                .map_err(err)?;
            next_seq = next_seq.max(max.map_or(0, |m| m + 1));
        }
        Ok(SqliteWriter {
            path: path.to_owned(),
            conn,
            next_seq,
        })
    }
}

/// Refuses an SQLite file that holds tables of its own (a journal, a session store, another
/// program's database), before anything is written: the schema below is created with `IF NOT
/// EXISTS`, so a session store given as `--trace sessions.db` got the trace's tables and rows
/// beside its own, and any database was switched to WAL mode.
fn refuse_other_databases(conn: &Connection, path: &Path) -> Result<(), TraceError> {
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(|e| TraceError::sqlite(path, e))?;
    let version = schema_version(conn, path)?;
    let others: Vec<&str> = tables
        .iter()
        .map(String::as_str)
        .filter(|t| !TABLES.contains(t))
        .collect();
    if others.is_empty() && (version > 0 || tables.is_empty()) {
        return Ok(());
    }
    let shown: Vec<&str> = if others.is_empty() {
        tables.iter().map(String::as_str).collect()
    } else {
        others
    };
    Err(TraceError::NotATrace {
        path: agentloop::printable::path(path),
        reason: format!(
            "it is an SQLite database with other tables ({})",
            shown.join(", ")
        ),
    })
}

/// The file's schema version, refused when newer than this crate's.
fn schema_version(conn: &Connection, path: &Path) -> Result<i64, TraceError> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| TraceError::sqlite(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(TraceError::NewerSchema {
            path: agentloop::printable::path(path),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), TraceError> {
    let err = |e| TraceError::sqlite(path, e);
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(err)?;
    let version = schema_version(&tx, path)?;
    let from = usize::try_from(version).unwrap_or(0);
    for migration in MIGRATIONS.iter().skip(from) {
        tx.execute_batch(migration).map_err(err)?;
    }
    tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
        .map_err(err)?;
    tx.commit().map_err(err)
}

impl TraceWriter for SqliteWriter {
    fn write(&mut self, record: &TraceRecord) -> Result<(), TraceError> {
        let (table, columns) = encode(record);
        let names: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
        let placeholders: Vec<String> = (1..=names.len() + 1).map(|i| format!("?{i}")).collect();
        let updates: Vec<String> = names
            .iter()
            .filter(|n| **n != "id")
            .map(|n| format!("{n} = excluded.{n}"))
            .collect();
        let sql = format!(
            "INSERT INTO {table} (seq, {}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}",
            names.join(", "),
            placeholders.join(", "),
            updates.join(", ")
        );
        let mut values: Vec<Sql> = Vec::with_capacity(columns.len() + 1);
        values.push(Sql::Integer(self.next_seq));
        values.extend(columns.into_iter().map(|(_, v)| v));
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(|e| TraceError::sqlite(&self.path, e))?;
        stmt.execute(rusqlite::params_from_iter(values))
            .map_err(|e| TraceError::sqlite(&self.path, e))?;
        self.next_seq += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TraceError> {
        // Every write commits on its own; a checkpoint moves the log into the database file.
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(|e| TraceError::sqlite(&self.path, e))
    }
}

fn text(s: &str) -> Sql {
    Sql::Text(s.to_owned())
}

fn opt_text(s: Option<&str>) -> Sql {
    s.map_or(Sql::Null, text)
}

fn int(n: u64) -> Sql {
    Sql::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn opt_int(n: Option<u64>) -> Sql {
    n.map_or(Sql::Null, int)
}

fn opt_real(x: Option<f64>) -> Sql {
    x.map_or(Sql::Null, Sql::Real)
}

fn opt_json(v: Option<&Value>) -> Sql {
    v.map_or(Sql::Null, |v| Sql::Text(v.to_string()))
}

/// A list of strings as a JSON array, or NULL when empty (run warnings, a call's retries).
fn string_list(warnings: &[String]) -> Sql {
    if warnings.is_empty() {
        return Sql::Null;
    }
    opt_json(Some(&Value::from(warnings.to_vec())))
}

fn common(span: &Span) -> Vec<(&'static str, Sql)> {
    vec![
        ("id", text(&span.id)),
        ("parent_id", opt_text(span.parent_id.as_deref())),
        ("run_id", text(&span.run_id)),
        ("started_at_ms", Sql::Integer(span.started_at_ms)),
        (
            "ended_at_ms",
            span.ended_at_ms.map_or(Sql::Null, Sql::Integer),
        ),
        ("duration_ms", opt_real(span.duration_ms)),
        ("status", text(span.status.as_str())),
        (
            "error_code",
            opt_text(span.error.as_ref().map(|e| e.code.as_str())),
        ),
        (
            "error_message",
            opt_text(span.error.as_ref().map(|e| e.message.as_str())),
        ),
    ]
}

fn usage_columns(usage: Option<&Usage>) -> [(&'static str, Sql); 5] {
    [
        ("input_tokens", opt_int(usage.map(|u| u.input_tokens))),
        ("output_tokens", opt_int(usage.map(|u| u.output_tokens))),
        (
            "cached_input_tokens",
            opt_int(usage.map(|u| u.cached_input_tokens)),
        ),
        (
            "cache_write_tokens",
            opt_int(usage.map(|u| u.cache_write_tokens)),
        ),
        (
            "reasoning_tokens",
            opt_int(usage.map(|u| u.reasoning_tokens)),
        ),
    ]
}

/// The table and the columns of a record.
fn encode(record: &TraceRecord) -> (&'static str, Vec<(&'static str, Sql)>) {
    let mut cols = common(record.span());
    let table = match record {
        TraceRecord::Run(r) => {
            cols.extend([
                ("parent_call_id", opt_text(r.parent_call_id.as_deref())),
                ("agent", text(&r.agent)),
                ("model", text(&r.model)),
                ("stop_reason", opt_text(r.stop_reason.as_deref())),
                ("turns", opt_int(r.turns.map(u64::from))),
                ("model_calls", opt_int(r.model_calls.map(u64::from))),
                ("tool_calls", opt_int(r.tool_calls.map(u64::from))),
            ]);
            cols.extend(usage_columns(r.usage.as_ref()));
            let limit = r.limit.as_ref().and_then(|l| serde_json::to_value(l).ok());
            let handoff = r
                .handoff
                .as_ref()
                .and_then(|h| serde_json::to_value(h).ok());
            cols.extend([
                ("cost_usd", opt_real(r.cost_usd)),
                ("limit_hit", opt_json(limit.as_ref())),
                ("warnings", string_list(&r.warnings)),
                ("tool_output", string_list(&r.tool_output)),
                ("handoff", opt_json(handoff.as_ref())),
                ("input", opt_text(r.input.as_deref())),
                ("output", opt_text(r.output.as_deref())),
            ]);
            "runs"
        }
        TraceRecord::Turn(t) => {
            let changed = t
                .tools_changed
                .as_ref()
                .and_then(|c| serde_json::to_value(c).ok());
            cols.extend([
                ("turn", int(u64::from(t.turn))),
                ("tools_changed", opt_json(changed.as_ref())),
            ]);
            "turns"
        }
        TraceRecord::ModelCall(m) => {
            cols.extend([
                ("model", text(&m.model)),
                ("provider", text(&m.provider)),
                ("messages", int(m.messages)),
            ]);
            cols.extend(usage_columns(m.usage.as_ref()));
            cols.extend([
                ("cost_usd", opt_real(m.cost_usd)),
                (
                    "finish_reason",
                    opt_text(m.finish_reason.map(|f| f.as_str())),
                ),
                ("tool_calls", opt_int(m.tool_calls)),
                ("text", opt_text(m.text.as_deref())),
                ("reasoning", opt_text(m.reasoning.as_deref())),
                ("cached", opt_int(m.cached.then_some(1))),
            ]);
            "model_calls"
        }
        TraceRecord::ToolCall(t) => {
            cols.extend([
                ("call_id", text(&t.call_id)),
                ("tool", text(&t.tool)),
                ("arguments", opt_json(t.arguments.as_ref())),
                ("output", opt_json(t.output.as_ref())),
                ("details", opt_json(t.details.as_ref())),
                ("retries", string_list(&t.retries)),
            ]);
            "tool_calls"
        }
        TraceRecord::Compaction(c) => {
            cols.extend([
                ("policy", text(&c.policy)),
                ("messages_replaced", int(c.messages_replaced)),
                ("tokens_before", int(c.tokens_before)),
                ("tokens_after", int(c.tokens_after)),
            ]);
            cols.extend(usage_columns(c.usage.as_ref()));
            cols.extend([
                ("cost_usd", opt_real(c.cost_usd)),
                ("fallback", opt_text(c.fallback.as_deref())),
                ("summary", opt_text(c.summary.as_deref())),
                ("replaced", opt_json(c.replaced.as_ref())),
            ]);
            "compactions"
        }
    };
    (table, cols)
}

fn conversion<E: std::error::Error + Send + Sync + 'static>(e: E) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, Type::Text, Box::new(e))
}

fn bad_value(what: String) -> rusqlite::Error {
    conversion(std::io::Error::new(std::io::ErrorKind::InvalidData, what))
}

fn opt_u64(row: &Row<'_>, col: &str) -> rusqlite::Result<Option<u64>> {
    Ok(row
        .get::<_, Option<i64>>(col)?
        .map(|n| u64::try_from(n).unwrap_or(0)))
}

fn opt_u32(row: &Row<'_>, col: &str) -> rusqlite::Result<Option<u32>> {
    Ok(row
        .get::<_, Option<i64>>(col)?
        .map(|n| u32::try_from(n).unwrap_or(0)))
}

fn opt_json_col(row: &Row<'_>, col: &str) -> rusqlite::Result<Option<Value>> {
    row.get::<_, Option<String>>(col)?
        .map(|s| serde_json::from_str(&s).map_err(conversion))
        .transpose()
}

/// A column a later schema version added reads as absent in an older file (readers never migrate).
fn added_column<T>(value: rusqlite::Result<Option<T>>) -> rusqlite::Result<Option<T>> {
    match value {
        Err(rusqlite::Error::InvalidColumnName(_)) => Ok(None),
        other => other,
    }
}

/// A JSON column a later version added, read as `T` (none in a file written before it).
fn added_json_col<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    name: &str,
) -> rusqlite::Result<Option<T>> {
    added_column(opt_json_col(row, name))?
        .map(serde_json::from_value)
        .transpose()
        .map_err(conversion)
}

fn usage_of(row: &Row<'_>) -> rusqlite::Result<Option<Usage>> {
    let Some(input_tokens) = opt_u64(row, "input_tokens")? else {
        return Ok(None);
    };
    Ok(Some(Usage {
        input_tokens,
        output_tokens: opt_u64(row, "output_tokens")?.unwrap_or(0),
        cached_input_tokens: opt_u64(row, "cached_input_tokens")?.unwrap_or(0),
        cache_write_tokens: opt_u64(row, "cache_write_tokens")?.unwrap_or(0),
        reasoning_tokens: opt_u64(row, "reasoning_tokens")?.unwrap_or(0),
    }))
}

fn span_of(row: &Row<'_>) -> rusqlite::Result<Span> {
    let status: String = row.get("status")?;
    let status =
        Status::parse(&status).ok_or_else(|| bad_value(format!("unknown status {status:?}")))?;
    let code: Option<String> = row.get("error_code")?;
    let message: Option<String> = row.get("error_message")?;
    let error = match (code, message) {
        (None, None) => None,
        (code, message) => Some(ErrorInfo {
            code: code.unwrap_or_default(),
            message: message.unwrap_or_default(),
        }),
    };
    Ok(Span {
        id: row.get("id")?,
        parent_id: row.get("parent_id")?,
        run_id: row.get("run_id")?,
        started_at_ms: row.get("started_at_ms")?,
        ended_at_ms: row.get("ended_at_ms")?,
        duration_ms: row.get("duration_ms")?,
        status,
        error,
    })
}

fn decode(table: &str, row: &Row<'_>) -> rusqlite::Result<TraceRecord> {
    let span = span_of(row)?;
    Ok(match table {
        "runs" => TraceRecord::Run(RunSpan {
            span,
            parent_call_id: added_column(row.get("parent_call_id"))?,
            agent: row.get("agent")?,
            model: row.get("model")?,
            stop_reason: row.get("stop_reason")?,
            turns: opt_u32(row, "turns")?,
            model_calls: opt_u32(row, "model_calls")?,
            tool_calls: opt_u32(row, "tool_calls")?,
            usage: usage_of(row)?,
            cost_usd: row.get("cost_usd")?,
            limit: opt_json_col(row, "limit_hit")?
                .map(serde_json::from_value)
                .transpose()
                .map_err(conversion)?,
            warnings: added_json_col(row, "warnings")?.unwrap_or_default(),
            tool_output: added_json_col(row, "tool_output")?.unwrap_or_default(),
            handoff: added_json_col(row, "handoff")?.map(Box::new),
            input: row.get("input")?,
            output: row.get("output")?,
        }),
        "turns" => TraceRecord::Turn(TurnSpan {
            span,
            turn: opt_u32(row, "turn")?.unwrap_or(0),
            tools_changed: added_json_col(row, "tools_changed")?,
        }),
        "model_calls" => TraceRecord::ModelCall(ModelCallSpan {
            span,
            model: row.get("model")?,
            provider: row.get("provider")?,
            messages: opt_u64(row, "messages")?.unwrap_or(0),
            usage: usage_of(row)?,
            cost_usd: row.get("cost_usd")?,
            finish_reason: row
                .get::<_, Option<String>>("finish_reason")?
                .map(|s| serde_json::from_value(Value::String(s)))
                .transpose()
                .map_err(conversion)?,
            tool_calls: opt_u64(row, "tool_calls")?,
            text: row.get("text")?,
            reasoning: row.get("reasoning")?,
            cached: added_column(opt_u64(row, "cached"))?.is_some_and(|n| n > 0),
        }),
        "compactions" => TraceRecord::Compaction(CompactionSpan {
            span,
            policy: row.get("policy")?,
            messages_replaced: opt_u64(row, "messages_replaced")?.unwrap_or(0),
            tokens_before: opt_u64(row, "tokens_before")?.unwrap_or(0),
            tokens_after: opt_u64(row, "tokens_after")?.unwrap_or(0),
            usage: usage_of(row)?,
            cost_usd: row.get("cost_usd")?,
            fallback: row.get("fallback")?,
            summary: row.get("summary")?,
            replaced: opt_json_col(row, "replaced")?,
        }),
        _ => TraceRecord::ToolCall(ToolCallSpan {
            span,
            call_id: row.get("call_id")?,
            tool: row.get("tool")?,
            arguments: opt_json_col(row, "arguments")?,
            output: opt_json_col(row, "output")?,
            details: opt_json_col(row, "details")?,
            retries: added_column(opt_json_col(row, "retries"))?
                .map(serde_json::from_value)
                .transpose()
                .map_err(conversion)?
                .unwrap_or_default(),
        }),
    })
}

/// Reads every span of a SQLite trace, in the order they were first written.
pub(crate) fn read(path: &Path) -> Result<(Vec<TraceRecord>, Vec<String>), TraceError> {
    let err = |e| TraceError::sqlite(path, e);
    if !path.exists() {
        return Err(TraceError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        ));
    }
    // Read only, leaving nothing beside the file (`trace list` of a read-only folder).
    let conn = crate::open_for_reading(path).map_err(err)?;
    schema_version(&conn, path)?;
    let has_runs: Option<String> = conn
        .query_row(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'runs'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(err)?;
    if has_runs.is_none() {
        return Ok((
            Vec::new(),
            vec![format!(
                "{}: holds no agentloop trace tables",
                agentloop::printable::path(path)
            )],
        ));
    }
    let mut rows: Vec<(i64, TraceRecord)> = Vec::new();
    let mut warnings = Vec::new();
    for table in TABLES {
        // A file of an older schema lacks the later tables (readers never migrate).
        let exists: Option<String> = conn
            .query_row(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .optional()
            .map_err(err)?;
        if exists.is_none() {
            continue;
        }
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY seq"))
            .map_err(err)?;
        let mapped = stmt
            .query_map([], |row| {
                Ok((row.get::<_, i64>("seq")?, decode(table, row)?))
            })
            .map_err(err)?;
        for (i, r) in mapped.enumerate() {
            match r {
                Ok(row) => rows.push(row),
                // One damaged row costs that row, not the trace.
                Err(e) => warnings.push(format!(
                    "{}: row {} of {table} is not a trace record and was skipped: {e}",
                    agentloop::printable::path(path),
                    i + 1
                )),
            }
        }
    }
    rows.sort_by_key(|(seq, _)| *seq);
    Ok((rows.into_iter().map(|(_, r)| r).collect(), warnings))
}
