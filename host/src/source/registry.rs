//! Registry access over one [`Session`] per endpoint (TLS per certs.d, auth flows):
//! manifests (with a size cap) and layer blobs (streamed, resumed with `Range` on transient
//! failures) through our own reqwest client, which sees status codes and `Retry-After`.

use std::sync::Arc;

use anyhow::{Result, anyhow, bail};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

use super::auth::AuthLookup;
use super::certs::HostTls;
use super::endpoints::Endpoint;
use super::http;
use super::image::{Descriptor, MAX_MANIFEST_SIZE, ResolvedImage};
use super::manifest::{self, Parsed};
use super::options::RegistryOptions;
use super::retry::{
    Failure, RateFloor, RetryBudget, STALL_RETRIES, classify_body, status_failure, timed_out, with_retry,
};
use super::session::Session;

/// What one manifest GET returned.
struct ManifestResponse {
    /// The manifest bytes (at most the cap asked for).
    body: Vec<u8>,
    /// `Content-Type` header.
    content_type: Option<String>,
    /// `Docker-Content-Digest` header.
    header_digest: Option<String>,
}

/// One registry endpoint (source or mirror) with an authenticated session.
pub(crate) struct RegistryClient {
    session: Arc<Session>,
    opts: RegistryOptions,
}

impl RegistryClient {
    /// Name for messages: `host/repository`.
    pub(crate) fn name(&self) -> String {
        self.session.name()
    }

    /// The endpoint this client talks to (trust checks fetch signatures from it).
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.session.endpoint
    }

    /// Connects to `endpoint` with its TLS material and credentials and authenticates
    /// (pull scope); retries of every request made through this client are taken from `budget`.
    pub(crate) async fn connect(
        opts: &RegistryOptions,
        endpoint: &Endpoint,
        tls: &HostTls,
        auth: AuthLookup,
        budget: Arc<RetryBudget>,
    ) -> Result<Self> {
        let session = Session::connect(opts, endpoint, tls, auth, budget).await?;
        Ok(RegistryClient { session: Arc::new(session), opts: opts.clone() })
    }

    /// Fetches a manifest by tag or digest (capped at [`MAX_MANIFEST_SIZE`], digest-checked when
    /// `expect` is given): body, its digest, and the `Content-Type`.
    pub(crate) async fn get_manifest(
        &self,
        reference: &str,
        expect: Option<&str>,
    ) -> Result<(Vec<u8>, String, Option<String>)> {
        let name = self.name();
        let ManifestResponse { body, content_type, header_digest } = self
            .get_manifest_body(reference, MAX_MANIFEST_SIZE, false)
            .await?
            .ok_or_else(|| anyhow!("registry {name}: manifest {reference}: manifest unknown (HTTP 404)"))?;
        let digest = crate::hash::sha256_digest(&body);
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
    pub(crate) async fn resolve(&self, tag: Option<&str>, digest: Option<&str>) -> Result<ResolvedImage> {
        let origin = format!("registry {}", self.name());
        let first = digest.or(tag).unwrap_or("latest").to_string();
        let (mut body, mut dgst, mut ct) = self.get_manifest(&first, digest).await?;
        let top_digest = dgst.clone();
        for _ in 0..4 {
            let what = format!("{origin} ({first})");
            match manifest::parse(&body, ct.as_deref(), &self.opts.platform, &what)? {
                Parsed::Manifest(layers, artifact) => {
                    return Ok(ResolvedImage { manifest_digest: dgst, top_digest, layers, artifact, origin });
                }
                Parsed::Index(d) => {
                    if d.size > MAX_MANIFEST_SIZE {
                        bail!("{origin}: manifest {} is {} bytes, more than the limit", d.digest, d.size);
                    }
                    (body, dgst, ct) = self.get_manifest(&d.digest, Some(&d.digest)).await?;
                    if body.len() as u64 != d.size {
                        bail!("{origin}: manifest {} is {} bytes, the index says {}", d.digest, body.len(), d.size);
                    }
                }
            }
        }
        bail!("{origin}: image indexes nested too deeply")
    }

    /// The HTTP client of this endpoint (its TLS settings), for lookaside signature servers.
    pub(crate) fn http_client(&self) -> &reqwest::Client {
        self.session.http()
    }

    /// Fetches a manifest by tag when it exists (`None` on HTTP 404), at most `cap` bytes:
    /// sigstore attachments (`sha256-<hex>.sig`).
    pub(crate) async fn optional_manifest(&self, tag: &str, cap: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.get_manifest_body(tag, cap, true).await?.map(|r| r.body))
    }

    /// One manifest GET, retried within the budget: at most `cap` bytes; HTTP 404 is `None`
    /// when `missing_ok`, else an error like every other non-transient status.
    async fn get_manifest_body(&self, reference: &str, cap: u64, missing_ok: bool) -> Result<Option<ManifestResponse>> {
        let url = self.session.url(&format!("manifests/{reference}"));
        let what = format!("registry {}: manifest {reference}", self.name());
        with_retry(self.session.retries(), self.opts.timeout, &what, || async {
            let rb = self.session.get(&url).header(reqwest::header::ACCEPT, manifest::ACCEPTED.join(", "));
            let resp = http::send(rb, "manifest").await?;
            let status = resp.status();
            match status.as_u16() {
                200 => {}
                404 if missing_ok => return Ok(None),
                401 => return Err(Failure::Fatal(self.session.unauthorized())),
                403 => return Err(Failure::Fatal(anyhow!("access denied (HTTP 403)"))),
                404 => return Err(Failure::Fatal(anyhow!("manifest unknown (HTTP 404)"))),
                _ => return Err(Failure::Fatal(anyhow!("unexpected HTTP {status}"))),
            }
            let header = |h: &str| resp.headers().get(h).and_then(|v| v.to_str().ok()).map(str::to_string);
            let (content_type, header_digest) = (header("content-type"), header("docker-content-digest"));
            let body = http::read_capped(resp, cap, "manifest").await?;
            Ok(Some(ManifestResponse { body, content_type, header_digest }))
        })
        .await
    }

    /// Reads a small blob whole (at most `cap` bytes), checking its size and digest.
    pub(crate) async fn read_small_blob(self: &Arc<Self>, desc: &Descriptor, cap: u64) -> Result<Vec<u8>> {
        if desc.size > cap {
            bail!("blob {} is {} bytes, more than the {cap} byte limit", desc.digest, desc.size);
        }
        let mut blob = self.open_blob(desc);
        let mut body = Vec::new();
        while let Some(chunk) = blob.next_chunk().await? {
            if body.len() as u64 + chunk.len() as u64 > desc.size {
                bail!("blob {} is larger than its descriptor says", desc.digest);
            }
            body.extend_from_slice(&chunk);
        }
        if crate::hash::sha256_digest(&body) != desc.digest {
            bail!("blob {} does not match its digest", desc.digest);
        }
        Ok(body)
    }

    /// Opens a layer blob for streaming.
    pub(crate) fn open_blob(self: &Arc<Self>, desc: &Descriptor) -> RegistryBlob {
        self.open_blob_at(desc, 0)
    }

    /// Opens a layer blob for streaming from byte `offset` on (another host took the rest).
    pub(crate) fn open_blob_at(self: &Arc<Self>, desc: &Descriptor, offset: u64) -> RegistryBlob {
        RegistryBlob {
            url: self.session.url(&format!("blobs/{}", desc.digest)),
            client: self.clone(),
            digest: desc.digest.clone(),
            offset,
            skip: 0,
            stream: None,
            failures: 0,
            stalls: 0,
            rate: None,
        }
    }
}

/// The first byte of a `Content-Range: bytes FIRST-LAST/LENGTH` header.
fn content_range_start(h: Option<&str>) -> Option<u64> {
    let (first, _) = h?.trim().strip_prefix("bytes ")?.split_once('-')?;
    first.trim().parse().ok()
}

/// A layer blob streamed from a registry; reconnects with a `Range` request after
/// transient failures (the caller's hash covers every byte exactly once).
pub(crate) struct RegistryBlob {
    client: Arc<RegistryClient>,
    url: String,
    digest: String,
    offset: u64,
    skip: u64,
    stream: Option<futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>>,
    failures: u32,
    /// Stalls and runs below the minimum rate so far ([`STALL_RETRIES`]).
    stalls: u32,
    /// The minimum rate of the current response.
    rate: Option<RateFloor>,
}

impl RegistryBlob {
    fn what(&self) -> String {
        format!("registry {}: blob {}", self.client.name(), self.digest)
    }

    async fn reopen(&mut self) -> std::result::Result<(), Failure> {
        let session = &self.client.session;
        let mut reauthenticated = false;
        let resp = loop {
            let mut req = session.get(&self.url);
            if self.offset > 0 {
                req = req.header(reqwest::header::RANGE, format!("bytes={}-", self.offset));
            }
            let resp = http::send(req, "blob").await?;
            if resp.status().as_u16() == 401 && !reauthenticated {
                // An expired token: ask for a new one, once.
                reauthenticated = session.reauthenticate().await.map_err(Failure::Fatal)?;
                if reauthenticated {
                    continue;
                }
            }
            break resp;
        };
        let status = resp.status();
        match status.as_u16() {
            200 => self.skip = self.offset, // Range ignored: skip what was already consumed.
            206 if self.offset > 0 => {
                // The body must start where we asked; anything else would shift every byte.
                let range = resp.headers().get(reqwest::header::CONTENT_RANGE).and_then(|v| v.to_str().ok());
                if content_range_start(range) != Some(self.offset) {
                    return Err(Failure::Fatal(anyhow!(
                        "asked for bytes from {} (Range), the registry answered 206 with Content-Range {}",
                        self.offset,
                        range.unwrap_or("(none)")
                    )));
                }
                self.skip = 0;
            }
            401 => return Err(Failure::Fatal(session.unauthorized())),
            403 => return Err(Failure::Fatal(anyhow!("access denied (HTTP 403)"))),
            404 => return Err(Failure::Fatal(anyhow!("blob unknown (HTTP 404)"))),
            _ => return Err(status_failure(status, resp.headers(), anyhow!("HTTP {status}"))),
        }
        self.stream = Some(resp.bytes_stream().boxed());
        self.rate = Some(RateFloor::new(self.client.opts.timeout));
        Ok(())
    }

    /// The next chunk of the blob, or `None` at its end.
    pub(crate) async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        let timeout = self.client.opts.timeout;
        loop {
            let mut stalled = false;
            let step: std::result::Result<Option<Bytes>, Failure> = async {
                if self.stream.is_none() {
                    match tokio::time::timeout(timeout, self.reopen()).await {
                        Ok(r) => r?,
                        Err(_) => {
                            stalled = true;
                            return Err(Failure::transient(timed_out(timeout)));
                        }
                    }
                }
                let Some(stream) = self.stream.as_mut() else {
                    return Err(Failure::Fatal(anyhow!("internal: no stream")));
                };
                match tokio::time::timeout(timeout, stream.next()).await {
                    Err(_) => {
                        stalled = true;
                        Err(Failure::transient(timed_out(timeout)))
                    }
                    Ok(None) => Ok(None),
                    Ok(Some(Err(e))) => {
                        stalled = e.is_timeout();
                        Err(classify_body(e))
                    }
                    Ok(Some(Ok(mut b))) => {
                        if let Some(rate) = self.rate.as_mut()
                            && let Err(e) = rate.add(b.len())
                        {
                            stalled = true;
                            return Err(Failure::transient(e));
                        }
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
                Err(Failure::Transient(e, ra)) => {
                    self.failures += 1;
                    self.stream = None;
                    let what = format!("{} at byte {}", self.what(), self.offset);
                    self.stalls += u32::from(stalled);
                    if self.stalls > STALL_RETRIES {
                        return Err(
                            e.context(format!("{what}: giving up, it stalled or was too slow {} times", self.stalls))
                        );
                    }
                    if let Err(spent) = self.client.session.retries().wait(&what, self.failures, &e, ra).await {
                        return Err(e.context(format!("{what}: giving up, {spent}")));
                    }
                }
                Err(Failure::Fatal(e)) => {
                    return Err(e.context(format!("{} (at byte {})", self.what(), self.offset)));
                }
            }
        }
    }
}

impl super::Source for Arc<RegistryClient> {
    fn resolve<'a>(&'a self, tag: Option<&'a str>, digest: Option<&'a str>) -> BoxFuture<'a, Result<ResolvedImage>> {
        Box::pin(RegistryClient::resolve(self, tag, digest))
    }

    fn open<'a>(&'a self, desc: &'a Descriptor) -> BoxFuture<'a, Result<Box<dyn super::Blob>>> {
        let blob: Box<dyn super::Blob> = Box::new(self.open_blob(desc));
        Box::pin(std::future::ready(Ok(blob)))
    }
}

impl super::Blob for RegistryBlob {
    fn next_chunk(&mut self) -> BoxFuture<'_, Result<Option<Bytes>>> {
        Box::pin(RegistryBlob::next_chunk(self))
    }
}

#[cfg(test)]
mod tests {
    use super::content_range_start;

    #[test]
    fn content_range_start_parses_the_first_byte() {
        assert_eq!(content_range_start(Some("bytes 100-199/200")), Some(100));
        assert_eq!(content_range_start(Some("bytes 0-0/*")), Some(0));
        assert_eq!(content_range_start(Some("bytes */200")), None);
        assert_eq!(content_range_start(Some("items 1-2/3")), None);
        assert_eq!(content_range_start(None), None);
    }
}
