//! Retry with exponential backoff and jitter, as a model that wraps a model.
//!
//! This is the one retry layer: providers never retry internally, so wrapping a provider in one
//! [`Retry`] gives exactly `max_attempts` calls at most. A call is retried when its error is
//! [`transient`](agentloop::ModelError::is_transient), before its first byte or part-way
//! through its stream: the events of an attempt that already reached the caller are then void,
//! and the layer says so with a [`ModelEvent::Retrying`] before the next attempt's events (the
//! run's driver reports it as a `model_retrying` event; the one accumulator starts the response
//! over). An error the layer gives up on after events of its attempt reached the caller is
//! passed through with `partial = true`.
//!
//! Metadata events (the response's start, usage, warnings) are held back until the first event
//! with content, so that a stream which fails right after announcing itself (Anthropic's
//! mid-stream `overloaded_error` after `message_start`) is retried without a word of it reaching
//! the caller; the usage it reported still goes on in the `Retrying` event.

use std::collections::VecDeque;
use std::time::Duration;

use agentloop::{
    Model, ModelError,
    model::{CacheIdentity, ModelEvent, ModelRequest, ModelRetry, ModelStream, Usage},
};
use futures::StreamExt;
use rand::Rng;

/// The policy: the core's, shared with tool retries; re-exported here for model users.
pub use agentloop::RetryPolicy;

/// The wait before retry number `retry` after `error`: the server's `Retry-After` within the
/// policy's cap, else the backoff with its jitter drawn at random. (A `Retry-After` over the cap
/// is never replaced by a shorter backoff: [`Retry`] gives up instead.)
fn wait(policy: &RetryPolicy, retry: u32, error: &ModelError) -> Duration {
    let sample = if policy.jitter > 0.0 {
        rand::rng().random_range(0.0..=1.0)
    } else {
        0.0
    };
    policy.delay(retry, error.retry_after, sample)
}

/// A model that retries another model's failed calls by a [`RetryPolicy`].
#[derive(Debug, Clone)]
pub struct Retry<M> {
    inner: M,
    policy: RetryPolicy,
}

impl<M: Model> Retry<M> {
    /// Wraps `inner` with the default policy.
    pub fn new(inner: M) -> Self {
        Retry {
            inner,
            policy: RetryPolicy::default(),
        }
    }

    /// Wraps `inner` with `policy`.
    pub fn with_policy(inner: M, policy: RetryPolicy) -> Self {
        Retry { inner, policy }
    }

    /// The wrapped model.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

/// Events that say nothing of the answer itself: held back until content arrives.
fn is_metadata(event: &ModelEvent) -> bool {
    matches!(
        event,
        ModelEvent::Start { .. } | ModelEvent::Usage(_) | ModelEvent::Warning(_)
    )
}

/// The next attempt after a failed one: the stream to read after `wait`, and what the
/// [`ModelEvent::Retrying`] that announces it says.
pub(crate) struct NextAttempt<'a> {
    /// The wait before it.
    pub(crate) wait: Duration,
    /// Its stream.
    pub(crate) stream: ModelStream<'a>,
    /// The retry it is (1 for the first).
    pub(crate) retry: u32,
    /// The model it asks.
    pub(crate) model: &'a str,
}

struct AttemptState<'a, F> {
    current: ModelStream<'a>,
    on_error: F,
    held: Vec<ModelEvent>,
    out: VecDeque<ModelEvent>,
    /// The usage the attempt under way reported last (usage events replace each other), not yet
    /// told in a `Retrying` event.
    spent: Option<Usage>,
    /// The wait before the next attempt is read, after its `Retrying` event went out.
    wait: Duration,
    /// The error given up on, returned once the events before it are out.
    failed: Option<ModelError>,
    delivered: bool,
    done: bool,
}

/// Reads `first`, and on an error asks `on_error` for the next attempt, whether or not events of
/// the failed one reached the caller: a [`ModelEvent::Retrying`] goes out before the next
/// attempt's events (and before its wait, so a UI can say so at once). Metadata events are held
/// back until content arrives; an error given up on after content is passed through with
/// `partial = true`. Retry and fallback share this one loop.
pub(crate) fn with_attempts<'a, F>(first: ModelStream<'a>, on_error: F) -> ModelStream<'a>
where
    F: FnMut(&mut ModelError) -> Option<NextAttempt<'a>> + Send + 'a,
{
    let state = AttemptState {
        current: first,
        on_error,
        held: Vec::new(),
        out: VecDeque::new(),
        spent: None,
        wait: Duration::ZERO,
        failed: None,
        delivered: false,
        done: false,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.out.pop_front() {
                return Some((Ok(event), st));
            }
            if st.done {
                return st.failed.take().map(|error| (Err(error), st));
            }
            if !st.wait.is_zero() {
                tokio::time::sleep(std::mem::take(&mut st.wait)).await;
            }
            match st.current.next().await {
                Some(Ok(event)) => {
                    match &event {
                        ModelEvent::Usage(u) => st.spent = Some(*u),
                        // An inner layer's retry: what it abandoned is told, with its usage.
                        ModelEvent::Retrying(_) => st.spent = None,
                        _ => {}
                    }
                    if !st.delivered && is_metadata(&event) {
                        st.held.push(event);
                    } else {
                        st.delivered = true;
                        st.out.extend(st.held.drain(..));
                        st.out.push_back(event);
                    }
                }
                None => {
                    st.done = true;
                    st.out.extend(st.held.drain(..));
                }
                Some(Err(mut error)) => {
                    let Some(next) = (st.on_error)(&mut error) else {
                        st.done = true;
                        if st.delivered {
                            error.partial = true;
                        }
                        // What the last attempt announced (its usage among it) goes out before
                        // the error: the caller counts the tokens a failed call spent.
                        st.out.extend(st.held.drain(..));
                        st.failed = Some(error);
                        continue;
                    };
                    st.held.clear();
                    st.delivered = false;
                    st.current = next.stream;
                    st.wait = next.wait;
                    st.out.push_back(ModelEvent::Retrying(Box::new(ModelRetry {
                        retry: next.retry,
                        model: next.model.to_owned(),
                        error,
                        delay: next.wait,
                        usage: st.spent.take(),
                    })));
                }
            }
        }
    }))
}

impl<M: Model> Model for Retry<M> {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        self.inner.cache_identity(request)
    }

    fn keeps_answers(&self) -> bool {
        self.inner.keeps_answers()
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let mut attempt = 1u32;
        with_attempts(self.inner.stream(request), move |error| {
            if !error.is_transient() || attempt >= self.policy.max_attempts.max(1) {
                return None;
            }
            if let Some(asked) = error.retry_after
                && asked > self.policy.max_retry_after
            {
                // Retrying sooner than the server asked only hammers it; the caller gets the
                // time asked for (`retry_after`) and decides.
                error.message = format!(
                    "{} (the server asked to wait {:.1} s, longer than the {:.1} s this client waits)",
                    error.message,
                    asked.as_secs_f64(),
                    self.policy.max_retry_after.as_secs_f64()
                );
                return None;
            }
            let wait = wait(&self.policy, attempt, error);
            tracing::warn!(
                model = self.inner.id(),
                attempt,
                code = error.code(),
                status = error.status,
                wait_ms = wait.as_millis() as u64,
                "model call failed; retrying"
            );
            let retry = attempt;
            attempt += 1;
            Some(NextAttempt {
                wait,
                stream: self.inner.stream(request),
                retry,
                model: self.inner.id(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentloop::model::ModelErrorKind;

    #[test]
    fn a_retry_after_within_the_cap_is_honoured_and_random_jitter_only_shortens_the_backoff() {
        let p = RetryPolicy::default()
            .with_jitter(1.0)
            .with_max_retry_after(Duration::from_secs(5));
        let asked = ModelError::new(ModelErrorKind::RateLimited, "slow down")
            .with_retry_after(Duration::from_secs(2));
        assert_eq!(wait(&p, 1, &asked), Duration::from_secs(2));
        let e = ModelError::new(ModelErrorKind::Server, "boom");
        for _ in 0..100 {
            assert!(wait(&p, 2, &e) <= p.backoff(2));
        }
    }
}
