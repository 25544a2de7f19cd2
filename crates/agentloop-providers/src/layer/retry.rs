//! Retry with exponential backoff and jitter, as a model that wraps a model.
//!
//! This is the one retry layer: providers never retry internally, so wrapping a provider in one
//! [`Retry`] gives exactly `max_attempts` calls at most. A call is retried only when its error
//! [`is_retryable`](agentloop::ModelError::is_retryable) and nothing of its response has reached
//! the caller yet; once an event has been yielded, a later error is passed through with
//! `partial = true`.
//!
//! Metadata events (the response's start, usage, warnings) are held back until the first event
//! with content, so that a stream which fails right after announcing itself (Anthropic's
//! mid-stream `overloaded_error` after `message_start`) can still be retried.

use std::collections::VecDeque;
use std::time::Duration;

use agentloop::{
    Model, ModelError,
    model::{ModelEvent, ModelRequest, ModelStream},
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

/// What to do after a failed attempt: wait, then read this stream instead; `None` gives up.
pub(crate) type NextAttempt<'a> = Option<(Duration, ModelStream<'a>)>;

struct AttemptState<'a, F> {
    current: ModelStream<'a>,
    on_error: F,
    held: Vec<ModelEvent>,
    out: VecDeque<ModelEvent>,
    delivered: bool,
    done: bool,
}

/// Reads `first`, and on an error before any event reached the caller asks `on_error` for the
/// next attempt. Metadata events are held back until content arrives; an error after content is
/// passed through with `partial = true`. Retry and fallback share this one loop.
pub(crate) fn with_attempts<'a, F>(first: ModelStream<'a>, on_error: F) -> ModelStream<'a>
where
    F: FnMut(&mut ModelError) -> NextAttempt<'a> + Send + 'a,
{
    let state = AttemptState {
        current: first,
        on_error,
        held: Vec::new(),
        out: VecDeque::new(),
        delivered: false,
        done: false,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.out.pop_front() {
                return Some((Ok(event), st));
            }
            if st.done {
                return None;
            }
            match st.current.next().await {
                Some(Ok(event)) => {
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
                    if st.delivered {
                        error.partial = true;
                        st.done = true;
                        return Some((Err(error), st));
                    }
                    let Some((wait, next)) = (st.on_error)(&mut error) else {
                        st.done = true;
                        return Some((Err(error), st));
                    };
                    st.held.clear();
                    st.current = next;
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
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

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let mut attempt = 1u32;
        with_attempts(self.inner.stream(request), move |error| {
            if !error.is_retryable() || attempt >= self.policy.max_attempts.max(1) {
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
            attempt += 1;
            Some((wait, self.inner.stream(request)))
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
