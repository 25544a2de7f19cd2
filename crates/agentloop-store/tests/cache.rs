#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The SQLite response cache: a kept answer until its time to live runs out, and files that are
//! not response caches.

use std::time::Duration;

use agentloop::ModelResponse;
use agentloop::model::cache::ResponseCache;
use agentloop_store::SqliteResponseCache;

#[test]
fn answers_are_kept_until_they_expire() {
    let dir = std::env::temp_dir().join(format!("agentloop-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cache = SqliteResponseCache::open(dir.join("responses.db")).unwrap();
    let answer = ModelResponse::text("hi");
    cache.put("k", &answer, Duration::from_millis(200)).unwrap();
    assert_eq!(cache.get("k").unwrap(), Some(answer));
    assert_eq!(cache.get("other").unwrap(), None);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(cache.get("k").unwrap(), None, "expired");
    // A session store is not a response cache.
    drop(agentloop_store::SqliteSessions::open(dir.join("sessions.db")).unwrap());
    let err = SqliteResponseCache::open(dir.join("sessions.db")).unwrap_err();
    assert!(err.contains("not an agentloop response cache"), "{err}");
}
