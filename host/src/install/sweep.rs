//! What killed runs leave behind (docs/design.md#atomic-switch keeps it out of `config.d`,
//! but it still takes space): staging directories and temporary state files in the install
//! directory, temporary drop-ins beside runtime configurations. Only names this program
//! makes are touched, and only when the process named in them is gone.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cap_std::fs::Dir;

use kata_addons_facts::{DROP_IN_NAME, INSTALL_DIR};

use crate::node::{self, Root, remove_entry};
use crate::state;

/// Prefix of staging directories inside the install directory (`.staging-<pid>`).
pub(super) const STAGING_PREFIX: &str = ".staging-";

/// What follows `.<drop-in name>` in a temporary drop-in beside a runtime configuration:
/// `.50-kata-addons.toml.kata-addons-tmp-<pid>` (without `-<pid>`: the name releases
/// before this one used, written only under the node lock).
const TMP_DROP_IN_SUFFIX: &str = ".kata-addons-tmp";

/// Prefix of the state file's temporary name (`node::write_atomic`: `.state.json.tmp-<pid>`).
fn state_tmp_prefix() -> String {
    format!(".{}.tmp-", state::STATE_FILE)
}

/// The temporary name this process stages drop-ins under, beside each `config.d`.
pub(super) fn tmp_drop_in_name(drop_in_name: &str) -> String {
    format!(".{drop_in_name}{TMP_DROP_IN_SUFFIX}-{}", std::process::id())
}

/// The owner pid of a leftover name's `<pid>` suffix, parsed strictly: decimal digits only,
/// no sign, no leading zero, 1 to `i32::MAX`. Anything else is not a name this program makes.
fn owner_pid(suffix: &str) -> Option<i32> {
    if suffix.is_empty() || suffix.len() > 10 || !suffix.bytes().all(|b| b.is_ascii_digit()) || suffix.starts_with('0')
    {
        return None;
    }
    suffix.parse::<i32>().ok().filter(|p| *p > 0)
}

/// Whether the leftover of process `pid` may be removed: this process (which has created
/// nothing yet when the sweep runs), or a process that no longer exists. A live process'
/// leftovers are left alone (under the node lock that cannot be another kata-addons run,
/// but a pid reused by anything else is not guessed about).
fn owner_gone(pid: i32) -> bool {
    if u32::try_from(pid).is_ok_and(|p| p == std::process::id()) {
        return true;
    }
    match rustix::process::Pid::from_raw(pid) {
        Some(p) => rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH),
        None => false,
    }
}

/// Removes what killed runs left behind (docs/design.md#atomic-switch keeps them out of
/// `config.d`, but they still take space): staging directories and temporary state and
/// owner files in the install directory, temporary drop-ins beside the runtime
/// configurations of `dirs`. Only names this program makes are touched, and only when their
/// owner process is gone. Returns the node paths removed.
pub(super) fn sweep_leftovers(root: &Root, addons: Option<&Dir>, dirs: &[PathBuf]) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    if let Some(addons) = addons {
        let state_tmp = state_tmp_prefix();
        let owner_tmp = format!(".{}.tmp-", super::owner::OWNER_FILE);
        for entry in addons.entries().context("listing the install directory")? {
            let entry = entry.context("listing the install directory")?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
            let Some(suffix) = name
                .strip_prefix(STAGING_PREFIX)
                .or_else(|| name.strip_prefix(state_tmp.as_str()))
                .or_else(|| name.strip_prefix(owner_tmp.as_str()))
            else {
                continue;
            };
            match owner_pid(suffix) {
                Some(pid) if owner_gone(pid) => {
                    remove_entry(addons, &name)?;
                    tracing::info!(step = "sweep", leftover = %name, pid, "removed what a killed run left in the install directory");
                    removed.push(format!("{}/{name}", INSTALL_DIR));
                }
                Some(pid) => {
                    tracing::warn!(leftover = %name, pid, "left alone: process {pid} is running")
                }
                None => tracing::warn!(leftover = %name, "left alone: not a name kata-addons makes"),
            }
        }
        if !removed.is_empty() {
            node::fsync_dir(addons)?;
        }
    }
    let legacy = format!(".{DROP_IN_NAME}{TMP_DROP_IN_SUFFIX}");
    let prefix = format!("{legacy}-");
    for d in dirs {
        // Not our directory: what cannot be read here is warned about, never fatal.
        match sweep_config_dir(root, d, &legacy, &prefix, &mut removed) {
            Ok(()) => {}
            Err(e) => tracing::warn!(dir = %node::node_path(d), "not swept for leftovers: {e:#}"),
        }
    }
    Ok(removed)
}

/// Removes the temporary drop-ins of dead processes (and the legacy fixed name) in the
/// runtime configuration directory `d`, adding their node paths to `removed`.
fn sweep_config_dir(root: &Root, d: &Path, legacy: &str, prefix: &str, removed: &mut Vec<String>) -> Result<()> {
    let dir = match root.dir().open_dir(d) {
        Ok(dir) => dir,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", node::node_path(d))),
    };
    let mut here = false;
    for entry in dir.entries().with_context(|| format!("listing {}", node::node_path(d)))? {
        let entry = entry.with_context(|| format!("listing {}", node::node_path(d)))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let stale = if name == legacy {
            true
        } else if let Some(suffix) = name.strip_prefix(prefix) {
            owner_pid(suffix).is_some_and(owner_gone)
        } else {
            continue;
        };
        let path = node::node_path(&d.join(&name));
        if !stale || !entry.file_type().with_context(|| format!("inspecting {path}"))?.is_file() {
            tracing::warn!(leftover = %path, "left alone: owned by a running process, or not a regular file");
            continue;
        }
        dir.remove_file(&name).with_context(|| format!("removing {path}"))?;
        tracing::info!(step = "sweep", leftover = %path, "removed a temporary drop-in a killed run left");
        removed.push(path);
        here = true;
    }
    if here {
        node::fsync_dir(&dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pids_are_parsed_strictly() {
        assert_eq!(owner_pid("1234"), Some(1234));
        assert_eq!(owner_pid("2147483647"), Some(i32::MAX));
        for bad in ["", "0", "01", "-1", "+1", "12a", "1 ", " 1", "2147483648", "99999999999", "1.0", "\u{0661}"] {
            assert_eq!(owner_pid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn own_and_dead_owners_are_gone_live_ones_not() {
        assert!(owner_gone(i32::try_from(std::process::id()).expect("pid")));
        let mut c = std::process::Command::new("true").spawn().expect("spawn");
        let pid = i32::try_from(c.id()).expect("pid");
        c.wait().expect("wait");
        assert!(owner_gone(pid));
        let mut live = std::process::Command::new("sleep").arg("30").spawn().expect("spawn");
        assert!(!owner_gone(i32::try_from(live.id()).expect("pid")));
        let _ = live.kill();
        let _ = live.wait();
    }
}
