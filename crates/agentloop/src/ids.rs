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

/// A fresh run id.
pub fn run_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// A fresh tool call id.
pub fn call_id() -> String {
    format!("call_{}", uuid::Uuid::now_v7().simple())
}
