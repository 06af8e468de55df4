//! The host's image references: a registry image in the shared grammar of
//! `kata-addons-facts` (the one the policy guest uses), or a local OCI layout.
//!
//! A plan's reference is converted structurally ([`ImageRef::from_plan`]); text is parsed
//! only where it comes from the command line or the node's files (registries.conf
//! rewrites, `fetch --image`).

use std::fmt;
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use kata_addons_facts::reference::{self, Familiar, LAYOUT_PREFIX, Named, RefError, describe};

use crate::policy::{ImageSource, RegistryRef};

pub(crate) use kata_addons_facts::reference::{
    DOCKER_HUB, NAME_TOTAL_LENGTH_MAX, is_registry_host as valid_domain, is_repository as valid_repository,
};
pub(crate) use kata_addons_facts::{is_sha256_digest as valid_digest, is_tag as valid_tag};

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
                write!(f, "{LAYOUT_PREFIX}{}", path.display())?;
                if let Some(t) = tag {
                    write!(f, ":{t}")?;
                }
                Ok(())
            }
        }
    }
}

impl From<Named> for ImageRef {
    fn from(n: Named) -> Self {
        ImageRef::Registry { registry: n.registry, repository: n.repository, tag: n.tag, digest: n.digest }
    }
}

impl ImageRef {
    /// Parses `registry/repo[:tag][@sha256:…]` (a name without a registry host means Docker
    /// Hub, as containers/image reads it) or `oci:<local path>[:tag]`.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix(LAYOUT_PREFIX) {
            let (path, tag) = reference::split_layout(rest);
            if path.is_empty() {
                bail!("image reference {s:?}: empty OCI layout path");
            }
            if let Some(t) = tag
                && !kata_addons_facts::is_tag(t)
            {
                bail!("image reference {s:?}: {}", RefError::BadTag(t.to_string()));
            }
            return Ok(ImageRef::Layout { path: PathBuf::from(path), tag: tag.map(str::to_string) });
        }
        reference::parse_named(s, Familiar::DockerHub)
            .map(ImageRef::from)
            .map_err(|e| anyhow!("image reference {s:?}: {}", describe(&e)))
    }

    /// A plan's registry reference, converted part by part: the policy parsed it with the
    /// shared grammar and `Policy::plan` checked the parts (`check_parts`); nothing is reparsed.
    pub fn from_plan(r: &RegistryRef) -> Self {
        ImageRef::Registry {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            tag: r.tag.clone(),
            digest: r.digest.clone(),
        }
    }

    /// A plan's image source in the fetch layer's terms, converted part by part (see
    /// [`ImageRef::from_plan`]).
    pub(crate) fn of_plan(source: &ImageSource) -> Self {
        match source {
            ImageSource::Registry(r) => ImageRef::from_plan(r),
            ImageSource::Layout(l) => ImageRef::Layout { path: PathBuf::from(&l.path), tag: l.tag.clone() },
        }
    }

    /// `registry/repository` (the name registries.conf prefixes and auth keys match).
    #[cfg(test)]
    pub(crate) fn name(&self) -> Option<String> {
        match self {
            ImageRef::Registry { registry, repository, .. } => Some(format!("{registry}/{repository}")),
            ImageRef::Layout { .. } => None,
        }
    }
}

/// The pinned manifest digest of a plan's image source, if the reference has one.
pub(crate) fn pinned_digest(source: &ImageSource) -> Option<&str> {
    match source {
        ImageSource::Registry(r) => r.digest.as_deref(),
        ImageSource::Layout(_) => None,
    }
}

/// A plan's image source as JSON (`preview`'s `plan.source`).
pub(crate) fn source_json(source: &ImageSource) -> serde_json::Value {
    match source {
        ImageSource::Registry(r) => serde_json::json!({
            "type": "registry", "registry": r.registry, "repository": r.repository, "tag": r.tag, "digest": r.digest,
        }),
        ImageSource::Layout(l) => serde_json::json!({ "type": "layout", "path": l.path, "tag": l.tag }),
    }
}

/// Splits a name (`host/path`, no tag or digest) into registry and repository, applying
/// the Docker Hub defaults (`busybox` = `docker.io/library/busybox`).
pub(crate) fn split_name(name: &str) -> Result<(String, String)> {
    let n = reference::parse_named(name, Familiar::DockerHub)
        .map_err(|e| anyhow!("invalid image name {name:?}: {}", describe(&e)))?;
    if n.tag.is_some() || n.digest.is_some() {
        bail!("invalid image name {name:?}: a name has no tag or digest");
    }
    Ok((n.registry, n.repository))
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
        assert!(ImageRef::parse("127.0.0.1:5000/a/b-c__d.e:v1@sha256:").is_err());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = ImageRef::parse(&format!("127.0.0.1:5000/a/b-c__d.e:v1@{d}")).unwrap();
        assert_eq!(r.name().unwrap(), "127.0.0.1:5000/a/b-c__d.e");
        for bad in ["r.io/A", "r.io/a//b", "r.io/a___b", "r.io/-a", "r.io/a:", "r.io:x/a", "r.io/a.-b", "[::1]:5000/a"]
        {
            assert!(ImageRef::parse(bad).is_err(), "{bad}");
        }
        assert!(ImageRef::parse("r.io/a---b").is_ok());
        let l = ImageRef::parse("oci:/x/y:t").unwrap();
        assert_eq!(l, ImageRef::Layout { path: "/x/y".into(), tag: Some("t".into()) });
        assert_eq!(split_name("docker.io/ubuntu").unwrap(), ("docker.io".into(), "library/ubuntu".into()));
        assert!(split_name("quay.io/a:v1").is_err());
    }
}
