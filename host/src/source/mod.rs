//! Image sources: remote registries (reqwest, per endpoint of registries.conf) and local OCI image layouts.
//!
//! Each kind is a [`Source`]: it resolves a tag or digest to a [`ResolvedImage`] (manifest
//! digest and layer descriptors) and opens blobs as a [`Blob`], so the pull and the
//! extraction code are shared. A new kind is one file implementing [`Source`] (and the
//! reference that names it).

pub(crate) mod artifact;
pub(crate) mod auth;
pub(crate) mod blobhash;
pub(crate) mod certs;
pub(crate) mod containerd_hosts;
pub(crate) mod containerd_pull;
pub(crate) mod endpoints;
pub(crate) mod http;
pub(crate) mod image;
pub(crate) mod layout;
pub(crate) mod manifest;
pub(crate) mod options;
pub(crate) mod paths;
pub mod proxy;
pub(crate) mod reference;
pub(crate) mod registries_conf;
pub(crate) mod registry;
pub(crate) mod retry;
pub(crate) mod session;

pub(crate) use image::{Descriptor, Platform, ResolvedImage};
pub(crate) use options::RegistryOptions;
pub use reference::ImageRef;

use anyhow::Result;
use bytes::Bytes;
use futures_util::future::BoxFuture;

/// One place images are read from (a registry endpoint, an OCI layout directory, ...).
pub(crate) trait Source: Send + Sync {
    /// Resolves a tag or digest (`None`, `None`: the source's default image) to the platform
    /// manifest and its layers.
    fn resolve<'a>(&'a self, tag: Option<&'a str>, digest: Option<&'a str>) -> BoxFuture<'a, Result<ResolvedImage>>;

    /// Opens one blob of a resolved image for reading, chunk by chunk (the caller verifies
    /// its size and digest).
    fn open<'a>(&'a self, desc: &'a Descriptor) -> BoxFuture<'a, Result<Box<dyn Blob>>>;
}

/// A blob being read.
pub(crate) trait Blob: Send {
    /// The next chunk, or `None` at the end of the blob.
    fn next_chunk(&mut self) -> BoxFuture<'_, Result<Option<Bytes>>>;
}
