//! When a failed call runs again, and how long it waits first: one [`RetryPolicy`] for model calls
//! (the providers' `Retry` layer) and tool calls (a tool's retry layer). The policy only computes;
//! it sleeps nowhere and draws no random number: the caller hands it the jitter sample, so the core
//! needs no source of randomness and a run with fixed ids replays its waits exactly.

use std::time::Duration;

/// How many attempts a call gets and how long each retry waits: an exponential backoff
/// (`base_delay`, doubling, at most `max_delay`), of which a fraction (`jitter`) is randomized, or
/// the server's `Retry-After` when it asks for one within `max_retry_after`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The most calls made in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles with each retry.
    pub base_delay: Duration,
    /// The longest computed wait.
    pub max_delay: Duration,
    /// The fraction of each computed wait that is randomized (0: none, 1: "full jitter").
    pub jitter: f64,
    /// The longest `Retry-After` honoured. A server that asks for longer gets the computed
    /// backoff instead (as the official OpenAI clients do).
    pub max_retry_after: Duration,
}

/// Defaults, the ones for model calls: 3 attempts, 0.5 s doubling up to 30 s, 25 % jitter,
/// `Retry-After` honoured up to 60 s.
impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            jitter: 0.25,
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// A policy of `max_attempts` calls with the other defaults.
    pub fn attempts(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts,
            ..Default::default()
        }
    }

    /// Sets the most calls made in all, the first included.
    #[must_use]
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Sets the base delay.
    #[must_use]
    pub fn with_base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// Sets the longest computed delay.
    #[must_use]
    pub fn with_max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Sets the jitter fraction (clamped to 0..=1).
    #[must_use]
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = unit(jitter);
        self
    }

    /// Sets the longest honoured `Retry-After`.
    #[must_use]
    pub fn with_max_retry_after(mut self, cap: Duration) -> Self {
        self.max_retry_after = cap;
        self
    }

    /// The retries after the first attempt: `max_attempts - 1`, none when `max_attempts` is 0.
    pub fn retries(&self) -> u32 {
        self.max_attempts.saturating_sub(1)
    }

    /// The computed backoff before retry number `retry` (1 for the first retry), before jitter.
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.saturating_sub(1));
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// The wait before retry number `retry`: the server's `retry_after` when it is within the cap,
    /// else the backoff shortened by up to `jitter` of itself, as far as `sample` (in 0..=1, drawn
    /// by the caller) says.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>, sample: f64) -> Duration {
        if let Some(after) = retry_after
            && after <= self.max_retry_after
        {
            return after;
        }
        let backoff = self.backoff(retry);
        let cut = unit(self.jitter) * unit(sample);
        if cut == 0.0 {
            return backoff;
        }
        backoff.mul_f64(1.0 - cut)
    }
}

/// A fraction clamped to 0..=1; not a number reads as 0.
fn unit(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_stops_at_the_cap() {
        let p = RetryPolicy::default()
            .with_base_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_millis(350));
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(3), Duration::from_millis(350));
        assert_eq!(p.backoff(200), Duration::from_millis(350));
    }

    #[test]
    fn retry_after_within_the_cap_is_honoured_and_beyond_it_ignored() {
        let p = RetryPolicy::default()
            .with_jitter(0.0)
            .with_max_retry_after(Duration::from_secs(5));
        let asked = Some(Duration::from_secs(2));
        assert_eq!(p.delay(1, asked, 0.5), Duration::from_secs(2));
        let too_long = Some(Duration::from_secs(600));
        assert_eq!(p.delay(1, too_long, 0.5), p.base_delay);
    }

    #[test]
    fn jitter_only_shortens_the_backoff_as_far_as_the_sample_says() {
        let p = RetryPolicy::default().with_jitter(1.0);
        assert_eq!(p.delay(2, None, 0.0), p.backoff(2));
        assert_eq!(p.delay(2, None, 0.5), p.backoff(2) / 2);
        for sample in [0.1, 0.9, 1.0, 7.0, -1.0, f64::NAN] {
            assert!(p.delay(2, None, sample) <= p.backoff(2));
        }
        let none = RetryPolicy::default().with_jitter(0.0);
        assert_eq!(none.delay(2, None, 0.9), none.backoff(2));
    }

    #[test]
    fn a_policy_of_no_attempts_has_no_retries() {
        assert_eq!(RetryPolicy::attempts(0).retries(), 0);
        assert_eq!(RetryPolicy::attempts(1).retries(), 0);
        assert_eq!(RetryPolicy::attempts(4).retries(), 3);
    }
}
