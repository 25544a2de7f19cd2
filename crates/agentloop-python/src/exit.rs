//! The interpreter's exit, as the runtime's threads meet it. A thread that takes the GIL while
//! the interpreter finalizes is made to exit there (Python before 3.14), unwinding through the
//! Rust frames it runs: the process aborts ("FATAL: exception not rethrown") or crashes. A run
//! on the runtime's threads may still be going when a script ends (started and never awaited,
//! or waited for on a daemon thread), and a sync tool's thread may still be waking a driven run.
//! So every call into Python from a thread that may not be the interpreter's own goes through
//! [`attach_unless_exiting`]: once the package's `atexit` hook ([`before_exit`]) has run, it runs
//! no Python, and the calls already under way are given the GIL and up to [`EXIT_WAIT`] to end.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// Calls into Python from [`attach_unless_exiting`] running right now.
static UNDER_WAY: AtomicUsize = AtomicUsize::new(0);
/// The interpreter is about to finalize: [`attach_unless_exiting`] runs no Python.
static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread that ran the exit hook, which finalizes the interpreter: it is never made to
/// exit, so its calls (a later `atexit` hook's run, a finalizer) still run.
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();
/// How long the exit hook waits for the calls under way.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// One call under way, counted until it is dropped (unwinding included).
struct UnderWay;

impl UnderWay {
    /// Counts a call, unless the interpreter is exiting.
    fn begin() -> Option<UnderWay> {
        // Counted before the check, as the hook sets the flag before it reads the count: one of
        // the two always sees the other.
        UNDER_WAY.fetch_add(1, Ordering::SeqCst);
        let call = UnderWay;
        let exiting =
            EXITING.load(Ordering::SeqCst) && EXIT_THREAD.get() != Some(&thread::current().id());
        (!exiting).then_some(call)
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        UNDER_WAY.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `f` with the GIL, unless the interpreter is exiting: then `None`, and no Python runs.
/// The caller then runs nothing in Python's place: a call (a tool's, a function model's, an
/// approval) is left unanswered, as a process killed at that moment leaves it, so a journaled
/// run resumes it rather than record a failure the exit made; an event or a cancel is dropped.
pub(crate) fn attach_unless_exiting<F, R>(f: F) -> Option<R>
where
    F: for<'py> FnOnce(Python<'py>) -> R,
{
    let _under_way = UnderWay::begin()?;
    Some(Python::attach(f))
}

/// True once the package's `atexit` hook has run: a run started from then on (by a later exit
/// handler) could never call its Python tools or model, so it is refused at its start.
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// The package's `atexit` hook, which runs before the interpreter finalizes: from now on
/// [`attach_unless_exiting`] runs no Python on any other thread, and the calls under way are
/// given the GIL and up to [`EXIT_WAIT`] to finish.
#[pyfunction]
#[pyo3(name = "_before_exit")]
pub(crate) fn before_exit(py: Python<'_>) {
    let _ = EXIT_THREAD.set(thread::current().id());
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let started = Instant::now();
        while UNDER_WAY.load(Ordering::SeqCst) > 0 && started.elapsed() < EXIT_WAIT {
            thread::sleep(Duration::from_millis(1));
        }
    });
}
