//! Run and call ids. Ids are injected into a run (see [`IdSource`]) so a replayed run is
//! deterministic; the default draws time-ordered UUIDs.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a run gets its ids from.
pub trait IdSource: Send + Sync {
    /// A new run id.
    fn run_id(&self) -> String;
    /// A new tool call id, for calls whose provider sent none.
    fn call_id(&self) -> String;
}

/// Time-ordered UUIDs (v7): unique across processes, sortable in traces.
#[derive(Debug, Default, Clone, Copy)]
pub struct UuidIds;

impl IdSource for UuidIds {
    fn run_id(&self) -> String {
        run_id()
    }
    fn call_id(&self) -> String {
        call_id()
    }
}

/// Sequential ids (`run_1`, `call_1`, ...): for tests and deterministic replays.
#[derive(Default)]
pub struct SequentialIds {
    runs: AtomicU64,
    calls: AtomicU64,
}

impl fmt::Debug for SequentialIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequentialIds").finish_non_exhaustive()
    }
}

impl IdSource for SequentialIds {
    fn run_id(&self) -> String {
        format!("run_{}", self.runs.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn call_id(&self) -> String {
        format!("call_{}", self.calls.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

thread_local! {
    /// Each thread's v7 counter. `Uuid::now_v7` shares one behind a process-wide mutex, which
    /// every run start of every worker took: at 10,000 runs started at once on two workers it was
    /// most of the process's futex calls. Ids stay unique (a counter reseeded at random each
    /// millisecond, with random bits after it) and ordered by their millisecond; within one they
    /// are ordered per thread.
    static V7: uuid::ContextV7 = const { uuid::ContextV7::new() };
}

/// A time-ordered UUID from the thread's counter.
fn v7() -> uuid::Uuid {
    V7.try_with(|context| uuid::Uuid::new_v7(uuid::Timestamp::now(context)))
        .unwrap_or_else(|_| uuid::Uuid::now_v7())
}

/// A fresh run id.
pub fn run_id() -> String {
    v7().simple().to_string()
}

/// A fresh tool call id.
pub fn call_id() -> String {
    format!("call_{}", v7().simple())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn ids_from_many_threads_are_unique_v7_and_ordered_within_a_thread() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..5_000).map(|_| run_id()).collect::<Vec<_>>()))
            .collect();
        let mut all = HashSet::new();
        for thread in threads {
            let ids = thread.join().unwrap_or_default();
            assert_eq!(ids.len(), 5_000);
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "a thread's ids are ordered"
            );
            for id in ids {
                let uuid = uuid::Uuid::parse_str(&id).unwrap_or_default();
                assert_eq!(uuid.get_version_num(), 7, "{id}");
                assert!(all.insert(id), "unique");
            }
        }
        assert_eq!(all.len(), 20_000);
        let call = call_id();
        assert!(call.starts_with("call_") && call.len() == 37, "{call}");
    }
}
