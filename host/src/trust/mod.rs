//! Image trust (docs/design.md#image-trust): the node's containers-policy.json(5) and
//! containers-registries.d(5), evaluated on the manifest digest actually pulled, before
//! anything is written, with the same decision as containers/image (skopeo, CRI-O).
//!
//! One deliberate difference: no policy file at the default location accepts the image
//! with one warning (containers/image refuses). A policy file named by
//! `--signature-policy` that is missing is an error.

pub(crate) mod gpg;
pub(crate) mod policy_fields;
pub(crate) mod policy_json;
pub(crate) mod reference;
pub(crate) mod registries_d;
pub(crate) mod sigstore;
pub(crate) mod simple_signing;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, anyhow, bail};

use crate::nodefs::{FilePath, MAX_CONFIG_FILE, NodeFs};
use crate::source::http;
use crate::source::registry::RegistryClient;
use crate::source::{Descriptor, ImageRef};
pub(crate) use crate::state::{TrustDecision, TrustRecord};
use policy_json::{KeySource, Policy, Requirement, docker_namespaces, oci_namespaces};
use reference::{DockerRef, DockerRefExt};
use registries_d::RegistriesD;

/// Node path of the default policy file.
pub(crate) const DEFAULT_POLICY: &str = "/etc/containers/policy.json";
/// Node path of the default registries.d directory.
pub(crate) const DEFAULT_REGISTRIES_D: &str = "/etc/containers/registries.d";
/// Node path of containers/image's built-in lookaside (for root), used when registries.d names none.
pub(crate) const DEFAULT_LOOKASIDE: &str = "/var/lib/containers/sigstore";
/// containers/image reads at most this many lookaside signatures.
const MAX_LOOKASIDE_SIGNATURES: usize = 128;

/// Where the trust configuration comes from.
#[derive(Debug, Clone)]
pub struct TrustOptions {
    /// `--signature-policy FILE` (a path on the runner's filesystem); else the node's default.
    pub signature_policy: Option<PathBuf>,
    /// `--registries-d DIR`; else the node's default.
    pub registries_d: Option<PathBuf>,
    /// The node root (`--root`, `/` by default). Key paths, `file://` lookasides and the
    /// default files are node paths beneath it.
    pub root: PathBuf,
}

impl Default for TrustOptions {
    fn default() -> Self {
        TrustOptions { signature_policy: None, registries_d: None, root: PathBuf::from("/") }
    }
}

/// Where the image came from, for reading its signatures.
pub(crate) enum Origin<'a> {
    /// A registry endpoint (the mirror or source the manifest was read from).
    Registry(&'a std::sync::Arc<RegistryClient>),
    /// A local OCI layout (no signatures).
    Layout,
}

static WARNED_NO_POLICY: AtomicBool = AtomicBool::new(false);

fn open_root(opts: &TrustOptions) -> Result<NodeFs> {
    NodeFs::open(&opts.root)
}

/// Reads a node file beneath the root (`None` when it does not exist).
fn read_node_file(root: &NodeFs, node_path: &str) -> Result<Option<Vec<u8>>> {
    root.read(&FilePath::node(node_path), MAX_CONFIG_FILE)
}

/// A loaded policy and where it came from.
struct Loaded {
    policy: Policy,
    file: String,
}

/// Loads the policy: `Ok(None)` when the default file is absent (accept, one warning).
fn load_policy(opts: &TrustOptions, root: &NodeFs) -> Result<Option<Loaded>> {
    let (file, bytes) = match &opts.signature_policy {
        Some(p) => {
            let b = root
                .read(&FilePath::Local(p.clone()), MAX_CONFIG_FILE)
                .with_context(|| format!("--signature-policy {}: cannot read", p.display()))?
                .with_context(|| format!("--signature-policy {}: the file does not exist", p.display()))?;
            (p.display().to_string(), b)
        }
        None => match read_node_file(root, DEFAULT_POLICY)? {
            Some(b) => (DEFAULT_POLICY.to_string(), b),
            None => {
                if !WARNED_NO_POLICY.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        policy = DEFAULT_POLICY,
                        "no image trust policy on the node ({DEFAULT_POLICY} is absent): image signatures are NOT checked (skopeo and CRI-O would refuse to pull)"
                    );
                }
                return Ok(None);
            }
        },
    };
    let policy = Policy::parse(&bytes).with_context(|| format!("{file}: invalid policy, every pull is refused"))?;
    Ok(Some(Loaded { policy, file }))
}

/// The policy's view of an image: transport, identity, scopes, Docker reference.
struct Subject {
    transport: &'static str,
    identity: String,
    namespaces: Vec<String>,
    docker: Option<DockerRef>,
}

fn subject(image: &ImageRef) -> Subject {
    match image {
        ImageRef::Registry { registry, repository, tag, digest } => {
            let d = DockerRef::of_image(registry, repository, tag.as_deref(), digest.as_deref());
            Subject {
                transport: "docker",
                identity: d.policy_identity(),
                namespaces: docker_namespaces(&d.name()),
                docker: Some(d),
            }
        }
        ImageRef::Layout { path, .. } => {
            let abs = std::fs::canonicalize(path)
                .unwrap_or_else(|_| std::path::absolute(path).unwrap_or_else(|_| path.clone()));
            let dir = abs.display().to_string();
            Subject { transport: "oci", namespaces: oci_namespaces(&dir), identity: dir, docker: None }
        }
    }
}

fn scope_name(transport: &str, scope: &Option<String>) -> String {
    match scope {
        None => "default".to_string(),
        Some(s) if s.is_empty() => format!("transports.{transport} \"\""),
        Some(s) => format!("scope {s:?}"),
    }
}

fn names(reqs: &[Requirement]) -> String {
    reqs.iter().map(Requirement::name).collect::<Vec<_>>().join("+")
}

/// What the policy says before any signature is read.
pub(crate) enum Gate {
    /// Decided without signatures: accepted (or unchecked, with no policy file).
    Decided,
    /// Signatures must be read: call [`check`] once the manifest digest is known.
    NeedsSignatures,
}

/// Decides what can be decided without reading signatures: a `reject` refuses at once
/// and an all-`insecureAcceptAnything` scope accepts. Errors name the file and the entry.
pub(crate) fn gate(opts: &TrustOptions, image: &ImageRef) -> Result<Gate> {
    let root = open_root(opts)?;
    let Some(loaded) = load_policy(opts, &root)? else {
        return Ok(Gate::Decided);
    };
    let subj = subject(image);
    let (scope, reqs) = loaded.policy.requirements_for(subj.transport, &subj.identity, &subj.namespaces);
    let where_ = format!("{}: {}", loaded.file, scope_name(subj.transport, &scope));
    if reqs.contains(&Requirement::Reject) {
        bail!("{where_}: reject: the policy refuses {image}");
    }
    if reqs.iter().all(|r| *r == Requirement::InsecureAcceptAnything) {
        let record = TrustRecord {
            decision: TrustDecision::Accepted,
            policy_file: loaded.file,
            scope: scope_name(subj.transport, &scope),
            requirement: names(reqs),
            identity: None,
            key: None,
        };
        tracing::info!(
            step = "trust",
            decision = %record.decision,
            policy = %record.policy_file,
            scope = %record.scope,
            requirement = %record.requirement,
            "image trust policy accepts {image} without signatures"
        );
        return Ok(Gate::Decided);
    }
    Ok(Gate::NeedsSignatures)
}

fn unchecked() -> TrustRecord {
    TrustRecord {
        decision: TrustDecision::Unchecked,
        policy_file: format!("{DEFAULT_POLICY} (absent)"),
        scope: "none".into(),
        requirement: "none".into(),
        identity: None,
        key: None,
    }
}

/// Signatures read for one image, each kind read once, when first needed.
struct Signatures {
    simple: Option<Vec<(String, Vec<u8>)>>,
    sigstore: Option<Vec<(String, sigstore::UntrustedSignature)>>,
}

/// A refusal by the trust policy (or a policy that cannot be loaded): final, the next
/// mirror is not tried, as in containers/image.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Refused(pub String);

/// Evaluates the policy for `image` whose top-level manifest has `digest`, read from
/// `origin`. `Ok` means every requirement of the deciding scope holds; errors are [`Refused`].
pub(crate) async fn check(
    opts: &TrustOptions,
    image: &ImageRef,
    digest: &str,
    origin: Origin<'_>,
) -> Result<TrustRecord> {
    check_inner(opts, image, digest, origin).await.map_err(|e| anyhow::Error::new(Refused(format!("{e:#}"))))
}

async fn check_inner(opts: &TrustOptions, image: &ImageRef, digest: &str, origin: Origin<'_>) -> Result<TrustRecord> {
    let root = open_root(opts)?;
    let Some(loaded) = load_policy(opts, &root)? else {
        return Ok(unchecked());
    };
    let subj = subject(image);
    let (scope, reqs) = loaded.policy.requirements_for(subj.transport, &subj.identity, &subj.namespaces);
    let scope_desc = scope_name(subj.transport, &scope);
    let mut sigs = Signatures { simple: None, sigstore: None };
    let mut record = TrustRecord {
        decision: TrustDecision::Accepted,
        policy_file: loaded.file.clone(),
        scope: scope_desc.clone(),
        requirement: names(reqs),
        identity: None,
        key: None,
    };
    for req in reqs {
        let what = format!("{}: {scope_desc}: {}", loaded.file, req.name());
        let verified = evaluate(opts, &root, req, &subj, image, digest, &origin, &mut sigs)
            .await
            .map_err(|e| anyhow!("{what}: {e:#}"))?;
        if let Some((identity, key)) = verified {
            record.identity = Some(identity);
            record.key = Some(key);
        }
    }
    tracing::info!(
        step = "trust",
        decision = %record.decision,
        policy = %record.policy_file,
        scope = %record.scope,
        requirement = %record.requirement,
        identity = record.identity.as_deref().unwrap_or(""),
        key = record.key.as_deref().unwrap_or(""),
        digest,
        "image trust policy accepted {image}"
    );
    Ok(record)
}

#[allow(clippy::too_many_arguments)]
async fn evaluate(
    opts: &TrustOptions,
    root: &NodeFs,
    req: &Requirement,
    subj: &Subject,
    image: &ImageRef,
    digest: &str,
    origin: &Origin<'_>,
    sigs: &mut Signatures,
) -> Result<Option<(String, String)>> {
    match req {
        Requirement::InsecureAcceptAnything => Ok(None),
        Requirement::Reject => bail!("the policy refuses {image}"),
        Requirement::SignedBaseLayer => bail!("signedBaseLayer never accepts an image (as in containers/image)"),
        Requirement::SignedBy { key_type, keys, identity } => {
            if key_type != "GPGKeys" {
                bail!("keyType {key_type:?} is not implemented (containers/image rejects it too)");
            }
            let keyring = load_gpg_keys(root, keys)?;
            if sigs.simple.is_none() {
                sigs.simple = Some(read_simple_signatures(opts, root, image, digest, origin).await?);
            }
            let list = sigs.simple.as_deref().unwrap_or_default();
            if list.is_empty() {
                bail!("no signature found for {digest} (a signature was required, but no signature exists)");
            }
            let mut reasons = Vec::new();
            for (from, blob) in list {
                let res = (|| -> Result<(String, String)> {
                    let (payload, fpr) = keyring.verify(blob)?;
                    let p = simple_signing::parse(&payload, simple_signing::ATOMIC_TYPE)
                        .context("invalid signature payload")?;
                    check_claims(&p, digest, identity, subj)?;
                    Ok((p.docker_reference, fpr))
                })();
                match res {
                    Ok(v) => return Ok(Some(v)),
                    Err(e) => reasons.push(format!("{from}: {e:#}")),
                }
            }
            bail!("none of the signatures for {digest} was accepted: {}", reasons.join("; "))
        }
        Requirement::SigstoreSigned { keys, unsupported, identity } => {
            let Some(keys) = keys else {
                bail!(
                    "{} is not supported by kata-addons: refused (fail closed); use keyPath, keyPaths, keyData or keyDatas",
                    unsupported.join(", ")
                );
            };
            let keyset = load_sigstore_keys(root, keys)?;
            if sigs.sigstore.is_none() {
                sigs.sigstore = Some(read_sigstore_signatures(opts, image, digest, origin).await?);
            }
            let list = sigs.sigstore.as_deref().unwrap_or_default();
            let mut reasons = Vec::new();
            for (from, s) in list {
                if s.media_type != sigstore::PAYLOAD_MEDIA_TYPE {
                    continue;
                }
                let res = (|| -> Result<(String, String)> {
                    let b64 = s
                        .annotations
                        .get(sigstore::SIGNATURE_ANNOTATION)
                        .with_context(|| format!("missing {} annotation", sigstore::SIGNATURE_ANNOTATION))?;
                    let fp = keyset.verify(&s.payload, b64)?;
                    let p = simple_signing::parse(&s.payload, simple_signing::COSIGN_TYPE)
                        .context("invalid signature payload")?;
                    check_claims(&p, digest, identity, subj)?;
                    Ok((p.docker_reference, fp))
                })();
                match res {
                    Ok(v) => return Ok(Some(v)),
                    Err(e) => reasons.push(format!("{from}: {e:#}")),
                }
            }
            if reasons.is_empty() {
                bail!("no signature found for {digest} (a signature was required, but no signature exists)");
            }
            bail!("none of the signatures for {digest} was accepted: {}", reasons.join("; "))
        }
    }
}

fn check_claims(
    p: &simple_signing::Payload,
    digest: &str,
    identity: &policy_json::IdentityMatch,
    subj: &Subject,
) -> Result<()> {
    if p.manifest_digest != digest {
        bail!("signature for digest {} does not match", p.manifest_digest);
    }
    if !identity.matches(subj.docker.as_ref(), &p.docker_reference) {
        bail!("signature for identity {:?} is not accepted ({})", p.docker_reference, identity.name());
    }
    Ok(())
}

fn key_blobs(root: &NodeFs, keys: &KeySource) -> Result<Vec<(String, Vec<u8>)>> {
    match keys {
        KeySource::Paths(paths) => paths
            .iter()
            .map(|p| {
                let b = read_node_file(root, p)?.with_context(|| format!("key file {p} does not exist on the node"))?;
                Ok((p.clone(), b))
            })
            .collect(),
        KeySource::Data(d) => Ok(d.iter().enumerate().map(|(i, b)| (format!("keyData[{i}]"), b.clone())).collect()),
    }
}

fn load_gpg_keys(root: &NodeFs, keys: &KeySource) -> Result<gpg::Keyring> {
    let mut ring: Option<gpg::Keyring> = None;
    for (what, b) in key_blobs(root, keys)? {
        let k = gpg::Keyring::parse(&b, &what)?;
        match &mut ring {
            Some(r) => r.extend(k),
            None => ring = Some(k),
        }
    }
    ring.context("no public keys imported")
}

fn load_sigstore_keys(root: &NodeFs, keys: &KeySource) -> Result<sigstore::PublicKeys> {
    let mut set: Option<sigstore::PublicKeys> = None;
    for (what, b) in key_blobs(root, keys)? {
        let k = sigstore::PublicKeys::parse(&b, &what)?;
        match &mut set {
            Some(s) => s.extend(k),
            None => set = Some(k),
        }
    }
    set.context("no public keys")
}

fn load_registries_d(opts: &TrustOptions, root: &NodeFs) -> Result<RegistriesD> {
    let dir = match &opts.registries_d {
        Some(d) => FilePath::Local(d.clone()),
        None => FilePath::node(DEFAULT_REGISTRIES_D),
    };
    RegistriesD::load(RegistriesD::read_dir(root, &dir)?)
}

/// The physical reference (endpoint host and repository, with the logical tag or digest)
/// whose registries.d configuration applies, as containers/image uses for mirrors.
fn physical(image: &ImageRef, client: &RegistryClient) -> Option<DockerRef> {
    let ImageRef::Registry { tag, digest, .. } = image else { return None };
    let ep = client.endpoint();
    Some(DockerRef::of_image(&ep.host, &ep.repository, tag.as_deref(), digest.as_deref()))
}

fn lookaside_url(base: &str, repository: &str, digest: &str, n: usize) -> Result<String> {
    let hex = digest.strip_prefix("sha256:").with_context(|| format!("unsupported digest {digest}"))?;
    Ok(format!("{}/{repository}@sha256={hex}/signature-{n}", base.trim_end_matches('/')))
}

/// Reads the simple signatures from the lookaside configured for the endpoint.
async fn read_simple_signatures(
    opts: &TrustOptions,
    root: &NodeFs,
    image: &ImageRef,
    digest: &str,
    origin: &Origin<'_>,
) -> Result<Vec<(String, Vec<u8>)>> {
    let Origin::Registry(client) = origin else { return Ok(Vec::new()) };
    let Some(phys) = physical(image, client) else { return Ok(Vec::new()) };
    let cfg = load_registries_d(opts, root)?.for_image(&phys.policy_identity(), &phys.name());
    let base = cfg.lookaside.clone().unwrap_or_else(|| format!("file://{DEFAULT_LOOKASIDE}"));
    tracing::debug!(lookaside = %base, from = cfg.lookaside_from.as_deref().unwrap_or("built-in default"), "reading simple signatures");
    let mut out = Vec::new();
    for n in 1..=MAX_LOOKASIDE_SIGNATURES + 1 {
        if n > MAX_LOOKASIDE_SIGNATURES {
            bail!("the lookaside {base} provides more than {MAX_LOOKASIDE_SIGNATURES} signatures");
        }
        let url = lookaside_url(&base, &phys.repository, digest, n)?;
        let blob = if let Some(path) = url.strip_prefix("file://") {
            root.read(&FilePath::node(path), sigstore::MAX_SIGNATURE_SIZE)?
        } else if url.starts_with("http://") || url.starts_with("https://") {
            http_signature(client, &url).await?
        } else {
            bail!("unsupported scheme in lookaside {base} (file://, http:// and https:// are)");
        };
        let Some(blob) = blob else { break };
        match simple_signature_blob(&blob).with_context(|| format!("parsing signature {url}"))? {
            Some(sig) => out.push((url.clone(), sig)),
            None => {
                tracing::debug!("{url}: a sigstore signature in the lookaside, not read (only simple signatures are)")
            }
        }
    }
    Ok(out)
}

/// The OpenPGP bytes of a lookaside blob (raw, or the typed `\0simple-signing\n` form);
/// `None` for a typed sigstore signature (`\0sigstore-json\n`), which `signedBy` ignores.
fn simple_signature_blob(blob: &[u8]) -> Result<Option<Vec<u8>>> {
    match blob.first() {
        None => bail!("empty signature blob"),
        Some(0) => {
            let rest = &blob[1..];
            let nl = rest.iter().position(|b| *b == b'\n').context("invalid signature format, missing newline")?;
            match &rest[..nl] {
                b"simple-signing" => Ok(Some(rest[nl + 1..].to_vec())),
                b"sigstore-json" => Ok(None),
                other => bail!("unrecognized signature format {:?}", String::from_utf8_lossy(other)),
            }
        }
        Some(b) if b & 0x80 != 0 => Ok(Some(blob.to_vec())),
        Some(b) => bail!("unrecognized signature format, starting with binary {b:#x}"),
    }
}

async fn http_signature(client: &RegistryClient, url: &str) -> Result<Option<Vec<u8>>> {
    let what = format!("signature {url}");
    let resp = http::send(client.http_client().get(url), &what)
        .await
        .map_err(|f| f.into_inner().context(format!("reading {what}")))?;
    match resp.status().as_u16() {
        200 => {}
        404 => return Ok(None),
        s => bail!("reading signature {url}: HTTP {s}"),
    }
    let body = http::read_capped(resp, sigstore::MAX_SIGNATURE_SIZE, &what).await.map_err(|f| f.into_inner())?;
    Ok(Some(body))
}

/// Reads sigstore attachments from the endpoint the image came from, when registries.d
/// enables them for it.
async fn read_sigstore_signatures(
    opts: &TrustOptions,
    image: &ImageRef,
    digest: &str,
    origin: &Origin<'_>,
) -> Result<Vec<(String, sigstore::UntrustedSignature)>> {
    let Origin::Registry(client) = origin else { return Ok(Vec::new()) };
    let Some(phys) = physical(image, client) else { return Ok(Vec::new()) };
    let root = open_root(opts)?;
    let cfg = load_registries_d(opts, &root)?.for_image(&phys.policy_identity(), &phys.name());
    if !cfg.use_sigstore_attachments {
        tracing::debug!("not reading sigstore attachments for {}: not enabled in registries.d", phys.name());
        return Ok(Vec::new());
    }
    let tag = sigstore::attachment_tag(digest)?;
    let where_ = format!("{}:{tag}", phys.name());
    let Some(body) = client.optional_manifest(&tag, sigstore::MAX_SIGNATURE_SIZE).await? else {
        return Ok(Vec::new());
    };
    let m: sigstore::AttachmentManifest =
        serde_json::from_slice(&body).with_context(|| format!("{where_}: not a valid attachment manifest"))?;
    let mut out = Vec::new();
    for (i, l) in m.layers.into_iter().enumerate() {
        let desc = Descriptor { media_type: l.media_type.clone(), digest: l.digest.clone(), size: l.size };
        let payload = client
            .read_small_blob(&desc, sigstore::MAX_SIGNATURE_SIZE)
            .await
            .with_context(|| format!("{where_}: layer {i}"))?;
        out.push((
            format!("{where_} layer {i}"),
            sigstore::UntrustedSignature { media_type: l.media_type, payload, annotations: l.annotations },
        ));
    }
    Ok(out)
}
