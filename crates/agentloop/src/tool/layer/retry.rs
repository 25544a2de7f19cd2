//! Retries of a failed call ([`ToolPolicy::retry`](super::ToolPolicy::retry)).

use std::sync::Arc;
use std::time::Duration;

use super::{CallFuture, CallService};
use crate::outcome::{CallOutcome, CallStatus, codes};
use crate::retry::RetryPolicy;
use crate::tool::{Arguments, ToolContext};

/// A tool's retry policy when it asks for `retries` and nothing more: `retries + 1` attempts, with
/// the tool defaults of [`ToolPolicy::retry`](super::ToolPolicy::retry).
pub(crate) fn tool_retries(retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts: retries.saturating_add(1),
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(2),
        jitter: 0.0,
        ..RetryPolicy::default()
    }
}

/// Runs a transiently failed call again, as its policy allows.
pub(crate) struct Retry {
    pub(super) inner: Arc<dyn CallService>,
    pub(super) policy: RetryPolicy,
}

impl CallService for Retry {
    fn call(&self, args: &Arguments, ctx: ToolContext) -> CallFuture {
        let inner = Arc::clone(&self.inner);
        let args = args.clone();
        let policy = self.policy.clone();
        Box::pin(async move {
            let retries = policy.retries();
            let mut outcome = inner.call(&args, ctx.clone()).await;
            let mut retried = 0u32;
            while retried < retries && retryable(&outcome) {
                let retry = retried + 1;
                let delay = policy.delay(retry, None, jitter_sample(&ctx.call_id, retry));
                ctx.progress.retrying(
                    retry,
                    outcome.code.as_deref().unwrap_or_default(),
                    &outcome.content.to_text(),
                    delay,
                );
                // The grace period of an interrupted run, and the drain of a batch that stopped
                // dispatching, are for attempts already running: an announced retry that they
                // stop does not run (nor count).
                tokio::select! {
                    biased;
                    _ = ctx.stop_retries.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
                retried += 1;
                outcome = inner.call(&args, ctx.clone()).await;
            }
            outcome.retries = retried;
            outcome
        })
    }
}

/// A failure worth another attempt: a recoverable error or a timeout that is not marked
/// permanent, nor about arguments the handler could not read (they would fail the same way
/// again, however the handler said so).
fn retryable(outcome: &CallOutcome) -> bool {
    outcome.status == CallStatus::Error
        && !outcome.permanent
        && outcome.code.as_deref() != Some(codes::INVALID_ARGUMENTS)
}

/// The jitter sample of a call's retry, in 0..=1: drawn from its call id and the retry's number,
/// not at random, so that the calls of a batch spread their retries and a run with fixed ids
/// waits the same each time (FNV-1a).
fn jitter_sample(call_id: &str, retry: u32) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in call_id.bytes().chain(retry.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_defaults_wait_100_ms_doubling_to_2_s_without_jitter() {
        let p = tool_retries(7);
        assert_eq!(p.retries(), 7);
        let waits: Vec<_> = (1..=7)
            .map(|r| p.delay(r, None, jitter_sample("call_1", r)))
            .collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(
            waits,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000)
            ]
        );
        assert_eq!(tool_retries(u32::MAX).max_attempts, u32::MAX);
    }

    #[test]
    fn a_tools_jitter_sample_is_fixed_by_its_call_and_retry() {
        let a = jitter_sample("call_1", 1);
        assert_eq!(a, jitter_sample("call_1", 1));
        assert_ne!(a, jitter_sample("call_2", 1));
        assert_ne!(a, jitter_sample("call_1", 2));
        assert!((0.0..1.0).contains(&a));
    }
}
