//! Docker references as containers/image compares them in signatures and policy scopes,
//! parsed with the host's one image-reference parser ([`ImageRef::parse`]).

use std::fmt;

use anyhow::{Result, bail};

use crate::source::ImageRef;

/// A normalised Docker reference: `host/repository[:tag][@digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerRef {
    /// Registry host with port.
    pub registry: String,
    /// Repository path.
    pub repository: String,
    /// Tag, if any.
    pub tag: Option<String>,
    /// Digest, if any.
    pub digest: Option<String>,
}

impl DockerRef {
    /// Parses and normalises (`busybox` = `docker.io/library/busybox`), like
    /// `reference.ParseNormalizedNamed`.
    pub fn parse(s: &str) -> Result<DockerRef> {
        if s.starts_with("oci:") || s.trim() != s {
            bail!("{s:?} is not a Docker reference");
        }
        match ImageRef::parse(s)? {
            ImageRef::Registry { registry, repository, tag, digest } => {
                Ok(DockerRef { registry, repository, tag, digest })
            }
            ImageRef::Layout { .. } => bail!("{s:?} is not a Docker reference"),
        }
    }

    /// Parses a reference that must already be in canonical form (`reference.ParseNamed`).
    pub fn parse_canonical(s: &str) -> Result<DockerRef> {
        let r = DockerRef::parse(s)?;
        if r.to_string() != s {
            bail!("{s:?} is not a canonical Docker reference");
        }
        Ok(r)
    }

    /// The reference the policy sees for an image: a reference without tag or digest means
    /// `:latest`, as containers/image's docker transport reads it.
    pub fn of_image(registry: &str, repository: &str, tag: Option<&str>, digest: Option<&str>) -> DockerRef {
        let tag = match (tag, digest) {
            (None, None) => Some("latest".to_string()),
            (t, _) => t.map(str::to_string),
        };
        DockerRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest: digest.map(str::to_string),
        }
    }

    /// `host/repository`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// Neither tag nor digest.
    pub fn is_name_only(&self) -> bool {
        self.tag.is_none() && self.digest.is_none()
    }

    /// The policy identity: `name@digest` when pinned, else `name:tag`.
    pub fn policy_identity(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => format!("{}@{d}", self.name()),
            (None, Some(t)) => format!("{}:{t}", self.name()),
            (None, None) => self.name(),
        }
    }
}

impl fmt::Display for DockerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}
