//! Fetch named files out of an image: resolve, stream layers top first, verify, write.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;

use crate::extract::layer::{self, Capture, Compression, LayerJob, Mode, TMP_PREFIX, TempFiles};
use crate::extract::{IndexBudget, LayerIndex, Resolution, View, check_wanted_path};
use crate::source::blobhash::BlobHasher;
use crate::source::endpoints::{Endpoint, NodeConfig};
use crate::source::registry::RegistryClient;
use crate::source::retry::RetryBudget;
use crate::source::{BlobReader, Descriptor, ImageRef, RegistryOptions, ResolvedImage, layout};

/// One file to take out of the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Absolute, normalised path inside the image.
    pub path: String,
    /// File name to write in the destination directory (no `/`).
    pub dest_name: String,
    /// dm-verity parameters known before the fetch (a measured image or extension): the
    /// tree is then computed while the file streams in ([`FetchedFile::streamed`]).
    pub verity: Option<crate::verity::Params>,
}

/// One file written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedFile {
    /// Path inside the image, as asked.
    pub path: String,
    /// Name written in the destination directory.
    pub dest_name: String,
    /// sha256 of the content (64 lowercase hex).
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// The dm-verity tree computed while the file streamed in, when [`Wanted::verity`] was given.
    pub streamed: Option<crate::verity::Streamed>,
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
}

enum Source {
    Registry(Arc<RegistryClient>),
    Layout(std::path::PathBuf),
}

impl Source {
    async fn open_blob(&self, desc: &Descriptor) -> Result<BlobReader> {
        Ok(match self {
            Source::Registry(c) => BlobReader::Registry(Box::new(c.open_blob(desc))),
            Source::Layout(root) => BlobReader::Layout(layout::LayoutBlob::open(root, desc).await?),
        })
    }
}

fn check_dest_name(n: &str) -> Result<()> {
    if !crate::policy::is_plain_file_name(n) || n.starts_with(TMP_PREFIX) {
        bail!("invalid destination file name {n:?}");
    }
    Ok(())
}

/// Registry connections (authenticated clients) kept across calls, one per endpoint, so that
/// resolving an image and then fetching from it connects and authenticates once. Building a
/// client loads the system CA roots, which costs milliseconds each time. The node
/// configuration (registries.conf, certs.d, auth files) is read once per `Connections`.
/// They share one retry budget: a `Connections` is one pull.
#[derive(Default)]
pub struct Connections {
    clients: std::sync::Mutex<HashMap<String, Arc<RegistryClient>>>,
    config: std::sync::Mutex<Option<Arc<NodeConfig>>>,
    budget: std::sync::OnceLock<Arc<RetryBudget>>,
    /// Trust decisions already made, by endpoint and manifest digest (issue 9).
    trusted: std::sync::Mutex<HashMap<String, crate::trust::TrustRecord>>,
    /// The last trust decision made through these connections.
    last_trust: std::sync::Mutex<Option<crate::trust::TrustRecord>>,
    /// Manifests already resolved, by endpoint and reference: one pull reads each manifest
    /// once, and a tag that moves between resolving and fetching cannot mix two images.
    resolved: std::sync::Mutex<HashMap<String, ResolvedImage>>,
}

impl Connections {
    /// No connections yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The node configuration, read on first use.
    pub fn config(&self, opts: &RegistryOptions) -> Result<Arc<NodeConfig>> {
        let mut guard = self.config.lock().map_err(|_| anyhow::anyhow!("internal: configuration lock poisoned"))?;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let c = Arc::new(opts.node.load()?);
        *guard = Some(c.clone());
        Ok(c)
    }

    /// An authenticated client for `ep` (for example the endpoint a manifest came from,
    /// [`ResolvedImage::endpoint`]), connecting on first use.
    pub async fn client(&self, opts: &RegistryOptions, ep: &Endpoint) -> Result<Arc<RegistryClient>> {
        let key = format!("{}|{}|{}", ep.host, ep.repository, ep.insecure);
        if let Some(c) = self.clients.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        if let Some(b) = &ep.blocked_by {
            bail!("{}: {b}", ep.describe());
        }
        let config = self.config(opts)?;
        let tls = config.tls_for(ep)?;
        let auth = config.auth_for(ep)?;
        let budget = self.budget.get_or_init(|| Arc::new(RetryBudget::new(opts.retry.clone()))).clone();
        let client = Arc::new(RegistryClient::connect(opts, ep, &tls, auth, budget).await?);
        if let Ok(mut m) = self.clients.lock() {
            m.insert(key, client.clone());
        }
        Ok(client)
    }

    /// Resolves `tag`/`digest` through `client`, once per endpoint and reference.
    async fn resolve(&self, client: &RegistryClient, tag: Option<&str>, digest: Option<&str>) -> Result<ResolvedImage> {
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

    /// The last image trust decision made through these connections.
    pub fn trust(&self) -> Option<crate::trust::TrustRecord> {
        self.last_trust.lock().ok().and_then(|t| t.clone())
    }

    /// Checks the trust policy on a resolved image before anything is read from it (once
    /// per endpoint and digest).
    async fn check_trust(
        &self,
        opts: &RegistryOptions,
        image: &ImageRef,
        resolved: &ResolvedImage,
        origin: crate::trust::Origin<'_>,
    ) -> Result<()> {
        let key = format!("{}|{}", resolved.origin, resolved.top_digest);
        let cached = self.trusted.lock().ok().and_then(|m| m.get(&key).cloned());
        let record = match cached {
            Some(r) => r,
            None => crate::trust::check(&opts.trust, image, &resolved.top_digest, origin).await?,
        };
        if let Ok(mut m) = self.trusted.lock() {
            m.insert(key, record.clone());
        }
        if let Ok(mut t) = self.last_trust.lock() {
            *t = Some(record);
        }
        Ok(())
    }
}

/// Tries each endpoint (mirrors first); returns the first success or the primary's error.
async fn over_endpoints<T, F, Fut>(opts: &RegistryOptions, conns: &Connections, image: &ImageRef, mut f: F) -> Result<T>
where
    F: FnMut(Source, ResolvedImage) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    match image {
        ImageRef::Layout { path, tag } => {
            let resolved = layout::resolve(path, tag.as_deref(), &opts.platform).await?;
            conns.check_trust(opts, image, &resolved, crate::trust::Origin::Layout).await?;
            f(Source::Layout(path.clone()), resolved).await
        }
        ImageRef::Registry { registry, repository, tag, digest } => {
            let config = conns.config(opts)?;
            let mut mirror_errors = Vec::new();
            for ep in config.endpoints(registry, repository, digest.is_some())? {
                if let Some(d) = &ep.decided_by {
                    tracing::debug!("trying {} ({d})", ep.describe());
                }
                let attempt = async {
                    let client = conns.client(opts, &ep).await?;
                    let resolved = conns.resolve(&client, tag.as_deref(), digest.as_deref()).await?;
                    conns.check_trust(opts, image, &resolved, crate::trust::Origin::Registry(&client)).await?;
                    f(Source::Registry(client), resolved).await
                }
                .await;
                match attempt {
                    Ok(v) => return Ok(v),
                    Err(e) if ep.mirror && e.downcast_ref::<crate::trust::Refused>().is_none() => {
                        tracing::warn!("{} failed, trying the next endpoint: {e:#}", ep.describe());
                        mirror_errors.push(format!("{}: {e:#}", ep.describe()));
                    }
                    Err(e) => {
                        if mirror_errors.is_empty() {
                            return Err(e);
                        }
                        return Err(e.context(format!("mirrors also failed: {}", mirror_errors.join("; "))));
                    }
                }
            }
            bail!("no registry endpoint for {image}")
        }
    }
}

/// Resolves an image to its platform manifest digest (`sha256:…`) without reading layers.
pub async fn resolve_digest(opts: &RegistryOptions, image: &ImageRef) -> Result<String> {
    resolve_digest_with(opts, &Connections::new(), image).await
}

/// [`resolve_digest`], reusing (and keeping) the connections in `conns`.
pub async fn resolve_digest_with(opts: &RegistryOptions, conns: &Connections, image: &ImageRef) -> Result<String> {
    Ok(resolve_with(opts, conns, image).await?.manifest_digest)
}

/// Resolves an image to its platform manifest, with the endpoint (mirror or source) that
/// served it ([`ResolvedImage::endpoint`]; `conns.client(opts, endpoint)` talks to it again).
pub async fn resolve_with(opts: &RegistryOptions, conns: &Connections, image: &ImageRef) -> Result<ResolvedImage> {
    over_endpoints(opts, conns, image, |_, r| async move { Ok(r) }).await.with_context(|| format!("resolve {image}"))
}

/// Fetches the wanted files of `image` into `dest` (temporary name, fsync, rename; mode 0644).
pub async fn fetch_files(
    opts: &RegistryOptions,
    image: &ImageRef,
    wanted: &[Wanted],
    dest: &Dir,
) -> Result<FetchReport> {
    fetch_files_with(opts, &Connections::new(), image, wanted, dest).await
}

/// [`fetch_files`], reusing (and keeping) the connections in `conns`.
pub async fn fetch_files_with(
    opts: &RegistryOptions,
    conns: &Connections,
    image: &ImageRef,
    wanted: &[Wanted],
    dest: &Dir,
) -> Result<FetchReport> {
    fetch_files_into(opts, conns, image, wanted, dest, "the destination directory").await
}

/// [`fetch_files_with`], naming the destination `place` in messages (a refusal for lack of
/// space names it: each file is checked against the free space when its tar header is read).
pub async fn fetch_files_into(
    opts: &RegistryOptions,
    conns: &Connections,
    image: &ImageRef,
    wanted: &[Wanted],
    dest: &Dir,
    place: &str,
) -> Result<FetchReport> {
    if wanted.is_empty() {
        bail!("nothing to fetch: no in-image path given");
    }
    let mut paths = Vec::new();
    for w in wanted {
        paths.push(check_wanted_path(&w.path)?);
        check_dest_name(&w.dest_name)?;
    }
    let mut names = HashSet::new();
    for w in wanted {
        if !names.insert(&w.dest_name) {
            bail!("destination file name {:?} given twice", w.dest_name);
        }
    }
    over_endpoints(opts, conns, image, |source, resolved| {
        let paths = paths.clone();
        async move {
            let temps = TempFiles::new(dest.try_clone().context("duplicate destination handle")?, place);
            let res = extract(opts, &source, &resolved, &paths, wanted, &temps).await;
            temps.cleanup();
            res
        }
    })
    .await
    .with_context(|| format!("fetch from {image}"))
}

#[allow(clippy::too_many_arguments)]
async fn read_layer(
    opts: &RegistryOptions,
    source: &Source,
    desc: &Descriptor,
    number: usize,
    upper: Vec<Arc<LayerIndex>>,
    mode: Mode,
    temps: &TempFiles,
    total: &Arc<AtomicU64>,
    budget: &Arc<IndexBudget>,
    streams: &Arc<HashMap<String, crate::verity::Params>>,
) -> Result<layer::LayerOutput> {
    let compression =
        Compression::from_media_type(&desc.media_type).with_context(|| format!("layer {}", desc.digest))?;
    if desc.size > opts.limits.max_blob_size {
        bail!("layer {} is {} bytes, more than the {} byte limit", desc.digest, desc.size, opts.limits.max_blob_size);
    }
    let mut blob = source.open_blob(desc).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let job = LayerJob {
        number,
        digest: desc.digest.clone(),
        compression,
        upper,
        mode,
        temps: temps.clone(),
        max_file_size: opts.limits.max_file_size,
        max_total_size: opts.limits.max_total_size,
        total: total.clone(),
        max_decompressed: layer::layer_cap(desc.size, opts.limits.max_layer_ratio, opts.limits.max_layer_bytes),
        budget: budget.clone(),
        streams: streams.clone(),
    };
    let thread = tokio::task::spawn_blocking(move || layer::run(job, rx));
    let bar = crate::progress::layer(&desc.digest, desc.size);
    let streamed: Result<()> = async {
        let mut tx = Some(tx);
        // The digest is computed on its own thread while the walker decompresses (issue 13).
        let hasher = BlobHasher::start();
        let (mut n, mut chunks) = (0u64, 0u64);
        while let Some(chunk) = blob.next_chunk().await? {
            n += chunk.len() as u64;
            chunks += 1;
            bar.inc(chunk.len() as u64);
            if n > desc.size {
                bail!("blob is larger than its descriptor says ({} bytes): refused", desc.size);
            }
            hasher.update(chunk.clone()).await?;
            if let Some(t) = &tx
                && t.send(chunk).await.is_err()
            {
                // The walker stopped (error or end of tar): keep hashing to the end.
                tx = None;
            }
        }
        drop(tx);
        tracing::debug!("blob {}: {n} bytes in {chunks} chunks", desc.digest);
        if n != desc.size {
            bail!("blob is truncated: {n} of {} bytes", desc.size);
        }
        let actual = hasher.finish().await?;
        if actual != desc.digest {
            bail!("blob digest mismatch: content hashes to {actual}");
        }
        Ok(())
    }
    .await;
    bar.finish_and_clear();
    let walked = thread.await.context("layer walker thread failed")?;
    match (streamed, walked) {
        (Err(e), Ok(out)) => {
            for c in out.captures.values() {
                temps.remove(&c.tmp);
            }
            Err(e)
        }
        (Err(e), Err(_)) => Err(e),
        (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(out)) => Ok(out),
    }
    .with_context(|| format!("layer {} ({})", desc.digest, desc.media_type))
}

async fn extract(
    opts: &RegistryOptions,
    source: &Source,
    resolved: &ResolvedImage,
    paths: &[String],
    wanted: &[Wanted],
    temps: &TempFiles,
) -> Result<FetchReport> {
    // Refuse unknown media types before reading anything.
    for l in &resolved.layers {
        Compression::from_media_type(&l.media_type).with_context(|| format!("layer {}", l.digest))?;
    }
    let n = resolved.layers.len();
    if n > opts.limits.max_layers {
        bail!(
            "{}: the image has {n} layers, more than the limit of {} (--max-layers)",
            resolved.origin,
            opts.limits.max_layers
        );
    }
    let budget = Arc::new(IndexBudget::new(opts.limits.max_index_entries, opts.limits.max_index_bytes));
    let top_first: Vec<&Descriptor> = resolved.layers.iter().rev().collect();
    let total = Arc::new(AtomicU64::new(0));
    let streams: Arc<HashMap<String, crate::verity::Params>> =
        Arc::new(paths.iter().zip(wanted).filter_map(|(p, w)| w.verity.clone().map(|v| (p.clone(), v))).collect());
    let mut indexes: Vec<Arc<LayerIndex>> = Vec::new();
    let mut captures: HashMap<(usize, String), Capture> = HashMap::new();
    let mut layers_read = Vec::new();
    let mut results: Vec<Resolution> = Vec::new();
    for (k, desc) in top_first.iter().enumerate() {
        let out = read_layer(
            opts,
            source,
            desc,
            k,
            indexes.clone(),
            Mode::Discover(paths.to_vec()),
            temps,
            &total,
            &budget,
            &streams,
        )
        .await?;
        layers_read.push(desc.digest.clone());
        tracing::debug!("layer {k} {}: {} entries", desc.digest, out.index.len());
        indexes.push(Arc::new(out.index));
        for (p, c) in out.captures {
            captures.insert((k, p), c);
        }
        let view = View { layers: indexes.iter().map(|a| a.as_ref()).collect(), all_read: k + 1 == n };
        results = paths.iter().map(|p| view.resolve(p)).collect();
        if results.iter().all(|r| !matches!(r, Resolution::Unknown { .. })) {
            break;
        }
    }
    // Every wanted path is decided.
    let mut missing = Vec::new();
    let mut targets = Vec::new();
    for (w, r) in wanted.iter().zip(&results) {
        match r {
            Resolution::File { layer, path, .. } => targets.push((*layer, path.clone())),
            Resolution::Missing(why) => missing.push(format!("{}: {why}", w.path)),
            Resolution::Unknown { .. } => missing.push(format!("{}: undecided", w.path)),
        }
    }
    if !missing.is_empty() {
        bail!("{}: not a regular file in the image: {}", resolved.origin, missing.join("; "));
    }
    // Second pass over layers whose needed file was not copied in the first pass.
    let mut reread: HashMap<usize, HashSet<String>> = HashMap::new();
    for (layer, path) in &targets {
        if !captures.contains_key(&(*layer, path.clone())) {
            reread.entry(*layer).or_default().insert(path.clone());
        }
    }
    let mut keys: Vec<usize> = reread.keys().copied().collect();
    keys.sort();
    for k in keys {
        let set = reread.remove(&k).unwrap_or_default();
        let desc = top_first[k];
        tracing::debug!("reading layer {} again for {:?}", desc.digest, set);
        let out = read_layer(
            opts,
            source,
            desc,
            k,
            indexes[..k].to_vec(),
            Mode::Exact(set),
            temps,
            &total,
            &budget,
            &streams,
        )
        .await?;
        layers_read.push(desc.digest.clone());
        for (p, c) in out.captures {
            if let Some(old) = captures.insert((k, p), c) {
                temps.remove(&old.tmp);
            }
        }
    }
    // Every layer read was verified: hand the files out.
    let dir = temps.dir();
    let mut sum = 0u64;
    let mut files = Vec::new();
    let mut placed: HashMap<String, String> = HashMap::new(); // tmp -> dest name
    for (w, (layer, path)) in wanted.iter().zip(&targets) {
        let c = captures
            .get(&(*layer, path.clone()))
            .with_context(|| format!("{}: /{path} was not captured from layer {layer}", w.path))?;
        sum += c.size;
        if sum > opts.limits.max_total_size {
            bail!("the files exceed the total limit of {} bytes", opts.limits.max_total_size);
        }
        let tmp = match placed.get(&c.tmp) {
            None => {
                layer::sync_file(dir, &c.tmp)?;
                c.tmp.clone()
            }
            Some(first) => copy_within(temps, first, &w.dest_name)?,
        };
        set_mode_0644(dir, &tmp)?;
        dir.rename(&tmp, dir, &w.dest_name)
            .with_context(|| format!("rename {tmp} to {} in the destination", w.dest_name))?;
        temps.keep(&tmp);
        placed.insert(c.tmp.clone(), w.dest_name.clone());
        files.push(FetchedFile {
            path: w.path.clone(),
            dest_name: w.dest_name.clone(),
            sha256: c.sha256.clone(),
            size: c.size,
            streamed: c.streamed.clone(),
        });
    }
    sync_dir(dir)?;
    Ok(FetchReport {
        manifest_digest: resolved.manifest_digest.clone(),
        origin: resolved.origin.clone(),
        files,
        layers_read,
        layer_count: n,
    })
}

fn copy_within(temps: &TempFiles, from: &str, to: &str) -> Result<String> {
    let dir = temps.dir();
    let mut src = dir.open(from).with_context(|| format!("reopen {from} in the destination"))?;
    let size = src.metadata().with_context(|| format!("inspecting {from} in the destination"))?.len();
    temps.check_space(to, size)?;
    let (tmp, mut dst) = temps.create()?;
    std::io::copy(&mut src, &mut dst).with_context(|| format!("copy {from} for {to}"))?;
    dst.sync_all().with_context(|| format!("fsync {tmp}"))?;
    Ok(tmp)
}

fn set_mode_0644(dir: &Dir, name: &str) -> Result<()> {
    use cap_std::fs::PermissionsExt;
    dir.set_permissions(name, cap_std::fs::Permissions::from_mode(0o644)).with_context(|| format!("chmod 0644 {name}"))
}

fn sync_dir(dir: &Dir) -> Result<()> {
    crate::node::fsync_dir(dir).context("fsync of the destination directory")
}

/// `kata-addons fetch`: fetch the paths into `dest` (created if missing) and print
/// each file with its sha256 and size.
pub async fn run_fetch(
    image: &str,
    paths: &[String],
    dest: &Path,
    registry: &crate::cli::RegistryArgs,
    root: &Path,
) -> Result<()> {
    let opts = RegistryOptions::from_args(registry, root)?;
    let image = ImageRef::parse(image)?;
    std::fs::create_dir_all(dest).with_context(|| format!("create {}", dest.display()))?;
    let dir = Dir::open_ambient_dir(dest, cap_std::ambient_authority())
        .with_context(|| format!("open {}", dest.display()))?;
    let mut wanted = Vec::new();
    let mut seen = HashSet::new();
    for p in paths {
        let base = p.rsplit('/').next().unwrap_or_default().to_string();
        if !seen.insert(base.clone()) {
            bail!("two paths have the same file name {base:?}; fetch them separately");
        }
        wanted.push(Wanted { path: p.clone(), dest_name: base, verity: None });
    }
    let conns = Connections::new();
    let place = dest.display().to_string();
    let report = fetch_files_into(&opts, &conns, &image, &wanted, &dir, &place).await?;
    println!("image {image}");
    println!("manifest {}", report.manifest_digest);
    if let Some(t) = conns.trust() {
        println!("trust {}", t.summary());
    }
    println!("layers read {} of {}", report.layers_read.len(), report.layer_count);
    for f in &report.files {
        println!("{}  {}  {}  {}", f.sha256, f.size, dest.join(&f.dest_name).display(), f.path);
    }
    Ok(())
}
