//! Abusive clients of `kata-addons webhook`, for tests/tests/webhook.rs and
//! `bench/webhook --abuse`: connections that complete the TLS handshake (HTTP/1.1, or the
//! HTTP/2 preface and SETTINGS) and then send nothing, bodies that trickle, and floods of
//! 3 MiB bodies, each from any of the loopback source addresses 127.0.0.0/8.

use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::admission::{BoxBody, Client, NAME, Proto, configmap, create};

/// The `i`-th loopback source address other than 127.0.0.1 (127.0.1.x, 127.0.2.x, …).
pub fn source(i: usize) -> IpAddr {
    let i = i + 1;
    IpAddr::V4(Ipv4Addr::new(127, 0, (i / 250 + 1) as u8, (i % 250 + 1) as u8))
}

/// An open connection that sends nothing more.
pub type Idle = tokio_rustls::client::TlsStream<TcpStream>;

/// The HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Opens a connection from `from` that completes the TLS handshake (and for HTTP/2 sends
/// the preface and SETTINGS) and then stays silent.
pub async fn open_idle(client: &Client, from: Option<IpAddr>, proto: Proto) -> std::io::Result<Idle> {
    let mut tls = client.tls_from(from, proto).await?;
    if proto == Proto::Http2 {
        tls.write_all(H2_PREFACE).await?;
        tls.flush().await?;
    }
    Ok(tls)
}

/// Reads (and discards) what the server sends until it closes the connection.
pub async fn until_closed(mut conn: Idle) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = conn.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// Whether the server closes a new connection from `from` before or at the handshake.
pub async fn refused(client: &Client, from: Option<IpAddr>) -> bool {
    match client.tls_from(from, Proto::Http1).await {
        Err(_) => true,
        Ok(mut c) => {
            let mut b = [0u8; 1];
            matches!(tokio::time::timeout(Duration::from_secs(5), c.read(&mut b)).await, Ok(Ok(0) | Err(_)))
        }
    }
}

/// A body declaring `total` bytes that sends `chunk` bytes every `every`.
pub struct Trickle {
    left: usize,
    total: usize,
    chunk: usize,
    every: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let deadline = tokio::time::Instant::now() + self.every;
        self.sleep.as_mut().reset(deadline);
        let n = self.chunk.min(self.left);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b' '; n])))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.total as u64)
    }
}

/// A body of `total` declared bytes sent `chunk` bytes every `every`.
pub fn trickle(total: usize, chunk: usize, every: Duration) -> BoxBody {
    use http_body_util::BodyExt;
    Trickle { left: total, total, chunk, every, sleep: Box::pin(tokio::time::sleep(Duration::ZERO)) }.boxed()
}

/// A review of about `bytes` bytes: a Secret whose object is one long array (never parsed
/// by the webhook), or, `configmap`, the ConfigMap with one value that long (over the
/// ConfigMap size limit: denied).
pub fn big_review(bytes: usize, as_configmap: bool) -> Bytes {
    let mut review = create("uid-big", &configmap(NAME, &[("kernelPath", "/k")]));
    if as_configmap {
        review["request"]["object"]["data"]["addonImage"] = "x".repeat(bytes - 1024).into();
    } else {
        review["request"]["kind"]["kind"] = "Secret".into();
        let n = (bytes - 1024) / 2;
        review["request"]["object"] = serde_json::Value::Array(vec![0.into(); n]);
    }
    Bytes::from(serde_json::to_vec(&review).expect("JSON"))
}

/// POSTs `body` to `/validate` on a new connection from `from`: the status.
pub async fn post_from(client: &Client, from: Option<IpAddr>, proto: Proto, body: BoxBody) -> std::io::Result<u16> {
    let mut conn = client.connect_from(from, proto).await?;
    Ok(conn.send("POST", "/validate", body).await?.status)
}

/// A well-behaved keep-alive client: one `GET /healthz` on a new connection from `from`,
/// then the connection is kept open (HTTP/2 pings answered) until the server closes it.
pub async fn keep_alive_until_closed(client: &Client, from: Option<IpAddr>, proto: Proto) -> std::io::Result<()> {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let io = TokioIo::new(client.tls_from(from, proto).await?);
    let req = |uri: &str| {
        hyper::Request::builder().uri(uri).header("host", "127.0.0.1").body(crate::admission::full(Bytes::new()))
    };
    match proto {
        Proto::Http1 => {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.map_err(std::io::Error::other)?;
            let conn = tokio::spawn(conn);
            let resp = send.send_request(req("/healthz").map_err(std::io::Error::other)?).await;
            resp.map_err(std::io::Error::other)?.into_body().collect().await.map_err(std::io::Error::other)?;
            conn.await.map_err(std::io::Error::other)?.map_err(std::io::Error::other)
        }
        Proto::Http2 => {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(std::io::Error::other)?;
            let conn = tokio::spawn(conn);
            let resp = send.send_request(req("https://127.0.0.1/healthz").map_err(std::io::Error::other)?).await;
            resp.map_err(std::io::Error::other)?.into_body().collect().await.map_err(std::io::Error::other)?;
            conn.await.map_err(std::io::Error::other)?.map_err(std::io::Error::other)
        }
    }
}
