//! A fault-injecting HTTP/1.1 proxy for tests (plain HTTP, GET/HEAD only).
//!
//! Each client connection carries one request (the proxy forces `Connection: close`), so
//! faults apply per request: answer the first N requests with an error status, cut blob
//! responses after some bytes, stall forever, or throttle: admit at most K blob downloads
//! at once and answer 429 with `Retry-After` past that. Every request line is logged, with
//! its arrival time and what the proxy answered; body bytes served are counted per
//! listening address (so one proxy can tell many clients apart: one address each).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to requests.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Answer this many requests (of any kind) with `fail_status` before passing through.
    pub fail_first: u32,
    /// Status used by `fail_first` (default 503).
    pub fail_status: Option<u16>,
    /// Cut blob responses (`/blobs/`) after this many body bytes…
    pub cut_blob_after: Option<u64>,
    /// …for this many responses.
    pub cut_times: u32,
    /// Accept connections and read requests but never answer.
    pub stall: bool,
    /// Stall only blob requests, after sending this many body bytes.
    pub stall_blob_after: Option<u64>,
    /// `fail_first` applies only to requests whose request line contains this.
    pub fail_matching: Option<String>,
    /// `Retry-After` value sent with injected failures and throttling answers.
    pub retry_after: Option<String>,
    /// Admit at most this many blob GETs at once; answer 429 past that.
    pub max_blobs: Option<usize>,
    /// Send blob bodies one byte per this interval.
    pub trickle_blobs: Option<std::time::Duration>,
}

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Event {
    /// When the request head arrived.
    pub at: Instant,
    /// The same, on the wall clock (to compare with an HTTP-date `Retry-After`).
    pub wall: SystemTime,
    /// The request line.
    pub line: String,
    /// Listening address the client connected to.
    pub local: SocketAddr,
    /// Status the proxy answered itself (injected failure or throttling); `None` when the
    /// request went to the registry.
    pub injected: Option<u16>,
}

/// Body bytes served (passed through from the registry) to one listening address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// Requests received.
    pub requests: u64,
    /// Answered 429 because of `max_blobs`.
    pub throttled: u64,
    /// Answered with an injected `fail_status`.
    pub failed: u64,
    /// Body bytes of blob responses.
    pub blob_bytes: u64,
    /// Body bytes of manifest responses.
    pub manifest_bytes: u64,
    /// Body bytes of any other response.
    pub other_bytes: u64,
}

#[derive(Default)]
struct Shared {
    log: Vec<String>,
    events: Vec<Event>,
    served: BTreeMap<IpAddr, Served>,
    active_blobs: usize,
    peak_blobs: usize,
    connections: usize,
}

/// Releases a blob admission when the response ends (or the connection drops).
struct Admission(Arc<Mutex<Shared>>);

impl Drop for Admission {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.active_blobs -= 1;
        }
    }
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    /// Address to send requests to.
    pub addr: SocketAddr,
    rules: Arc<Mutex<Rules>>,
    shared: Arc<Mutex<Shared>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` with `rules`.
    pub fn start(upstream: SocketAddr, rules: Rules) -> Self {
        Self::start_on(upstream, rules, &[IpAddr::from([127, 0, 0, 1])])
    }

    /// Starts a proxy listening on the same free port of each address in `ips` (bytes
    /// served are counted per address); [`Proxy::addr`] is the first one.
    pub fn start_on(upstream: SocketAddr, rules: Rules, ips: &[IpAddr]) -> Self {
        let rules = Arc::new(Mutex::new(rules));
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (r, l) = (rules.clone(), shared.clone());
        let ips = ips.to_vec();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let first = TcpListener::bind(SocketAddr::new(ips[0], 0)).await.expect("proxy bind");
                let port = first.local_addr().expect("addr").port();
                let mut listeners = vec![first];
                for ip in &ips[1..] {
                    listeners.push(TcpListener::bind(SocketAddr::new(*ip, port)).await.expect("proxy bind"));
                }
                addr_tx.send(SocketAddr::new(ips[0], port)).expect("send addr");
                let mut tasks = tokio::task::JoinSet::new();
                for listener in listeners {
                    let (r, l) = (r.clone(), l.clone());
                    tasks.spawn(async move {
                        loop {
                            let Ok((client, _)) = listener.accept().await else { continue };
                            if let Ok(mut sh) = l.lock() {
                                sh.connections += 1;
                            }
                            let Ok(local) = client.local_addr() else { continue };
                            let (r, l) = (r.clone(), l.clone());
                            tokio::spawn(async move {
                                let _ = handle(client, local, upstream, r, l).await;
                            });
                        }
                    });
                }
                tokio::select! {
                    _ = tasks.join_next() => {}
                    _ = stop_rx => {}
                }
            });
            rt.shutdown_background();
        });
        let addr = addr_rx.recv().expect("proxy address");
        Proxy { addr, rules, shared, stop: Some(stop_tx), thread: Some(thread) }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Replaces the rules.
    pub fn set_rules(&self, rules: Rules) {
        *self.rules.lock().expect("rules") = rules;
    }

    /// Request lines seen so far (`GET /v2/… HTTP/1.1`).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().expect("log").log.clone()
    }

    /// Every request with its arrival time and the proxy's own answer, in arrival order.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().expect("log").events.clone()
    }

    /// Bytes and requests per listening address.
    pub fn served(&self) -> BTreeMap<IpAddr, Served> {
        self.shared.lock().expect("log").served.clone()
    }

    /// TCP connections accepted so far (a TLS attempt that never sends a request counts).
    pub fn connections(&self) -> usize {
        self.shared.lock().expect("log").connections
    }

    /// Most blob downloads that were in flight at once.
    pub fn peak_blobs(&self) -> usize {
        self.shared.lock().expect("log").peak_blobs
    }

    /// Request lines containing `needle`.
    pub fn requests_matching(&self, needle: &str) -> Vec<String> {
        self.requests().into_iter().filter(|l| l.contains(needle)).collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn read_head(s: &mut TcpStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok((buf, rest));
        }
        if buf.len() > 64 * 1024 {
            return Err(std::io::Error::other("head too large"));
        }
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof in head"));
        }
        buf.extend_from_slice(&tmp[..n]);
        // Not HTTP (a TLS ClientHello from a client trying HTTPS first): answer 400 and
        // close at once, as a plain-HTTP registry (Go's net/http) does.
        if !buf[0].is_ascii_uppercase() {
            s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await?;
            s.shutdown().await?;
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP request"));
        }
    }
}

async fn answer(client: &mut TcpStream, code: u16, retry_after: Option<&str>) -> std::io::Result<()> {
    let ra = retry_after.map(|v| format!("Retry-After: {v}\r\n")).unwrap_or_default();
    let resp = format!("HTTP/1.1 {code} Injected\r\n{ra}Content-Length: 0\r\nConnection: close\r\n\r\n");
    client.write_all(resp.as_bytes()).await?;
    client.shutdown().await
}

async fn handle(
    mut client: TcpStream,
    local: SocketAddr,
    upstream: SocketAddr,
    rules: Arc<Mutex<Rules>>,
    shared: Arc<Mutex<Shared>>,
) -> std::io::Result<()> {
    let (head, _) = read_head(&mut client).await?;
    let (at, wall) = (Instant::now(), SystemTime::now());
    let text = String::from_utf8_lossy(&head).to_string();
    let request_line = text.lines().next().unwrap_or_default().to_string();
    let is_blob = request_line.contains("/blobs/");
    let is_get = request_line.starts_with("GET ");
    // Decide under the locks, act after them.
    let (stall, fail, cut, stall_after, retry_after, admission, trickle) = {
        let mut r = rules.lock().expect("rules");
        let mut sh = shared.lock().expect("log");
        let fail = if r.fail_first > 0 && r.fail_matching.as_ref().is_none_or(|m| request_line.contains(m.as_str())) {
            r.fail_first -= 1;
            Some(r.fail_status.unwrap_or(503))
        } else {
            None
        };
        let cut = if is_blob && r.cut_times > 0 && r.cut_blob_after.is_some() {
            r.cut_times -= 1;
            r.cut_blob_after
        } else {
            None
        };
        let mut throttled = false;
        let mut admission = None;
        if fail.is_none()
            && is_blob
            && is_get
            && let Some(k) = r.max_blobs
        {
            if sh.active_blobs >= k {
                throttled = true;
            } else {
                sh.active_blobs += 1;
                sh.peak_blobs = sh.peak_blobs.max(sh.active_blobs);
                admission = Some(Admission(shared.clone()));
            }
        }
        let injected = fail.or(throttled.then_some(429));
        sh.log.push(request_line.clone());
        sh.events.push(Event { at, wall, line: request_line.clone(), local, injected });
        let s = sh.served.entry(local.ip()).or_default();
        s.requests += 1;
        s.throttled += u64::from(throttled);
        s.failed += u64::from(fail.is_some());
        let trickle = if is_blob { r.trickle_blobs } else { None };
        (
            r.stall,
            injected,
            cut,
            if is_blob { r.stall_blob_after } else { None },
            r.retry_after.clone(),
            admission,
            trickle,
        )
    };
    if stall {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        return Ok(());
    }
    if let Some(code) = fail {
        return answer(&mut client, code, retry_after.as_deref()).await;
    }
    let mut up = TcpStream::connect(upstream).await?;
    let mut new_head = String::new();
    for (i, line) in text.split("\r\n").enumerate() {
        if line.is_empty() {
            continue;
        }
        if i > 0 && line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        new_head.push_str(line);
        new_head.push_str("\r\n");
    }
    new_head.push_str("Connection: close\r\n\r\n");
    up.write_all(new_head.as_bytes()).await?;
    let (resp_head, first_body) = read_head(&mut up).await?;
    client.write_all(&resp_head).await?;
    let count = |n: usize| {
        if let Ok(mut sh) = shared.lock() {
            let s = sh.served.entry(local.ip()).or_default();
            let n = n as u64;
            if is_blob {
                s.blob_bytes += n;
            } else if request_line.contains("/manifests/") {
                s.manifest_bytes += n;
            } else {
                s.other_bytes += n;
            }
        }
    };
    let limit = cut.or(stall_after);
    let mut sent = 0u64;
    let mut chunk = first_body;
    let mut tmp = vec![0u8; 16 * 1024];
    loop {
        if let Some(max) = limit {
            let allowed = max.saturating_sub(sent) as usize;
            if chunk.len() > allowed {
                client.write_all(&chunk[..allowed]).await?;
                count(allowed);
                client.flush().await?;
                if cut.is_some() {
                    // Cut: drop both connections mid-body.
                    return Ok(());
                }
                tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                return Ok(());
            }
        }
        if let Some(every) = trickle {
            for b in &chunk {
                client.write_all(std::slice::from_ref(b)).await?;
                client.flush().await?;
                tokio::time::sleep(every).await;
            }
        } else {
            client.write_all(&chunk).await?;
        }
        count(chunk.len());
        sent += chunk.len() as u64;
        let n = up.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        chunk = tmp[..n].to_vec();
    }
    drop(admission);
    client.shutdown().await
}
