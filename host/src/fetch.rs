//! One pull of an image: resolve it over the registry endpoints (mirrors first), check the
//! trust policy on the digest actually resolved, then hand the layers to [`crate::extract`].
//!
//! A [`Pull`] is the unit: it keeps the authenticated clients (one per endpoint), the node
//! configuration, the retry budget, the manifests resolved and the trust decisions made, so
//! that resolving an image and then fetching its files connects, authenticates and reads
//! each manifest once, and a tag that moves in between cannot mix two images.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, anyhow, bail};
use cap_std::fs::Dir;

use crate::extract::{self, Limits, TempFiles, check_wanted_path};
use crate::source::containerd_pull::CtdSource;
use crate::source::endpoints::{Endpoint, NodeConfig};
use crate::source::layout::LayoutSource;
use crate::source::registry::RegistryClient;
use crate::source::retry::RetryBudget;
use crate::source::{ImageRef, RegistryOptions, ResolvedImage, Source};
use crate::state::TrustRecord;
use crate::trust::{self, TrustOptions};

pub use crate::extract::{FetchedFile, Wanted};

/// Everything a pull needs: how to reach registries, which trust policy admits an image,
/// and the caps on what its layers may make the runner do.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Registry access (node files, platform, timeout, retries, proxy).
    pub(crate) registry: RegistryOptions,
    /// Image trust policy files (policy.json, registries.d) beneath the node root.
    pub trust: TrustOptions,
    /// Extraction limits.
    pub limits: Limits,
}

impl PullOptions {
    /// Default registry access with these trust files and extraction limits: the way in for
    /// in-process callers (the fuzz tests) that read OCI layouts only.
    pub fn for_layouts(trust: TrustOptions, limits: Limits) -> PullOptions {
        PullOptions { registry: RegistryOptions::default(), trust, limits }
    }
}

/// An image resolved and admitted by the trust policy.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The platform manifest and its layers.
    pub image: ResolvedImage,
}

/// What a fetch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchReport {
    /// Digest of the platform manifest used (`sha256:…`).
    pub manifest_digest: String,
    /// Where the image came from (registry endpoint or layout).
    pub origin: String,
    /// The files, in the order asked.
    pub files: Vec<FetchedFile>,
    /// Digests of the layer blobs read (a layer read twice appears twice).
    pub layers_read: Vec<String>,
    /// Number of layers in the image.
    pub layer_count: usize,
    /// The trust decision that admitted the image.
    pub(crate) trust: TrustRecord,
}

/// One pull: connections and decisions kept across its steps (see the module comment).
pub struct Pull<'a> {
    opts: &'a PullOptions,
    clients: Mutex<HashMap<String, Arc<RegistryClient>>>,
    config: OnceLock<Arc<NodeConfig>>,
    budget: OnceLock<Arc<RetryBudget>>,
    /// Trust decisions already made, by origin and top digest.
    trusted: Mutex<HashMap<String, TrustRecord>>,
    /// Manifests already resolved, by endpoint and reference.
    resolved: Mutex<HashMap<String, ResolvedImage>>,
    /// Endpoints that failed, with the error: not contacted again during this pull (one
    /// install's resolve, trust and fetch passes).
    failed: Mutex<HashMap<String, String>>,
    /// When the pull must have ended (`--pull-deadline` after its first registry step).
    deadline: OnceLock<tokio::time::Instant>,
    /// containerd nodes: the hosts of each `registry/repository`, connected on first use.
    containerd: Mutex<HashMap<String, Arc<CtdSource>>>,
}

/// The key of an endpoint in [`Pull`]'s maps.
fn endpoint_key(ep: &Endpoint) -> String {
    format!("{}|{}|{}", ep.host, ep.repository, ep.insecure)
}

impl<'a> Pull<'a> {
    /// A pull with nothing connected yet.
    pub fn new(opts: &'a PullOptions) -> Self {
        Pull {
            opts,
            clients: Mutex::new(HashMap::new()),
            config: OnceLock::new(),
            budget: OnceLock::new(),
            trusted: Mutex::new(HashMap::new()),
            resolved: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            deadline: OnceLock::new(),
            containerd: Mutex::new(HashMap::new()),
        }
    }

    /// When the pull must have ended: `--pull-deadline` after the first registry step.
    fn deadline(&self) -> tokio::time::Instant {
        *self.deadline.get_or_init(|| tokio::time::Instant::now() + self.opts.registry.pull_deadline)
    }

    /// The error of `ep` if it already failed during this pull.
    fn failed(&self, ep: &Endpoint) -> Option<String> {
        self.failed.lock().ok().and_then(|m| m.get(&endpoint_key(ep)).cloned())
    }

    /// Remembers that `ep` failed with `e`.
    fn remember_failure(&self, ep: &Endpoint, e: &anyhow::Error) {
        if let Ok(mut m) = self.failed.lock() {
            m.entry(endpoint_key(ep)).or_insert_with(|| format!("{e:#}"));
        }
    }

    /// Admits or refuses `image` by the trust policy before anything is written: what the
    /// policy decides without signatures (a `reject`, an all-`insecureAcceptAnything` scope)
    /// is decided at once; a policy that needs signatures is checked on the digest resolved
    /// now (and kept for the rest of this pull).
    pub(crate) async fn admit(&self, image: &ImageRef) -> Result<()> {
        if let trust::Gate::NeedsSignatures = trust::gate(&self.opts.trust, image)? {
            self.resolve(image).await?;
        }
        Ok(())
    }

    /// Resolves an image to its platform manifest without reading layers, and checks the
    /// trust policy on it.
    pub(crate) async fn resolve(&self, image: &ImageRef) -> Result<Resolved> {
        let (image, _admitted) = self
            .over_endpoints(image, |_, r| async move { Ok(r) })
            .await
            .with_context(|| format!("resolving {image}"))?;
        Ok(Resolved { image })
    }

    /// Fetches the wanted files of `image` into `dest` (temporary name, fsync, rename; mode
    /// 0644), naming the destination `place` in messages (a refusal for lack of space
    /// names it: each file is checked against the free space when its tar header is read).
    pub async fn files(&self, image: &ImageRef, wanted: &[Wanted], dest: &Dir, place: &str) -> Result<FetchReport> {
        let paths = check_wanted(wanted)?;
        let limits = &self.opts.limits;
        let (extracted, trust) = self
            .over_endpoints(image, |source, resolved| {
                let paths = paths.clone();
                async move {
                    let temps = TempFiles::new(dest.try_clone().context("duplicate destination handle")?, place);
                    let res = extract::image::extract(limits, &*source, &resolved, &paths, wanted, &temps).await;
                    temps.cleanup();
                    Ok((res?, resolved))
                }
            })
            .await
            .with_context(|| format!("pulling {image}"))?;
        let (out, resolved) = extracted;
        Ok(FetchReport {
            manifest_digest: resolved.manifest_digest,
            origin: resolved.origin,
            files: out.files,
            layers_read: out.layers_read,
            layer_count: resolved.layers.len(),
            trust,
        })
    }

    /// The node configuration, read on first use.
    fn config(&self) -> Result<Arc<NodeConfig>> {
        if let Some(c) = self.config.get() {
            return Ok(c.clone());
        }
        let c = Arc::new(self.opts.registry.node.load()?);
        Ok(self.config.get_or_init(|| c).clone())
    }

    /// The retry budget of this pull.
    fn budget(&self) -> Arc<RetryBudget> {
        let opts = &self.opts.registry;
        let deadline = self.deadline();
        self.budget
            .get_or_init(|| Arc::new(RetryBudget::with_deadline(opts.retry.clone(), deadline, opts.pull_deadline)))
            .clone()
    }

    /// The containerd hosts of `registry/repository` (kept for the whole pull).
    fn containerd_source(&self, config: &Arc<NodeConfig>, registry: &str, repository: &str) -> Result<Arc<CtdSource>> {
        let key = format!("{registry}/{repository}");
        if let Some(s) = self.containerd.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(s);
        }
        let eps = config.endpoints(registry, repository, false)?;
        let src = Arc::new(CtdSource::new(eps, &self.opts.registry, config.clone(), self.budget())?);
        let why = config.containerd.as_ref().map(|c| c.why.as_str()).unwrap_or_default();
        tracing::info!("{key}: containerd hosts ({why}), in order: {}", src.describe_hosts().join(", "));
        if let Ok(mut m) = self.containerd.lock() {
            m.insert(key, src.clone());
        }
        Ok(src)
    }

    /// An authenticated client for `ep`, connecting on first use.
    async fn client(&self, ep: &Endpoint) -> Result<Arc<RegistryClient>> {
        let key = endpoint_key(ep);
        if let Some(c) = self.clients.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        if let Some(b) = &ep.blocked_by {
            bail!("{}: {b}", ep.describe());
        }
        let config = self.config()?;
        let tls = config.tls_for(ep)?;
        let auth = config.auth_for(ep)?;
        let opts = &self.opts.registry;
        let budget = self.budget();
        let client = Arc::new(RegistryClient::connect(opts, ep, &tls, auth, budget).await?);
        if let Ok(mut m) = self.clients.lock() {
            m.insert(key, client.clone());
        }
        Ok(client)
    }

    /// Resolves `tag`/`digest` through `client`, once per endpoint and reference.
    async fn resolve_at(
        &self,
        client: &RegistryClient,
        tag: Option<&str>,
        digest: Option<&str>,
    ) -> Result<ResolvedImage> {
        let ep = client.endpoint();
        let key = format!("{}|{}|{}|{tag:?}|{digest:?}", ep.host, ep.repository, ep.insecure);
        if let Some(r) = self.resolved.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(r);
        }
        let r = client.resolve(tag, digest).await?;
        if let Ok(mut m) = self.resolved.lock() {
            m.insert(key, r.clone());
        }
        Ok(r)
    }

    /// The trust decision on a resolved image, made before anything is read from it (once
    /// per origin and digest).
    async fn check_trust(
        &self,
        image: &ImageRef,
        resolved: &ResolvedImage,
        origin: trust::Origin<'_>,
    ) -> Result<TrustRecord> {
        let key = format!("{}|{}", resolved.origin, resolved.top_digest);
        if let Some(r) = self.trusted.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(r);
        }
        let record = trust::check(&self.opts.trust, image, &resolved.top_digest, origin).await?;
        if let Ok(mut m) = self.trusted.lock() {
            m.insert(key, record.clone());
        }
        Ok(record)
    }

    /// Tries each endpoint (mirrors first) until `f` succeeds on an image the trust policy
    /// admits; returns its result and that decision, or the primary's error. A refusal by
    /// the trust policy is final (the next mirror is not tried, as in containers/image).
    /// An endpoint that failed earlier in this pull is not contacted again, and when every
    /// one failed the error names each; everything ends by the pull deadline.
    async fn over_endpoints<T, F, Fut>(&self, image: &ImageRef, f: F) -> Result<(T, TrustRecord)>
    where
        F: FnMut(Box<dyn Source>, ResolvedImage) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        match tokio::time::timeout_at(self.deadline(), self.over_endpoints_once(image, f)).await {
            Ok(r) => r,
            Err(_) => Err(anyhow!(
                "{image}: the pull did not finish within the pull deadline of {} s (--pull-deadline)",
                self.opts.registry.pull_deadline.as_secs()
            )),
        }
    }

    async fn over_endpoints_once<T, F, Fut>(&self, image: &ImageRef, mut f: F) -> Result<(T, TrustRecord)>
    where
        F: FnMut(Box<dyn Source>, ResolvedImage) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        match image {
            ImageRef::Layout { path, tag } => {
                let source = LayoutSource { root: path.clone(), platform: self.opts.registry.platform.clone() };
                let resolved = source.resolve(tag.as_deref(), None).await?;
                let trust = self.check_trust(image, &resolved, trust::Origin::Layout).await?;
                Ok((f(Box::new(source), resolved).await?, trust))
            }
            ImageRef::Registry { registry, repository, tag, digest } => {
                let config = self.config()?;
                if config.containerd.is_some() {
                    let src = self.containerd_source(&config, registry, repository)?;
                    let (resolved, client) = src.resolve_image(tag.as_deref(), digest.as_deref()).await?;
                    let trust = self.check_trust(image, &resolved, trust::Origin::Registry(&client)).await?;
                    return Ok((f(Box::new(src), resolved).await?, trust));
                }
                let mut mirror_errors = Vec::new();
                for ep in config.endpoints(registry, repository, digest.is_some())? {
                    if let Some(d) = &ep.decided_by {
                        tracing::debug!("trying {} ({d})", ep.describe());
                    }
                    if let Some(e) = self.failed(&ep) {
                        let e = anyhow!("{} failed earlier in this pull, not contacted again: {e}", ep.describe());
                        if ep.mirror {
                            mirror_errors.push(format!("{e:#}"));
                            continue;
                        }
                        if mirror_errors.is_empty() {
                            return Err(e);
                        }
                        return Err(e.context(format!("mirrors also failed: {}", mirror_errors.join("; "))));
                    }
                    let attempt = async {
                        let client = self.client(&ep).await?;
                        let resolved = self.resolve_at(&client, tag.as_deref(), digest.as_deref()).await?;
                        let trust = self.check_trust(image, &resolved, trust::Origin::Registry(&client)).await?;
                        Ok::<_, anyhow::Error>((f(Box::new(client), resolved).await?, trust))
                    }
                    .await;
                    let refused = attempt.as_ref().err().is_some_and(|e| e.downcast_ref::<trust::Refused>().is_some());
                    if let Err(e) = &attempt
                        && !refused
                    {
                        self.remember_failure(&ep, e);
                    }
                    match attempt {
                        Ok(v) => return Ok(v),
                        Err(e) if ep.mirror && !refused => {
                            tracing::warn!("{} failed, trying the next endpoint: {e:#}", ep.describe());
                            mirror_errors.push(format!("{}: {e:#}", ep.describe()));
                        }
                        Err(e) if mirror_errors.is_empty() => return Err(e),
                        Err(e) => return Err(e.context(format!("mirrors also failed: {}", mirror_errors.join("; ")))),
                    }
                }
                Err(anyhow!("no registry endpoint for {image}"))
            }
        }
    }
}

/// The wanted paths, normalised, after checking every path and destination name.
fn check_wanted(wanted: &[Wanted]) -> Result<Vec<String>> {
    if wanted.is_empty() {
        bail!("nothing to fetch: no in-image path given");
    }
    let mut paths = Vec::new();
    let mut names = HashSet::new();
    for w in wanted {
        paths.push(check_wanted_path(&w.path)?);
        extract::check_dest_name(&w.dest_name)?;
        if !names.insert(&w.dest_name) {
            bail!("destination file name {:?} given twice", w.dest_name);
        }
    }
    Ok(paths)
}
