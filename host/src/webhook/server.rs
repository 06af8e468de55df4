//! The webhook's listeners and connections, and what bounds them.
//!
//! - TLS handshake: at most [`HANDSHAKE_TIMEOUT`]; request headers: [`HEADER_TIMEOUT`];
//!   a body: [`BODY_TIMEOUT`](super::http::BODY_TIMEOUT) once its budget is held.
//! - A connection with no request in flight for `idle_timeout` (a keep-alive connection
//!   between requests, an HTTP/2 connection answering pings, one that never sent a byte)
//!   is shut down gracefully (HTTP/2 GOAWAY), and dropped [`CLOSE_GRACE`] later if the
//!   peer does not close. HTTP/2 peers are pinged every [`H2_PING_INTERVAL`] and dropped
//!   when a ping is not answered within [`H2_PING_TIMEOUT`].
//! - At most `max_connections_per_ip` connections from one source address; further ones
//!   are closed at once. At most `max_connections` in all: when every slot is taken, the
//!   connection idle the longest (no request in flight) is closed to make room, so silent
//!   connections cannot lock out a client that has a review to send.
//! - Small HTTP/2 flow-control windows and HTTP/1 buffers, so a connection whose request
//!   waits for the body budget holds at most [`H2_WINDOW`] of unread body.
//! - The probes (`/healthz`, `/readyz`) are also served on a separate plain-HTTP listener
//!   (`probe_listen`) with its own connection slots, so a flood of the HTTPS port never
//!   fails the kubelet's probes.
//! - The same slots and timeouts serve the `--metrics-address` listener (`crate::metrics::serve`).
//! - Every limit that fires is counted in `kata_addons_webhook_rejected_connections_total`.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

use super::decide::Reviewer;
use super::http::{self, App, Body};
use super::tls;
use crate::metrics::webhook::{Refusal, WebhookMetrics};
use crate::policy::Policy;

/// Longest TLS handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time to receive a request's headers once its first byte arrived.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an HTTP/2 peer is pinged.
pub(crate) const H2_PING_INTERVAL: Duration = Duration::from_secs(20);
/// How long an HTTP/2 ping may go unanswered.
pub(crate) const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);
/// After an idle connection was asked to close, how long until it is dropped.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// HTTP/2 flow-control window, per stream and per connection.
pub(crate) const H2_WINDOW: u32 = 64 << 10;
/// Concurrent HTTP/2 streams per connection.
const H2_STREAMS: u32 = 64;
/// Largest HTTP/1 read buffer (so also the largest request head).
const H1_BUFFER: usize = 64 << 10;
/// Largest HTTP/2 header list.
const H2_HEADERS: u32 = 64 << 10;
/// Connection slots of the probe listener, in all and per source address.
const PROBE_CONNECTIONS: usize = 64;
const PROBE_CONNECTIONS_PER_IP: usize = 16;
/// Idle timeout of the probe listener (kubelet opens one connection per probe).
const PROBE_IDLE: Duration = Duration::from_secs(5);

/// How `kata-addons webhook` serves (validated by the command layer).
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Address and port of the HTTPS listener.
    pub listen: SocketAddr,
    /// Address and port of the plain-HTTP probe listener, if any.
    pub probe_listen: Option<SocketAddr>,
    /// Server certificate chain (PEM), re-read when it changes.
    pub tls_cert: PathBuf,
    /// Server private key (PEM), re-read when it changes.
    pub tls_key: PathBuf,
    /// Most policy evaluations at once (1-4).
    pub concurrency: usize,
    /// Longest time for one review, queueing included.
    pub review_timeout: Duration,
    /// How often the certificate files are checked for changes.
    pub cert_poll: Duration,
    /// After SIGTERM, how long to keep serving with /readyz failing.
    pub shutdown_delay: Duration,
    /// Longest wait for in-flight requests after the listener closed.
    pub shutdown_timeout: Duration,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// Most open HTTPS connections.
    pub max_connections: usize,
    /// Most open HTTPS connections from one source address.
    pub max_connections_per_ip: usize,
    /// Most bytes of request bodies held at once, over all connections.
    pub body_budget: usize,
    /// Where to serve Prometheus metrics, if anywhere (started by the command layer).
    pub metrics: Option<SocketAddr>,
}

/// Connection slots: a total and a per-source-address count, and the open connections'
/// activity (to pick the one to close when every slot is taken).
pub(crate) struct Slots {
    total: Arc<Semaphore>,
    size: usize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    per_ip_max: usize,
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    next_id: AtomicU64,
    /// Where the limits that fire are counted, if anywhere.
    metrics: Option<WebhookMetrics>,
}

/// A source address's share of the slots, reserved at accept time.
struct Reserved {
    slots: Arc<Slots>,
    ip: IpAddr,
}

/// One connection's slot, given back when dropped.
struct Slot {
    reserved: Reserved,
    id: u64,
    _permit: OwnedSemaphorePermit,
}

impl Slots {
    /// `size` slots, at most `per_ip_max` for one source address; refusals counted in `metrics`.
    pub(crate) fn new(size: usize, per_ip_max: usize, metrics: Option<WebhookMetrics>) -> Arc<Slots> {
        Arc::new(Slots {
            total: Arc::new(Semaphore::new(size)),
            size,
            per_ip: Mutex::default(),
            per_ip_max,
            open: Mutex::default(),
            next_id: AtomicU64::new(0),
            metrics,
        })
    }

    /// Counts a connection from `ip`, unless that address has its most already.
    fn reserve(self: &Arc<Self>, ip: IpAddr) -> Result<Reserved, &'static str> {
        let ip = ip.to_canonical();
        let mut per_ip = self.per_ip.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = per_ip.entry(ip).or_insert(0);
        if *n >= self.per_ip_max {
            self.count(Refusal::per_address);
            return Err("too many connections from this address");
        }
        *n += 1;
        Ok(Reserved { slots: Arc::clone(self), ip })
    }

    /// A slot for a reserved connection. When every slot is taken, the connection idle
    /// the longest (no request in flight) is closed to make room; when none is idle,
    /// there is no slot.
    async fn take(self: &Arc<Self>, reserved: Reserved, activity: &Arc<Activity>) -> Result<Slot, &'static str> {
        let permit = match Arc::clone(&self.total).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if !self.evict_idlest() {
                    self.count(Refusal::capacity);
                    return Err("too many connections, none idle");
                }
                self.count(Refusal::evicted_idle);
                match tokio::time::timeout(CLOSE_GRACE, Arc::clone(&self.total).acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        self.count(Refusal::capacity);
                        return Err("too many connections");
                    }
                }
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, Arc::clone(activity));
        Ok(Slot { reserved, id, _permit: permit })
    }

    /// Counts a limit that fired.
    fn count(&self, why: Refusal) {
        if let Some(m) = &self.metrics {
            m.refused(why);
        }
    }

    /// Tells the connection idle the longest to close; false if none is idle.
    fn evict_idlest(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let victim = open
            .values()
            .filter(|a| a.in_flight.load(Ordering::Acquire) == 0 && !a.evicted.load(Ordering::Acquire))
            .min_by_key(|a| *a.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        match victim {
            Some(a) => {
                a.evicted.store(true, Ordering::Release);
                a.evict.notify_one();
                true
            }
            None => false,
        }
    }

    /// Waits until every slot is free (every connection closed).
    pub(crate) async fn all_free(&self) {
        let n = u32::try_from(self.size).unwrap_or(u32::MAX);
        let _ = self.total.acquire_many(n).await;
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut per_ip = self.slots.per_ip.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.reserved.slots.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}

/// Requests in flight on one connection, when the last one ended, and whether it was
/// asked to make room for a new connection.
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
    evicted: AtomicBool,
    evict: Notify,
}

/// A request in flight; ends when dropped.
pub(crate) struct Busy(Arc<Activity>);

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        })
    }

    /// A request starts; it ends when the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(self))
    }

    /// When the connection will have been idle for `idle`, if nothing starts.
    fn idle_at(&self, idle: Duration) -> Instant {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Instant::now() + idle;
        }
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) + idle
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The HTTP/1.1 + HTTP/2 connection settings of both listeners.
pub(crate) fn http_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(H1_BUFFER);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_STREAMS)
        .initial_stream_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .max_header_list_size(H2_HEADERS)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    builder
}

/// Serves one connection until it ends, it has been idle for `idle`, or the server stops
/// (then in-flight requests get `drain` to finish).
pub(crate) async fn connection<I, S>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    service: S,
    activity: Arc<Activity>,
    (idle, drain): (Duration, Duration),
    mut stop: watch::Receiver<bool>,
    peer: SocketAddr,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<Body>, Error = std::convert::Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    /// Logs the client's unlogged refusals however the connection ends.
    struct Closed(std::net::IpAddr);
    impl Drop for Closed {
        fn drop(&mut self) {
            http::connection_closed(self.0);
        }
    }
    let _closed = Closed(peer.ip());
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut closing: Option<Instant> = None;
    loop {
        let wake = closing.unwrap_or_else(|| activity.idle_at(idle));
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = activity.evict.notified() => {
                tracing::debug!(%peer, "closing the longest-idle connection to make room for a new one");
                return;
            }
            _ = stop.changed(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Instant::now() + drain);
            }
            _ = tokio::time::sleep_until(wake) => {
                if closing.is_some() {
                    tracing::debug!(%peer, "connection dropped: not closed after the shutdown request");
                    return;
                }
                if activity.idle_at(idle) <= Instant::now() {
                    tracing::debug!(%peer, ?idle, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = Some(Instant::now() + CLOSE_GRACE);
                }
            }
        }
    }
}

/// Installs the SIGTERM and SIGINT handlers now; the future resolves on either.
fn shutdown_signal() -> Result<impl Future<Output = &'static str>> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Accepts on `listener` until `stop`, giving each connection a slot of `slots`, serving
/// it with `serve` (which receives the TCP stream, the peer, the stop signal and the
/// connection's activity).
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    slots: Arc<Slots>,
    mut stop: watch::Receiver<bool>,
    serve: F,
) where
    F: Fn(tokio::net::TcpStream, SocketAddr, watch::Receiver<bool>, Arc<Activity>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let reserved = match slots.reserve(peer.ip()) {
            Ok(r) => r,
            Err(why) => {
                if http::log_refusal(peer.ip(), std::time::Instant::now()) {
                    tracing::warn!(%peer, "{why}; closing this one");
                }
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let activity = Activity::new();
        let (slots, task) = (Arc::clone(&slots), serve(tcp, peer, stop.clone(), Arc::clone(&activity)));
        tokio::spawn(async move {
            let _slot = match slots.take(reserved, &activity).await {
                Ok(s) => s,
                Err(why) => {
                    if http::log_refusal(peer.ip(), std::time::Instant::now()) {
                        tracing::warn!(%peer, "{why}; closing this one");
                    }
                    return;
                }
            };
            task.await;
        });
    }
}

/// Serves until SIGTERM/SIGINT, then finishes in-flight requests and returns.
pub(crate) async fn serve(opts: &Options, policy: Policy, metrics: WebhookMetrics) -> Result<()> {
    let (acceptor, certs) = tls::acceptor(&opts.tls_cert, &opts.tls_key)?;
    let stop_signal = shutdown_signal()?;
    let listener = TcpListener::bind(opts.listen).await.with_context(|| format!("listening on {}", opts.listen))?;
    let local = listener.local_addr().context("listener address")?;
    let probe_listener = match opts.probe_listen {
        Some(a) => Some(TcpListener::bind(a).await.with_context(|| format!("listening on {a} (probes)"))?),
        None => None,
    };
    let reviewer = Reviewer::new(policy, opts.concurrency, opts.review_timeout);
    let policy_sha = reviewer.policy_sha256();
    let app = Arc::new(App::new(reviewer, opts.body_budget, opts.review_timeout, metrics.clone()));
    let reloader = tokio::spawn(Arc::clone(&certs).watch(opts.cert_poll));
    let builder = Arc::new(http_builder());
    let (stop_tx, stop_rx) = watch::channel(false);
    let slots = Slots::new(opts.max_connections, opts.max_connections_per_ip, Some(metrics.clone()));
    let probe_slots = Slots::new(PROBE_CONNECTIONS, PROBE_CONNECTIONS_PER_IP, None);
    tracing::info!(
        listen = %local,
        probes = ?probe_listener.as_ref().and_then(|l| l.local_addr().ok()),
        policy = %policy_sha,
        concurrency = opts.concurrency,
        "webhook serving"
    );

    let (idle, drain) = (opts.idle_timeout, opts.shutdown_timeout);
    let main = {
        let (app, builder) = (Arc::clone(&app), Arc::clone(&builder));
        accept_loop(listener, Arc::clone(&slots), stop_rx.clone(), move |tcp, peer, stop, activity| {
            let (acceptor, app, builder) = (acceptor.clone(), Arc::clone(&app), Arc::clone(&builder));
            let metrics = metrics.clone();
            async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                let tls = tokio::select! {
                    r = handshake => match r {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => {
                            metrics.refused(Refusal::handshake_timeout);
                            return tracing::debug!(%peer, "TLS handshake timed out");
                        }
                    },
                    _ = activity.evict.notified() => return,
                };
                let busy = Arc::clone(&activity);
                let service = hyper::service::service_fn(move |req| {
                    let (app, busy) = (Arc::clone(&app), busy.begin());
                    async move {
                        let r = http::route(app, req, peer).await;
                        drop(busy);
                        r
                    }
                });
                connection(tls, &builder, service, activity, (idle, drain), stop, peer).await;
            }
        })
    };
    let probes = probe_listener.map(|l| {
        let (app, builder) = (Arc::clone(&app), Arc::clone(&builder));
        accept_loop(l, Arc::clone(&probe_slots), stop_rx.clone(), move |tcp, peer, stop, activity| {
            let (app, builder) = (Arc::clone(&app), Arc::clone(&builder));
            async move {
                let busy = Arc::clone(&activity);
                let service = hyper::service::service_fn(move |req| {
                    let (app, busy) = (Arc::clone(&app), busy.begin());
                    async move {
                        let r = http::route_probe(app, req).await;
                        drop(busy);
                        r
                    }
                });
                connection(tcp, &builder, service, activity, (PROBE_IDLE, drain), stop, peer).await;
            }
        })
    });
    let main = tokio::spawn(main);
    let probes = probes.map(tokio::spawn);

    let sig = stop_signal.await;
    app.ready.store(false, Ordering::Release);
    tracing::info!(signal = sig, delay = ?opts.shutdown_delay, "shutting down: readiness off, finishing in-flight requests");
    tokio::time::sleep(opts.shutdown_delay).await;
    let _ = stop_tx.send(true);
    let _ = main.await;
    if let Some(p) = probes {
        let _ = p.await;
    }
    reloader.abort();
    tokio::select! {
        _ = async { slots.all_free().await; probe_slots.all_free().await } => {
            tracing::info!("all connections closed; exiting");
        }
        _ = tokio::time::sleep(drain) => {
            tracing::warn!(timeout = ?drain, "in-flight requests did not finish in time; exiting");
        }
    }
    Ok(())
}
