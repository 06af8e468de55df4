//! Where kata-addons' files are on a node: the install directory and its version
//! directories, and every runtime configuration directory that may hold a kata-addons
//! drop-in (all known layouts, whatever the state says).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cap_std::fs::Dir;

use kata_addons_facts::{DROP_IN_NAME, INSTALL_DIR};

use crate::kata_config::{self, CONFIG_D};
use crate::node::{self, Root};
use crate::state;

/// Opens a node directory if it exists (never creates it).
pub(super) fn open_dir_if_exists(root: &Root, node_dir: &str) -> Result<Option<Dir>> {
    match root.dir().open_dir(node::rel_path(node_dir)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if node::is_absent(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("opening {node_dir} (a symlink leading outside the root is refused)")),
    }
}

/// Opens the install directory if it exists (never creates it).
pub(super) fn open_addons(root: &Root) -> Result<Option<Dir>> {
    open_dir_if_exists(root, INSTALL_DIR)
}

/// Names of the directories in the install directory that have the shape of a version
/// directory (the state's grammar); staging directories and files are not among them.
pub(super) fn version_dirs(addons: &Dir) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in addons.entries().context("listing the install directory")? {
        let entry = entry.context("listing the install directory")?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let is_dir = entry.file_type().with_context(|| format!("inspecting {name}"))?.is_dir();
        // `lost+found`: the install directory may be a filesystem of its own.
        if is_dir && name != "lost+found" && state::validate::check_version_dir("versionDir", &name).is_ok() {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Root-relative directories that may hold a runtime configuration kata-addons wrote a
/// drop-in for: for every known candidate of every provider (the policy's own list, for
/// `kata_prefix`), every `--runtime-config` given, the plan's candidates and every Kata
/// configuration a RuntimeClass handler of the node's CRI configuration runs, the directory
/// of the file as named and of the file it resolves to. A candidate that cannot be
/// resolved (a symlink loop) is skipped with a warning.
pub(super) fn known_config_dirs(root: &Root, kata_prefix: &str, given: &[String], plan: &[String]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let candidates = kata_addons_facts::known_runtime_configs(kata_prefix);
    // Every Kata configuration a RuntimeClass handler on the node runs (GPU shims, custom
    // runtimes, multi-installs): drop-ins there are kata-addons' too, state or not.
    let handlers = kata_config::config_paths(root).unwrap_or_else(|e| {
        tracing::warn!("skipped the CRI configuration while looking for kata-addons files: {e:#}");
        Vec::new()
    });
    for c in candidates.iter().chain(given).chain(plan).chain(&handlers) {
        if !kata_addons_facts::is_clean_path(c) {
            continue;
        }
        let parent = c.rsplit_once('/').map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
        for p in [root.resolve(parent), root.resolve(c).map(|r| r.parent().map(Path::to_path_buf).unwrap_or_default())]
        {
            match p {
                Ok(rel) if !rel.as_os_str().is_empty() && !out.contains(&rel) => {
                    if root.dir().metadata(&rel).is_ok_and(|m| m.is_dir()) {
                        out.push(rel);
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(candidate = %c, "skipped while looking for kata-addons files: {e:#}"),
            }
        }
    }
    out
}

/// Node paths of the drop-ins carrying kata-addons' header in the `config.d` of `dirs`; one
/// that cannot be inspected is listed too (it may be ours), with a warning.
pub(super) fn our_drop_ins(root: &Root, dirs: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for d in dirs {
        let p = node::node_path(&d.join(CONFIG_D).join(DROP_IN_NAME));
        let ours = match root.dir().symlink_metadata(node::rel_path(&p)) {
            Ok(m) if m.is_file() => state::validate::carries_header(root, &p),
            Ok(_) => Ok(false),
            Err(e) if node::is_absent(&e) => Ok(false),
            Err(e) => Err(anyhow::Error::new(e).context(format!("inspecting {p}"))),
        };
        match ours {
            Ok(false) => {}
            Ok(true) => out.push(p),
            Err(e) => {
                tracing::warn!(drop_in = %p, "cannot tell whether this is a kata-addons drop-in: {e:#}");
                out.push(p);
            }
        }
    }
    out
}
