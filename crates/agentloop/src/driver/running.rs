//! The calls that are running, polled inside the run's own task.
//!
//! What `FuturesUnordered` does for the loop, with one difference that pays for the module: a
//! call's place (its pinned future's memory and its waker) is kept when the call ends and taken
//! by the next call, so a run allocates its places on its first batch and never again, where
//! `FuturesUnordered` allocates and frees a task per call. At 10,000 runs at once every
//! allocation is paid with cold caches (`agentloop-bench scale`, BENCHMARKS.md under #30).
//!
//! A woken call raises its place's flag and wakes the run; a poll of the set polls the places
//! whose flag is up, each once, in the order of the places. Batches are a few calls wide (and
//! capped by the agent's concurrency), so looking at every place's flag costs less than the
//! ready queue it replaces.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::Stream;
use futures::task::AtomicWaker;

/// Futures running together; their outputs come out as each finishes.
pub(crate) struct Running<F> {
    places: Vec<Place<F>>,
    /// The run's task, woken by any call's waker.
    run: Arc<AtomicWaker>,
    /// How many places hold a future.
    live: usize,
}

/// A call's place: its future, pinned where it was allocated (`None` between calls), and the
/// waker its future is polled with.
struct Place<F> {
    future: Pin<Box<Option<F>>>,
    flag: Arc<Flag>,
    waker: Waker,
}

/// Raised when a place's future asks to be polled again.
struct Flag {
    woken: AtomicBool,
    run: Arc<AtomicWaker>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.run.wake();
    }
}

impl<F> Default for Running<F> {
    fn default() -> Self {
        Running {
            places: Vec::new(),
            run: Arc::new(AtomicWaker::new()),
            live: 0,
        }
    }
}

impl<F: Future> Running<F> {
    /// Starts `future` in a free place (a new one when all are taken); it is first polled with
    /// the set.
    pub(crate) fn push(&mut self, future: F) {
        self.live += 1;
        if let Some(place) = self.places.iter_mut().find(|p| p.future.is_none()) {
            place.future.set(Some(future));
            place.flag.woken.store(true, Ordering::Relaxed);
            return;
        }
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            run: Arc::clone(&self.run),
        });
        self.places.push(Place {
            future: Box::pin(Some(future)),
            waker: Waker::from(Arc::clone(&flag)),
            flag,
        });
    }

    /// Drops every running future (its call is cancelled); the places are kept. The count goes
    /// first: a drop that panics (the caller catches it) leaves a set that reads as dry, never one
    /// that waits for futures it no longer holds.
    pub(crate) fn clear(&mut self) {
        self.live = 0;
        for place in &mut self.places {
            place.future.set(None);
        }
    }
}

impl<F: Future> Extend<F> for Running<F> {
    fn extend<I: IntoIterator<Item = F>>(&mut self, futures: I) {
        for future in futures {
            self.push(future);
        }
    }
}

impl<F: Future> Stream for Running<F> {
    type Item = F::Output;

    /// The output of a call that finished; `None` when none is running.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let this = self.get_mut();
        if this.live == 0 {
            return Poll::Ready(None);
        }
        // Registered before the flags are read: a call woken after its flag was looked at
        // wakes the run again.
        this.run.register(cx.waker());
        for place in &mut this.places {
            if !place.flag.woken.swap(false, Ordering::Acquire) {
                continue;
            }
            let Some(future) = place.future.as_mut().as_pin_mut() else {
                continue;
            };
            if let Poll::Ready(output) = future.poll(&mut Context::from_waker(&place.waker)) {
                place.future.set(None);
                this.live -= 1;
                return Poll::Ready(Some(output));
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use std::time::Duration;

    use futures::{FutureExt, StreamExt};

    use super::*;

    fn after(ms: u64, out: u64) -> Pin<Box<dyn Future<Output = u64> + Send>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            out
        })
    }

    #[tokio::test(start_paused = true)]
    async fn outputs_come_as_the_futures_finish_and_the_set_runs_dry() {
        let mut running = Running::default();
        running.extend([after(30, 3), after(10, 1), after(20, 2)]);
        let mut got = Vec::new();
        while let Some(out) = running.next().await {
            got.push(out);
        }
        assert_eq!(got, [1, 2, 3]);
        assert!(running.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_batch_takes_the_places_of_the_calls_that_ended() {
        let mut running = Running::default();
        running.extend([after(5, 1), after(5, 2)]);
        assert!(running.next().await.is_some());
        assert!(running.next().await.is_some());
        running.extend([after(5, 3), after(1, 4), after(2, 5)]);
        assert_eq!(running.places.len(), 3);
        assert_eq!(running.next().await, Some(4));
        running.push(after(1, 6));
        assert_eq!(running.places.len(), 3);
        let mut rest = Vec::new();
        while let Some(out) = running.next().await {
            rest.push(out);
        }
        assert_eq!(rest, [6, 5, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn cleared_futures_are_dropped_and_the_set_is_dry() {
        let dropped = Arc::new(AtomicBool::new(false));
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let guard = Guard(dropped.clone());
        let mut running = Running::default();
        running.push(Box::pin(async move {
            let _guard = guard;
            std::future::pending::<u64>().await
        }) as Pin<Box<dyn Future<Output = u64> + Send>>);
        assert!(running.next().now_or_never().is_none());
        running.clear();
        assert!(dropped.load(Ordering::SeqCst));
        assert!(running.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_drop_that_panics_while_clearing_leaves_a_dry_set() {
        struct Loud;
        impl Drop for Loud {
            #[expect(
                clippy::panic,
                reason = "the handler under test panics as it is dropped"
            )]
            fn drop(&mut self) {
                panic!("a handler whose drop panics");
            }
        }
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let (loud, guard) = (Loud, Guard(dropped.clone()));
        let mut running = Running::default();
        running.push(Box::pin(async move {
            let _loud = loud;
            std::future::pending::<u64>().await
        }) as Pin<Box<dyn Future<Output = u64> + Send>>);
        running.push(Box::pin(async move {
            let _guard = guard;
            std::future::pending::<u64>().await
        }));
        assert!(running.next().now_or_never().is_none());
        let cleared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| running.clear()));
        assert!(cleared.is_err());
        let after = tokio::time::timeout(Duration::from_secs(1), running.next()).await;
        assert!(
            matches!(after, Ok(None)),
            "the set waits on what it no longer runs"
        );
        // What the panic left in its place is dropped with the set.
        assert!(!dropped.load(Ordering::SeqCst));
        drop(running);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wakes_from_other_threads_are_not_lost() {
        let mut running = Running::default();
        for round in 0..200u64 {
            for k in 0..4u64 {
                let (tx, rx) = tokio::sync::oneshot::channel::<u64>();
                tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    let _ = tx.send(round * 4 + k);
                });
                running.push(Box::pin(async move { rx.await.unwrap_or(u64::MAX) })
                    as Pin<Box<dyn Future<Output = u64> + Send>>);
            }
            let mut got = Vec::new();
            while let Some(out) = running.next().await {
                got.push(out);
            }
            got.sort_unstable();
            assert_eq!(got, (round * 4..round * 4 + 4).collect::<Vec<_>>());
        }
        assert_eq!(running.places.len(), 4);
    }
}
