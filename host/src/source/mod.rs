//! Image sources: remote registries (reqwest, per endpoint of registries.conf) and local OCI image layouts.
//!
//! Both resolve an [`ImageRef`] to a [`ResolvedImage`] (manifest digest and layer
//! descriptors) and open layer blobs as a [`BlobReader`], so the extraction code is shared.

pub(crate) mod artifact;
pub(crate) mod auth;
pub(crate) mod blob;
pub(crate) mod blobhash;
pub(crate) mod certs;
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
