//! Image sources: remote registries (reqwest, per endpoint of registries.conf) and local OCI image layouts.
//!
//! Both resolve an [`ImageRef`] to a [`ResolvedImage`] (manifest digest and layer
//! descriptors) and open layer blobs as a [`BlobReader`], so the extraction code is shared.

pub mod auth;
pub mod blobhash;
pub mod certs;
pub mod endpoints;
pub mod layout;
pub mod manifest;
pub mod proxy;
pub mod reference;
pub mod registries_conf;
pub mod registry;
pub mod retry;
pub mod session;

use std::fmt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;

use crate::cli::RegistryArgs;

pub use reference::{ImageRef, valid_digest};

/// Largest manifest or index accepted (bytes).
pub const MAX_MANIFEST_SIZE: u64 = 4 * 1024 * 1024;

/// An OS/architecture/variant triple to select from an image index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// Operating system (`linux`).
    pub os: String,
    /// Architecture in Go naming (`amd64`, `arm64`, `s390x`, `ppc64le`).
    pub arch: String,
    /// Variant (`v7`, `v8`), if any.
    pub variant: Option<String>,
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.arch)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl Platform {
    /// Parses `os/arch[/variant]`.
    pub fn parse(s: &str) -> Result<Self> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => {
                Ok(Platform { os: os.to_string(), arch: arch.to_string(), variant: None })
            }
            [os, arch, v] if ok(os) && ok(arch) && ok(v) => {
                Ok(Platform { os: os.to_string(), arch: arch.to_string(), variant: Some(v.to_string()) })
            }
            _ => bail!("invalid platform {s:?}: expected os/arch[/variant], e.g. linux/amd64"),
        }
    }

    /// The platform this program runs on.
    pub fn current() -> Self {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "powerpc64" => "ppc64",
            "riscv64" => "riscv64",
            "s390x" => "s390x",
            "arm" => "arm",
            other => other,
        };
        Platform { os: std::env::consts::OS.to_string(), arch: arch.to_string(), variant: None }
    }

    /// Whether an index entry's platform matches this one.
    pub fn matches(&self, os: &str, arch: &str, variant: Option<&str>) -> bool {
        if self.os != os || self.arch != arch {
            return false;
        }
        match (&self.variant, variant) {
            (None, _) => true,
            (Some(want), Some(have)) => want == have,
            // arm64 without variant means v8.
            (Some(want), None) => self.arch == "arm64" && want == "v8",
        }
    }
}

/// Size limits for what is extracted.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest single extracted file (bytes).
    pub max_file_size: u64,
    /// Largest sum of all extracted files (bytes).
    pub max_total_size: u64,
    /// Largest layer blob (bytes, compressed).
    pub max_blob_size: u64,
    /// Most layers an image may have (`--max-layers`).
    pub max_layers: usize,
    /// Most decompressed bytes per compressed byte of a layer (`--max-layer-ratio`).
    pub max_layer_ratio: u64,
    /// Absolute ceiling of one layer's decompressed bytes (`--max-layer-bytes`).
    pub max_layer_bytes: u64,
    /// Most tar entries indexed over all layers read (`--max-index-entries`).
    pub max_index_entries: u64,
    /// Most bytes the merged index may hold (`--max-index-bytes`).
    pub max_index_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_size: 4 << 30,
            max_total_size: 8 << 30,
            max_blob_size: 16 << 30,
            max_layers: 256,
            max_layer_ratio: crate::extract::layer::DEFAULT_MAX_RATIO,
            max_layer_bytes: crate::extract::layer::DEFAULT_MAX_LAYER_BYTES,
            max_index_entries: 250_000,
            max_index_bytes: 24 << 20,
        }
    }
}

impl Limits {
    /// The defaults, overridden by the command-line limit flags.
    pub fn from_args(a: &crate::cli::LimitArgs) -> Result<Self> {
        let d = Limits::default();
        let positive = |v: Option<u64>, flag: &str, default: u64| -> Result<u64> {
            match v {
                Some(0) => bail!("{flag} must be at least 1"),
                Some(v) => Ok(v),
                None => Ok(default),
            }
        };
        Ok(Limits {
            max_file_size: positive(a.max_file_bytes, "--max-file-bytes", d.max_file_size)?,
            max_total_size: positive(a.max_total_bytes, "--max-total-bytes", d.max_total_size)?,
            max_blob_size: d.max_blob_size,
            max_layers: positive(a.max_layers.map(|v| v as u64), "--max-layers", d.max_layers as u64)? as usize,
            max_layer_ratio: positive(a.max_layer_ratio, "--max-layer-ratio", d.max_layer_ratio)?,
            max_layer_bytes: positive(a.max_layer_bytes, "--max-layer-bytes", d.max_layer_bytes)?,
            max_index_entries: positive(a.max_index_entries, "--max-index-entries", d.max_index_entries)?,
            max_index_bytes: positive(a.max_index_bytes, "--max-index-bytes", d.max_index_bytes)?,
        })
    }
}

/// How to reach registries; built from the command line.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// The node files (registries.conf, certs.d, auth) and the flags overriding them.
    pub node: endpoints::NodeFiles,
    /// Platform to select from image indexes.
    pub platform: Platform,
    /// Longest wait for any registry response or progress.
    pub timeout: Duration,
    /// Retries of transient failures (backoff, `Retry-After`, per-pull budget).
    pub retry: retry::RetryPolicy,
    /// Extraction size limits.
    pub limits: Limits,
    /// Image trust policy files (policy.json, registries.d).
    pub trust: crate::trust::TrustOptions,
    /// HTTP(S) proxy from `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` (default: none).
    pub proxy: proxy::ProxyEnv,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            node: endpoints::NodeFiles::default(),
            platform: Platform::current(),
            timeout: Duration::from_secs(30),
            retry: retry::RetryPolicy::default(),
            limits: Limits::default(),
            trust: crate::trust::TrustOptions::default(),
            proxy: proxy::ProxyEnv::default(),
        }
    }
}

impl RegistryOptions {
    /// Builds the options from the command-line registry arguments; node files beneath `root`.
    pub fn from_args(args: &RegistryArgs, root: &Path) -> Result<Self> {
        let platform = match &args.platform {
            Some(p) => Platform::parse(p).context("--platform")?,
            None => Platform::current(),
        };
        if args.timeout == 0 {
            bail!("--timeout must be at least 1 second");
        }
        let proxy = proxy::ProxyEnv::from_env()?;
        if proxy.is_set() {
            tracing::info!(proxy = %proxy, "registry proxy from the environment");
        } else {
            tracing::debug!(proxy = %proxy, "registry proxy from the environment");
        }
        Ok(RegistryOptions {
            node: endpoints::NodeFiles {
                root: root.to_path_buf(),
                registries_conf: args.registries_conf.clone(),
                registries_conf_dir: args.registries_conf_dir.clone(),
                cert_dirs: args.cert_dir.clone(),
                auth_file: args.auth_file.clone(),
                insecure_registries: args.insecure_registry.clone(),
            },
            platform,
            timeout: Duration::from_secs(args.timeout),
            retry: retry::RetryPolicy {
                max_retries: args.retries,
                max_wait: Duration::from_secs(args.retry_budget),
                ..retry::RetryPolicy::default()
            },
            limits: Limits::from_args(&args.limits)?,
            trust: crate::trust::TrustOptions {
                signature_policy: args.signature_policy.clone(),
                registries_d: args.registries_d.clone(),
                root: None,
            },
            proxy,
        })
    }
}

/// A content descriptor (layer or manifest).
#[derive(Debug, Clone)]
pub struct Descriptor {
    /// Media type.
    pub media_type: String,
    /// Digest (`sha256:…`).
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// An image resolved to one platform manifest.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// Digest of the platform manifest (`sha256:…`).
    pub manifest_digest: String,
    /// Digest of the manifest the reference named (the index for a multi-platform image):
    /// what signatures sign.
    pub top_digest: String,
    /// Layers, bottom first (manifest order).
    pub layers: Vec<Descriptor>,
    /// Human-readable name of where the image came from (for messages).
    pub origin: String,
    /// The registry endpoint (mirror or source) the manifest came from; `None` for a layout.
    pub endpoint: Option<endpoints::Endpoint>,
}

/// A blob being read, chunk by chunk.
pub enum BlobReader {
    /// From a registry.
    Registry(Box<registry::RegistryBlob>),
    /// From a local layout.
    Layout(layout::LayoutBlob),
}

impl BlobReader {
    /// The next chunk, or `None` at the end of the blob.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        match self {
            BlobReader::Registry(r) => r.next_chunk().await,
            BlobReader::Layout(l) => l.next_chunk().await,
        }
    }
}
