#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! The SQLite session store: save and load, one writer at a time (a dead writer's lock is taken
//! over), and files that are not session stores.

use agentloop::session::{SessionError, SessionStore, StoredSession};
use agentloop_store::SqliteSessions;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("agentloop-sessions-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("sessions.db")
}

#[test]
fn one_writer_at_a_time_and_a_dead_writers_lock_is_taken_over() {
    let path = scratch("locks");
    let store = SqliteSessions::open(&path).unwrap();
    let held = store.lock("s").unwrap();
    match store.lock("s") {
        Err(SessionError::Busy { id, .. }) => assert_eq!(id, "s"),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("a second writer got the session"),
    }
    drop(held);
    drop(store.lock("s").unwrap());
    // A lock left by a process that no longer lives.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO session_locks (id, owner, pid, acquired_ms) VALUES ('s', 'gone', 4000000, 0)",
        [],
    )
    .unwrap();
    drop(conn);
    let taken = store.lock("s");
    assert!(taken.is_ok(), "a dead writer's lock is taken over");
}

#[test]
fn a_live_writer_holds_its_session_even_where_its_process_cannot_be_seen() {
    // A writer in another container (or on another host) has a process id this one cannot
    // see: its lock must hold all the same, for as long as it lives.
    let path = scratch("unseen");
    let store = SqliteSessions::open(&path).unwrap();
    let held = store.lock("s").unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE session_locks SET pid = 4000000 WHERE id = 's'", [])
        .unwrap();
    let other = SqliteSessions::open(&path).unwrap();
    match other.lock("s") {
        Err(SessionError::Busy { id, holder }) => {
            assert_eq!(id, "s");
            assert!(holder.contains("4000000"), "{holder}");
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("a live writer's session was taken from it"),
    }
    drop(held);
    drop(other.lock("s").unwrap());
    // Released, a session leaves no lock file behind.
    let locks = path.with_file_name("sessions.db.locks");
    assert_eq!(std::fs::read_dir(&locks).unwrap().count(), 0);
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM session_locks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0);
}

#[test]
fn sessions_round_trip_and_foreign_files_are_refused() {
    let path = scratch("round");
    let store = SqliteSessions::open(&path).unwrap();
    let mut s = StoredSession::new("a", "agent");
    s.messages.push(agentloop::Message::user("hi"));
    s.metadata.insert("k".into(), serde_json::json!(1));
    store.save(&s).unwrap();
    assert_eq!(store.load("a").unwrap().unwrap(), s);
    assert!(store.load("b").unwrap().is_none());
    assert_eq!(store.list().unwrap()[0].messages, 1);
    let foreign = path.with_file_name("notes.db");
    std::fs::write(&foreign, b"not a database at all, just text").unwrap();
    let err = SqliteSessions::open(&foreign).unwrap_err();
    assert_eq!(err.code(), "session.io");
    assert!(
        err.to_string().contains("not an agentloop session store"),
        "{err}"
    );
    // A journal is not a session store either.
    let journal = path.with_file_name("runs.db");
    drop(agentloop_store::SqliteJournal::open(&journal).unwrap());
    let err = SqliteSessions::open(&journal).unwrap_err();
    assert!(err.to_string().contains("agentloop-sessions"), "{err}");
}

#[test]
fn a_store_of_the_first_format_is_brought_up_to_date_and_keeps_its_sessions() {
    let path = scratch("v1");
    // A store as version 1 wrote it: no history column.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE agentloop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
         INSERT INTO agentloop_meta VALUES ('format', 'agentloop-sessions'), ('version', '1');
         CREATE TABLE sessions (id TEXT PRIMARY KEY, agent TEXT NOT NULL, messages TEXT NOT NULL,
             usage TEXT NOT NULL, cost_usd REAL NOT NULL, runs INTEGER NOT NULL,
             metadata TEXT NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
         CREATE TABLE session_locks (id TEXT PRIMARY KEY, owner TEXT NOT NULL,
             pid INTEGER NOT NULL, acquired_ms INTEGER NOT NULL);
         INSERT INTO sessions VALUES ('old', 'a',
             '[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}]',
             '{\"input_tokens\":0,\"output_tokens\":0}', 0, 1, '{}', 0, 0);",
    )
    .unwrap();
    drop(conn);
    let store = SqliteSessions::open(&path).unwrap();
    let mut old = store.load("old").unwrap().unwrap();
    assert_eq!(old.messages.len(), 1);
    assert!(old.history.is_empty());
    assert_eq!(old.full_history(), old.messages.as_slice());
    // A compacted session keeps its history beside the transcript.
    old.history = vec![
        agentloop::Message::user("hi"),
        agentloop::Message::user("more"),
    ];
    store.save(&old).unwrap();
    let back = store.load("old").unwrap().unwrap();
    assert_eq!(back.history.len(), 2);
    assert_eq!(back.full_history().len(), 2);
    let version: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT value FROM agentloop_meta WHERE key = 'version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, "2");
}
