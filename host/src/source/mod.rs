//! Image sources: remote registries (through `oci-client`) and local OCI image layouts.
//!
//! Both resolve an [`ImageRef`] to a [`ResolvedImage`] (manifest digest and layer
//! descriptors) and open layer blobs as a [`BlobReader`], so the extraction code is shared.

pub mod auth;
pub mod layout;
pub mod manifest;
pub mod registries_conf;
pub mod registry;
pub mod retry;
pub mod tls;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;

use crate::cli::RegistryArgs;

/// Largest manifest or index accepted (bytes).
pub const MAX_MANIFEST_SIZE: u64 = 4 * 1024 * 1024;

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// An image in a registry.
    Registry {
        /// Registry host, with port if any.
        registry: String,
        /// Repository path.
        repository: String,
        /// Tag, if any.
        tag: Option<String>,
        /// Pinned manifest digest (`sha256:…`), if any.
        digest: Option<String>,
    },
    /// An image in a local OCI image layout directory.
    Layout {
        /// Layout directory.
        path: PathBuf,
        /// Tag (`org.opencontainers.image.ref.name`), if any.
        tag: Option<String>,
    },
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Registry { registry, repository, tag, digest } => {
                write!(f, "{registry}/{repository}")?;
                if let Some(t) = tag {
                    write!(f, ":{t}")?;
                }
                if let Some(d) = digest {
                    write!(f, "@{d}")?;
                }
                Ok(())
            }
            ImageRef::Layout { path, tag } => {
                write!(f, "oci:{}", path.display())?;
                if let Some(t) = tag {
                    write!(f, ":{t}")?;
                }
                Ok(())
            }
        }
    }
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b[1..].iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// True for `sha256:` followed by 64 lowercase hex digits.
pub fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
}

fn valid_repository(r: &str) -> bool {
    !r.is_empty()
        && r.split('/').all(|c| {
            !c.is_empty()
                && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        })
}

impl ImageRef {
    /// Parses `registry/repo[:tag][@sha256:…]` or `oci:/path[:tag]`.
    ///
    /// A reference without a registry host (`busybox`, `library/busybox`) means `docker.io`.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("oci:") {
            // The tag is after the last ':' if that part has no '/'.
            let (path, tag) = match rest.rsplit_once(':') {
                Some((p, t)) if !t.contains('/') && !p.is_empty() => (p, Some(t.to_string())),
                _ => (rest, None),
            };
            if path.is_empty() {
                bail!("image reference {s:?}: empty OCI layout path");
            }
            if let Some(t) = &tag
                && !valid_tag(t)
            {
                bail!("image reference {s:?}: invalid tag {t:?}");
            }
            return Ok(ImageRef::Layout { path: PathBuf::from(path), tag });
        }
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => {
                if !valid_digest(d) {
                    bail!("image reference {s:?}: digest must be sha256: and 64 lowercase hex");
                }
                (n, Some(d.to_string()))
            }
            None => (s, None),
        };
        let last_slash = name.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (name, tag) = match name[last_slash..].rfind(':') {
            Some(i) => (&name[..last_slash + i], Some(name[last_slash + i + 1..].to_string())),
            None => (name, None),
        };
        if let Some(t) = &tag
            && !valid_tag(t)
        {
            bail!("image reference {s:?}: invalid tag {t:?}");
        }
        let (registry, repository) = match name.split_once('/') {
            Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => {
                (host.to_string(), rest.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let registry = auth::normalize_registry(&registry);
        let repository = if registry == "docker.io" && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if !valid_repository(&repository) {
            bail!("image reference {s:?}: invalid repository {repository:?}");
        }
        if registry.is_empty() {
            bail!("image reference {s:?}: empty registry");
        }
        Ok(ImageRef::Registry { registry, repository, tag, digest })
    }
}

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
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_file_size: 4 << 30, max_total_size: 8 << 30, max_blob_size: 16 << 30 }
    }
}

/// How to reach registries; built from the command line.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Explicit auth file (`--auth-file`); else the default search.
    pub auth_file: Option<PathBuf>,
    /// registries.conf to use; `None` means the default when present.
    pub registries_conf: Option<PathBuf>,
    /// Directory of extra CA certificates.
    pub cert_dir: Option<PathBuf>,
    /// Registries (`host[:port]`) reached over plain HTTP.
    pub insecure_registries: Vec<String>,
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
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            auth_file: None,
            registries_conf: None,
            cert_dir: None,
            insecure_registries: Vec::new(),
            platform: Platform::current(),
            timeout: Duration::from_secs(30),
            retry: retry::RetryPolicy::default(),
            limits: Limits::default(),
            trust: crate::trust::TrustOptions::default(),
        }
    }
}

impl RegistryOptions {
    /// Builds the options from the command-line registry arguments.
    pub fn from_args(args: &RegistryArgs) -> Result<Self> {
        let platform = match &args.platform {
            Some(p) => Platform::parse(p).context("--platform")?,
            None => Platform::current(),
        };
        if args.timeout == 0 {
            bail!("--timeout must be at least 1 second");
        }
        Ok(RegistryOptions {
            auth_file: args.auth_file.clone(),
            registries_conf: args.registries_conf.clone(),
            cert_dir: args.cert_dir.clone(),
            insecure_registries: args.insecure_registry.clone(),
            platform,
            timeout: Duration::from_secs(args.timeout),
            retry: retry::RetryPolicy {
                max_retries: args.retries,
                max_wait: Duration::from_secs(args.retry_budget),
                ..retry::RetryPolicy::default()
            },
            trust: crate::trust::TrustOptions {
                signature_policy: args.signature_policy.clone(),
                registries_d: args.registries_d.clone(),
                root: None,
            },
            ..RegistryOptions::default()
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
