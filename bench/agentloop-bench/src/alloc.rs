//! A counting global allocator: the system allocator, with every allocation (and reallocation)
//! counted once [`start`] is called, so that the bench can say how many heap allocations a turn,
//! a call, an event and a journaled step cost.
//!
//! Only `allocs` counts. The counters are one cache line that every thread's allocations would
//! write: counted in the timed commands, two atomic adds per allocation cost a single thread
//! about 0.2 µs a turn, and at `scale` on two worker threads the line went back and forth
//! between the cores at every allocation (2.8 % of `perf`'s samples in the counter's add alone).
//! The switch is read, never written, while the timed commands run.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The system allocator (or mimalloc, with the `mimalloc` feature), counted.
pub struct Counting;

/// Which allocator this build counts: the runner reports each figure with it.
#[cfg(not(feature = "mimalloc"))]
pub const NAME: &str = "system";
/// Which allocator this build counts: the runner reports each figure with it.
#[cfg(feature = "mimalloc")]
pub const NAME: &str = "mimalloc";

#[cfg(not(feature = "mimalloc"))]
const INNER: std::alloc::System = std::alloc::System;
#[cfg(feature = "mimalloc")]
const INNER: mimalloc::MiMalloc = mimalloc::MiMalloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to the inner allocator with the caller's arguments unchanged; the counters
// are only read by the bench.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract is the inner allocator's `alloc`.
        unsafe { INNER.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as above.
        unsafe { INNER.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { INNER.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            REALLOCS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(
                new_size.saturating_sub(layout.size()) as u64,
                Ordering::Relaxed,
            );
        }
        // SAFETY: as above.
        unsafe { INNER.realloc(ptr, layout, new_size) }
    }
}

/// Counts an allocation of `size` bytes, when counting.
#[inline]
fn count(size: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

/// Counts every allocation from now on (`allocs`); the timed commands never call it.
pub fn start() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// The counts so far: allocations (a `realloc` is one more, as it may move the block), and bytes
/// asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// `alloc` and `alloc_zeroed` calls.
    pub allocs: u64,
    /// `realloc` calls.
    pub reallocs: u64,
    /// Bytes asked for (growth only, for a `realloc`).
    pub bytes: u64,
}

impl Counts {
    /// Allocations of any kind (a `realloc` included).
    pub fn total(&self) -> u64 {
        self.allocs + self.reallocs
    }

    /// The counts since `before`.
    pub fn since(&self, before: Counts) -> Counts {
        Counts {
            allocs: self.allocs - before.allocs,
            reallocs: self.reallocs - before.reallocs,
            bytes: self.bytes - before.bytes,
        }
    }
}

/// The counts now.
pub fn counts() -> Counts {
    Counts {
        allocs: ALLOCS.load(Ordering::Relaxed),
        reallocs: REALLOCS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}
