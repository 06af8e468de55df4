//! `uninstall`: put the node back as it was before kata-addons.

use anyhow::{Context, Result};

use kata_addons_facts::{DROP_IN_NAME, INSTALL_DIR};

use super::discovery::{known_config_dirs, open_addons, version_dirs};
use super::owner;
use super::sweep::sweep_leftovers;
use crate::kata_config::{CONFIG_D, Selection};
use crate::lock;
use crate::node::{self, Root, Site, remove_entry};
use crate::state::{self, State};

/// What `uninstall` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uninstalled {
    /// The state record that was removed; `None` when none was recorded (lost or never written).
    pub state: Option<Box<State>>,
    /// Node paths of the drop-ins removed.
    pub drop_ins: Vec<String>,
    /// Version directories removed (names inside the install directory).
    pub dirs: Vec<String>,
    /// Node paths of what killed runs left behind, removed.
    pub leftovers: Vec<String>,
    /// Node paths found and left alone: not written by kata-addons, or owned by a running process.
    pub left_alone: Vec<String>,
}

impl Uninstalled {
    /// Nothing was installed and nothing was found to remove.
    pub fn nothing(&self) -> bool {
        self.state.is_none() && self.drop_ins.is_empty() && self.dirs.is_empty() && self.leftovers.is_empty()
    }
}

/// Puts the node back as it was before kata-addons: removes what the state records
/// (drop-ins first, so the runtime stops using the files, then the version directories,
/// then the state) and, whether or not a state exists, every drop-in carrying kata-addons'
/// header at its fixed name in the `config.d` of every known runtime configuration (all
/// providers and layouts under `--kata-prefix`, plus each `--runtime-config`), every
/// version directory and what killed runs left in the install directory. A drop-in without
/// the header is never removed, even one the state lists (it is reported). A damaged state is refused (exit 1), and
/// so is a root a live daemon owns ([`super::owner`]) unless `force`: it would reinstall.
pub fn uninstall(site: &Site, selection: &Selection, force: bool) -> Result<Uninstalled> {
    let root = Root::open(&site.root)?;
    let _lock = lock::acquire(&root, site.lock_timeout)?;
    let live_owner = owner::refuse_if_owned(&root, force, "uninstall")?;
    let addons = open_addons(&root)?;
    let st = match &addons {
        Some(a) => state::read(a)?,
        None => None,
    };
    let known = known_config_dirs(&root, &selection.kata_prefix, &selection.only, &[]);
    let mut out = Uninstalled { leftovers: sweep_leftovers(&root, addons.as_ref(), &known)?, ..Default::default() };
    if let Some(st) = &st {
        for p in st.drop_ins.iter().map(|d| &d.path).chain(&st.previous_drop_ins) {
            match state::validate::remove_drop_in(&root, p)? {
                state::validate::DropInRemoval::Removed => {
                    tracing::info!(drop_in = %p, "removed drop-in");
                    out.drop_ins.push(p.clone());
                }
                state::validate::DropInRemoval::NotOurs => out.left_alone.push(p.clone()),
                state::validate::DropInRemoval::Absent => {}
            }
        }
    }
    // Drop-ins no state records: a lost state, or one older than the drop-in.
    for d in &known {
        let p = node::node_path(&d.join(CONFIG_D).join(DROP_IN_NAME));
        if out.drop_ins.contains(&p) || out.left_alone.contains(&p) {
            continue;
        }
        match state::validate::remove_drop_in(&root, &p) {
            Ok(state::validate::DropInRemoval::Removed) => {
                tracing::info!(drop_in = %p, "removed a kata-addons drop-in no state recorded");
                out.drop_ins.push(p);
            }
            Ok(state::validate::DropInRemoval::NotOurs) => out.left_alone.push(p),
            Ok(state::validate::DropInRemoval::Absent) => {}
            Err(e) => {
                tracing::warn!(drop_in = %p, "left alone: cannot inspect it: {e:#}");
                out.left_alone.push(p);
            }
        }
    }
    let Some(addons) = addons else { return Ok(out) };
    if let Some(st) = &st {
        for d in std::iter::once(&st.version_dir).chain(&st.previous_dirs) {
            if addons.symlink_metadata(d).is_ok() {
                remove_entry(&addons, d)?;
                tracing::info!(dir = %d, "removed version directory");
                out.dirs.push(d.clone());
            }
        }
    }
    for d in version_dirs(&addons)? {
        remove_entry(&addons, &d)?;
        tracing::info!(dir = %d, "removed a version directory no state recorded");
        out.dirs.push(d);
    }
    if st.is_some() {
        addons.remove_file(state::STATE_FILE).context("removing the state file")?;
    }
    // A dead owner's record goes with the rest; a live (forced) owner keeps its own.
    if !live_owner && owner::remove(&addons)? {
        tracing::info!("removed the record of a daemon that no longer runs");
    }
    node::fsync_dir(&addons)?;
    for entry in addons.entries().context("listing the install directory")? {
        let entry = entry.context("listing the install directory")?;
        let p = format!("{INSTALL_DIR}/{}", entry.file_name().to_string_lossy());
        if live_owner && entry.file_name() == owner::OWNER_FILE {
            tracing::info!(path = %p, "kept: the record of the daemon that owns this node root");
            continue;
        }
        tracing::warn!(path = %p, "left alone: not something kata-addons writes");
        out.left_alone.push(p);
    }
    drop(addons);
    // The install directory is ours; remove it when it is empty (else it holds what was reported).
    let _ = root.dir().remove_dir(node::rel_path(INSTALL_DIR));
    out.state = st.map(Box::new);
    Ok(out)
}
