//! Provider facts (docs/design.md#providers): which artifacts each provider boots, and
//! where its standard runtime configurations live (the node layout itself is in
//! `kata-addons-facts`).

use alloc::string::String;
use alloc::vec::Vec;

use crate::wit::{ArtifactKind, Provider};

/// Artifact kinds the provider accepts: IBM SE seals one image, so a kernel only.
pub(crate) fn allowed(p: Provider) -> &'static [ArtifactKind] {
    match p {
        Provider::Se => &[ArtifactKind::Kernel],
        Provider::Tdx | Provider::Snp => {
            &[ArtifactKind::Kernel, ArtifactKind::Initrd, ArtifactKind::Image, ArtifactKind::Extension]
        }
    }
}

/// The provider's standard runtime configuration candidates for kata-deploy at `kata_prefix`.
pub(crate) fn runtime_configs(p: Provider, kata_prefix: &str) -> Vec<String> {
    p.layout().runtime_configs(kata_prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_line_up_with_providers() {
        for p in Provider::ALL.iter().copied() {
            assert_eq!(p.layout().name, p.wit_name());
            assert_eq!(Provider::from_wit_name(p.wit_name()), Some(p));
        }
        assert_eq!(Provider::from_wit_name("SE"), None);
        let layouts: Vec<_> = Provider::ALL.iter().map(|p| *p.layout()).collect();
        assert_eq!(layouts, kata_addons_facts::PROVIDERS);
    }
}
