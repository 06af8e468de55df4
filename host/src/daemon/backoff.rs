//! Failed attempts back off (docs/daemon.md#backoff): the n-th consecutive failure of the
//! same attempt (the same input digest and, when known, the same image digest) waits
//! `min(min · 2^(n-1), max)` less up to 25 % random jitter (so a fleet does not retry in
//! step) before the next attempt; another input, another image digest or a success starts
//! over. Nothing is fetched for that attempt in between, whatever the ticks say.

use std::time::{Duration, Instant, SystemTime};

/// When a failed attempt may be tried again.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    /// What failed: (input digest, image digest if the failure got that far).
    key: Option<(String, Option<String>)>,
    /// Consecutive failures of `key`.
    failures: u32,
    /// The next attempt (monotonic, and on the wall clock for logs and readiness).
    next: Option<(Instant, SystemTime)>,
}

/// One scheduled retry, for logs and the readiness file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Retry {
    /// Consecutive failures so far.
    pub failures: u32,
    /// Wait before the next attempt.
    pub wait: Duration,
    /// The next attempt on the wall clock.
    pub at: SystemTime,
}

impl Retry {
    /// `next attempt at <HTTP-date> (in N s, failure K)`.
    pub(super) fn describe(&self) -> String {
        format!(
            "next attempt at {} (in {:.1} s, failure {})",
            httpdate::fmt_http_date(self.at),
            self.wait.as_secs_f64(),
            self.failures
        )
    }
}

impl Backoff {
    /// No failure yet; waits from `min` doubling up to `max`.
    pub(super) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max: max.max(min), key: None, failures: 0, next: None }
    }

    /// Records a failure of the attempt for `input` (at `image`, when known) and schedules
    /// the next one.
    pub(super) fn failed(&mut self, input: &str, image: Option<&str>) -> Retry {
        let same = self
            .key
            .as_ref()
            .is_some_and(|(i, d)| i == input && (d.is_none() || image.is_none() || d.as_deref() == image));
        self.failures = if same { self.failures.saturating_add(1) } else { 1 };
        let image = image.map(str::to_string).or_else(|| if same { self.key.take().and_then(|k| k.1) } else { None });
        self.key = Some((input.to_string(), image));
        let wait = self.wait(self.failures, fastrand::f64());
        let at = SystemTime::now() + wait;
        self.next = Some((Instant::now() + wait, at));
        Retry { failures: self.failures, wait, at }
    }

    /// The wait after `failures` consecutive failures, `r` in [0, 1) drawing the jitter.
    fn wait(&self, failures: u32, r: f64) -> Duration {
        let exp = failures.saturating_sub(1).min(30);
        let base = self.min.saturating_mul(1u32 << exp).min(self.max);
        base.mul_f64(1.0 - 0.25 * r)
    }

    /// Starts over (a success).
    pub(super) fn reset(&mut self) {
        self.key = None;
        self.failures = 0;
        self.next = None;
    }

    /// The scheduled retry of `input` that has not come yet, if any: until then nothing
    /// is attempted for it. Another input is never held back.
    pub(super) fn pending(&self, input: &str) -> Option<Retry> {
        let (i, _) = self.key.as_ref()?;
        let (next, at) = self.next?;
        let now = Instant::now();
        (i == input && now < next).then(|| Retry { failures: self.failures, wait: next - now, at })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_with_at_most_a_quarter_of_jitter() {
        let b = Backoff::new(Duration::from_secs(10), Duration::from_secs(600));
        assert_eq!(b.wait(1, 0.0), Duration::from_secs(10));
        assert_eq!(b.wait(2, 0.0), Duration::from_secs(20));
        assert_eq!(b.wait(7, 0.0), Duration::from_secs(600));
        assert_eq!(b.wait(1000, 0.0), Duration::from_secs(600));
        assert!(b.wait(1, 0.999) >= Duration::from_millis(7500));
        assert!(b.wait(7, 0.999) >= Duration::from_secs(450));
    }

    #[test]
    fn another_input_or_image_starts_over_and_is_not_held_back() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(600));
        assert_eq!(b.failed("a", Some("d1")).failures, 1);
        assert_eq!(b.failed("a", None).failures, 2, "a failure before the resolve is the same attempt");
        assert_eq!(b.failed("a", Some("d1")).failures, 3);
        assert!(b.pending("a").is_some());
        assert!(b.pending("b").is_none(), "another input is tried at once");
        assert_eq!(b.failed("a", Some("d2")).failures, 1, "a moved tag starts over");
        assert_eq!(b.failed("b", Some("d2")).failures, 1);
        b.reset();
        assert!(b.pending("b").is_none());
    }
}
