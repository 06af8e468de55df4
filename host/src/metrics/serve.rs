//! `--metrics-address`: plain HTTP `GET /metrics` (docs/metrics.md#endpoint), served on the
//! process's own runtime with the webhook's connection limits (`crate::webhook::server`):
//! connection slots in all and per source address, the idlest connection closed to make
//! room, header and idle timeouts, HTTP/2 pings. A scrape encodes the registry into memory
//! (a few KiB) and never waits for the work loop; the work loop never waits for it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::webhook::server::{Slots, accept_loop, connection, http_builder};

/// Connection slots of the metrics listener, in all and per source address.
const CONNECTIONS: usize = 64;
const CONNECTIONS_PER_IP: usize = 16;
/// A metrics connection with no request in flight this long is closed (Prometheus
/// reconnects at its next scrape).
const IDLE: Duration = Duration::from_secs(10);
/// How long an idle connection asked to close may take.
const DRAIN: Duration = Duration::from_secs(2);
/// The OpenMetrics text format's `Content-Type`.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` and serves `registry` there on the current runtime until the process ends;
/// returns the bound address.
pub(crate) async fn spawn(addr: SocketAddr, registry: Registry) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("listening on {addr} (metrics)"))?;
    let local = listener.local_addr().context("metrics listener address")?;
    let registry = Arc::new(registry);
    let builder = Arc::new(http_builder());
    let slots = Slots::new(CONNECTIONS, CONNECTIONS_PER_IP, None);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        // Held for the life of the listener: it stops only with the process.
        let _stop_tx = stop_tx;
        accept_loop(listener, slots, stop_rx, move |tcp, peer, stop, activity| {
            let (registry, builder) = (Arc::clone(&registry), Arc::clone(&builder));
            async move {
                let busy = Arc::clone(&activity);
                let service = hyper::service::service_fn(move |req| {
                    let (registry, busy) = (Arc::clone(&registry), busy.begin());
                    async move {
                        let r = route(&registry, &req);
                        drop(busy);
                        r
                    }
                });
                connection(tcp, &builder, service, activity, (IDLE, DRAIN), stop, peer).await;
            }
        })
        .await;
    });
    tracing::info!(listen = %local, "metrics serving at /metrics");
    Ok(local)
}

/// Answers one request: `GET /metrics`, or 404/405.
fn route(registry: &Registry, req: &Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != "/metrics" {
        return Ok(plain(StatusCode::NOT_FOUND, "not found\n"));
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return Ok(plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"));
    }
    let open_metrics = req
        .headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (body, content_type) = match encode(registry, open_metrics) {
        Ok(b) => b,
        Err(_) => return Ok(plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n")),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(r)
}

/// The exposition of `registry`: OpenMetrics text, or the Prometheus text format 0.0.4.
pub(crate) fn encode(registry: &Registry, open_metrics: bool) -> Result<(String, &'static str), std::fmt::Error> {
    let mut out = String::with_capacity(8 << 10);
    if open_metrics {
        text::encode(&mut out, registry)?;
        Ok((out, OPENMETRICS))
    } else {
        prometheus_text::encode(&mut out, registry)?;
        Ok((out, prometheus_text::CONTENT_TYPE))
    }
}

/// A short plain-text answer.
fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}
