//! Where layer blobs are read from (a registry endpoint or a local layout), chunk by chunk.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use bytes::Bytes;

use super::image::Descriptor;
use super::{layout, registry};

/// Where the blobs of one resolved image are read from.
pub(crate) enum BlobSource {
    /// The registry endpoint (mirror or source) the manifest came from.
    Registry(Arc<registry::RegistryClient>),
    /// A local OCI layout directory.
    Layout(PathBuf),
}

impl BlobSource {
    /// Opens one blob for reading.
    pub(crate) async fn open(&self, desc: &Descriptor) -> Result<BlobReader> {
        Ok(match self {
            BlobSource::Registry(c) => BlobReader::Registry(Box::new(c.open_blob(desc))),
            BlobSource::Layout(root) => BlobReader::Layout(layout::LayoutBlob::open(root, desc).await?),
        })
    }
}

/// A blob being read, chunk by chunk.
pub(crate) enum BlobReader {
    /// From a registry.
    Registry(Box<registry::RegistryBlob>),
    /// From a local layout.
    Layout(layout::LayoutBlob),
}

impl BlobReader {
    /// The next chunk, or `None` at the end of the blob.
    pub(crate) async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        match self {
            BlobReader::Registry(r) => r.next_chunk().await,
            BlobReader::Layout(l) => l.next_chunk().await,
        }
    }
}
