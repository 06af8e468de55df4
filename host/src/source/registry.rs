//! Registry access over one [`Session`] per endpoint: manifests with a size cap, layer
//! blobs streamed with resume on transient failures.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use bytes::Bytes;
use futures_util::StreamExt;
use super::auth::AuthLookup;
use super::certs::HostTls;
use super::endpoints::Endpoint;
use super::manifest::{self, Parsed};
use super::session::Session;
use super::{Descriptor, MAX_MANIFEST_SIZE, RegistryOptions, ResolvedImage};

/// Whether a failure is worth retrying.
#[derive(Debug)]
pub enum Failure {
    /// Connection error, timeout, 5xx, 429.
    Transient(anyhow::Error),
    /// Anything else.
    Fatal(anyhow::Error),
}

impl Failure {
    fn into_inner(self) -> anyhow::Error {
        match self {
            Failure::Transient(e) | Failure::Fatal(e) => e,
        }
    }
}

const TIMED_OUT: &str = "timed out: no response or progress from the registry";

/// Classifies a transport error (connect, timeout, body) as transient, others as fatal.
pub fn classify_reqwest(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        return Failure::Transient(anyhow::Error::new(e).context(TIMED_OUT));
    }
    if e.is_connect() || e.is_timeout() || e.is_request() || e.is_body() || e.is_decode() {
        Failure::Transient(anyhow::Error::new(e))
    } else {
        Failure::Fatal(anyhow::Error::new(e))
    }
}

fn classify_io(e: std::io::Error) -> Failure {
    if let Some(r) = e.get_ref().and_then(|inner| inner.downcast_ref::<reqwest::Error>())
        && r.is_timeout()
    {
        return Failure::Transient(anyhow::Error::new(e).context(TIMED_OUT));
    }
    let transient = e.get_ref().and_then(|inner| inner.downcast_ref::<reqwest::Error>()).is_some()
        || matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::TimedOut
        );
    if transient { Failure::Transient(anyhow::Error::new(e)) } else { Failure::Fatal(anyhow::Error::new(e)) }
}

/// Runs `f` with a per-attempt timeout, retrying transient failures with exponential backoff.
pub async fn with_retry<T, F, Fut>(opts: &RegistryOptions, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, Failure>>,
{
    let mut delay = opts.backoff;
    let mut attempt = 1;
    loop {
        let res = match tokio::time::timeout(opts.timeout, f()).await {
            Ok(r) => r,
            Err(_) => {
                Err(Failure::Transient(anyhow!("timed out: no response within {} s", opts.timeout.as_secs_f64())))
            }
        };
        match res {
            Ok(v) => return Ok(v),
            Err(Failure::Transient(e)) if attempt < opts.attempts => {
                tracing::warn!("{what}: attempt {attempt} failed, retrying in {delay:?}: {e:#}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
                attempt += 1;
            }
            Err(Failure::Transient(e)) => {
                return Err(e.context(format!("{what}: gave up after {attempt} attempts")));
            }
            Err(Failure::Fatal(e)) => return Err(e.context(what.to_string())),
        }
    }
}

/// One registry endpoint (source or mirror) with an authenticated session.
pub struct RegistryClient {
    session: Arc<Session>,
    opts: RegistryOptions,
}

impl RegistryClient {
    /// Name for messages: `host/repository`.
    pub fn name(&self) -> String {
        self.session.name()
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.session.endpoint
    }

    /// Connects to `endpoint` with its TLS material and credentials, and authenticates (pull scope).
    pub async fn connect(opts: &RegistryOptions, endpoint: &Endpoint, tls: &HostTls, auth: AuthLookup) -> Result<Self> {
        let session = Session::connect(opts, endpoint, tls, auth).await?;
        Ok(RegistryClient { session: Arc::new(session), opts: opts.clone() })
    }

    /// Fetches a manifest by tag or digest (capped at [`MAX_MANIFEST_SIZE`], digest-checked when
    /// `expect` is given): body, its digest, and the `Content-Type`.
    pub async fn get_manifest(&self, reference: &str, expect: Option<&str>) -> Result<(Vec<u8>, String, Option<String>)> {
        self.fetch_manifest(reference, expect).await
    }

    /// Fetches one manifest (by tag or digest), capped and digest-checked.
    async fn fetch_manifest(&self, reference: &str, expect: Option<&str>) -> Result<(Vec<u8>, String, Option<String>)> {
        let url = self.session.url(&format!("manifests/{reference}"));
        let name = self.name();
        let what = format!("registry {name}: manifest {reference}");
        let (body, content_type, header_digest) = with_retry(&self.opts, &what, || async {
            let resp = self
                .session
                .get(&url)
                .header(reqwest::header::ACCEPT, manifest::ACCEPTED.join(", "))
                .send()
                .await
                .map_err(classify_reqwest)?;
            let status = resp.status();
            if status.is_server_error() || status.as_u16() == 429 {
                return Err(Failure::Transient(anyhow!("HTTP {status}")));
            }
            match status.as_u16() {
                200 => {}
                401 => return Err(Failure::Fatal(self.session.unauthorized())),
                403 => return Err(Failure::Fatal(anyhow!("access denied (HTTP 403)"))),
                404 => return Err(Failure::Fatal(anyhow!("manifest unknown (HTTP 404)"))),
                _ => return Err(Failure::Fatal(anyhow!("unexpected HTTP {status}"))),
            }
            if let Some(len) = resp.content_length()
                && len > MAX_MANIFEST_SIZE
            {
                return Err(Failure::Fatal(anyhow!(
                    "manifest is {len} bytes, more than the {MAX_MANIFEST_SIZE} byte limit"
                )));
            }
            let ct =
                resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
            let hd = resp.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).map(str::to_string);
            let mut body = Vec::new();
            let mut stream = resp.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(classify_reqwest)?;
                if body.len() as u64 + chunk.len() as u64 > MAX_MANIFEST_SIZE {
                    return Err(Failure::Fatal(anyhow!("manifest is larger than the {MAX_MANIFEST_SIZE} byte limit")));
                }
                body.extend_from_slice(&chunk);
            }
            Ok((body, ct, hd))
        })
        .await?;
        let digest = manifest::sha256_digest(&body);
        if let Some(want) = expect
            && want != digest
        {
            bail!("registry {name}: manifest digest mismatch: pinned {want}, received content hashes to {digest}");
        }
        if let Some(h) = &header_digest
            && h.starts_with("sha256:")
            && *h != digest
        {
            bail!(
                "registry {name}: manifest {reference}: Docker-Content-Digest {h} does not match the content ({digest})"
            );
        }
        Ok((body, digest, content_type))
    }

    /// Resolves a tag or digest to the platform manifest and its layers.
    pub async fn resolve(&self, tag: Option<&str>, digest: Option<&str>) -> Result<ResolvedImage> {
        let origin = format!("registry {}", self.name());
        let first = digest.or(tag).unwrap_or("latest").to_string();
        let (mut body, mut dgst, mut ct) = self.fetch_manifest(&first, digest).await?;
        for _ in 0..4 {
            let what = format!("{origin} ({first})");
            match manifest::parse(&body, ct.as_deref(), &self.opts.platform, &what)? {
                Parsed::Manifest(layers) => {
                    return Ok(ResolvedImage { manifest_digest: dgst, layers, origin, endpoint: Some(self.endpoint().clone()) });
                }
                Parsed::Index(d) => {
                    if d.size > MAX_MANIFEST_SIZE {
                        bail!("{origin}: manifest {} is {} bytes, more than the limit", d.digest, d.size);
                    }
                    (body, dgst, ct) = self.fetch_manifest(&d.digest, Some(&d.digest)).await?;
                    if body.len() as u64 != d.size {
                        bail!("{origin}: manifest {} is {} bytes, the index says {}", d.digest, body.len(), d.size);
                    }
                }
            }
        }
        bail!("{origin}: image indexes nested too deeply")
    }

    /// Opens a layer blob for streaming.
    pub fn open_blob(&self, desc: &Descriptor) -> RegistryBlob {
        RegistryBlob {
            session: self.session.clone(),
            desc: desc.clone(),
            name: self.name(),
            opts: self.opts.clone(),
            offset: 0,
            skip: 0,
            stream: None,
            failures: 0,
        }
    }
}

/// A layer blob streamed from a registry; reconnects with a `Range` request after
/// transient failures (the caller's hash covers every byte exactly once).
pub struct RegistryBlob {
    session: Arc<Session>,
    desc: Descriptor,
    name: String,
    opts: RegistryOptions,
    offset: u64,
    skip: u64,
    stream: Option<futures_util::stream::BoxStream<'static, std::io::Result<Bytes>>>,
    failures: u32,
}

impl RegistryBlob {
    fn what(&self) -> String {
        format!("registry {}: blob {}", self.name, self.desc.digest)
    }

    async fn reopen(&mut self) -> std::result::Result<(), Failure> {
        let url = self.session.url(&format!("blobs/{}", self.desc.digest));
        let mut reauthenticated = false;
        let resp = loop {
            let mut rb = self.session.get(&url);
            if self.offset > 0 {
                rb = rb.header(reqwest::header::RANGE, format!("bytes={}-", self.offset));
            }
            let resp = rb.send().await.map_err(classify_reqwest)?;
            let status = resp.status().as_u16();
            if status == 401 && !reauthenticated {
                // An expired token: ask for a new one, once.
                reauthenticated = self.session.reauthenticate().await.map_err(Failure::Fatal)?;
                if reauthenticated {
                    continue;
                }
            }
            break resp;
        };
        let status = resp.status();
        if status.is_server_error() || matches!(status.as_u16(), 408 | 429) {
            return Err(Failure::Transient(anyhow!("HTTP {status}")));
        }
        match status.as_u16() {
            206 => self.skip = 0,
            // Range ignored: skip what was already consumed.
            200 => self.skip = self.offset,
            401 => return Err(Failure::Fatal(self.session.unauthorized())),
            403 => return Err(Failure::Fatal(anyhow!("access denied (HTTP 403)"))),
            404 => return Err(Failure::Fatal(anyhow!("blob unknown (HTTP 404)"))),
            _ => return Err(Failure::Fatal(anyhow!("unexpected HTTP {status}"))),
        }
        self.stream = Some(resp.bytes_stream().map(|r| r.map_err(std::io::Error::other)).boxed());
        Ok(())
    }

    /// The next chunk of the blob, or `None` at its end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        loop {
            let step: std::result::Result<Option<Bytes>, Failure> = async {
                if self.stream.is_none() {
                    match tokio::time::timeout(self.opts.timeout, self.reopen()).await {
                        Ok(r) => r?,
                        Err(_) => {
                            return Err(Failure::Transient(anyhow!(
                                "timed out: no response within {} s",
                                self.opts.timeout.as_secs_f64()
                            )));
                        }
                    }
                }
                let Some(stream) = self.stream.as_mut() else {
                    return Err(Failure::Fatal(anyhow!("internal: no stream")));
                };
                match tokio::time::timeout(self.opts.timeout, stream.next()).await {
                    Err(_) => Err(Failure::Transient(anyhow!(
                        "timed out: stalled, no data for {} s",
                        self.opts.timeout.as_secs_f64()
                    ))),
                    Ok(None) => Ok(None),
                    Ok(Some(Err(e))) => Err(classify_io(e)),
                    Ok(Some(Ok(mut b))) => {
                        if self.skip > 0 {
                            let n = (self.skip).min(b.len() as u64) as usize;
                            self.skip -= n as u64;
                            b = b.slice(n..);
                        }
                        self.offset += b.len() as u64;
                        Ok(Some(b))
                    }
                }
            }
            .await;
            match step {
                Ok(Some(b)) if b.is_empty() => continue,
                Ok(r) => return Ok(r),
                Err(Failure::Transient(e)) if self.failures + 1 < self.opts.attempts => {
                    self.failures += 1;
                    let delay = (self.opts.backoff * 2u32.pow(self.failures - 1)).min(Duration::from_secs(10));
                    tracing::warn!("{}: failed at byte {}, retrying in {delay:?}: {e:#}", self.what(), self.offset);
                    self.stream = None;
                    tokio::time::sleep(delay).await;
                }
                Err(f) => {
                    let e = f.into_inner();
                    return Err(e.context(format!("{} (at byte {})", self.what(), self.offset)));
                }
            }
        }
    }
}
