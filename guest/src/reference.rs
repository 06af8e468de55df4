//! `addonImage`: the shared reference grammar (`kata-addons-facts`), with the registry
//! written out (no Docker Hub default for a bare name), as the plan's image source.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use kata_addons_facts::reference::{self, Familiar, Reference};

use crate::wit::{ImageSource, LayoutRef, RegistryRef};

/// A parsed image reference.
pub(crate) struct Parsed {
    /// Normalised reference string (explicit `latest` tag when neither tag nor digest).
    pub normalised: String,
    /// The parsed reference.
    pub source: ImageSource,
}

/// Parses a (trimmed, non-empty) reference; `Err` lists every problem found.
pub(crate) fn parse(s: &str) -> Result<Parsed, Vec<String>> {
    let parsed = match reference::parse(s, Familiar::Refused) {
        Ok(Reference::Registry(n)) => Reference::Registry(n.with_default_tag()),
        Ok(layout) => layout,
        Err(problems) => return Err(problems.iter().map(ToString::to_string).collect()),
    };
    let normalised = parsed.to_string();
    let source = match parsed {
        Reference::Registry(n) => ImageSource::Registry(RegistryRef {
            registry: n.registry,
            repository: n.repository,
            tag: n.tag,
            digest: n.digest,
        }),
        Reference::Layout { path, tag } => ImageSource::Layout(LayoutRef { path, tag }),
    };
    Ok(Parsed { normalised, source })
}
