//! Node layout: where kata-addons installs, what it names its drop-in, and where the
//! standard Kata runtime configurations of each provider live (docs/design.md#host-layout,
//! docs/design.md#kata-layouts).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// Node directory under which version directories (and the state file) are created.
pub const INSTALL_DIR: &str = "/etc/kata-containers/addons";
/// File name of the state record inside [`INSTALL_DIR`].
pub const STATE_FILE: &str = "state.json";
/// Name of the drop-in directory beside a runtime configuration.
pub const CONFIG_D: &str = "config.d";
/// File name of the drop-in inside each runtime configuration's `config.d`.
pub const DROP_IN_NAME: &str = "50-kata-addons.toml";
/// First line of every drop-in. Constant: no value is ever formatted into a comment.
pub const HEADER: &str = "# Managed by kata-addons. Do not edit: run `kata-addons uninstall` to remove it.\n";
/// kata-deploy's default installation prefix (`--kata-prefix`).
pub const DEFAULT_KATA_PREFIX: &str = "/opt/kata";
/// kata-deploy's Go-runtime configuration directory under the prefix.
pub const KATA_DEPLOY_DEFAULTS: &str = "share/defaults/kata-containers";
/// The runtime-rs configuration directory under [`KATA_DEPLOY_DEFAULTS`].
pub const RUNTIME_RS: &str = "runtime-rs";
/// Dotted TOML table every provider's drop-in sets keys in.
pub const HYPERVISOR_TABLE: &str = "hypervisor.qemu";

/// Where one provider's standard runtime configurations live, and how one is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderLayout {
    /// Name as written in `provider` (`se`, `tdx`, `snp`): the WIT `provider`'s name.
    pub name: &'static str,
    /// Node path of the runtime's `configuration.toml` on OpenShift.
    pub openshift_config: &'static str,
    /// kata-deploy's Go-runtime shim (`qemu-<tee>`); the runtime-rs shim adds `-runtime-rs`.
    pub shim: &'static str,
    /// The `[hypervisor.qemu]` setting only this TEE's configurations have.
    pub marker: Marker,
}

/// A `[hypervisor.qemu]` setting that tells one TEE's Kata configurations apart. Facts
/// (kata-containers 7c6ba40, `src/runtime/config/configuration-qemu-*.toml.in` and
/// `src/runtime-rs/config/configuration-qemu-*-runtime-rs.toml.in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// The key is set, to anything.
    Set(&'static str),
    /// The key is `true`.
    True(&'static str),
    /// The key is this string.
    Equals(&'static str, &'static str),
}

impl Marker {
    /// The key, in `[hypervisor.qemu]`.
    pub fn key(self) -> &'static str {
        match self {
            Marker::Set(k) | Marker::True(k) | Marker::Equals(k, _) => k,
        }
    }

    /// Whether the key's effective value (strings as themselves, other values in TOML
    /// syntax) is this marker's.
    pub fn matches(self, value: &str) -> bool {
        match self {
            Marker::Set(_) => true,
            Marker::True(_) => value == "true",
            Marker::Equals(_, want) => value == want,
        }
    }
}

/// The marker as a reason: `sev_snp_guest = true`, `machine_type = "s390-ccw-virtio"`.
impl core::fmt::Display for Marker {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Marker::Set(k) => write!(f, "{k} is set"),
            Marker::True(k) => write!(f, "{k} = true"),
            Marker::Equals(k, v) => write!(f, "{k} = \"{v}\""),
        }
    }
}

/// IBM Secure Execution (kata-se).
pub const SE: ProviderLayout = ProviderLayout {
    name: "se",
    openshift_config: "/etc/kata-containers/kata-se/configuration.toml",
    shim: "qemu-se",
    marker: Marker::Equals("machine_type", "s390-ccw-virtio"),
};
/// Intel TDX (kata-tdx).
pub const TDX: ProviderLayout = ProviderLayout {
    name: "tdx",
    openshift_config: "/etc/kata-containers/kata-tdx/configuration.toml",
    shim: "qemu-tdx",
    marker: Marker::Set("tdx_quote_generation_service_socket_port"),
};
/// AMD SEV-SNP (kata-snp).
pub const SNP: ProviderLayout = ProviderLayout {
    name: "snp",
    openshift_config: "/etc/kata-containers/kata-snp/configuration.toml",
    shim: "qemu-snp",
    marker: Marker::True("sev_snp_guest"),
};

/// Every provider's layout, in provider (WIT) order (`se`, `tdx`, `snp`).
pub const PROVIDERS: [ProviderLayout; 3] = [SE, TDX, SNP];

/// The layout of the provider named `name`, if it is one.
pub fn provider_layout(name: &str) -> Option<&'static ProviderLayout> {
    PROVIDERS.iter().find(|p| p.name == name)
}

impl ProviderLayout {
    /// Every place a standard runtime configuration of the provider can live, in a fixed
    /// order: OpenShift's file, then for kata-deploy's Go-runtime shim and its runtime-rs
    /// shim the file in the defaults directory (a relative symlink into `runtimes/<shim>/`
    /// since 2026, a plain file sharing one `config.d` before) and the per-shim file itself.
    pub fn runtime_configs(&self, kata_prefix: &str) -> Vec<String> {
        let prefix = kata_prefix.trim_end_matches('/');
        let go = format!("{prefix}/{KATA_DEPLOY_DEFAULTS}");
        let rs = format!("{go}/{RUNTIME_RS}");
        let rs_shim = format!("{}-runtime-rs", self.shim);
        alloc::vec![
            String::from(self.openshift_config),
            format!("{go}/configuration-{}.toml", self.shim),
            format!("{go}/runtimes/{0}/configuration-{0}.toml", self.shim),
            format!("{rs}/configuration-{rs_shim}.toml"),
            format!("{rs}/runtimes/{rs_shim}/configuration-{rs_shim}.toml"),
        ]
    }
}

/// Every standard runtime configuration candidate of every provider, in provider order,
/// each provider's in [`ProviderLayout::runtime_configs`] order: where a kata-addons
/// drop-in can be on a node with kata-deploy at `kata_prefix`. The runner's state-less
/// uninstall and leftover sweep look here.
pub fn known_runtime_configs(kata_prefix: &str) -> Vec<String> {
    PROVIDERS.iter().flat_map(|p| p.runtime_configs(kata_prefix)).collect()
}

/// Node path of the directory holding `path` (`""` for a top-level entry).
pub fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// Node path of the drop-in for a (resolved) runtime configuration path.
pub fn drop_in_path(runtime_config: &str) -> String {
    format!("{}/{CONFIG_D}/{DROP_IN_NAME}", parent_dir(runtime_config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_in_sits_in_config_d_beside_its_configuration() {
        assert_eq!(
            drop_in_path("/etc/kata-containers/kata-se/configuration.toml"),
            "/etc/kata-containers/kata-se/config.d/50-kata-addons.toml"
        );
    }

    #[test]
    fn known_configs_are_every_providers_candidates() {
        let all = known_runtime_configs("/opt/kata/");
        assert_eq!(all.len(), 15);
        assert_eq!(all[5], "/etc/kata-containers/kata-tdx/configuration.toml");
        assert_eq!(all[6], "/opt/kata/share/defaults/kata-containers/configuration-qemu-tdx.toml");
        assert_eq!(
            all[14],
            "/opt/kata/share/defaults/kata-containers/runtime-rs/runtimes/qemu-snp-runtime-rs/configuration-qemu-snp-runtime-rs.toml"
        );
        assert_eq!(provider_layout("tdx").map(|p| p.shim), Some("qemu-tdx"));
        assert_eq!(provider_layout("TDX"), None);
    }
}
