//! Manifest and index parsing shared by registry and layout sources.

use anyhow::{Context, Result, bail};
use oci_spec::image::{Descriptor as OciDescriptor, ImageIndex, ImageManifest};

use super::artifact::{self, Artifact};
use super::image::{Descriptor, Platform};
use super::reference::valid_digest;

/// OCI image manifest media type.
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker schema 2 manifest media type.
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list media type.
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Media types accepted for manifests, for the `Accept` header.
pub(crate) const ACCEPTED: [&str; 4] = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// A parsed manifest document.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// An image index / manifest list: the descriptor chosen for the platform.
    Index(Descriptor),
    /// An image manifest: its layers, bottom first, and what they hold when it is an OCI
    /// artifact ([`artifact::is_artifact`]).
    Manifest(Vec<Descriptor>, Option<Artifact>),
}

fn descriptor(d: &OciDescriptor, what: &str) -> Result<Descriptor> {
    let digest = d.digest().to_string();
    if !valid_digest(&digest) {
        bail!("{what}: unsupported or malformed digest {digest:?}");
    }
    if let Some(urls) = d.urls()
        && !urls.is_empty()
    {
        bail!("{what} {digest}: foreign layer with external urls refused (not contacted: {})", urls.join(", "));
    }
    Ok(Descriptor { media_type: d.media_type().to_string(), digest, size: d.size() })
}

/// Parses a manifest or index (oci-spec types; Docker schema 2 has the same shape); for an
/// index, selects the entry for `platform`.
///
/// `content_type` is the HTTP `Content-Type` (or the descriptor media type), if known.
pub(crate) fn parse(body: &[u8], content_type: Option<&str>, platform: &Platform, origin: &str) -> Result<Parsed> {
    let doc: serde_json::Value =
        serde_json::from_slice(body).with_context(|| format!("{origin}: manifest is not valid JSON"))?;
    let schema_version = doc.get("schemaVersion").and_then(|v| v.as_i64());
    if schema_version != Some(2) {
        bail!("{origin}: unsupported manifest schemaVersion {schema_version:?} (only 2)");
    }
    let media_type = doc
        .get("mediaType")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or("").trim().to_string()))
        .unwrap_or_default();
    let is_index = match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        _ => doc.get("manifests").is_some() && doc.get("layers").is_none(),
    };
    if is_index {
        let index: ImageIndex =
            serde_json::from_value(doc).with_context(|| format!("{origin}: malformed image index"))?;
        let mut seen = Vec::new();
        for e in index.manifests() {
            let Some(p) = e.platform() else { continue };
            let (os, arch) = (p.os().to_string(), p.architecture().to_string());
            if platform.matches(&os, &arch, p.variant().as_deref()) {
                return Ok(Parsed::Index(descriptor(e, "index entry")?));
            }
            let mut name = format!("{os}/{arch}");
            if let Some(v) = p.variant() {
                name.push('/');
                name.push_str(v);
            }
            seen.push(name);
        }
        bail!(
            "{origin}: the image index has no manifest for platform {platform}; it has: {}",
            if seen.is_empty() { "no platform-specific manifests".to_string() } else { seen.join(", ") }
        );
    }
    if !media_type.is_empty() && media_type != OCI_MANIFEST && media_type != DOCKER_MANIFEST {
        bail!("{origin}: unsupported manifest media type {media_type:?}");
    }
    if doc.get("layers").is_none_or(|l| l.as_array().is_some_and(|a| a.is_empty())) {
        bail!("{origin}: manifest has no layers");
    }
    let m: ImageManifest =
        serde_json::from_value(doc).with_context(|| format!("{origin}: malformed image manifest"))?;
    descriptor(m.config(), "config")?;
    let layers = m
        .layers()
        .iter()
        .map(|l| descriptor(l, "layer"))
        .collect::<Result<Vec<_>>>()
        .with_context(|| format!("{origin}: bad layer descriptor"))?;
    let artifact = match artifact::is_artifact(&m) {
        true => Some(artifact::parse(&m).with_context(|| format!("{origin}: OCI artifact"))?),
        false => None,
    };
    Ok(Parsed::Manifest(layers, artifact))
}
