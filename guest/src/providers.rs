//! Provider facts (docs/design.md#providers): which artifacts each provider boots, and
//! where its standard runtime configurations live (the node layout itself is in
//! `kata-addons-facts`).

use alloc::string::String;
use alloc::vec::Vec;

use kata_addons_facts::ProviderLayout;

use crate::wit::{ArtifactKind, Provider};

/// Every provider, in the order of [`kata_addons_facts::PROVIDERS`].
pub(crate) const ALL: [Provider; 3] = [Provider::Se, Provider::Tdx, Provider::Snp];

/// The provider written `name` in `provider` / `ADDON_PROVIDER` (exact, lowercase).
pub(crate) fn named(name: &str) -> Option<Provider> {
    ALL.into_iter().find(|p| p.wit_name() == name)
}

/// Where the provider's runtime configurations live.
pub(crate) fn layout(p: Provider) -> &'static ProviderLayout {
    let [se, tdx, snp] = &kata_addons_facts::PROVIDERS;
    match p {
        Provider::Se => se,
        Provider::Tdx => tdx,
        Provider::Snp => snp,
    }
}

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
    layout(p).runtime_configs(kata_prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_line_up_with_providers() {
        for p in ALL {
            assert_eq!(layout(p).name, p.wit_name());
            assert_eq!(named(p.wit_name()), Some(p));
        }
        assert_eq!(named("SE"), None);
    }
}
