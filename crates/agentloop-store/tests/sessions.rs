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
