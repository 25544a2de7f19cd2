//! A run driven on its asyncio loop's own thread (`run_async`, `stream`) instead of on a thread
//! of the runtime: the run's future is polled from a loop callback ([`Poll`]), with a waker that
//! asks the loop for the next poll (`call_soon` on the loop's thread, `call_soon_threadsafe` from
//! any other), at most one poll pending. A function model is then a plain call with the GIL
//! already held, and a coroutine tool's answer wakes nothing but the loop it runs on: no thread
//! hand-off per turn. The runtime's context is entered while polling, so timers, sockets and
//! `spawn_blocking` still run on its threads; runs that write to a store synchronously (journal,
//! sessions, traces) are not driven here (see `NativeAgent::launch`).
//!
//! A wake from another thread runs Python (`call_soon_threadsafe`) inside Rust frames. Were the
//! interpreter to finalize meanwhile (the run finished by another wake-up, the script at its
//! end), that thread would be made to exit as it next took the GIL, unwinding through those
//! frames: the process aborts ("FATAL: exception not rethrown") or crashes. So such a wake goes
//! through [`attach_unless_exiting`]: once the package's exit hook has run it queues nothing
//! (nothing will poll the run again), and those under way are waited for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::thread::{self, ThreadId};

use futures::future::BoxFuture;
use pyo3::prelude::*;

use crate::exit::attach_unless_exiting;
use crate::outbox::{Outbox, lock};

/// Polls in one loop callback at most, when the run keeps waking itself on the loop's thread
/// (a batch of eager tasks that answered at once): then the loop gets its turn.
const POLLS_PER_CALLBACK: usize = 8;

/// A run whose future the loop's thread polls.
pub(crate) struct Driven {
    future: Mutex<Option<BoxFuture<'static, ()>>>,
    /// A [`Poll`] is on the loop's queue.
    scheduled: AtomicBool,
    /// The loop's thread is polling: a wake-up from that thread polls again in the same callback.
    polling: AtomicBool,
    /// Woken (on the loop's thread) while polling.
    again: AtomicBool,
    thread: ThreadId,
    call_soon: Py<PyAny>,
    call_soon_threadsafe: Py<PyAny>,
    /// The run's coroutine calls, started by the poll that queued them.
    outbox: Arc<Outbox>,
}

impl Driven {
    /// Drives `future` on `event_loop`, which runs on this thread, its first poll queued now.
    pub(crate) fn start(
        py: Python<'_>,
        event_loop: &Py<PyAny>,
        outbox: Arc<Outbox>,
        future: BoxFuture<'static, ()>,
    ) -> PyResult<()> {
        let driven = Arc::new(Driven {
            future: Mutex::new(Some(future)),
            scheduled: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            again: AtomicBool::new(false),
            thread: thread::current().id(),
            call_soon: event_loop.getattr(py, "call_soon")?,
            call_soon_threadsafe: event_loop.getattr(py, "call_soon_threadsafe")?,
            outbox,
        });
        driven.schedule(py)
    }

    fn on_loop_thread(&self) -> bool {
        thread::current().id() == self.thread
    }

    /// Queues a poll, unless one is queued already.
    fn schedule(self: &Arc<Self>, py: Python<'_>) -> PyResult<()> {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let poll = Py::new(py, Poll(Arc::clone(self)))?;
        let queue = if self.on_loop_thread() {
            &self.call_soon
        } else {
            &self.call_soon_threadsafe
        };
        queue.call1(py, (poll,)).map(drop)
    }

    /// The loop is closed with the run unfinished: it finishes on the runtime instead, its
    /// coroutine calls failing as they would on a closed loop, so nothing waits forever.
    fn orphaned(&self) {
        let Ok(mut slot) = self.future.try_lock() else {
            return;
        };
        if let (Some(future), Ok(rt)) = (slot.take(), crate::runtime()) {
            rt.spawn(future);
        }
    }
}

impl Wake for Driven {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.on_loop_thread() && self.polling.load(Ordering::Acquire) {
            self.again.store(true, Ordering::Release);
            return;
        }
        if self.scheduled.load(Ordering::Acquire) {
            return;
        }
        let queued = if self.on_loop_thread() {
            Python::attach(|py| self.schedule(py))
        } else {
            match attach_unless_exiting(|py| self.schedule(py)) {
                Some(queued) => queued,
                None => return,
            }
        };
        if queued.is_err() {
            self.orphaned();
        }
    }
}

/// One poll of a driven run: a callback on its loop.
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct Poll(Arc<Driven>);

#[pymethods]
impl Poll {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let driven = &self.0;
        driven.scheduled.store(false, Ordering::Release);
        let rt = crate::runtime()?;
        let waker = Waker::from(Arc::clone(driven));
        let mut cx = Context::from_waker(&waker);
        let mut finished = false;
        driven.polling.store(true, Ordering::Release);
        for _ in 0..POLLS_PER_CALLBACK {
            driven.again.store(false, Ordering::Release);
            {
                let mut slot = lock(&driven.future);
                let Some(future) = slot.as_mut() else {
                    finished = true;
                    break;
                };
                let _runtime = rt.enter();
                if future.as_mut().poll(&mut cx).is_ready() {
                    *slot = None;
                    finished = true;
                }
            }
            if finished {
                break;
            }
            // The calls this poll queued start now, on this thread, as the loop's tasks.
            driven.outbox.start_waiting(py);
            if !driven.again.load(Ordering::Acquire) {
                break;
            }
        }
        driven.polling.store(false, Ordering::Release);
        if !finished && driven.again.swap(false, Ordering::AcqRel) {
            driven.schedule(py)?;
        }
        Ok(())
    }
}
