#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! The journal's file format: a version-1 file (written here with version 1's schema and
//! chain, rows as that version's writer made them) is carried over to version 2 when opened,
//! its runs, steps and approvals unchanged in meaning: a run cut short resumes to the answer an
//! uninterrupted run gives, a damaged row is still reported at its step, a waiting call can
//! still be answered, and the `steps` view shows the rows as they were. In a version-2 file the
//! chained sums still catch a changed, torn or missing step.

use std::sync::Arc;

mod support;

use agentloop::journal::{Journal, JournalError};
use agentloop::model::ModelRequest;
use agentloop::permissions::{Answer, ApprovalRequest};
use agentloop::testing::FunctionModel;
use agentloop::{Agent, Message, ModelResponse, RunOptions, StopReason, Tool, ToolError};
use agentloop_store::{JournalReader, SqliteJournal};
use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};
use support::{header, step, temp_dir};

/// Version 1's schema, as its `SqliteJournal` created it.
const V1_SCHEMA: &str = "
CREATE TABLE agentloop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    header TEXT NOT NULL,
    header_sum TEXT NOT NULL,
    status TEXT NOT NULL,
    stop_reason TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE steps (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    step TEXT NOT NULL,
    sum TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE approvals (
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    request TEXT NOT NULL,
    answer TEXT,
    PRIMARY KEY (run_id, call_id)
);
INSERT INTO agentloop_meta (key, value) VALUES ('format', 'agentloop-journal'), ('version', '1');
";

/// Version 1's sums: hex text, each step's over the previous sum's text, its number and text.
fn v1_sum(previous: &str, seq: u64, step: &str) -> String {
    let mut h = Sha256::new();
    h.update(previous.as_bytes());
    h.update(seq.to_le_bytes());
    h.update(step.as_bytes());
    format!("{:x}", h.finalize())
}

/// Writes a run as version 1's writer did: its row, then its steps chained from its header.
fn v1_run(conn: &Connection, run_id: &str, header: &str, status: &str, steps: &[String]) {
    let header_sum = format!("{:x}", Sha256::digest(header.as_bytes()));
    conn.execute(
        "INSERT INTO runs (run_id, agent, fingerprint, header, header_sum, status, created_ms, \
         updated_ms) VALUES (?1, 'a', 'f', ?2, ?3, ?4, 1, 2)",
        params![run_id, header, header_sum, status],
    )
    .unwrap();
    let mut previous = header_sum;
    for (seq, text) in (0u64..).zip(steps) {
        let sum = v1_sum(&previous, seq, text);
        conn.execute(
            "INSERT INTO steps (run_id, seq, step, sum) VALUES (?1, ?2, ?3, ?4)",
            params![run_id, seq as i64, text, sum],
        )
        .unwrap();
        previous = sum;
    }
}

/// An agent that calls `echo` twice in each of two turns, then answers with what it was told.
fn agent() -> Agent {
    let model = FunctionModel::new(|request: &ModelRequest<'_>| {
        let results: Vec<String> = request
            .messages
            .iter()
            .filter_map(Message::as_tool_result)
            .map(|r| r.call_id.to_string())
            .collect();
        let turn = results.len() / 2;
        if turn >= 2 {
            return Ok(ModelResponse::text(format!("saw {}", results.join(","))));
        }
        Ok(ModelResponse::tool_calls((0..2).map(|k| {
            (
                format!("c{turn}{k}"),
                "echo",
                format!(r#"{{"n":{}}}"#, turn * 2 + k),
            )
        })))
    });
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Args {
        n: u32,
    }
    let tool = Tool::builder("echo")
        .description("Says its number.")
        .idempotent(true)
        .handler(|args: Args, _ctx| async move { Ok::<_, ToolError>(args.n.to_string()) });
    Agent::builder()
        .name("format")
        .model(model)
        .tool(tool)
        .build()
        .unwrap()
}

/// Every row the `steps` table (version 1) or view (version 2) shows, in run and step order.
fn step_rows(conn: &Connection) -> Vec<(String, i64, String, String)> {
    conn.prepare("SELECT run_id, seq, step, sum FROM steps ORDER BY run_id, seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn a_version_1_file_is_carried_over_and_its_runs_resume_and_read_as_before() {
    let dir = temp_dir("format-v1");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // A whole run, journaled: the steps a version-1 writer would have written for it.
    let whole_path = dir.join("whole.db");
    let whole = rt.block_on(async {
        let journal = Arc::new(SqliteJournal::open(&whole_path).unwrap());
        let options = RunOptions {
            journal: Some(journal as Arc<dyn Journal>),
            ..RunOptions::default()
        };
        agent()
            .run_with(Vec::new(), Some(Message::user("go")), options)
            .await
    });
    assert_eq!(whole.stop_reason, StopReason::Finished);
    let journaled = JournalReader::open(&whole_path)
        .unwrap()
        .load(&whole.run_id)
        .unwrap();
    let texts: Vec<String> = journaled
        .steps
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
    assert!(texts.len() > 8, "{} steps", texts.len());

    // The version-1 file: that run cut after 7 steps (as a crash leaves it), a run with a
    // changed row, and a run waiting on an approval.
    let path = dir.join("v1.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL;").unwrap();
    conn.execute_batch(V1_SCHEMA).unwrap();
    let cut = 7;
    v1_run(
        &conn,
        &whole.run_id,
        &serde_json::to_string(&journaled.header).unwrap(),
        "running",
        &texts[..cut],
    );
    let small: Vec<String> = (0..4)
        .map(|n| serde_json::to_string(&step(n)).unwrap())
        .collect();
    v1_run(
        &conn,
        "changed",
        &serde_json::to_string(&header("changed")).unwrap(),
        "running",
        &small,
    );
    conn.execute(
        "UPDATE steps SET step = step || ' ' WHERE run_id = 'changed' AND seq = 2",
        [],
    )
    .unwrap();
    v1_run(
        &conn,
        "waiting",
        &serde_json::to_string(&header("waiting")).unwrap(),
        "suspended",
        &small[..1],
    );
    let request = ApprovalRequest {
        call_id: "c9".into(),
        tool: "shell".into(),
        arguments: serde_json::json!({"cmd": "ls"}),
        agent: String::new(),
        question: None,
    };
    conn.execute(
        "INSERT INTO approvals (run_id, call_id, request) VALUES ('waiting', 'c9', ?1)",
        [serde_json::to_string(&request).unwrap()],
    )
    .unwrap();
    let v1_rows = step_rows(&conn);
    assert_eq!(v1_rows.len(), cut + 4 + 1);
    drop(conn);

    // A reader that opens it read-only (`journal list`) has it carried over first, then reads it.
    let copy = dir.join("v1-read.db");
    std::fs::copy(&path, &copy).unwrap();
    let read = JournalReader::open_read_only(&copy)
        .unwrap()
        .runs()
        .unwrap();
    assert_eq!(read.len(), 3, "{read:?}");

    // Opened by this version: carried over to version 2's tables (and on to version 3, which
    // adds none).
    let journal = Arc::new(SqliteJournal::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    let version: String = conn
        .query_row(
            "SELECT value FROM agentloop_meta WHERE key = 'version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        version,
        agentloop_store::journal::JOURNAL_VERSION.to_string()
    );
    assert_eq!(
        step_rows(&conn),
        v1_rows,
        "the steps view shows the rows as they were"
    );

    let reader = JournalReader::open(&path).unwrap();
    let listed: Vec<(String, String, u64)> = reader
        .runs()
        .unwrap()
        .into_iter()
        .map(|r| (r.run_id, r.status, r.steps))
        .collect();
    let mut expected = vec![
        ("changed".to_owned(), "running".to_owned(), 4),
        ("waiting".to_owned(), "suspended".to_owned(), 1),
        (whole.run_id.clone(), "running".to_owned(), cut as u64),
    ];
    expected.sort();
    assert_eq!(listed, expected);

    // The changed row is still reported at its step, the ones before it readable.
    let (intact, damage) = reader.load_intact("changed").unwrap();
    assert_eq!(intact.steps, vec![step(0), step(1)]);
    assert!(
        matches!(damage, Some(JournalError::Damaged { step: Some(2), .. })),
        "{damage:?}"
    );

    // The waiting call is listed and answered as before.
    let pending = reader.pending().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].request, request);
    reader.answer("waiting", "c9", Answer::AllowOnce).unwrap();
    let waiting = reader.load("waiting").unwrap();
    assert_eq!(waiting.approvals[0].answer, Some(Answer::AllowOnce));
    assert_eq!(waiting.steps, vec![step(0)]);

    // The cut run reads as its first 7 steps and resumes to the uninterrupted run's answer,
    // each step after the cut appended to the carried-over chain.
    let loaded = reader.load(&whole.run_id).unwrap();
    assert_eq!(loaded.steps, journaled.steps[..cut]);
    let resumed = rt.block_on(async {
        journal.own(&whole.run_id).unwrap();
        let options = RunOptions {
            journal: Some(journal.clone() as Arc<dyn Journal>),
            ..RunOptions::default()
        };
        agent().resume(loaded, options, false).await.unwrap()
    });
    assert_eq!(resumed.stop_reason, StopReason::Finished);
    assert_eq!(resumed.transcript, whole.transcript);
    assert_eq!(resumed.tool_calls_run, whole.tool_calls_run);
    let after = reader.load(&whole.run_id).unwrap();
    // The resume journals its restart besides the steps the cut run had left.
    assert!(
        after.steps.len() > journaled.steps.len(),
        "{}",
        after.steps.len()
    );
    assert_eq!(after.steps[..cut], journaled.steps[..cut]);
    assert_eq!(
        after.status,
        agentloop::journal::RunStatus::Finished {
            stop_reason: "finished".into()
        }
    );

    // A fork of a carried-over run copies its steps as a new run's.
    let forked = rt
        .block_on(journal.fork(&whole.run_id, 3, "forked", None))
        .unwrap();
    assert_eq!(forked.steps, journaled.steps[..4]);
    assert_eq!(reader.load("forked").unwrap().steps, journaled.steps[..4]);
    drop(journal);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_chain_catches_a_changed_torn_or_missing_step_in_a_version_2_file() {
    let dir = temp_dir("format-v2-damage");
    let path = dir.join("runs.db");
    let journal = SqliteJournal::open(&path).unwrap();
    futures::executor::block_on(async {
        for id in ["a", "b"] {
            journal.begin(&header(id)).await.unwrap();
        }
        // The runs' steps alternate, and are kept in the order they were committed.
        for n in 0..5 {
            journal.append("a", n, &step(n)).await.unwrap();
            journal.append("b", n, &step(n)).await.unwrap();
        }
    });
    let conn = Connection::open(&path).unwrap();
    // A new file is made with 2 KB pages (each WAL frame is one, see `FileKind::page_size`);
    // the version-1 file of the test above, made with SQLite's 4 KB, works as it is.
    let page_size: i64 = conn
        .pragma_query_value(None, "page_size", |r| r.get(0))
        .unwrap();
    assert_eq!(page_size, 2048);
    let order: Vec<(String, i64)> = conn
        .prepare(
            "SELECT r.run_id, s.seq FROM step_log s JOIN runs r USING (run_no) ORDER BY s.rowid",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let alternating: Vec<(String, i64)> = (0..5)
        .flat_map(|n| [("a".to_owned(), n), ("b".to_owned(), n)])
        .collect();
    assert_eq!(order, alternating);

    let reader = JournalReader::open(&path).unwrap();
    let all: Vec<_> = (0..5).map(step).collect();
    assert_eq!(reader.load("a").unwrap().steps, all);
    let damaged_at = |run: &str| -> (usize, Option<u64>) {
        let (intact, damage) = reader.load_intact(run).unwrap();
        match damage {
            Some(JournalError::Damaged { step, .. }) => (intact.steps.len(), step),
            other => panic!("{run}: no damage reported ({other:?})"),
        }
    };

    // A changed step, through the view as version 1's table took it.
    conn.execute(
        "UPDATE steps SET step = step || ' ' WHERE run_id = 'a' AND seq = 2",
        [],
    )
    .unwrap();
    assert_eq!(damaged_at("a"), (2, Some(2)));
    // A torn sum.
    conn.execute(
        "UPDATE step_log SET sum = substr(sum, 1, 16) \
         WHERE run_no = (SELECT run_no FROM runs WHERE run_id = 'b') AND seq = 3",
        [],
    )
    .unwrap();
    assert_eq!(damaged_at("b"), (3, Some(3)));
    // A missing step.
    conn.execute("DELETE FROM steps WHERE run_id = 'b' AND seq = 1", [])
        .unwrap();
    assert_eq!(damaged_at("b"), (1, Some(1)));

    // A run begun by one writer and first appended to by another chains from its header's sum
    // as the file holds it.
    futures::executor::block_on(journal.begin(&header("c"))).unwrap();
    drop(journal);
    let journal = SqliteJournal::open(&path).unwrap();
    futures::executor::block_on(async {
        for n in 0..3 {
            journal.append("c", n, &step(n)).await.unwrap();
        }
    });
    assert_eq!(reader.load("c").unwrap().steps, all[..3]);
    let _ = std::fs::remove_dir_all(&dir);
}
