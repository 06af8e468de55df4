//! Local OCI image layouts (`oci:/path[:tag]`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use serde::Deserialize;
use tokio::io::AsyncReadExt;

use super::image::{Descriptor, MAX_MANIFEST_SIZE, Platform, ResolvedImage};
use super::manifest::{self, Parsed};
use super::reference::valid_digest;

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CHUNK: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IndexEntry {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<IndexEntry>,
}

fn blob_path(root: &Path, digest: &str) -> Result<PathBuf> {
    if !valid_digest(digest) {
        bail!("unsupported or malformed digest {digest:?}");
    }
    let hex = &digest["sha256:".len()..];
    Ok(root.join("blobs").join("sha256").join(hex))
}

/// Opens a file of the layout without blocking on it and refuses anything but a regular
/// file (a FIFO in place of `index.json` or a blob would hang the pull forever).
async fn open_regular(path: &Path) -> Result<tokio::fs::File> {
    let p = path.to_path_buf();
    let f = tokio::task::spawn_blocking(move || -> Result<std::fs::File> {
        let f = crate::nodefs::open_local(&p).with_context(|| format!("open {}", p.display()))?;
        crate::nodefs::ensure_regular(&f, &p.display())?;
        Ok(f)
    })
    .await
    .context("opening a layout file")??;
    Ok(tokio::fs::File::from_std(f))
}

async fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>> {
    let f = open_regular(path).await?;
    let mut buf = Vec::new();
    f.take(cap + 1).read_to_end(&mut buf).await.with_context(|| format!("read {}", path.display()))?;
    if buf.len() as u64 > cap {
        bail!("{}: larger than the {cap} byte limit", path.display());
    }
    Ok(buf)
}

async fn read_verified(root: &Path, d: &Descriptor) -> Result<Vec<u8>> {
    if d.size > MAX_MANIFEST_SIZE {
        bail!("manifest {} is {} bytes, more than the {MAX_MANIFEST_SIZE} byte limit", d.digest, d.size);
    }
    let body = read_capped(&blob_path(root, &d.digest)?, MAX_MANIFEST_SIZE).await?;
    let actual = crate::hash::sha256_digest(&body);
    if actual != d.digest {
        bail!("manifest blob {} has digest {actual}: corrupt layout", d.digest);
    }
    if body.len() as u64 != d.size {
        bail!("manifest blob {} is {} bytes, descriptor says {}", d.digest, body.len(), d.size);
    }
    Ok(body)
}

/// Resolves a layout reference to a platform manifest.
pub(crate) async fn resolve(root: &Path, tag: Option<&str>, platform: &Platform) -> Result<ResolvedImage> {
    let origin = format!("OCI layout {}", root.display());
    let index_path = root.join("index.json");
    let body = read_capped(&index_path, MAX_MANIFEST_SIZE)
        .await
        .with_context(|| format!("{origin}: not an OCI image layout"))?;
    let index: Index =
        serde_json::from_slice(&body).with_context(|| format!("{origin}: index.json is not a valid image index"))?;
    let name = |e: &IndexEntry| e.annotations.as_ref().and_then(|a| a.get(REF_NAME)).cloned();
    let entry = match tag {
        Some(t) => index.manifests.iter().rev().find(|e| name(e).as_deref() == Some(t)).with_context(|| {
            let tags: Vec<String> = index.manifests.iter().filter_map(name).collect();
            format!("{origin}: no image tagged {t:?} (tags: {})", tags.join(", "))
        })?,
        None => match index.manifests.as_slice() {
            [one] => one,
            [] => bail!("{origin}: index.json lists no images"),
            many => {
                let tags: Vec<String> = many.iter().filter_map(name).collect();
                bail!(
                    "{origin}: index.json lists {} images; name one with oci:PATH:TAG (tags: {})",
                    many.len(),
                    tags.join(", ")
                )
            }
        },
    };
    let mut desc = Descriptor {
        media_type: entry.media_type.clone(),
        digest: entry.digest.clone(),
        size: u64::try_from(entry.size).context("negative size in index.json")?,
    };
    let top_digest = desc.digest.clone();
    for _ in 0..4 {
        let body = read_verified(root, &desc).await.with_context(|| format!("{origin}: manifest {}", desc.digest))?;
        match manifest::parse(&body, Some(&desc.media_type), platform, &origin)? {
            Parsed::Index(d) => desc = d,
            Parsed::Manifest(layers, artifact) => {
                return Ok(ResolvedImage { manifest_digest: desc.digest, top_digest, layers, artifact, origin });
            }
        }
    }
    bail!("{origin}: image indexes nested too deeply")
}

/// A layer blob read from a layout directory.
pub(crate) struct LayoutBlob {
    file: tokio::fs::File,
}

impl LayoutBlob {
    /// Opens the blob for `desc` under the layout `root`.
    pub(crate) async fn open(root: &Path, desc: &Descriptor) -> Result<Self> {
        let path = blob_path(root, &desc.digest)?;
        let file = open_regular(&path).await.context("open layer blob")?;
        Ok(LayoutBlob { file })
    }

    /// Reads the next chunk.
    pub(crate) async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        let mut buf = BytesMut::zeroed(CHUNK);
        let n = self.file.read(&mut buf).await.context("read layer blob")?;
        if n == 0 {
            return Ok(None);
        }
        buf.truncate(n);
        Ok(Some(buf.freeze()))
    }
}

/// An OCI layout directory as a [`super::Source`]: images named by tag (a layout reference
/// carries no digest; `digest` is not used), resolved for `platform`.
pub(crate) struct LayoutSource {
    /// The layout directory.
    pub(crate) root: PathBuf,
    /// The platform to pick from an image index.
    pub(crate) platform: Platform,
}

impl super::Source for LayoutSource {
    fn resolve<'a>(&'a self, tag: Option<&'a str>, _digest: Option<&'a str>) -> BoxFuture<'a, Result<ResolvedImage>> {
        Box::pin(resolve(&self.root, tag, &self.platform))
    }

    fn open<'a>(&'a self, desc: &'a Descriptor) -> BoxFuture<'a, Result<Box<dyn super::Blob>>> {
        Box::pin(async move { Ok(Box::new(LayoutBlob::open(&self.root, desc).await?) as Box<dyn super::Blob>) })
    }
}

impl super::Blob for LayoutBlob {
    fn next_chunk(&mut self) -> BoxFuture<'_, Result<Option<Bytes>>> {
        Box::pin(LayoutBlob::next_chunk(self))
    }
}
