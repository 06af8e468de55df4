//! A fault-injecting HTTP/1.1 proxy for tests (plain HTTP, GET/HEAD only).
//!
//! Each client connection carries one request (the proxy forces `Connection: close`), so
//! faults apply per request: answer the first N requests with an error status, cut blob
//! responses after some bytes, or stall forever. Every request line is logged.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    /// Address to send requests to.
    pub addr: SocketAddr,
    rules: Arc<Mutex<Rules>>,
    log: Arc<Mutex<Vec<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` with `rules`.
    pub fn start(upstream: SocketAddr, rules: Rules) -> Self {
        let rules = Arc::new(Mutex::new(rules));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (r, l) = (rules.clone(), log.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
                addr_tx.send(listener.local_addr().expect("addr")).expect("send addr");
                let accept = async {
                    loop {
                        let Ok((client, _)) = listener.accept().await else { continue };
                        let (r, l) = (r.clone(), l.clone());
                        tokio::spawn(async move {
                            let _ = handle(client, upstream, r, l).await;
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stop_rx => {}
                }
            });
            rt.shutdown_background();
        });
        let addr = addr_rx.recv().expect("proxy address");
        Proxy { addr, rules, log, stop: Some(stop_tx), thread: Some(thread) }
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
        self.log.lock().expect("log").clone()
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
    }
}

async fn handle(
    mut client: TcpStream,
    upstream: SocketAddr,
    rules: Arc<Mutex<Rules>>,
    log: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let (head, _) = read_head(&mut client).await?;
    let text = String::from_utf8_lossy(&head).to_string();
    let request_line = text.lines().next().unwrap_or_default().to_string();
    log.lock().expect("log").push(request_line.clone());
    let is_blob = request_line.contains("/blobs/");
    // Decide under the lock, act after it.
    let (stall, fail, cut, stall_after) = {
        let mut r = rules.lock().expect("rules");
        let fail = if r.fail_first > 0 {
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
        (r.stall, fail, cut, if is_blob { r.stall_blob_after } else { None })
    };
    if stall {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        return Ok(());
    }
    if let Some(code) = fail {
        let resp = format!("HTTP/1.1 {code} Injected\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        client.write_all(resp.as_bytes()).await?;
        return client.shutdown().await;
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
    let limit = cut.or(stall_after);
    let mut sent = 0u64;
    let mut chunk = first_body;
    let mut tmp = vec![0u8; 16 * 1024];
    loop {
        if let Some(max) = limit {
            let allowed = max.saturating_sub(sent) as usize;
            if chunk.len() > allowed {
                client.write_all(&chunk[..allowed]).await?;
                client.flush().await?;
                if cut.is_some() {
                    // Cut: drop both connections mid-body.
                    return Ok(());
                }
                tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                return Ok(());
            }
        }
        client.write_all(&chunk).await?;
        sent += chunk.len() as u64;
        let n = up.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        chunk = tmp[..n].to_vec();
    }
    client.shutdown().await
}
