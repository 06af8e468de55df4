//! `kata-addons webhook`: a validating admission webhook (DESIGN.md §7) for the ConfigMap
//! `kata-addon-artifacts`. It runs the same policy component as `preview` (and nothing
//! else): an invalid ConfigMap is denied with every violation, exactly as `preview` prints
//! them; a valid one is allowed with warnings that preview what the nodes will install.
//!
//! HTTPS (rustls, HTTP/1.1 and HTTP/2), `POST /validate`, `GET /healthz`, `GET /readyz`.
//! The certificate pair is re-read every `--cert-poll-interval` and swapped in when its
//! content changes (service-ca, cert-manager and kubelet's `..data` symlink swap all
//! replace the files atomically; a half-rotated pair whose key does not match is ignored
//! until it does). Limits: 3 MiB request bodies (read with a cap), a deadline per review,
//! at most `--concurrency` policy evaluations at once (on the blocking pool), a bounded
//! number of connections, and graceful shutdown on SIGTERM/SIGINT.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::configmap::{self, Input};
use crate::policy::{Policy, PolicyError, Provider, Violation, ViolationCode};
use crate::preview::{self, Preview};

/// The one ConfigMap the webhook validates.
pub const CONFIGMAP_NAME: &str = "kata-addon-artifacts";
/// The AdmissionReview API version served (in and out).
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// Largest request body read (the API server itself caps requests at 3 MiB).
pub const MAX_BODY: usize = 3 << 20;
/// Kubernetes recommends at most 120 characters per admission warning.
pub const MAX_WARNING_CHARS: usize = 120;
/// Most warnings in one response. The API server keeps at most 4096 characters of
/// warnings per request from all sources (beyond that it cuts each to 256); 16 × 120
/// stays under half of that.
pub const MAX_WARNINGS: usize = 16;
/// Most open connections; further ones are closed at once.
const MAX_CONNECTIONS: usize = 1024;
/// Longest TLS handshake, request header read, or request body read.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest certificate or key file read.
const MAX_PEM: u64 = 1 << 20;

/// `kata-addons webhook` options.
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// Address and port to serve HTTPS on.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Server certificate chain (PEM), re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// Server private key (PEM), re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// Most policy evaluations at once (1-4; the policy engine keeps 4 instance slots).
    #[arg(long, value_name = "N", default_value_t = default_concurrency())]
    pub concurrency: usize,
    /// Longest time for one review, queueing included, in seconds (keep it below the
    /// webhook configuration's timeoutSeconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 4.0)]
    pub review_timeout: f64,
    /// How often the certificate files are checked for changes, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub cert_poll_interval: f64,
    /// After SIGTERM, keep serving (with /readyz failing) this long, in seconds, so that
    /// the Service stops routing here before the listener closes.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    pub shutdown_delay: f64,
    /// Longest wait for in-flight requests after the listener closed, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
    pub shutdown_timeout: f64,
}

/// Number of CPUs, at most 4 (the policy engine's instance pool).
fn default_concurrency() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).min(4)
}

fn seconds(name: &str, v: f64, min: f64, max: f64) -> Result<Duration> {
    if !(v.is_finite() && v >= min && v <= max) {
        bail!("--{name} must be between {min} and {max} seconds, got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

/// Validated limits of a running webhook.
#[derive(Debug, Clone, Copy)]
struct Limits {
    review_timeout: Duration,
    cert_poll: Duration,
    shutdown_delay: Duration,
    shutdown_timeout: Duration,
}

impl WebhookArgs {
    fn limits(&self) -> Result<Limits> {
        if !(1..=4).contains(&self.concurrency) {
            bail!("--concurrency must be between 1 and 4, got {}", self.concurrency);
        }
        Ok(Limits {
            review_timeout: seconds("review-timeout", self.review_timeout, 0.01, 30.0)?,
            cert_poll: seconds("cert-poll-interval", self.cert_poll_interval, 0.05, 3600.0)?,
            shutdown_delay: seconds("shutdown-delay", self.shutdown_delay, 0.0, 300.0)?,
            shutdown_timeout: seconds("shutdown-timeout", self.shutdown_timeout, 0.0, 300.0)?,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Certificates

/// The certificate pair as read from disk, to notice changes.
#[derive(PartialEq, Eq)]
struct PemFiles {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn read_capped(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(MAX_PEM + 1).read_to_end(&mut buf).with_context(|| format!("reading {}", path.display()))?;
    if buf.len() as u64 > MAX_PEM {
        bail!("{} is larger than {MAX_PEM} bytes", path.display());
    }
    Ok(buf)
}

impl PemFiles {
    fn read(cert: &Path, key: &Path) -> Result<PemFiles> {
        Ok(PemFiles { cert: read_capped(cert)?, key: read_capped(key)? })
    }

    /// The certified key, checking that the key belongs to the first certificate.
    fn certified_key(&self, provider: &rustls::crypto::CryptoProvider) -> Result<CertifiedKey> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
            .context("parsing the certificate PEM")?;
        if chain.is_empty() {
            bail!("the certificate file holds no CERTIFICATE block");
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| anyhow::anyhow!("{e:?}"))
            .context("parsing the private key PEM")?;
        CertifiedKey::from_der(chain, key, provider).context("the private key does not match the certificate")
    }
}

/// Serves the current certificate pair; [`CertStore::reload`] swaps it.
#[derive(Debug)]
struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    fn load(cert_path: &Path, key_path: &Path, provider: Arc<rustls::crypto::CryptoProvider>) -> Result<CertStore> {
        let files = PemFiles::read(cert_path, key_path)?;
        let ck = files
            .certified_key(&provider)
            .with_context(|| format!("loading the TLS pair {} / {}", cert_path.display(), key_path.display()))?;
        Ok(CertStore {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(ck)),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn set(&self, ck: CertifiedKey) {
        match self.current.write() {
            Ok(mut g) => *g = Arc::new(ck),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(ck),
        }
    }

    /// Re-reads the files every `every`; swaps the pair in when their content changed and
    /// they form a valid pair (a half-written rotation is retried on the next tick).
    async fn watch(self: Arc<Self>, every: Duration) {
        let mut last = PemFiles::read(&self.cert_path, &self.key_path).ok();
        let mut last_error = String::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let store = Arc::clone(&self);
            let read = tokio::task::spawn_blocking(move || PemFiles::read(&store.cert_path, &store.key_path)).await;
            let files = match read {
                Ok(Ok(f)) => f,
                Ok(Err(e)) => {
                    let msg = format!("{e:#}");
                    if msg != last_error {
                        tracing::warn!(error = %msg, "cannot read the TLS pair; serving the previous one");
                        last_error = msg;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "certificate reload task failed");
                    continue;
                }
            };
            if last.as_ref() == Some(&files) {
                continue;
            }
            match files.certified_key(&self.provider) {
                Ok(ck) => {
                    self.set(ck);
                    tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded");
                    last = Some(files);
                    last_error.clear();
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    if msg != last_error {
                        tracing::warn!(error = %msg, "the changed TLS pair is not usable (yet); serving the previous one");
                        last_error = msg;
                    }
                }
            }
        }
    }
}

/// rustls asks for the certificate on every handshake: the current one is served.
#[derive(Debug)]
struct Resolver(Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

// ---------------------------------------------------------------------------------------
// AdmissionReview (admission.k8s.io/v1). The envelope is not part of the OpenAPI spec
// (so not in k8s-openapi); the objects in it (ConfigMap, Status) are k8s-openapi types.

/// The parts of an AdmissionReview request the webhook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<RequestIn>,
}

/// `{group, version, kind}` of the object under review.
#[derive(Debug, Deserialize)]
struct Gvk {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

/// The parts of `AdmissionRequest` the webhook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn {
    uid: String,
    kind: Gvk,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    operation: String,
    #[serde(default)]
    object: Option<serde_json::Value>,
    #[serde(default)]
    dry_run: Option<bool>,
}

/// The review sent back.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut,
}

/// `AdmissionResponse`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut {
    uid: String,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// What the webhook decided about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed, with warnings.
    Allow(Vec<String>),
    /// Denied: HTTP-style code, reason, message.
    Deny {
        /// 422 for an invalid ConfigMap, 500 when the policy failed.
        code: i32,
        /// `Invalid` or `InternalError`.
        reason: &'static str,
        /// Every problem, one per line.
        message: String,
    },
}

impl Decision {
    fn into_response(self, uid: String) -> ResponseOut {
        match self {
            Decision::Allow(warnings) => ResponseOut { uid, allowed: true, status: None, warnings },
            Decision::Deny { code, reason, message } => ResponseOut {
                uid,
                allowed: false,
                status: Some(Status {
                    code: Some(code),
                    message: Some(message),
                    reason: Some(reason.to_string()),
                    status: Some("Failure".to_string()),
                    ..Status::default()
                }),
                warnings: Vec::new(),
            },
        }
    }

    fn invalid(message: String) -> Decision {
        Decision::Deny { code: 422, reason: "Invalid", message }
    }

    fn internal(message: String) -> Decision {
        Decision::Deny { code: 500, reason: "InternalError", message }
    }
}

/// A request the webhook cannot answer with a review (HTTP 400).
#[derive(Debug)]
struct BadRequest(String);

// ---------------------------------------------------------------------------------------
// Decisions

/// Everything a review needs.
struct Shared {
    policy: Arc<Policy>,
    policy_slots: Arc<Semaphore>,
    limits: Limits,
    ready: AtomicBool,
}

/// Which request runs the policy.
enum Target {
    /// Not the ConfigMap (or not an operation that changes it): allowed untouched.
    Other,
    /// DELETE of the ConfigMap.
    Delete,
    /// CREATE/UPDATE of the ConfigMap, with its object.
    Write(Box<ConfigMap>),
}

fn classify(req: &RequestIn) -> Result<Target, BadRequest> {
    let is_configmap = req.kind.group.is_empty()
        && req.kind.kind == "ConfigMap"
        && req.sub_resource.as_deref().unwrap_or_default().is_empty();
    if !is_configmap {
        return Ok(Target::Other);
    }
    let object_name = req.object.as_ref().and_then(|o| o.pointer("/metadata/name")).and_then(|n| n.as_str());
    let name = req.name.as_deref().filter(|n| !n.is_empty()).or(object_name);
    if name != Some(CONFIGMAP_NAME) {
        return Ok(Target::Other);
    }
    match req.operation.as_str() {
        "DELETE" => Ok(Target::Delete),
        "CREATE" | "UPDATE" => {
            let Some(object) = req.object.clone() else {
                return Err(BadRequest(format!("{} of ConfigMap {CONFIGMAP_NAME} without an object", req.operation)));
            };
            let cm: ConfigMap = serde_json::from_value(object)
                .map_err(|e| BadRequest(format!("the object is not a valid ConfigMap: {e}")))?;
            Ok(Target::Write(Box::new(cm)))
        }
        _ => Ok(Target::Other),
    }
}

/// `binaryData` is never read by the runner; a key in both maps is ambiguous.
fn binary_data_violations(cm: &ConfigMap) -> Vec<Violation> {
    let data = cm.data.as_ref();
    let mut out = Vec::new();
    for key in cm.binary_data.iter().flat_map(|b| b.keys()) {
        if data.is_some_and(|d| d.contains_key(key)) {
            out.push(Violation {
                key: key.clone(),
                code: ViolationCode::Conflict,
                message: "is set in both data and binaryData; set it in data only".to_string(),
            });
        } else {
            out.push(Violation {
                key: format!("binaryData.{key}"),
                code: ViolationCode::NotAllowed,
                message: "kata-addons reads text values from data only; move the value to data".to_string(),
            });
        }
    }
    out
}

/// The ConfigMap's `data` through the same reader `preview --configmap` uses (so the
/// runner's limits on ConfigMap input apply here too).
fn configmap_input(cm: &ConfigMap) -> Result<Input> {
    let empty = BTreeMap::new();
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": CONFIGMAP_NAME },
        "data": cm.data.as_ref().unwrap_or(&empty),
    });
    let text = serde_json::to_string(&doc).context("serialising the ConfigMap data")?;
    let origin = format!("ConfigMap {}/{CONFIGMAP_NAME}", cm.metadata.namespace.as_deref().unwrap_or_default());
    if text.len() as u64 > configmap::MAX_BYTES {
        bail!("{origin} data is larger than the limit of {} bytes", configmap::MAX_BYTES);
    }
    let data = configmap::parse_configmap(&text).context("reading the ConfigMap data")?;
    configmap::check_counts(&origin, &data)?;
    Ok(Input::ConfigMap { origin, data })
}

/// Runs the policy for one ConfigMap on the blocking pool, within the review deadline.
async fn evaluate(shared: &Shared, cm: ConfigMap) -> Decision {
    let deadline = Instant::now() + shared.limits.review_timeout;
    let binary = binary_data_violations(&cm);
    let input = match configmap_input(&cm) {
        Ok(i) => i,
        Err(e) => return Decision::invalid(format!("invalid configuration: {e:#}")),
    };
    let permit = match tokio::time::timeout_at(deadline.into(), Arc::clone(&shared.policy_slots).acquire_owned()).await
    {
        Ok(Ok(p)) => p,
        Ok(Err(_)) => return Decision::internal("the webhook is shutting down".to_string()),
        Err(_) => {
            return Decision::internal(format!(
                "the kata-addons policy did not get to run within {:?} (webhook overloaded); retry",
                shared.limits.review_timeout
            ));
        }
    };
    let policy = Arc::clone(&shared.policy);
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        preview::compute(&policy, &input)
    });
    let result = match tokio::time::timeout_at(deadline.into(), task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Decision::internal(format!("the kata-addons policy evaluation failed: {e}")),
        Err(_) => {
            return Decision::internal(format!(
                "the kata-addons policy did not finish within {:?}; the ConfigMap was not checked",
                shared.limits.review_timeout
            ));
        }
    };
    match result {
        Ok(p) if binary.is_empty() => Decision::Allow(preview_warnings(&p)),
        Ok(_) => Decision::invalid(PolicyError::Rejected(binary).to_string()),
        Err(PolicyError::Rejected(v)) => Decision::invalid(PolicyError::Rejected([binary, v].concat()).to_string()),
        Err(e) => Decision::internal(format!("the kata-addons policy could not check the ConfigMap: {e}")),
    }
}

/// Decides one request.
async fn decide(shared: &Shared, req: &RequestIn) -> Result<Decision, BadRequest> {
    Ok(match classify(req)? {
        Target::Other => Decision::Allow(Vec::new()),
        Target::Delete => Decision::Allow(vec![warning(
            "kata-addons: nodes keep the installed addon; run the uninstall DaemonSet to remove it",
        )]),
        Target::Write(cm) => evaluate(shared, *cm).await,
    })
}

// ---------------------------------------------------------------------------------------
// Warnings

/// One warning as the API server accepts it: printable (control characters would make
/// it drop the warning), at most [`MAX_WARNING_CHARS`] characters (cut with `…`).
pub fn warning(text: &str) -> String {
    let clean: String = text.chars().map(|c| if c.is_control() { '\u{fffd}' } else { c }).collect();
    if clean.chars().count() <= MAX_WARNING_CHARS {
        return clean;
    }
    let mut out: String = clean.chars().take(MAX_WARNING_CHARS - 1).collect();
    out.push('…');
    out
}

/// The Kata runtime a provider selects, named without a node path (the path depends on
/// each node's Kata layout).
fn runtime_name(p: Provider) -> &'static str {
    match p {
        Provider::Se => "the Kata runtime for IBM Secure Execution",
        Provider::Tdx => "the Kata runtime for Intel TDX",
        Provider::Snp => "the Kata runtime for AMD SEV-SNP",
    }
}

/// `key = value` lines of a TOML table, dotted, in document order of the serializer.
fn toml_assignments(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
    for (k, v) in table {
        let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(t) => toml_assignments(&name, t, out),
            other => out.push(format!("{name} = {other}")),
        }
    }
}

/// The preview as admission warnings: image, provider and runtime, version, each file,
/// and each key the drop-in sets. Unique, printable, cut to the API server's limits.
pub fn preview_warnings(p: &Preview) -> Vec<String> {
    let plan = &p.plan;
    let mut lines = vec![
        format!("kata-addons: image {}", plan.image),
        format!(
            "kata-addons: provider {}: {} boots it (drop-in in [{}])",
            preview::provider_name(plan.provider),
            runtime_name(plan.provider),
            plan.hypervisor_table
        ),
        format!("kata-addons: version {}", plan.version),
    ];
    for a in &plan.artifacts {
        let sha = a.sha256.as_deref().map(|s| format!(", sha256 {s}")).unwrap_or_default();
        lines.push(format!("kata-addons: {} {} from the image{sha}", preview::kind_name(a.kind), a.source));
    }
    let mut sets = Vec::new();
    // Every runtime configuration gets the same text: the first one shows what is set.
    if let Some(Ok(table)) = p.drop_ins.first().map(|d| toml::from_str::<toml::Table>(&d.contents)) {
        toml_assignments("", &table, &mut sets);
    }
    for s in sets {
        lines.push(format!("kata-addons: drop-in sets {s}"));
    }
    if crate::layout::pinned_digest(plan).is_none() {
        lines.push(format!(
            "kata-addons: {} = first 12 hex digits of the manifest digest, known after the pull",
            crate::layout::UNKNOWN_DIGEST
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for l in lines.iter().map(|l| warning(l)) {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    if out.len() > MAX_WARNINGS {
        let more = out.len() - (MAX_WARNINGS - 1);
        out.truncate(MAX_WARNINGS - 1);
        out.push(format!("kata-addons: … and {more} more (run `kata-addons preview` for all)"));
    }
    out
}

// ---------------------------------------------------------------------------------------
// HTTP

type Body = Full<Bytes>;

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

fn bad_request(status: StatusCode, peer: SocketAddr, msg: String) -> Response<Body> {
    tracing::warn!(%peer, status = status.as_u16(), error = %msg, "refused an admission request");
    text(status, format!("{msg}\n"))
}

/// Reads the body with the 3 MiB cap and the I/O deadline.
async fn read_body(req: Request<Incoming>) -> Result<Bytes, (StatusCode, String)> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err((StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {MAX_BODY} bytes")));
    }
    let body = Limited::new(req.into_body(), MAX_BODY);
    match tokio::time::timeout(IO_TIMEOUT, body.collect()).await {
        Err(_) => Err((StatusCode::REQUEST_TIMEOUT, "request body not received in time".to_string())),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err((StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {MAX_BODY} bytes")))
        }
        Ok(Err(e)) => Err((StatusCode::BAD_REQUEST, format!("reading the request body: {e}"))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

async fn validate(shared: &Shared, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let started = Instant::now();
    let body = match read_body(req).await {
        Ok(b) => b,
        Err((status, msg)) => return bad_request(status, peer, msg),
    };
    let review: ReviewIn = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(StatusCode::BAD_REQUEST, peer, format!("not an AdmissionReview: {e}")),
    };
    if review.api_version != REVIEW_API_VERSION || review.kind != "AdmissionReview" {
        return bad_request(
            StatusCode::BAD_REQUEST,
            peer,
            format!(
                "expected apiVersion {REVIEW_API_VERSION} kind AdmissionReview, got apiVersion {:?} kind {:?}",
                review.api_version, review.kind
            ),
        );
    }
    let Some(request) = review.request else {
        return bad_request(StatusCode::BAD_REQUEST, peer, "the AdmissionReview has no request".to_string());
    };
    let decision = match decide(shared, &request).await {
        Ok(d) => d,
        Err(BadRequest(msg)) => return bad_request(StatusCode::BAD_REQUEST, peer, msg),
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
    let out = ReviewOut {
        api_version: REVIEW_API_VERSION,
        kind: "AdmissionReview",
        response: decision.into_response(request.uid),
    };
    match serde_json::to_vec(&out) {
        Ok(b) => json(b),
        Err(e) => {
            tracing::error!(error = %e, "serialising the AdmissionReview response");
            text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
        }
    }
}

async fn route(shared: Arc<Shared>, req: Request<Incoming>, peer: SocketAddr) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    let get = matches!(*req.method(), Method::GET | Method::HEAD);
    Ok(match path {
        "/validate" if req.method() == Method::POST => validate(&shared, req, peer).await,
        "/healthz" if get => text(StatusCode::OK, "ok\n"),
        "/readyz" if get => {
            if shared.ready.load(Ordering::Acquire) {
                text(StatusCode::OK, "ok\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            }
        }
        "/validate" | "/healthz" | "/readyz" => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
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

/// Serves until SIGTERM/SIGINT, then finishes in-flight requests and returns.
pub async fn serve(args: &WebhookArgs, policy: Policy) -> Result<()> {
    let limits = args.limits()?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs = Arc::new(CertStore::load(&args.tls_cert, &args.tls_key, Arc::clone(&provider))?);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(Arc::clone(&certs))));
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let stop = shutdown_signal()?;
    let listener = TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let local = listener.local_addr().context("listener address")?;
    let shared = Arc::new(Shared {
        policy: Arc::new(policy),
        policy_slots: Arc::new(Semaphore::new(args.concurrency)),
        limits,
        ready: AtomicBool::new(true),
    });
    let reloader = tokio::spawn(Arc::clone(&certs).watch(limits.cert_poll));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(IO_TIMEOUT);
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(64);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tracing::info!(listen = %local, policy = %shared.policy.sha256(), concurrency = args.concurrency, "webhook serving");
    tokio::pin!(stop);
    let mut stop_at: Option<tokio::time::Instant> = None;
    loop {
        let delay_over = async {
            match stop_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            sig = &mut stop, if stop_at.is_none() => {
                shared.ready.store(false, Ordering::Release);
                tracing::info!(signal = sig, delay = ?limits.shutdown_delay, "shutting down: readiness off, finishing in-flight requests");
                stop_at = Some(tokio::time::Instant::now() + limits.shutdown_delay);
            }
            _ = delay_over => break,
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = Arc::clone(&connections).try_acquire_owned() else {
                    tracing::warn!(%peer, "too many connections; closing this one");
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, builder, shared, watcher) =
                    (acceptor.clone(), Arc::clone(&builder), Arc::clone(&shared), graceful.watcher());
                tokio::spawn(async move {
                    let _slot = slot;
                    let tls = match tokio::time::timeout(IO_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => { tracing::debug!(%peer, error = %e, "TLS handshake failed"); return; }
                        Err(_) => { tracing::debug!(%peer, "TLS handshake timed out"); return; }
                    };
                    let service = hyper::service::service_fn(move |req| route(Arc::clone(&shared), req, peer));
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    reloader.abort();
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed; exiting"),
        _ = tokio::time::sleep(limits.shutdown_timeout) => {
            tracing::warn!(timeout = ?limits.shutdown_timeout, "in-flight requests did not finish in time; exiting");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_cut_and_printable() {
        let w = warning(&format!("a\nb{}", "x".repeat(300)));
        assert_eq!(w.chars().count(), MAX_WARNING_CHARS);
        assert!(!w.chars().any(char::is_control));
        assert!(w.ends_with('…'));
        assert_eq!(warning("short"), "short");
    }

    #[test]
    fn binary_data_is_named() {
        let cm = ConfigMap {
            data: Some([("kernelPath".to_string(), "/k".to_string())].into()),
            binary_data: Some(
                [
                    ("kernelPath".to_string(), k8s_openapi::ByteString(vec![1])),
                    ("blob".to_string(), k8s_openapi::ByteString(vec![2])),
                ]
                .into(),
            ),
            ..ConfigMap::default()
        };
        let v = binary_data_violations(&cm);
        let keys: Vec<&str> = v.iter().map(|v| v.key.as_str()).collect();
        assert_eq!(keys, ["binaryData.blob", "kernelPath"]);
    }
}
