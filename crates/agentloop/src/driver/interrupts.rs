//! What interrupts a run's steps while they wait: its cancellation, a suspension and its
//! deadline. [`Driver::race`] races a step against them, checked first; one [`Interrupts`] a run
//! holds the waiter and the timer every step shares. Apart from the loop, which only races.

use std::task::Poll;

use futures::{Future, FutureExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::machine::{Input, Interrupt};

use super::Driver;

/// Sleeps until `at`; with no `at` (a time past what the clock holds, or no bound), forever.
pub(super) async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pin_project_lite::pin_project! {
    /// [`Driver::race`]'s future: `step` polled once, then raced against the run's interrupts,
    /// which are checked first (biased), as `tokio::select!` with `biased` does.
    pub(super) struct Race<'d, 'a, F> {
        driver: &'d Driver<'a>,
        deadline: Option<Instant>,
        polled: bool,
        #[pin]
        step: F,
    }
}

impl<'d, 'a, F: Future> Future for Race<'d, 'a, F> {
    type Output = Result<F::Output, Interrupt>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !*this.polled {
            *this.polled = true;
            if let Some(by) = this.driver.interrupted_already(*this.deadline) {
                return Poll::Ready(Err(by));
            }
            if let Poll::Ready(value) = this.step.as_mut().poll(cx) {
                return Poll::Ready(Ok(value));
            }
        }
        if let Poll::Ready(by) = this.driver.poll_interrupts(*this.deadline, cx) {
            return Poll::Ready(Err(by));
        }
        this.step.poll(cx).map(Ok)
    }
}

pin_project_lite::pin_project! {
    /// What interrupts a run's steps while they wait: its interrupt token (its cancellation, or
    /// a suspension) and its deadline. One for the whole run, made when a step first waits: a
    /// waiter and a timer made for each step that waits were an allocation and a registration
    /// with the token and the timer wheel each time (two a turn of a run that waits for its
    /// model and its tools).
    pub(crate) struct Interrupts {
        // The interrupt token is the run's cancel token, or a child of it that a suspension
        // also fires (a durable run's): one waiter for both, told apart by `cancel`.
        #[pin]
        cancelled: tokio_util::sync::WaitForCancellationFutureOwned,
        cancel: CancellationToken,
        fired: bool,
        // The deadline's timer, when the run has one.
        sleep: Option<(Instant, std::pin::Pin<Box<tokio::time::Sleep>>)>,
    }
}

impl Interrupts {
    fn new(driver: &Driver<'_>, deadline: Option<Instant>) -> Self {
        Interrupts {
            cancelled: driver.interrupt.clone().cancelled_owned(),
            cancel: driver.cancel.clone(),
            fired: false,
            sleep: deadline.map(|d| (d, Box::pin(tokio::time::sleep_until(d)))),
        }
    }

    fn poll_interrupt(
        self: std::pin::Pin<&mut Self>,
        deadline: Option<Instant>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Interrupt> {
        let this = self.project();
        if !*this.fired && this.cancelled.poll(cx).is_ready() {
            *this.fired = true;
        }
        if *this.fired {
            return Poll::Ready(if this.cancel.is_cancelled() {
                Interrupt::Cancelled
            } else {
                Interrupt::Suspended
            });
        }
        let sleep = match (deadline, this.sleep.as_mut()) {
            (None, _) => return Poll::Pending,
            (Some(d), Some((at, sleep))) => {
                if *at != d {
                    // Every step of a run races the same deadline; were one to differ, the timer
                    // is set to it.
                    *at = d;
                    sleep.as_mut().reset(d);
                }
                sleep
            }
            (Some(d), None) => {
                &mut this
                    .sleep
                    .insert((d, Box::pin(tokio::time::sleep_until(d))))
                    .1
            }
        };
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Interrupt::Deadline);
        }
        Poll::Pending
    }
}

impl<'a> Driver<'a> {
    /// The interrupt that has already happened, if any, without waiting.
    pub(super) fn interrupted_now(&self, deadline: Option<Instant>) -> Option<Interrupt> {
        if self.cancel.is_cancelled() {
            Some(Interrupt::Cancelled)
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Interrupt::Deadline)
        } else {
            None
        }
    }

    /// Polls the run's interrupts (made at the first call), for a step racing them.
    fn poll_interrupts(
        &self,
        deadline: Option<Instant>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Interrupt> {
        let mut interrupts = self
            .interrupts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        interrupts
            .get_or_insert_with(|| Box::pin(Interrupts::new(self, deadline)))
            .as_mut()
            .poll_interrupt(deadline, cx)
    }

    /// The interrupt that has already happened, suspension included, without waiting: what
    /// [`Driver::poll_interrupts`] would answer at once.
    fn interrupted_already(&self, deadline: Option<Instant>) -> Option<Interrupt> {
        // Cancelling the run cancels the interrupt token too (it is the same token or a child).
        if self.interrupt.is_cancelled() {
            Some(if self.cancel.is_cancelled() {
                Interrupt::Cancelled
            } else {
                Interrupt::Suspended
            })
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Interrupt::Deadline)
        } else {
            None
        }
    }

    /// Awaits `step` unless an interrupt comes first; one that already happened wins, so nothing
    /// new starts after a cancel or a passed deadline. Most steps are ready at their first poll:
    /// those are taken without polling the run's [`Interrupts`] (a cancellation waiter and a
    /// timer, made when a step first waits). A future of its own rather
    /// than an `async fn`: that kept `step` three times over (as passed, moved into a local,
    /// pinned), and the model call's race was the largest part of every running run's future.
    pub(super) fn race<F: Future>(&self, deadline: Option<Instant>, step: F) -> Race<'_, 'a, F> {
        Race {
            driver: self,
            deadline,
            polled: false,
            step,
        }
    }

    /// Performs a step unless an interrupt came first (see [`Driver::race`]). `stop` is told
    /// when the step loses.
    pub(super) fn raced<'s>(
        &'s self,
        deadline: Option<Instant>,
        stop: Option<&'s CancellationToken>,
        step: impl Future<Output = Input> + 's,
    ) -> impl Future<Output = Input> + 's {
        self.race(deadline, step).map(move |raced| match raced {
            Ok(input) => input,
            Err(by) => {
                if let Some(t) = stop {
                    t.cancel();
                }
                Input::Interrupted { by }
            }
        })
    }
}
