//! What an image resolves to: its platform, manifest digests and layer descriptors.

use std::fmt;

use anyhow::{Result, bail};

/// Largest manifest or index accepted (bytes).
pub(crate) const MAX_MANIFEST_SIZE: u64 = 4 * 1024 * 1024;

/// An OS/architecture/variant triple to select from an image index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Platform {
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
    pub(crate) fn parse(s: &str) -> Result<Self> {
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
    pub(crate) fn current() -> Self {
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
    pub(crate) fn matches(&self, os: &str, arch: &str, variant: Option<&str>) -> bool {
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

/// A content descriptor (layer or manifest).
#[derive(Debug, Clone)]
pub(crate) struct Descriptor {
    /// Media type.
    pub media_type: String,
    /// Digest (`sha256:…`).
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// An image resolved to one platform manifest.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedImage {
    /// Digest of the platform manifest (`sha256:…`).
    pub manifest_digest: String,
    /// Digest of the manifest the reference named (the index for a multi-platform image):
    /// what signatures sign.
    pub top_digest: String,
    /// Layers, bottom first (manifest order).
    pub layers: Vec<Descriptor>,
    /// The titled files when the manifest is an OCI artifact
    /// (docs/design.md#oci-artifacts), else `None`.
    pub artifact: Option<super::artifact::Artifact>,
    /// Human-readable name of where the image came from (for messages).
    pub origin: String,
}
