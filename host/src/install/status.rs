//! `status`: the node verified against the state, and the boot paths Kata will use.

use std::io::ErrorKind;

use anyhow::{Context, Result};

use super::discovery::open_addons;
use super::integrity::Finding;
use crate::kata_config;
use crate::node::{self, Root, Site};
use crate::state::{self, DropInRecord, State};

/// Result of `status`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The recorded state, if any.
    pub state: Option<State>,
    /// One line per mismatch between the node and the state.
    pub problems: Vec<String>,
    /// The boot paths Kata will use, per recorded runtime configuration, after merging
    /// the main file and every `config.d` fragment in order.
    pub effective: Vec<Effective>,
    /// The node's Kata release now (docs/design.md#node-kata-release), printed whether or
    /// not a `kataVersion` was checked.
    pub kata_release: String,
    /// Which registry configuration the node uses for the installed image and, on a
    /// containerd node, its hosts in order (`status` only, not the readiness probe).
    pub registry: Vec<String>,
}

/// The effective boot paths of one runtime configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Effective {
    /// Node path of the resolved runtime configuration.
    pub runtime_config: String,
    /// The hypervisor table our drop-in sets keys in (e.g. `hypervisor.qemu`).
    pub table: String,
    /// Effective `kernel`, with the fragment that set it.
    pub kernel: Option<kata_config::Setting>,
    /// Effective `initrd`.
    pub initrd: Option<kata_config::Setting>,
    /// Effective `image`.
    pub image: Option<kata_config::Setting>,
}

/// Merges every fragment of one recorded runtime configuration; reports fragments Kata
/// cannot load and every key of our drop-in that a later fragment overrides.
fn check_effective(
    root: &Root,
    d: &DropInRecord,
    installed: &[String],
    problems: &mut Vec<String>,
) -> Result<Option<Effective>> {
    let rc_rel = node::rel_path(&d.runtime_config);
    match root.dir().metadata(&rc_rel) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            problems.push(format!("{}: not a regular file", d.runtime_config));
            return Ok(None);
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            problems.push(format!(
                "{}: the runtime configuration is gone (Kata uninstalled?); its drop-in is restored when it returns",
                d.runtime_config
            ));
            return Ok(None);
        }
        // A symlink loop is the node's file drifting, not a failure to read the node.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            problems.push(format!("{}: a symlink loop, not a regular file", d.runtime_config));
            return Ok(None);
        }
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", d.runtime_config)),
    }
    let fragments = kata_config::fragments(root, &rc_rel)?;
    for f in &fragments {
        if let Err(why) = &f.table {
            problems.push(format!("{}: {why}", f.path));
        }
    }
    let ours = fragments.iter().find(|f| f.path == d.path).and_then(|f| f.table.as_ref().ok());
    let mut table = vec!["hypervisor".to_string(), "qemu".to_string()];
    if let Some(ours) = ours {
        let leaves = kata_config::leaves(ours);
        if let Some((k, _)) = leaves.first() {
            table = k[..k.len().saturating_sub(1)].to_vec();
        }
        for (key, _) in &leaves {
            let key_ref: Vec<&str> = key.iter().map(String::as_str).collect();
            if let Some(eff) = kata_config::effective(&fragments, &key_ref)
                && eff.from != d.path
            {
                problems.push(format!(
                    "{}: {} is {:?}, set by {} which Kata reads after {}",
                    d.runtime_config,
                    key.join("."),
                    eff.value,
                    eff.from,
                    d.path
                ));
            }
        }
    }
    let table_ref: Vec<&str> = table.iter().map(String::as_str).collect();
    problems.extend(kata_config::stale_extensions(&fragments, &d.path, &table_ref, installed));
    let get = |k: &str| {
        let mut path: Vec<&str> = table.iter().map(String::as_str).collect();
        path.push(k);
        kata_config::effective(&fragments, &path)
    };
    Ok(Some(Effective {
        runtime_config: d.runtime_config.clone(),
        table: table.join("."),
        kernel: get("kernel"),
        initrd: get("initrd"),
        image: get("image"),
    }))
}

impl Status {
    /// Exit code (docs/design.md#exit-codes): 0 healthy, 3 nothing installed, 4 drifted.
    pub fn exit_code(&self) -> u8 {
        match (&self.state, self.problems.is_empty()) {
            (None, _) => 3,
            (Some(_), true) => 0,
            (Some(_), false) => 4,
        }
    }
}

/// The state recorded on the node, read and validated without verifying anything against
/// it (no hashing): what the daemon needs to know which directories to watch.
pub fn recorded_state(site: &Site) -> Result<Option<State>> {
    let root = Root::open(&site.root)?;
    match open_addons(&root)? {
        Some(addons) => state::read(&addons),
        None => Ok(None),
    }
}

/// How `status` checks the installed artifacts (the drop-ins are always hashed: they are small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Hash every artifact against the state (`kata-addons status`).
    Hash,
    /// Presence and size only: the readiness probe (`status --ready-file`), every 30 s, where
    /// the daemon itself re-hashes a file whose metadata changed and all of them every
    /// `--verify-interval`; hashing a 2 GiB image per probe cost ~1.1 s of CPU.
    Size,
}

/// Verifies every recorded file and drop-in by sha256, that no later `config.d` fragment
/// overrides what a drop-in sets, and that every recorded RuntimeClass handler still runs
/// the configuration its drop-in was written for.
pub fn status(site: &Site, artifacts: Depth) -> Result<Status> {
    let root = Root::open(&site.root)?;
    let recorded = match open_addons(&root)? {
        Some(addons) => state::read(&addons)?,
        None => None,
    };
    let wanted = recorded.as_ref().and_then(|st| st.kata.as_ref()).and_then(crate::state::KataRecord::wanted);
    // The readiness probe (every 30 s) reads the node's RPM database only when there is a
    // `kataVersion` to check against it.
    let kata_now = match (artifacts, &wanted) {
        (Depth::Size, None) => Err("not read by the readiness probe (no kataVersion to check)".to_string()),
        _ => crate::kata_release::observe(&site.root, kata_addons_facts::DEFAULT_KATA_PREFIX),
    };
    let kata_release = match &kata_now {
        Ok(n) => n.to_string(),
        Err(e) if wanted.is_none() && artifacts == Depth::Size => e.clone(),
        Err(e) => format!("unreadable: {e}"),
    };
    let nothing = || Status {
        state: None,
        problems: vec![],
        effective: vec![],
        kata_release: kata_release.clone(),
        registry: vec![],
    };
    let Some(st) = recorded else { return Ok(nothing()) };
    let mut problems = Vec::new();
    // The node's Kata changed under an addon installed for another release.
    if let Some(w) = &wanted
        && let Err(why) = crate::kata_release::check(w, &kata_now)
    {
        let then = st.kata.as_ref().map(|k| k.node.as_str()).unwrap_or_default();
        problems.push(format!("{why} (installed when the node had {then})"));
    }
    let hashed = |path: &str, expected: &str| match node::hash_file(root.dir(), &node::rel_path(path)) {
        Ok(Some((sha, _))) if sha == expected => None,
        Ok(Some((sha, _))) => Some(format!("{path}: sha256 {sha}, expected {expected}")),
        Ok(None) => Some(format!("{path}: missing")),
        Err(e) => Some(format!("{path}: {e:#}")),
    };
    let sized = |path: &str, size: u64| match root.dir().metadata(node::rel_path(path)) {
        Ok(m) if m.is_file() && m.len() == size => None,
        Ok(m) if m.is_file() => Some(format!("{path}: {} bytes, expected {size}", m.len())),
        Ok(_) => Some(format!("{path}: not a regular file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!("{path}: missing")),
        Err(e) => Some(format!("{path}: {e}")),
    };
    for f in &st.files {
        problems.extend(match artifacts {
            Depth::Hash => match super::integrity::check(root.dir(), &node::rel_path(&f.path), f) {
                Ok(Finding::Intact) => None,
                Ok(Finding::Differs(what)) => Some(format!("{}: {what}", f.path)),
                Ok(Finding::Missing) => Some(format!("{}: missing", f.path)),
                Err(e) => Some(format!("{}: {e:#}", f.path)),
            },
            Depth::Size => sized(&f.path, f.size),
        });
    }
    for p in &st.published {
        problems.extend(match artifacts {
            Depth::Hash => hashed(&p.path, &p.sha256),
            Depth::Size => sized(&p.path, p.size),
        });
    }
    for d in &st.drop_ins {
        problems.extend(hashed(&d.path, &d.sha256));
    }
    let mut effective = Vec::new();
    let installed: Vec<String> = st.files.iter().map(|f| f.path.clone()).collect();
    for d in &st.drop_ins {
        if let Some(e) = check_effective(&root, d, &installed, &mut problems)? {
            effective.push(e);
        }
    }
    // A handler whose config path changed in the CRI configuration: the drop-in is for a
    // configuration the handler no longer runs.
    let handlers: Vec<(String, String)> =
        st.drop_ins.iter().filter_map(|d| Some((d.handler.clone()?, d.runtime_config.clone()))).collect();
    problems.extend(kata_config::drift(&root, &handlers, st.provider)?);
    let registry = match artifacts {
        Depth::Hash => crate::source::containerd_pull::status_lines(&site.root, &st.image),
        Depth::Size => Vec::new(),
    };
    Ok(Status { state: Some(st), problems, effective, kata_release, registry })
}
