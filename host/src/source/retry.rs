//! Retries of registry requests: which failures are transient, how long to wait (exponential
//! backoff with full jitter, `Retry-After` honoured up to a cap) and a retry budget shared by
//! every request of one pull (a count and a total waiting time), so that a fleet of nodes
//! behind one throttling registry spreads out instead of giving up, and a dead registry
//! still ends in a clear error.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Result, anyhow};

/// Default `--pull-deadline`, seconds: below the MachineConfig unit's `TimeoutStartSec`
/// (15 min), which also covers podman pulling the runner image.
pub(crate) const DEFAULT_PULL_DEADLINE: u64 = 600;

/// How transient failures are retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Ceiling of the first backoff draw; it doubles with each retry of one request.
    pub base: Duration,
    /// Largest ceiling of one backoff draw.
    pub max_backoff: Duration,
    /// Longest `Retry-After` honoured; a longer one is cut to this.
    pub max_retry_after: Duration,
    /// Most retries per pull, all requests together.
    pub max_retries: u32,
    /// Most time spent waiting between retries per pull, all requests together.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_millis(250),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            max_retries: 12,
            max_wait: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `n` (1 = first retry) of one request: a uniform draw in
    /// `[0, min(max_backoff, base·2^(n-1))]` (full jitter), and never less than the server's
    /// `Retry-After` (capped at `max_retry_after`). `unit` is a uniform draw in `[0, 1)`.
    pub(crate) fn delay(&self, n: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        let exp = n.saturating_sub(1).min(30);
        let ceiling = self.base.saturating_mul(1u32 << exp).min(self.max_backoff);
        let jitter = ceiling.mul_f64(unit.clamp(0.0, 1.0));
        match retry_after {
            Some(ra) => jitter.max(ra.min(self.max_retry_after)),
            None => jitter,
        }
    }
}

/// Whether a failed request is worth retrying.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Connection error, reset, timeout, HTTP 5xx, 408 or 429; with the server's
    /// `Retry-After`, if it sent one.
    Transient(anyhow::Error, Option<Duration>),
    /// Anything else (other 4xx, TLS errors, bad content).
    Fatal(anyhow::Error),
}

impl Failure {
    /// A transient failure without `Retry-After`.
    pub(crate) fn transient(e: anyhow::Error) -> Self {
        Failure::Transient(e, None)
    }

    /// The error inside.
    pub(crate) fn into_inner(self) -> anyhow::Error {
        match self {
            Failure::Transient(e, _) | Failure::Fatal(e) => e,
        }
    }
}

/// Retry accounting for one pull, shared by all its requests (auth, manifests, blobs).
#[derive(Debug)]
pub(crate) struct RetryBudget {
    policy: RetryPolicy,
    used: Mutex<(u32, Duration)>,
    /// The pull's deadline (`--pull-deadline`): no wait may end past it.
    deadline: Option<(tokio::time::Instant, Duration)>,
}

impl RetryBudget {
    /// A fresh budget.
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        RetryBudget { policy, used: Mutex::new((0, Duration::ZERO)), deadline: None }
    }

    /// A fresh budget for a pull that must end by `deadline` (`total` after it began).
    pub(crate) fn with_deadline(policy: RetryPolicy, deadline: tokio::time::Instant, total: Duration) -> Self {
        RetryBudget { deadline: Some((deadline, total)), ..Self::new(policy) }
    }

    /// Retries taken so far.
    pub(crate) fn retries(&self) -> u32 {
        self.used.lock().map(|u| u.0).unwrap_or(0)
    }

    /// Takes one retry from the budget: the wait before retry `n` of one request, or the
    /// reason the budget is spent.
    pub(crate) fn take(&self, n: u32, retry_after: Option<Duration>) -> std::result::Result<Duration, String> {
        let delay = self.policy.delay(n, retry_after, fastrand::f64());
        let mut used = self.used.lock().map_err(|_| "retry budget lock poisoned".to_string())?;
        let p = &self.policy;
        if used.0 >= p.max_retries {
            return Err(format!("retry budget spent: {} retries (at most {} per pull)", used.0, p.max_retries));
        }
        if let Some((deadline, total)) = self.deadline
            && tokio::time::Instant::now() + delay > deadline
        {
            return Err(format!(
                "the next wait of {:.1} s would pass the pull deadline of {} s (--pull-deadline)",
                delay.as_secs_f64(),
                total.as_secs()
            ));
        }
        if used.1 + delay > p.max_wait {
            return Err(format!(
                "retry budget spent: {:.1} s waited, the next wait of {:.1} s would pass the {} s per pull",
                used.1.as_secs_f64(),
                delay.as_secs_f64(),
                p.max_wait.as_secs()
            ));
        }
        used.0 += 1;
        used.1 += delay;
        Ok(delay)
    }

    /// Logs retry `n` of one request and sleeps; `Err` (with the reason) if the budget is
    /// spent or the request already had `limit` retries.
    pub(crate) async fn wait(
        &self,
        what: &str,
        (n, limit): (u32, u32),
        e: &anyhow::Error,
        retry_after: Option<Duration>,
    ) -> Result<(), String> {
        if n > limit {
            return Err(format!("{limit} retries of one request to a mirror, trying the next source"));
        }
        let delay = self.take(n, retry_after)?;
        let ra = retry_after.map(|d| format!(" (Retry-After {} s)", d.as_secs_f64())).unwrap_or_default();
        tracing::warn!(
            retry = self.retries(),
            delay_ms = delay.as_millis() as u64,
            "{what}: {e:#}; retry {} of at most {} in {:.2} s{ra}",
            self.retries(),
            self.policy.max_retries,
            delay.as_secs_f64()
        );
        tokio::time::sleep(delay).await;
        Ok(())
    }
}

/// The retries allowed to the requests to one endpoint in one pull, built once per
/// endpoint: the pull's shared budget, and the most retries of one request (a mirror gets
/// [`MIRROR_RETRIES`], then the next endpoint is tried; a source is bounded by the budget).
#[derive(Debug, Clone)]
pub(crate) struct Retries {
    budget: Arc<RetryBudget>,
    limit: u32,
}

impl Retries {
    /// The retries of an endpoint (`mirror` or source) drawing from `budget`.
    pub(crate) fn new(budget: Arc<RetryBudget>, mirror: bool) -> Self {
        Retries { budget, limit: if mirror { MIRROR_RETRIES } else { u32::MAX } }
    }

    /// Logs retry `n` of one request and sleeps; `Err` (with the reason) when the budget is
    /// spent or the request had its retries.
    pub(crate) async fn wait(
        &self,
        what: &str,
        n: u32,
        e: &anyhow::Error,
        retry_after: Option<Duration>,
    ) -> Result<(), String> {
        self.budget.wait(what, (n, self.limit), e, retry_after).await
    }
}

/// Runs `f` with a per-attempt `timeout`, retrying transient failures as `retries` allow.
pub(crate) async fn with_retry<T, F, Fut>(retries: &Retries, timeout: Duration, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, Failure>>,
{
    let mut n = 0;
    loop {
        // No answer at all within the timeout: the endpoint accepts and does not serve.
        // Waiting again would double the time to fail over (or to fail): not retried.
        let res = match tokio::time::timeout(timeout, f()).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Fatal(anyhow!(
                "{TIMED_OUT}: no response within {} s (not retried)",
                timeout.as_secs_f64()
            ))),
        };
        match res {
            Ok(v) => return Ok(v),
            Err(Failure::Transient(e, ra)) => {
                n += 1;
                if let Err(spent) = retries.wait(what, n, &e, ra).await {
                    return Err(e.context(format!("{what}: giving up, {spent}")));
                }
            }
            Err(Failure::Fatal(e)) => return Err(e.context(what.to_string())),
        }
    }
}

/// Parses a `Retry-After` value: delta-seconds or an HTTP-date (a date in the past is 0).
pub(crate) fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The `Retry-After` of a response, if present and valid.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(v, SystemTime::now())
}

/// Whether an HTTP status is worth retrying: 408, 429 and 5xx.
pub(crate) fn transient_status(status: reqwest::StatusCode) -> bool {
    status.is_server_error() || matches!(status.as_u16(), 408 | 429)
}

/// Classifies a non-success response status (with its headers, for `Retry-After`).
pub(crate) fn status_failure(
    status: reqwest::StatusCode,
    headers: &reqwest::header::HeaderMap,
    e: anyhow::Error,
) -> Failure {
    if transient_status(status) { Failure::Transient(e, retry_after(headers)) } else { Failure::Fatal(e) }
}

/// The one wording of a registry timeout (no response, or a body that stopped moving).
pub(crate) const TIMED_OUT: &str = "timed out: no response or progress from the registry";

/// A registry timeout after `timeout` without a response or progress.
pub(crate) fn timed_out(timeout: Duration) -> anyhow::Error {
    anyhow!("{TIMED_OUT} for {} s", timeout.as_secs_f64())
}

/// True when the error chain holds a TLS failure (rustls reports handshake garbage from a
/// plain-HTTP server and untrusted certificates as `InvalidData`): retrying cannot help.
fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        // io::Error's `source()` skips the error it wraps: look inside with `get_ref()`.
        let mut io = err.downcast_ref::<std::io::Error>();
        while let Some(i) = io {
            if i.kind() == std::io::ErrorKind::InvalidData {
                return true;
            }
            io = i.get_ref().and_then(|inner| inner.downcast_ref::<std::io::Error>());
        }
        cur = err.source();
    }
    false
}

/// Retries of one request to a mirror before the next source is tried.
pub(crate) const MIRROR_RETRIES: u32 = 2;

const TLS_HINT: &str = "TLS failed (not retried); if this registry serves plain HTTP, name it with \
                        --insecure-registry or `insecure = true` in registries.conf";

/// Longest TCP connect plus TLS handshake: a third of `--timeout`, between 1 and 10 s (a
/// live registry completes both in milliseconds; one that does not is cut well before a
/// response would be).
pub(crate) fn connect_timeout(timeout: Duration) -> Duration {
    (timeout / 3).clamp(Duration::from_secs(1), Duration::from_secs(10)).min(timeout)
}

/// Slowest a response body may arrive, in bytes per second averaged over each `--timeout`
/// window: a slower one is cut (then resumed once, or the next endpoint tried).
pub(crate) const MIN_RATE: u64 = 1024;

/// Checks that a body keeps at least [`MIN_RATE`] over each window.
#[derive(Debug)]
pub(crate) struct RateFloor {
    window: Duration,
    start: tokio::time::Instant,
    bytes: u64,
}

impl RateFloor {
    /// Starts measuring now, over windows of `window`.
    pub(crate) fn new(window: Duration) -> Self {
        RateFloor { window, start: tokio::time::Instant::now(), bytes: 0 }
    }

    /// Counts `n` more bytes; an error once a whole window passed below the floor.
    pub(crate) fn add(&mut self, n: usize) -> Result<()> {
        self.bytes += n as u64;
        let elapsed = self.start.elapsed();
        if elapsed >= self.window {
            let need = MIN_RATE as f64 * elapsed.as_secs_f64();
            if (self.bytes as f64) < need {
                anyhow::bail!(
                    "{TIMED_OUT}: too slow, {} bytes in {:.1} s (the minimum is {MIN_RATE} bytes/s over --timeout)",
                    self.bytes,
                    elapsed.as_secs_f64()
                );
            }
            *self = RateFloor::new(self.window);
        }
        Ok(())
    }
}

/// Retries of one blob after it stalled or ran below [`MIN_RATE`] (a resume with `Range`):
/// a second stall ends it, so a trickling registry costs at most two `--timeout` windows.
pub(crate) const STALL_RETRIES: u32 = 1;

/// Classifies a reqwest error from sending a request: a connection that cannot be made
/// (refused, unreachable, connect or TLS handshake timeout) and TLS failures are not
/// retried (the next endpoint is tried at once); resets and other I/O errors are transient.
pub(crate) fn classify_reqwest(e: reqwest::Error) -> Failure {
    if is_tls_failure(&e) {
        return Failure::Fatal(anyhow::Error::new(e).context(TLS_HINT));
    }
    if e.is_connect() {
        let what = if e.is_timeout() { "connect or TLS handshake timed out" } else { "cannot connect" };
        return Failure::Fatal(anyhow::Error::new(e).context(format!("{what} (not retried)")));
    }
    if e.is_timeout() {
        return Failure::Fatal(anyhow::Error::new(e).context(format!("{TIMED_OUT}: no response (not retried)")));
    }
    if e.is_request() || e.is_body() || e.is_decode() {
        Failure::transient(anyhow::Error::new(e))
    } else {
        Failure::Fatal(anyhow::Error::new(e))
    }
}

/// Classifies a reqwest error while reading a response body: a stall is transient (the
/// caller resumes or gives up per [`STALL_RETRIES`]); the rest as [`classify_reqwest`].
pub(crate) fn classify_body(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        return Failure::transient(anyhow::Error::new(e).context(TIMED_OUT));
    }
    classify_reqwest(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_doubles_up_to_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay(1, None, 0.0), Duration::ZERO);
        assert_eq!(p.delay(1, None, 0.999_999), p.base.mul_f64(0.999_999));
        assert_eq!(p.delay(3, None, 0.5), p.base * 2);
        assert_eq!(p.delay(40, None, 0.5), p.max_backoff / 2);
    }

    #[test]
    fn retry_after_is_a_floor_with_a_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay(1, Some(Duration::from_secs(2)), 0.5), Duration::from_secs(2));
        assert_eq!(p.delay(1, Some(Duration::from_secs(3600)), 0.5), p.max_retry_after);
        assert_eq!(p.delay(10, Some(Duration::from_secs(1)), 1.0), p.max_backoff);
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:40 GMT", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:30 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn budget_counts_and_time() {
        let b = RetryBudget::new(RetryPolicy { max_retries: 2, ..RetryPolicy::default() });
        assert!(b.take(1, None).is_ok());
        assert!(b.take(2, None).is_ok());
        assert!(b.take(3, None).unwrap_err().contains("2 retries"));
        let b = RetryBudget::new(RetryPolicy { max_wait: Duration::from_secs(5), ..RetryPolicy::default() });
        assert_eq!(b.take(1, Some(Duration::from_secs(4))), Ok(Duration::from_secs(4)));
        assert!(b.take(1, Some(Duration::from_secs(2))).unwrap_err().contains("would pass the 5 s"));
    }

    #[test]
    fn statuses() {
        use reqwest::StatusCode;
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(transient_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 416] {
            assert!(!transient_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }
}
