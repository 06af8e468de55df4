//! The one image-reference parser of the host: `registry/repo[:tag][@sha256:…]` (the
//! docker/distribution grammar containers/image uses) and `oci:/path[:tag]`.
//!
//! registries.conf rewrites, auth lookups and the registry client all use it.

use std::fmt;
use std::path::PathBuf;

use anyhow::{Result, bail};

/// Docker Hub's canonical name in references.
pub const DOCKER_HUB: &str = "docker.io";

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

/// True for a valid tag (`[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`).
pub fn valid_tag(t: &str) -> bool {
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

/// One path component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let ch = b[i];
        if ch.is_ascii_lowercase() || ch.is_ascii_digit() {
            i += 1;
            continue;
        }
        // A separator run: ".", "_", "__" or one or more "-".
        let start = i;
        while i < b.len() && matches!(b[i], b'.' | b'_' | b'-') {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = !sep.is_empty() && (sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-'));
        if !ok {
            return false;
        }
    }
    true
}

/// True for a repository path (`component(/component)*`).
pub fn valid_repository(r: &str) -> bool {
    !r.is_empty() && r.split('/').all(valid_component)
}

/// True for a registry `host[:port]` (DNS-ish labels or an IPv4 address, optional port).
pub fn valid_domain(d: &str) -> bool {
    let (host, port) = match d.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    !host.is_empty()
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Splits a name (`host/path`, no tag or digest) into domain and repository, applying
/// the Docker Hub defaults (`busybox` = `docker.io/library/busybox`).
pub fn split_name(name: &str) -> Result<(String, String)> {
    let (registry, repository) = match name.split_once('/') {
        Some((host, rest))
            if host.contains('.')
                || host.contains(':')
                || host == "localhost"
                || host.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (host.to_string(), rest.to_string())
        }
        _ => (DOCKER_HUB.to_string(), name.to_string()),
    };
    let registry = if registry == "index.docker.io" { DOCKER_HUB.to_string() } else { registry };
    let repository =
        if registry == DOCKER_HUB && !repository.contains('/') { format!("library/{repository}") } else { repository };
    if !valid_domain(&registry) {
        bail!("invalid registry {registry:?} in {name:?}");
    }
    if !valid_repository(&repository) {
        bail!("invalid repository {repository:?} in {name:?}");
    }
    if registry.len() + 1 + repository.len() > 255 {
        bail!("image name {name:?} is longer than 255 characters");
    }
    Ok((registry, repository))
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
        let (registry, repository) = split_name(name).map_err(|e| anyhow::anyhow!("image reference {s:?}: {e}"))?;
        Ok(ImageRef::Registry { registry, repository, tag, digest })
    }

    /// A registry reference from already separated parts, validated like [`ImageRef::parse`].
    pub fn registry(registry: &str, repository: &str, tag: Option<&str>, digest: Option<&str>) -> Result<Self> {
        let mut s = format!("{registry}/{repository}");
        if let Some(t) = tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = digest {
            s.push('@');
            s.push_str(d);
        }
        Self::parse(&s)
    }

    /// `registry/repository` (the name registries.conf prefixes and auth keys match).
    pub fn name(&self) -> Option<String> {
        match self {
            ImageRef::Registry { registry, repository, .. } => Some(format!("{registry}/{repository}")),
            ImageRef::Layout { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        let r = ImageRef::parse("busybox").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/busybox");
        let r = ImageRef::parse("index.docker.io/foo/bar:1").unwrap();
        assert_eq!(r.to_string(), "docker.io/foo/bar:1");
        let r = ImageRef::parse("127.0.0.1:5000/a/b-c__d.e:v1@sha256:".to_string().as_str());
        assert!(r.is_err());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = ImageRef::parse(&format!("127.0.0.1:5000/a/b-c__d.e:v1@{d}")).unwrap();
        assert_eq!(r.name().unwrap(), "127.0.0.1:5000/a/b-c__d.e");
        for bad in ["r.io/A", "r.io/a//b", "r.io/a___b", "r.io/-a", "r.io/a:", "r.io:x/a", "r.io/a.-b"] {
            assert!(ImageRef::parse(bad).is_err(), "{bad}");
        }
        assert!(ImageRef::parse("r.io/a---b").is_ok());
        let l = ImageRef::parse("oci:/x/y:t").unwrap();
        assert_eq!(l, ImageRef::Layout { path: "/x/y".into(), tag: Some("t".into()) });
    }
}
