//! The webhook's HTTP endpoints: `POST /validate`, `GET /healthz`, `GET /readyz` on the
//! HTTPS listener, the probes alone on the plain-HTTP probe listener.
//!
//! Request bodies share one budget of bytes in flight: a review takes its declared length
//! (or [`MAX_BODY`] when none is declared) from the budget before reading a byte, holds it
//! until answered, and is refused with 503 when the budget does not free up within the
//! review deadline. So however many clients send bodies at once, the bodies held in memory
//! never exceed the budget (the flow-control windows of the connections bound the rest).
//! Bodies declaring at most [`SMALL_BODY`] draw on a reserve of an eighth more, so a
//! flood of large bodies cannot hold up the few-KiB reviews the API server sends.
//! One source address holds at most a quarter of the budget (at least one [`MAX_BODY`]):
//! past that its reviews are refused at once, so slow bodies from one client cannot take
//! the whole budget for their [`BODY_TIMEOUT`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::decide::{BadRequest, Decision, Reviewer};
use super::review;
use crate::metrics::webhook::{Answer, Refusal, WebhookMetrics};

/// Largest request body read (the API server itself caps requests at 3 MiB).
pub(crate) const MAX_BODY: usize = 3 << 20;
/// Bodies of at most this many declared bytes draw on the small-body reserve.
pub(crate) const SMALL_BODY: usize = 64 << 10;
/// Longest time to receive a request body once its budget is held.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Response bodies: always small and whole.
pub(super) type Body = Full<Bytes>;

/// What the endpoints share.
pub(super) struct App {
    /// Runs the policy.
    pub reviewer: Reviewer,
    /// `/readyz` answers 200 while set (cleared at SIGTERM).
    pub ready: AtomicBool,
    /// Bytes of request bodies that may be in memory at once.
    budget: Arc<Semaphore>,
    /// The reserve of small bodies (an eighth more), so a flood of large bodies does not
    /// hold up the API server's usual reviews of a few KiB.
    small: Arc<Semaphore>,
    /// Its size.
    budget_bytes: usize,
    /// Bytes of the budget each source address holds.
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    /// Longest wait for the budget, and for the whole review once it is read.
    review_timeout: Duration,
    /// Where answers and refusals are counted.
    metrics: WebhookMetrics,
}

impl App {
    /// Endpoints reviewing with `reviewer`, holding at most `budget_bytes` of request bodies.
    pub(super) fn new(
        reviewer: Reviewer,
        budget_bytes: usize,
        review_timeout: Duration,
        metrics: WebhookMetrics,
    ) -> App {
        App {
            reviewer,
            ready: AtomicBool::new(true),
            budget: Arc::new(Semaphore::new(budget_bytes)),
            small: Arc::new(Semaphore::new(budget_bytes / 8)),
            budget_bytes,
            held: Arc::default(),
            review_timeout,
            metrics,
        }
    }
}

/// A source address's part of the budget: given back when dropped.
struct Held {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
    bytes: usize,
}

impl Held {
    /// `bytes` more for `ip`, unless that would pass `max`.
    fn take(held: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, bytes: usize, max: usize) -> Option<Held> {
        let mut map = held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(ip).or_insert(0);
        if *n + bytes > max {
            if *n == 0 {
                map.remove(&ip);
            }
            return None;
        }
        *n += bytes;
        Some(Held { held: Arc::clone(held), ip, bytes })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut map = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.ip) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// A body's share of the budget, held until the review is answered.
struct Budget {
    _global: OwnedSemaphorePermit,
    _client: Held,
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn json(body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// How often one client's refusals are logged: the first in each interval, then one line
/// counting the rest.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Most clients whose refusals are counted at once (a client's entry goes once its interval
/// has passed; past this, refusals of new clients are counted together).
const REFUSAL_LOG_CLIENTS: usize = 1024;

/// Refusals per client, so that a client sending thousands of refused requests (HTTP/2
/// streams) a second costs a log line per interval, not one per request.
#[derive(Default)]
struct RefusalLog {
    clients: HashMap<IpAddr, Refusals>,
    /// Refusals not logged for clients that found the table full.
    overflow: u64,
}

/// One client's refusals in its current interval.
struct Refusals {
    since: Instant,
    /// Refusals in the interval that were not logged.
    unlogged: u64,
}

/// The refusal log of this process.
static REFUSAL_LOG: Mutex<Option<RefusalLog>> = Mutex::new(None);

/// Whether a refusal for `ip` is logged now (the first of its interval); logs the count
/// of the previous interval's unlogged refusals first.
pub(super) fn log_refusal(ip: IpAddr, now: Instant) -> bool {
    let mut guard = REFUSAL_LOG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let log = guard.get_or_insert_with(RefusalLog::default);
    if let Some(r) = log.clients.get_mut(&ip) {
        if now.duration_since(r.since) < REFUSAL_LOG_INTERVAL {
            r.unlogged += 1;
            return false;
        }
        if r.unlogged > 0 {
            tracing::warn!(client = %ip, refused = r.unlogged, interval = ?REFUSAL_LOG_INTERVAL, "more admission requests refused (not logged one by one)");
        }
        *r = Refusals { since: now, unlogged: 0 };
        return true;
    }
    if log.clients.len() >= REFUSAL_LOG_CLIENTS {
        flush_stale(log, now);
    }
    if log.clients.len() >= REFUSAL_LOG_CLIENTS {
        log.overflow += 1;
        return false;
    }
    log.clients.insert(ip, Refusals { since: now, unlogged: 0 });
    true
}

/// Logs and forgets the clients whose interval has passed.
fn flush_stale(log: &mut RefusalLog, now: Instant) {
    log.clients.retain(|ip, r| {
        let stale = now.duration_since(r.since) >= REFUSAL_LOG_INTERVAL;
        if stale && r.unlogged > 0 {
            tracing::warn!(client = %ip, refused = r.unlogged, "more admission requests refused (not logged one by one)");
        }
        !stale
    });
    if log.overflow > 0 {
        tracing::warn!(refused = log.overflow, "more admission requests refused by clients not counted one by one");
        log.overflow = 0;
    }
}

/// Logs the count of a client's unlogged refusals when its connection closes.
pub(super) fn connection_closed(ip: IpAddr) {
    let mut guard = REFUSAL_LOG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(log) = guard.as_mut()
        && let Some(r) = log.clients.get_mut(&ip)
        && r.unlogged > 0
    {
        tracing::warn!(client = %ip, refused = r.unlogged, "more admission requests refused on the connection just closed (not logged one by one)");
        r.unlogged = 0;
    }
}

fn bad_request(status: StatusCode, peer: SocketAddr, msg: String) -> Response<Body> {
    if log_refusal(peer.ip(), Instant::now()) {
        tracing::warn!(%peer, status = status.as_u16(), error = %msg, "refused an admission request");
    }
    let mut r = text(status, format!("{msg}\n"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn too_large() -> (StatusCode, String) {
    (StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {MAX_BODY} bytes"))
}

/// Takes the body's share of the budget, then reads it (with the cap and the deadline).
async fn read_body(app: &App, req: Request<Incoming>, peer: IpAddr) -> Result<(Vec<u8>, Budget), (StatusCode, String)> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let want = match declared {
        Some(n) if n > MAX_BODY as u64 => return Err(too_large()),
        Some(n) => n as usize,
        None => MAX_BODY,
    };
    let share = want.clamp(1, app.budget_bytes);
    let per_client = (app.budget_bytes / 4).max(MAX_BODY);
    let Some(client) = Held::take(&app.held, peer.to_canonical(), share, per_client) else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "webhook overloaded: this client already has {per_client} bytes of request bodies in flight; retry"
            ),
        ));
    };
    let pool = if declared.is_some() && want <= SMALL_BODY { &app.small } else { &app.budget };
    let share = u32::try_from(share).unwrap_or(u32::MAX);
    let permit = match tokio::time::timeout(app.review_timeout, Arc::clone(pool).acquire_many_owned(share)).await {
        Ok(Ok(p)) => p,
        Ok(Err(_)) => return Err((StatusCode::SERVICE_UNAVAILABLE, "the webhook is shutting down".to_string())),
        Err(_) => {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!("webhook overloaded: {} bytes of request bodies already in flight; retry", app.budget_bytes),
            ));
        }
    };
    let mut body = req.into_body();
    let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err((StatusCode::REQUEST_TIMEOUT, "request body not received in time".to_string())),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err((StatusCode::BAD_REQUEST, format!("reading the request body: {e}"))),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > want {
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok((buf, Budget { _global: permit, _client: client }))
}

/// Answers a `POST /validate` and counts the answer.
async fn validate(app: &App, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let arrived = Instant::now();
    let (response, answer, warnings) = review_request(app, req, peer).await;
    app.metrics.answered(answer, warnings, arrived.elapsed());
    response
}

/// The answer to a `POST /validate`, its decision and its warning count.
async fn review_request(app: &App, req: Request<Incoming>, peer: SocketAddr) -> (Response<Body>, Answer, usize) {
    let fail = |r: Response<Body>| (r, Answer::error, 0);
    let (body, _budget) = match read_body(app, req, peer.ip()).await {
        Ok(b) => b,
        Err((status, msg)) => {
            let limit = match status {
                StatusCode::SERVICE_UNAVAILABLE => Some(Refusal::body_budget),
                StatusCode::PAYLOAD_TOO_LARGE => Some(Refusal::body_too_large),
                StatusCode::REQUEST_TIMEOUT => Some(Refusal::body_timeout),
                _ => None,
            };
            if let Some(l) = limit {
                app.metrics.refused(l);
            }
            return fail(bad_request(status, peer, msg));
        }
    };
    let started = Instant::now();
    let request = match review::parse(&body) {
        Ok(r) => r,
        Err(msg) => return fail(bad_request(StatusCode::BAD_REQUEST, peer, msg)),
    };
    let decision = match app.reviewer.decide(&request).await {
        Ok(d) => d,
        Err(BadRequest(msg)) => return fail(bad_request(StatusCode::BAD_REQUEST, peer, msg)),
    };
    let (answer, warnings) = match &decision {
        Decision::Allow(w) => (Answer::allowed, w.len()),
        Decision::Deny { code: 422, .. } => (Answer::denied, 0),
        Decision::Deny { .. } => (Answer::error, 0),
    };
    let allowed = matches!(decision, Decision::Allow(_));
    if !matches!(decision, Decision::Allow(ref w) if w.is_empty()) {
        tracing::info!(
            uid = %request.uid,
            operation = %request.operation,
            namespace = request.namespace.as_deref().unwrap_or_default(),
            name = request.name.as_deref().unwrap_or_default(),
            dry_run = request.dry_run.unwrap_or(false),
            allowed,
            elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "reviewed"
        );
    }
    match review::answer(decision.into_response(&request.uid)) {
        Ok(b) => (json(b), answer, warnings),
        Err(e) => {
            tracing::error!(error = %e, "serialising the AdmissionReview response");
            fail(text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n"))
        }
    }
}

/// `/healthz` and `/readyz`, or `None` for another path.
fn probe(app: &App, req: &Request<Incoming>) -> Option<Response<Body>> {
    let get = matches!(*req.method(), Method::GET | Method::HEAD);
    Some(match req.uri().path() {
        "/healthz" if get => text(StatusCode::OK, "ok\n"),
        "/readyz" if get && app.ready.load(Ordering::Acquire) => text(StatusCode::OK, "ok\n"),
        "/readyz" if get => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
        "/healthz" | "/readyz" => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
        _ => return None,
    })
}

/// The HTTPS listener's endpoints.
pub(super) async fn route(
    app: Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, Infallible> {
    if let Some(r) = probe(&app, &req) {
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/validate" if req.method() == Method::POST => validate(&app, req, peer).await,
        "/validate" => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

/// The probe listener's endpoints: the probes only.
pub(super) async fn route_probe(app: Arc<App>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(probe(&app, &req).unwrap_or_else(|| text(StatusCode::NOT_FOUND, "not found\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One client's refusals: the first of each interval is logged, the rest only counted.
    #[test]
    fn refusals_are_logged_once_per_client_and_interval() {
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.7".parse().expect("ip"), "192.0.2.8".parse().expect("ip"));
        let t = Instant::now();
        assert!(log_refusal(a, t));
        let logged = (0..10_000).filter(|_| log_refusal(a, t + Duration::from_millis(5))).count();
        assert_eq!(logged, 0);
        assert!(log_refusal(b, t), "another client has its own interval");
        assert!(log_refusal(a, t + REFUSAL_LOG_INTERVAL), "the next interval logs again");
        connection_closed(a);
    }
}
