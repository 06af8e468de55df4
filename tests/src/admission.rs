//! Talking to `kata-addons webhook` the way the API server does: the real binary on
//! 127.0.0.1 with a test CA, HTTPS over HTTP/1.1 or HTTP/2 (hyper + rustls), and
//! AdmissionReview bodies whose objects are `k8s-openapi` types.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;

/// The ConfigMap the webhook validates.
pub const NAME: &str = "kata-addon-artifacts";
/// The operator namespace.
pub const NAMESPACE: &str = "openshift-sandboxed-containers-operator";

/// A ConfigMap `name` with `data`.
pub fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            ..ObjectMeta::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..ConfigMap::default()
    }
}

/// A `k8s-openapi` object as the JSON the API server embeds.
pub fn object<T: serde::Serialize>(o: &T) -> Value {
    serde_json::to_value(o).expect("serialise object")
}

/// An AdmissionReview (`admission.k8s.io/v1`) request as the API server sends it.
/// `kind` is `(group, version, kind)`; `object`/`old_object` as for the operation.
pub fn review(
    uid: &str,
    operation: &str,
    kind: (&str, &str, &str),
    name: &str,
    object: Option<Value>,
    old_object: Option<Value>,
    dry_run: bool,
) -> Value {
    let user = k8s_openapi::api::authentication::v1::UserInfo {
        username: Some("kube:admin".into()),
        groups: Some(vec!["system:authenticated".into()]),
        ..Default::default()
    };
    let resource = format!("{}s", kind.2.to_lowercase());
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": kind.0, "version": kind.1, "kind": kind.2},
            "resource": {"group": kind.0, "version": kind.1, "resource": resource},
            "requestKind": {"group": kind.0, "version": kind.1, "kind": kind.2},
            "requestResource": {"group": kind.0, "version": kind.1, "resource": resource},
            "name": name,
            "namespace": NAMESPACE,
            "operation": operation,
            "userInfo": object_of(&user),
            "object": object,
            "oldObject": old_object,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": format!("{}Options", capitalise(operation))},
        }
    })
}

fn object_of<T: serde::Serialize>(o: &T) -> Value {
    serde_json::to_value(o).expect("serialise")
}

fn capitalise(op: &str) -> String {
    let lower = op.to_lowercase();
    let mut c = lower.chars();
    c.next().map(|f| f.to_uppercase().collect::<String>() + c.as_str()).unwrap_or_default()
}

/// A CREATE review of ConfigMap `cm`.
pub fn create(uid: &str, cm: &ConfigMap) -> Value {
    let name = cm.metadata.name.clone().unwrap_or_default();
    review(uid, "CREATE", ("", "v1", "ConfigMap"), &name, Some(object(cm)), None, false)
}

/// HTTP version to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1 (ALPN `http/1.1`).
    Http1,
    /// HTTP/2 (ALPN `h2`).
    Http2,
}

/// An HTTPS client trusting the given CA certificates.
#[derive(Clone)]
pub struct Client {
    addr: SocketAddr,
    roots: Arc<rustls::RootCertStore>,
}

/// A response: status and body.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}: body is not JSON ({e}): {}", self.status, self.text()))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One open connection.
pub enum Conn {
    /// HTTP/1.1.
    H1(hyper::client::conn::http1::SendRequest<BoxBody>),
    /// HTTP/2.
    H2(hyper::client::conn::http2::SendRequest<BoxBody>),
}

/// Request bodies.
pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A body with a declared length.
pub fn full(b: impl Into<Bytes>) -> BoxBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// A body of `chunks` × `chunk` bytes without a declared length (sent chunked / as DATA frames).
pub struct Unsized {
    left: usize,
    chunk: usize,
}

impl Body for Unsized {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b' '; self.chunk])))))
    }
}

/// A streamed body of `chunks` × `chunk` bytes with no content-length.
pub fn unsized_body(chunks: usize, chunk: usize) -> BoxBody {
    Unsized { left: chunks, chunk }.boxed()
}

impl Client {
    /// A client for `addr` trusting the PEM CA files.
    pub fn new(addr: SocketAddr, cas: &[&Path]) -> Client {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for ca in cas {
            for c in CertificateDer::pem_file_iter(ca).expect("CA file") {
                roots.add(c.expect("CA PEM")).expect("add CA");
            }
        }
        Client { addr, roots: Arc::new(roots) }
    }

    fn connector(&self, proto: Proto) -> TlsConnector {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(Arc::clone(&self.roots))
            .with_no_client_auth();
        cfg.alpn_protocols = vec![match proto {
            Proto::Http1 => b"http/1.1".to_vec(),
            Proto::Http2 => b"h2".to_vec(),
        }];
        TlsConnector::from(Arc::new(cfg))
    }

    async fn tls(&self, proto: Proto) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.tls_from(None, proto).await
    }

    /// A TLS connection (ALPN `proto`) from the local address `from` (any of 127.0.0.0/8
    /// is a distinct source address on Linux loopback), nothing sent after the handshake.
    pub async fn tls_from(
        &self,
        from: Option<std::net::IpAddr>,
        proto: Proto,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = match from {
            None => TcpStream::connect(self.addr).await?,
            Some(ip) => {
                let socket =
                    if ip.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
                socket.bind(SocketAddr::new(ip, 0))?;
                socket.connect(self.addr).await?
            }
        };
        tcp.set_nodelay(true)?;
        let name = rustls_pki_types::ServerName::IpAddress(self.addr.ip().into());
        self.connector(proto).connect(name, tcp).await
    }

    /// The DER of the certificate the server presents now.
    pub async fn served_cert(&self) -> Vec<u8> {
        let tls = self.tls(Proto::Http1).await.expect("TLS handshake");
        let certs = tls.get_ref().1.peer_certificates().expect("server certificate");
        certs[0].as_ref().to_vec()
    }

    /// Opens a connection speaking `proto` (checks that ALPN agreed on it).
    pub async fn connect(&self, proto: Proto) -> std::io::Result<Conn> {
        self.connect_from(None, proto).await
    }

    /// Opens a connection speaking `proto` from the local address `from`.
    pub async fn connect_from(&self, from: Option<std::net::IpAddr>, proto: Proto) -> std::io::Result<Conn> {
        let tls = self.tls_from(from, proto).await?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let io = TokioIo::new(tls);
        let map = |e: hyper::Error| std::io::Error::other(e);
        Ok(match proto {
            Proto::Http1 => {
                assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]), "ALPN");
                let (send, conn) = hyper::client::conn::http1::handshake(io).await.map_err(map)?;
                tokio::spawn(conn);
                Conn::H1(send)
            }
            Proto::Http2 => {
                assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "ALPN");
                let (send, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(map)?;
                tokio::spawn(conn);
                Conn::H2(send)
            }
        })
    }

    /// One request on a new connection.
    pub async fn post(&self, proto: Proto, path: &str, body: &Value) -> Reply {
        let mut c = self.connect(proto).await.expect("connect");
        c.post(path, body).await.expect("request")
    }

    /// One GET on a new connection.
    pub async fn get(&self, path: &str) -> std::io::Result<Reply> {
        let mut c = self.connect(Proto::Http1).await?;
        c.send("GET", path, full(Bytes::new())).await
    }
}

impl Conn {
    /// POSTs JSON to `path` (`?timeout=5s` as the API server adds it).
    pub async fn post(&mut self, path: &str, body: &Value) -> std::io::Result<Reply> {
        let bytes = serde_json::to_vec(body).expect("JSON");
        self.send("POST", path, full(bytes)).await
    }

    /// Sends a request with any body.
    pub async fn send(&mut self, method: &str, path: &str, body: BoxBody) -> std::io::Result<Reply> {
        let h2 = matches!(self, Conn::H2(_));
        let uri = if h2 { format!("https://127.0.0.1{path}") } else { path.to_string() };
        let mut req = hyper::Request::builder().method(method).uri(uri).header("content-type", "application/json");
        if !h2 {
            req = req.header("host", "127.0.0.1");
        }
        let req = req.body(body).map_err(std::io::Error::other)?;
        let resp = match self {
            Conn::H1(s) => {
                s.ready().await.map_err(std::io::Error::other)?;
                s.send_request(req).await
            }
            Conn::H2(s) => {
                s.ready().await.map_err(std::io::Error::other)?;
                s.send_request(req).await
            }
        }
        .map_err(std::io::Error::other)?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(std::io::Error::other)?.to_bytes();
        Ok(Reply { status, body })
    }
}

/// A running `kata-addons webhook`.
pub struct Webhook {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its plain-HTTP probe listener.
    pub probe_addr: SocketAddr,
    /// Its stderr (logs).
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

/// A policy cache directory shared by every webhook and `preview` this test process runs,
/// so the component is compiled once rather than at every start.
pub fn cache_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("cache dir")).path()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

impl Webhook {
    /// Starts `kata-addons [global] webhook --listen 127.0.0.1:<free> --tls-cert C --tls-key K [extra]`
    /// and waits until `/healthz` answers.
    pub fn start(global: &[&str], cert: &Path, key: &Path, extra: &[&str], ca: &Path) -> Webhook {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("webhook.log");
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let probe_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut cmd = Command::new(crate::kata_addons_bin());
        cmd.arg("--cache-dir")
            .arg(cache_dir())
            .args(global)
            .arg("webhook")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .arg("--probe-listen")
            .arg(probe_addr.to_string())
            .args(extra)
            .env("HOME", dir.path())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let child = cmd.spawn().expect("start kata-addons webhook");
        let mut w = Webhook { child, addr, probe_addr, log, _dir: dir };
        w.wait_healthy(ca);
        w
    }

    fn wait_healthy(&mut self, ca: &Path) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let client = Client::new(self.addr, &[ca]);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                panic!("webhook exited early ({st}):\n{}", self.logs());
            }
            if let Ok(r) = rt.block_on(client.get("/healthz"))
                && r.status == 200
            {
                return;
            }
            assert!(Instant::now() < deadline, "webhook not healthy in 60 s:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `GET path` on the plain-HTTP probe listener: the status, or the error.
    pub async fn probe(&self, path: &str) -> std::io::Result<u16> {
        probe(self.probe_addr, path).await
    }

    /// Its peak resident set size so far (`VmHWM` of `/proc/<pid>/status`), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc status");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM value")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    }

    /// Waits (at most `limit`) for the process to exit.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(Instant::now() < deadline, "webhook did not exit within {limit:?}:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over plain HTTP/1.1 on a new connection to `addr`: the status.
pub async fn probe(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let tcp = TcpStream::connect(addr).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .uri(path)
        .header("host", "127.0.0.1")
        .body(full(Bytes::new()))
        .map_err(std::io::Error::other)?;
    let resp = send.send_request(req).await.map_err(std::io::Error::other)?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await.map_err(std::io::Error::other)?;
    Ok(status)
}
