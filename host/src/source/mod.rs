//! Image sources: remote registries (reqwest, per endpoint of registries.conf) and local OCI image layouts.
//!
//! Both resolve an [`ImageRef`] to a [`ResolvedImage`] (manifest digest and layer
//! descriptors) and open layer blobs as a [`BlobReader`], so the extraction code is shared.

pub mod artifact;
pub mod auth;
pub mod blob;
pub mod blobhash;
pub mod certs;
pub mod endpoints;
pub mod http;
pub mod image;
pub mod layout;
pub mod manifest;
pub mod options;
pub mod paths;
pub mod proxy;
pub mod reference;
pub mod registries_conf;
pub mod registry;
pub mod retry;
pub mod session;

pub use image::{Descriptor, MAX_MANIFEST_SIZE, Platform, ResolvedImage};
pub use options::RegistryOptions;
pub use reference::{ImageRef, valid_digest};
