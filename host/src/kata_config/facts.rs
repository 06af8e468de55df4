//! What the runner reads of a target runtime configuration for the policy's `render`: its
//! effective configuration WITHOUT kata-addons' drop-in (the resolved main file and the
//! other `config.d` fragments, merged as Kata merges: tables merge, everything else,
//! arrays included, replaced by the later fragment), in the WIT's records. The runner
//! decides nothing from it.

use std::path::Path;

use anyhow::Result;

use super::files::{self as runtime, Fragment, RuntimeConfig};
use crate::node::Root;
use crate::policy::{EffectiveKey, ExtensionImage, RuntimeConfigFacts};

/// The string boot keys of the hypervisor table the policy is told about.
pub(crate) const BOOT_KEYS: [&str; 5] = ["kernel", "initrd", "image", "kernel_verity_params", "rootfs_type"];

/// The array of guest extension images in the hypervisor table.
pub(crate) const EXTENSIONS_KEY: &str = "guest_extension_images";

/// The fragments Kata reads for the configuration at root-relative `rel`, without the one
/// named `drop_in_name` in its `config.d` (kata-addons' own).
pub(crate) fn fragments_without(root: &Root, rel: &Path, drop_in_name: &str) -> Result<Vec<Fragment>> {
    let mut all = runtime::fragments(root, rel)?;
    let ours = format!("/{}/{drop_in_name}", runtime::CONFIG_D);
    all.retain(|f| !f.path.ends_with(&ours));
    Ok(all)
}

/// The effective `guest_extension_images` of `table` (dotted) in `fragments`: the array
/// of the last fragment that sets it, and that fragment.
pub(crate) fn extensions(fragments: &[Fragment], table: &[&str]) -> (Vec<ExtensionImage>, Option<String>) {
    let mut found: Option<(&toml::Value, &str)> = None;
    for f in fragments {
        let Ok(t) = &f.table else { continue };
        let mut cur = Some(t);
        for k in table {
            cur = cur.and_then(|c| c.get(*k)).and_then(toml::Value::as_table);
        }
        if let Some(v) = cur.and_then(|c| c.get(EXTENSIONS_KEY)) {
            found = Some((v, &f.path));
        }
    }
    let Some((v, from)) = found else { return (Vec::new(), None) };
    let text = |e: &toml::Value, k: &str| e.get(k).and_then(toml::Value::as_str).unwrap_or_default().to_string();
    let entries = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| ExtensionImage {
                    name: text(e, "name"),
                    path: text(e, "path"),
                    verity_params: text(e, "verity_params"),
                })
                .collect()
        })
        .unwrap_or_default();
    (entries, Some(from.to_string()))
}

/// The facts of the runtime configuration at root-relative `rel` (node path `path`).
pub(crate) fn read(root: &Root, rel: &Path, path: &str, table: &str, drop_in_name: &str) -> Result<RuntimeConfigFacts> {
    let fragments = fragments_without(root, rel, drop_in_name)?;
    Ok(of_fragments(&fragments, path, table))
}

/// The facts of already-read fragments.
pub(crate) fn of_fragments(fragments: &[Fragment], path: &str, table: &str) -> RuntimeConfigFacts {
    let dotted: Vec<&str> = table.split('.').collect();
    let keys = BOOT_KEYS
        .iter()
        .filter_map(|k| {
            let mut key = dotted.clone();
            key.push(k);
            runtime::effective(fragments, &key).map(|s| EffectiveKey {
                key: k.to_string(),
                value: s.value,
                from: s.from,
            })
        })
        .collect();
    let (extensions, extensions_from) = extensions(fragments, &dotted);
    RuntimeConfigFacts { path: path.to_string(), handler: None, keys, extensions, extensions_from }
}

/// Entries of `guest_extension_images` that kata-addons' drop-in (`ours`, a node path in
/// `fragments`) re-emits but that are no longer what is in effect without it: one message
/// per stale entry. The addon's own entries (whose `path` is one of `installed`) are not
/// re-emitted and are skipped.
pub(crate) fn stale_extensions(
    fragments: &[Fragment],
    ours: &str,
    table: &[&str],
    installed: &[String],
) -> Vec<String> {
    let Some(mine) = fragments.iter().find(|f| f.path == ours) else { return Vec::new() };
    let (in_drop_in, set) = extensions(std::slice::from_ref(mine), table);
    if set.is_none() {
        return Vec::new();
    }
    let own: Vec<&str> = in_drop_in.iter().filter(|e| installed.contains(&e.path)).map(|e| e.name.as_str()).collect();
    let others: Vec<Fragment> = fragments.iter().filter(|f| f.path != ours).cloned().collect();
    let (base, from) = extensions(&others, table);
    let from = from.unwrap_or_else(|| "no file (none in effect)".to_string());
    let reemitted: Vec<&ExtensionImage> = in_drop_in.iter().filter(|e| !own.contains(&e.name.as_str())).collect();
    let expected: Vec<&ExtensionImage> = base.iter().filter(|e| !own.contains(&e.name.as_str())).collect();
    let mut out = Vec::new();
    for e in &reemitted {
        match expected.iter().find(|b| b.name == e.name) {
            Some(b) if b == e => {}
            Some(b) => out.push(format!(
                "{ours}: guest_extension_images entry {:?} is stale: the drop-in re-emits path {:?}, verity_params {:?}, \
                 but in effect without kata-addons (set by {from}) it is path {:?}, verity_params {:?}",
                e.name, e.path, e.verity_params, b.path, b.verity_params
            )),
            None => out.push(format!(
                "{ours}: guest_extension_images entry {:?} is stale: the drop-in re-emits it, but it is no longer in \
                 effect without kata-addons (set by {from})",
                e.name
            )),
        }
    }
    for b in &expected {
        if !reemitted.iter().any(|e| e.name == b.name) {
            out.push(format!(
                "{ours}: guest_extension_images entry {:?} (set by {from}) is missing from the drop-in, which replaces \
                 the array: Kata would not attach it",
                b.name
            ));
        }
    }
    if out.is_empty() {
        let order = |v: &[&ExtensionImage]| v.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        if order(&reemitted) != order(&expected) {
            out.push(format!(
                "{ours}: guest_extension_images entries are in another order than in effect without kata-addons ({from})"
            ));
        }
    }
    out
}

/// The facts `render` takes of one runtime configuration found on the node: its boot keys
/// and extension images in effect without kata-addons' drop-in (see the module comment).
pub(crate) fn for_render(root: &Root, rc: &RuntimeConfig) -> Result<RuntimeConfigFacts> {
    read(root, &rc.rel, &rc.resolved, kata_addons_facts::HYPERVISOR_TABLE, kata_addons_facts::DROP_IN_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(path: &str, text: &str) -> Fragment {
        Fragment { path: path.into(), table: toml::from_str(text).map_err(|e| e.to_string()) }
    }

    #[test]
    fn arrays_are_replaced_tables_merged_and_our_drop_in_ignored() {
        let base = frag(
            "/opt/kata/configuration-qemu-snp.toml",
            r#"[hypervisor.qemu]
kernel = "/opt/kata/vmlinuz"
image = "/opt/kata/kata-containers-confidential.img"
kernel_verity_params = "root_hash=aa"
rootfs_type = "erofs"
[[hypervisor.qemu.guest_extension_images]]
name = "coco"
path = "/opt/kata/coco.img"
verity_params = "root_hash=bb"
"#,
        );
        let devkit = frag(
            "/opt/kata/config.d/25-devkit.toml",
            r#"[hypervisor.qemu]
[[hypervisor.qemu.guest_extension_images]]
name = "coco"
path = "/opt/kata/coco.img"
verity_params = "root_hash=bb"
[[hypervisor.qemu.guest_extension_images]]
name = "devkit"
path = "/opt/kata/devkit.img"
"#,
        );
        let later = frag("/opt/kata/config.d/30-x.toml", "[hypervisor.qemu]\nrootfs_type = \"ext4\"\n");
        let f = of_fragments(&[base, devkit, later], "/opt/kata/configuration-qemu-snp.toml", "hypervisor.qemu");
        let k: Vec<(&str, &str, &str)> =
            f.keys.iter().map(|k| (k.key.as_str(), k.value.as_str(), k.from.as_str())).collect();
        assert_eq!(k[0], ("kernel", "/opt/kata/vmlinuz", "/opt/kata/configuration-qemu-snp.toml"));
        assert_eq!(k.last().copied(), Some(("rootfs_type", "ext4", "/opt/kata/config.d/30-x.toml")));
        assert_eq!(f.extensions.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), vec!["coco", "devkit"]);
        assert_eq!(f.extensions[1].verity_params, "");
        assert_eq!(f.extensions_from.as_deref(), Some("/opt/kata/config.d/25-devkit.toml"));
    }
}
