//! Which TEE a Kata runtime configuration boots, from the facts Kata itself reads: the
//! effective hypervisor table of the file and its `config.d` fragments (kata-addons' own
//! drop-in left out), and the file's place in a known layout.
//!
//! Facts (kata-containers 7c6ba40, `src/runtime/config/configuration-qemu-*.toml.in` and
//! `src/runtime-rs/config/configuration-qemu-*-runtime-rs.toml.in`): every TEE
//! configuration has `[hypervisor.qemu]` with `confidential_guest = true`, and each TEE's
//! (plain and NVIDIA GPU) one setting of its own, the provider's marker in the shared facts
//! (`kata_addons_facts::Marker`: SNP `sev_snp_guest = true`, TDX
//! `tdx_quote_generation_service_socket_port`, IBM SE `machine_type = "s390-ccw-virtio"`).
//! kata-deploy names a shim's file `configuration-<shim>.toml` (a custom runtime's
//! `configuration-<base shim>.toml`), and OpenShift
//! `/etc/kata-containers/kata-<tee>/configuration.toml`. The TEE is the WIT `Provider`.

use kata_addons_facts::PROVIDERS;

use crate::kata_config::files::{self as runtime, RuntimeConfig};
use crate::node::Root;
use crate::policy::Provider;

/// The provider a runtime configuration's path says: OpenShift's `kata-<tee>/configuration.toml`,
/// or a kata-deploy shim `configuration-<...>-<tee>[-runtime-rs].toml`.
pub(crate) fn of_layout(node_path: &str) -> Option<Provider> {
    let mut parts = node_path.rsplit('/');
    let file = parts.next()?;
    if file == "configuration.toml" {
        return parts.next()?.strip_prefix("kata-").and_then(Provider::from_wit_name);
    }
    let shim = file.strip_prefix("configuration-")?.strip_suffix(".toml")?;
    let shim = shim.strip_suffix("-runtime-rs").unwrap_or(shim);
    Provider::from_wit_name(shim.rsplit('-').next()?)
}

/// Checks that `rc` is a Kata configuration Kata loads and that it boots `tee`; the error
/// says what the file and its fragments say instead.
pub(crate) fn check(root: &Root, rc: &RuntimeConfig, tee: Provider) -> Result<(), String> {
    let ours = kata_addons_facts::DROP_IN_NAME;
    let fragments: Vec<runtime::Fragment> = runtime::fragments(root, &rc.rel)
        .map_err(|e| format!("{e:#}"))?
        .into_iter()
        .filter(|f| !f.path.ends_with(&format!("/{}/{ours}", runtime::CONFIG_D)))
        .collect();
    for f in &fragments {
        if let Err(why) = &f.table {
            return Err(format!("Kata cannot load this configuration: {}: {why}", f.path));
        }
    }
    let get = |k: &str| runtime::effective(&fragments, &["hypervisor", "qemu", k]);
    let mut hypervisors: Vec<String> = Vec::new();
    for f in &fragments {
        if let Ok(t) = &f.table
            && let Some(h) = t.get("hypervisor").and_then(toml::Value::as_table)
        {
            for k in h.keys() {
                if !hypervisors.contains(k) {
                    hypervisors.push(k.clone());
                }
            }
        }
    }
    if !hypervisors.iter().any(|h| h == "qemu") {
        return Err(format!(
            "not a QEMU Kata configuration (hypervisor tables: {}): the {} provider boots [hypervisor.qemu]",
            if hypervisors.is_empty() { "none".to_string() } else { hypervisors.join(", ") },
            tee
        ));
    }
    let truthy = |k: &str| get(k).is_some_and(|s| s.value == "true");
    if !truthy("confidential_guest") {
        return Err(format!(
            "not a confidential guest configuration (hypervisor.qemu.confidential_guest is {}): not a {} TEE",
            get("confidential_guest").map_or("not set".to_string(), |s| format!("{} in {}", s.value, s.from)),
            tee
        ));
    }
    // Each provider's marker setting (`ProviderLayout::marker`), looked at in the order
    // snp, tdx, se.
    let by_settings = Provider::ALL.iter().rev().find_map(|p| {
        let m = p.layout().marker;
        get(m.key()).is_some_and(|s| m.matches(&s.value)).then(|| (*p, m.to_string()))
    });
    let by_layout = of_layout(&rc.resolved).or_else(|| of_layout(&rc.named));
    match (by_settings, by_layout) {
        (Some((t, _)), _) if t == tee => Ok(()),
        (Some((t, why)), _) => Err(format!("a {} configuration ({why}), not {}", t, tee)),
        (None, Some(t)) if t == tee => Ok(()),
        (None, Some(t)) => Err(format!("a {} configuration by its place in the Kata layout, not {}", t, tee)),
        (None, None) => Err(format!(
            "neither its settings ({}) nor its name say which TEE it boots; kata-addons does not guess that it is {}",
            PROVIDERS.iter().rev().map(|p| p.marker.key()).collect::<Vec<_>>().join(", "),
            tee
        )),
    }
}
