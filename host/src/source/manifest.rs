//! Manifest and index parsing shared by registry and layout sources.

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::{Descriptor, Platform, valid_digest};

/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker schema 2 manifest media type.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list media type.
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Media types accepted for manifests, for the `Accept` header.
pub const ACCEPTED: [&str; 4] = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    urls: Option<Vec<String>>,
    #[serde(default)]
    platform: Option<RawPlatform>,
}

#[derive(Debug, Deserialize)]
struct RawPlatform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDoc {
    schema_version: Option<i64>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    layers: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    config: Option<RawDescriptor>,
}

/// A parsed manifest document.
#[derive(Debug)]
pub enum Parsed {
    /// An image index / manifest list: the descriptor chosen for the platform.
    Index(Descriptor),
    /// An image manifest: its layers, bottom first.
    Manifest(Vec<Descriptor>),
}

fn descriptor(d: &RawDescriptor, what: &str) -> Result<Descriptor> {
    if !valid_digest(&d.digest) {
        bail!("{what}: unsupported or malformed digest {:?}", d.digest);
    }
    if let Some(urls) = &d.urls
        && !urls.is_empty()
    {
        bail!("{what} {}: foreign layer with external urls refused (not contacted: {})", d.digest, urls.join(", "));
    }
    let size = u64::try_from(d.size).with_context(|| format!("{what} {}: negative size", d.digest))?;
    Ok(Descriptor { media_type: d.media_type.clone(), digest: d.digest.clone(), size })
}

/// Parses a manifest or index; for an index, selects the entry for `platform`.
///
/// `content_type` is the HTTP `Content-Type` (or the descriptor media type), if known.
pub fn parse(body: &[u8], content_type: Option<&str>, platform: &Platform, origin: &str) -> Result<Parsed> {
    let doc: RawDoc = serde_json::from_slice(body).with_context(|| format!("{origin}: manifest is not valid JSON"))?;
    if doc.schema_version != Some(2) {
        bail!("{origin}: unsupported manifest schemaVersion {:?} (only 2)", doc.schema_version);
    }
    let media_type = doc
        .media_type
        .clone()
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or("").trim().to_string()))
        .unwrap_or_default();
    let is_index = match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        _ => doc.manifests.is_some() && doc.layers.is_none(),
    };
    if is_index {
        let entries = doc.manifests.unwrap_or_default();
        let mut seen = Vec::new();
        for e in &entries {
            let Some(p) = &e.platform else { continue };
            if platform.matches(&p.os, &p.architecture, p.variant.as_deref()) {
                return Ok(Parsed::Index(descriptor(e, "index entry")?));
            }
            let mut name = format!("{}/{}", p.os, p.architecture);
            if let Some(v) = &p.variant {
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
    let _ = doc.config.as_ref().map(|c| descriptor(c, "config")).transpose()?;
    let layers = doc.layers.with_context(|| format!("{origin}: manifest has no layers"))?;
    if layers.is_empty() {
        bail!("{origin}: manifest has no layers");
    }
    layers
        .iter()
        .map(|l| descriptor(l, "layer"))
        .collect::<Result<Vec<_>>>()
        .map(Parsed::Manifest)
        .with_context(|| format!("{origin}: bad layer descriptor"))
}

/// sha256 of `data` as `sha256:<hex>`.
pub fn sha256_digest(data: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}
