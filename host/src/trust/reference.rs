//! Docker references as containers/image compares them in signatures and policy scopes:
//! the shared grammar's normalised [`Named`] (`kata-addons-facts`), with the readings the
//! trust policy needs.

use anyhow::{Result, anyhow, bail};
use kata_addons_facts::reference::{self, Familiar, Named};

/// A normalised Docker reference: `host/repository[:tag][@digest]`.
pub(crate) type DockerRef = Named;

/// The readings of a [`DockerRef`] the trust policy uses.
pub(crate) trait DockerRefExt: Sized {
    /// Parses and normalises (`busybox` = `docker.io/library/busybox`), like
    /// `reference.ParseNormalizedNamed`.
    fn parse(s: &str) -> Result<Self>;
    /// Parses a reference that must already be in canonical form (`reference.ParseNamed`).
    fn parse_canonical(s: &str) -> Result<Self>;
    /// The reference the policy sees for an image: a reference without tag or digest
    /// means `:latest`, as containers/image's docker transport reads it.
    fn of_image(registry: &str, repository: &str, tag: Option<&str>, digest: Option<&str>) -> Self;
    /// Neither tag nor digest.
    fn is_name_only(&self) -> bool;
    /// The policy identity: `name@digest` when pinned, else `name:tag`.
    fn policy_identity(&self) -> String;
}

impl DockerRefExt for Named {
    fn parse(s: &str) -> Result<Named> {
        if s.starts_with(reference::LAYOUT_PREFIX) || s.trim() != s {
            bail!("{s:?} is not a Docker reference");
        }
        reference::parse_named(s, Familiar::DockerHub)
            .map_err(|e| anyhow!("{s:?} is not a Docker reference: {}", reference::describe(&e)))
    }

    fn parse_canonical(s: &str) -> Result<Named> {
        let r = <Named as DockerRefExt>::parse(s)?;
        if r.to_string() != s {
            bail!("{s:?} is not a canonical Docker reference");
        }
        Ok(r)
    }

    fn of_image(registry: &str, repository: &str, tag: Option<&str>, digest: Option<&str>) -> Named {
        Named {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest: digest.map(str::to_string),
        }
        .with_default_tag()
    }

    fn is_name_only(&self) -> bool {
        self.tag.is_none() && self.digest.is_none()
    }

    fn policy_identity(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => format!("{}@{d}", self.name()),
            (None, Some(t)) => format!("{}:{t}", self.name()),
            (None, None) => self.name(),
        }
    }
}
