//! A pull over containerd's hosts as containerd's resolver and fetcher do it (containerd
//! `remotes/docker/resolver.go` `Resolve`, `fetcher.go` `Fetch`, 1.6/1.7): a tag is
//! resolved on the hosts with both `pull` and `resolve`, in order, the next host tried on
//! any failure (connection, TLS, 404, 5xx); manifests by digest and blobs come from every
//! host in order (the fetcher checks that one host has `pull`, then walks all of them),
//! again the next host on any failure. So a pull-only mirror serves the manifests by
//! digest and the blobs, never the tag. Every host's TLS files are read before the first
//! request: one that cannot be read fails the pull, as containerd's `ConfigureHosts` does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::{Result, anyhow, bail};
use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::endpoints::{Endpoint, NodeConfig};
use super::image::{Descriptor, MAX_MANIFEST_SIZE, ResolvedImage};
use super::manifest::{self, Parsed};
use super::options::RegistryOptions;
use super::registry::{RegistryBlob, RegistryClient};
use super::retry::RetryBudget;

/// The hosts of one `registry/repository` on a containerd node, connected on first use.
pub(crate) struct CtdSource {
    /// The hosts, in containerd's order.
    eps: Vec<Endpoint>,
    opts: RegistryOptions,
    config: Arc<NodeConfig>,
    budget: Arc<RetryBudget>,
    /// TLS material per host, read up front.
    tls: Vec<super::certs::HostTls>,
    /// Connected clients, or why a host could not be connected (not tried again).
    clients: tokio::sync::Mutex<HashMap<usize, Result<Arc<RegistryClient>, String>>>,
    /// Images already resolved, by reference, with the client that resolved them.
    resolved: Mutex<HashMap<String, (ResolvedImage, Arc<RegistryClient>)>>,
}

impl CtdSource {
    /// The hosts of `eps` (from [`NodeConfig::endpoints`] on a containerd node).
    pub(crate) fn new(
        eps: Vec<Endpoint>,
        opts: &RegistryOptions,
        config: Arc<NodeConfig>,
        budget: Arc<RetryBudget>,
    ) -> Result<CtdSource> {
        let tls = eps.iter().map(|ep| config.tls_for(ep)).collect::<Result<Vec<_>>>()?;
        Ok(CtdSource {
            tls,
            eps,
            opts: opts.clone(),
            config,
            budget,
            clients: tokio::sync::Mutex::new(HashMap::new()),
            resolved: Mutex::new(HashMap::new()),
        })
    }

    /// The hosts' `scheme://host/path (from)`, in order, for messages and `status`.
    pub(crate) fn describe_hosts(&self) -> Vec<String> {
        self.eps
            .iter()
            .map(|e| match &e.ctd {
                Some(h) => format!("{} ({})", h.url(), h.from),
                None => e.describe(),
            })
            .collect()
    }

    /// The client of host `i`, connecting on first use.
    async fn client(&self, i: usize) -> Result<Arc<RegistryClient>> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(&i) {
            return c.clone().map_err(|e| anyhow!("failed earlier in this pull, not contacted again: {e}"));
        }
        let ep = self.eps.get(i).ok_or_else(|| anyhow!("internal: no host {i}"))?;
        let r = async {
            let tls = self.tls.get(i).ok_or_else(|| anyhow!("internal: no TLS for host {i}"))?;
            let auth = self.config.auth_for(ep)?;
            RegistryClient::connect(&self.opts, ep, tls, auth, self.budget.clone()).await.map(Arc::new)
        }
        .await;
        let kept = r.as_ref().map(Arc::clone).map_err(|e| format!("{e:#}"));
        clients.insert(i, kept);
        r
    }

    /// Indexes of the hosts with `pull` and `resolve`, in order (tag resolution).
    fn resolve_hosts(&self) -> Vec<usize> {
        (0..self.eps.len()).filter(|i| self.eps[*i].ctd.as_ref().is_some_and(|h| h.pull && h.resolve)).collect()
    }

    /// Indexes of the hosts fetched from (manifests by digest, blobs): every host in
    /// order when one has `pull`, else none.
    fn fetch_hosts(&self) -> Vec<usize> {
        if self.eps.iter().any(|e| e.ctd.as_ref().is_some_and(|h| h.pull)) {
            (0..self.eps.len()).collect()
        } else {
            Vec::new()
        }
    }

    /// A message naming a host.
    fn who(&self, i: usize) -> String {
        match self.eps.get(i).and_then(|e| e.ctd.as_ref()) {
            Some(h) => format!("{} ({})", h.url(), h.from),
            None => format!("host {i}"),
        }
    }

    /// Tries `f` on each host of `order` until one succeeds; the error names every host.
    async fn first_ok<T, F, Fut>(&self, order: &[usize], what: &str, mut f: F) -> Result<(T, Arc<RegistryClient>)>
    where
        F: FnMut(Arc<RegistryClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        if order.is_empty() {
            bail!("{what}: no host of hosts.toml may do it (capabilities)");
        }
        let mut errors = Vec::new();
        for &i in order {
            let r = match self.client(i).await {
                Ok(c) => f(c.clone()).await.map(|v| (v, c)),
                Err(e) => Err(e),
            };
            match r {
                Ok(v) => return Ok(v),
                Err(e) => {
                    tracing::info!("{what}: {}: {e:#}; trying the next host", self.who(i));
                    errors.push(format!("{}: {e:#}", self.who(i)));
                }
            }
        }
        bail!("{what}: every host failed: {}", errors.join("; "))
    }

    /// A manifest by digest from the pull hosts.
    async fn manifest_by_digest(&self, digest: &str) -> Result<((Vec<u8>, Option<String>), Arc<RegistryClient>)> {
        let pull = self.fetch_hosts();
        self.first_ok(&pull, &format!("manifest {digest}"), |c| async move {
            let (body, _, ct) = c.get_manifest(digest, Some(digest)).await?;
            Ok((body, ct))
        })
        .await
    }

    /// Resolves a tag (on the resolve hosts) or a digest to the platform manifest, with the
    /// client that resolved the reference (trust checks read signatures through it).
    pub(crate) async fn resolve_image(
        &self,
        tag: Option<&str>,
        digest: Option<&str>,
    ) -> Result<(ResolvedImage, Arc<RegistryClient>)> {
        let key = format!("{tag:?}|{digest:?}");
        if let Some(r) = self.resolved.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(r);
        }
        let (top, resolver) = match digest {
            Some(d) => (d.to_string(), None),
            None => {
                let tag = tag.unwrap_or("latest");
                let order = self.resolve_hosts();
                let (d, c) = self
                    .first_ok(&order, &format!("resolving tag {tag}"), |c| async move {
                        Ok(c.get_manifest(tag, None).await?.1)
                    })
                    .await?;
                (d, Some(c))
            }
        };
        let ((mut body, mut ct), served) = self.manifest_by_digest(&top).await?;
        let client = resolver.unwrap_or(served);
        let origin = format!("registry {}", client.name());
        let mut dgst = top.clone();
        for _ in 0..4 {
            let what = format!("{origin} ({dgst})");
            match manifest::parse(&body, ct.as_deref(), &self.opts.platform, &what)? {
                Parsed::Manifest(layers, artifact) => {
                    let r = ResolvedImage { manifest_digest: dgst, top_digest: top, layers, artifact, origin };
                    if let Ok(mut m) = self.resolved.lock() {
                        m.insert(key, (r.clone(), client.clone()));
                    }
                    return Ok((r, client));
                }
                Parsed::Index(d) => {
                    if d.size > MAX_MANIFEST_SIZE {
                        bail!("{origin}: manifest {} is {} bytes, more than the limit", d.digest, d.size);
                    }
                    ((body, ct), _) = self.manifest_by_digest(&d.digest).await?;
                    if body.len() as u64 != d.size {
                        bail!("{origin}: manifest {} is {} bytes, the index says {}", d.digest, body.len(), d.size);
                    }
                    dgst = d.digest;
                }
            }
        }
        bail!("{origin}: image indexes nested too deeply")
    }
}

/// A blob read from the pull hosts in order; a failure (before or during the body) moves
/// to the next host from the byte reached, as containerd's reader reopens.
struct CtdBlob {
    src: Arc<CtdSource>,
    desc: Descriptor,
    order: Vec<usize>,
    pos: usize,
    cur: Option<RegistryBlob>,
    offset: u64,
    errors: Vec<String>,
}

impl CtdBlob {
    /// The next chunk, or `None` at the end.
    async fn next(&mut self) -> Result<Option<Bytes>> {
        loop {
            if self.cur.is_none() {
                let Some(&i) = self.order.get(self.pos) else {
                    if self.errors.is_empty() {
                        bail!("blob {}: no host of hosts.toml may pull it (capabilities)", self.desc.digest);
                    }
                    bail!("blob {}: every host failed: {}", self.desc.digest, self.errors.join("; "));
                };
                match self.src.client(i).await {
                    Ok(c) => self.cur = Some(c.open_blob_at(&self.desc, self.offset)),
                    Err(e) => {
                        self.errors.push(format!("{}: {e:#}", self.src.who(i)));
                        self.pos += 1;
                        continue;
                    }
                }
            }
            let Some(cur) = self.cur.as_mut() else { continue };
            match cur.next_chunk().await {
                Ok(Some(b)) => {
                    self.offset += b.len() as u64;
                    return Ok(Some(b));
                }
                Ok(None) => return Ok(None),
                Err(e) => {
                    let who = self.order.get(self.pos).map(|i| self.src.who(*i)).unwrap_or_default();
                    tracing::info!("blob {}: {who}: {e:#}; trying the next host", self.desc.digest);
                    self.errors.push(format!("{who}: {e:#}"));
                    self.cur = None;
                    self.pos += 1;
                }
            }
        }
    }
}

impl super::Blob for CtdBlob {
    fn next_chunk(&mut self) -> BoxFuture<'_, Result<Option<Bytes>>> {
        Box::pin(self.next())
    }
}

/// `status` lines: which registry configuration the node uses for `image` and, on a
/// containerd node, its hosts in order with the file and line each came from.
pub(crate) fn status_lines(root: &std::path::Path, image: &str) -> Vec<String> {
    let files = super::endpoints::NodeFiles { root: root.to_path_buf(), ..Default::default() };
    let config = match files.load() {
        Ok(c) => c,
        Err(e) => return vec![format!("registry configuration: cannot be read: {e:#}")],
    };
    let Some(c) = &config.containerd else {
        return vec![
            "registry configuration: registries.conf and containers certs.d (CRI-O's; containerd does not \
                     serve the Kata handlers)"
                .to_string(),
        ];
    };
    let mut out = vec![format!("registry configuration: containerd hosts.toml, because {}", c.why)];
    match super::ImageRef::parse(image) {
        Ok(super::ImageRef::Registry { registry, repository, .. }) => {
            match config.endpoints(&registry, &repository, false) {
                Ok(eps) => {
                    for (i, e) in eps.iter().enumerate() {
                        if let Some(h) = &e.ctd {
                            let caps = match (h.pull, h.resolve) {
                                (true, true) => "pull, resolve",
                                (true, false) => "pull: digests and blobs only",
                                (false, true) => "resolve without pull: digests and blobs only",
                                (false, false) => "push: digests and blobs only",
                            };
                            out.push(format!("host {}: {} [{caps}] from {}", i + 1, h.url(), h.from));
                        }
                    }
                }
                Err(e) => out.push(format!("hosts of {registry}: {e:#}")),
            }
        }
        Ok(_) => out.push("the image is an OCI layout: no registry".to_string()),
        Err(e) => out.push(format!("image {image}: {e:#}")),
    }
    out
}

impl super::Source for Arc<CtdSource> {
    fn resolve<'a>(&'a self, tag: Option<&'a str>, digest: Option<&'a str>) -> BoxFuture<'a, Result<ResolvedImage>> {
        Box::pin(async move { Ok(self.resolve_image(tag, digest).await?.0) })
    }

    fn open<'a>(&'a self, desc: &'a Descriptor) -> BoxFuture<'a, Result<Box<dyn super::Blob>>> {
        let blob: Box<dyn super::Blob> = Box::new(CtdBlob {
            src: self.clone(),
            desc: desc.clone(),
            order: self.fetch_hosts(),
            pos: 0,
            cur: None,
            offset: 0,
            errors: Vec::new(),
        });
        Box::pin(std::future::ready(Ok(blob)))
    }
}
