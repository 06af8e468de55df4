//! Validation of a state record against the layout contract (docs/design.md#host-layout)
//! before any of its paths is acted on, and the one way a recorded drop-in is removed.
//!
//! A state file is input like any other: it may be damaged or written by someone else.
//! Every path field must name something kata-addons could have written:
//! - drop-ins: `<runtime config dir>/config.d/50-kata-addons.toml`, absolute, normalised;
//! - version directories: a plain name made of the version grammar (`[A-Za-z0-9._+-]`,
//!   starting with a letter or digit), never `.`, `..`, empty, or containing `/`;
//! - files: `<install dir>/<version dir>/<plain name>`.
//!
//! A record that fails is refused as a whole (exit 1), naming the field; nothing is changed.

use std::io::{ErrorKind, Read};

use anyhow::{Result, anyhow, bail};
use cap_std::fs::Dir;

use kata_addons_facts::{DROP_IN_NAME, HEADER, INSTALL_DIR};

use crate::node::{self, Root};

/// Largest state file accepted.
pub(crate) const MAX_STATE_BYTES: u64 = 1 << 20;

/// Longest version directory name accepted (version ≤ 128 + `-` + 12 hex + suffix).
const MAX_DIR_NAME: usize = 200;

/// What to do about a state file that cannot be used: the same advice for every refusal.
pub(crate) const START_OVER: &str = "inspect and repair it, or remove it and run `kata-addons uninstall` (with the \
    --kata-prefix and --runtime-config install was given, if any): without a state it removes every drop-in \
    carrying kata-addons' header at <runtime config dir>/config.d/50-kata-addons.toml of every known runtime \
    configuration and the version directories under /etc/kata-containers/addons";

/// Longest text accepted in the recorded Kata release fields.
const MAX_KATA_TEXT: usize = 1024;

/// The recorded Kata release: short printable text only (it is printed by `status`), a
/// `kataVersion` in the RPM version and release grammar (`[A-Za-z0-9._+~^]`).
pub(crate) fn check_kata(k: &crate::state::KataRecord) -> Result<()> {
    if k.node.len() > MAX_KATA_TEXT || k.node.chars().any(char::is_control) {
        return Err(refuse("kata.node", &k.node, "is not a short line of printable text"));
    }
    for (field, v) in [("kata.version", &k.version), ("kata.release", &k.release)] {
        if let Some(v) = v
            && (v.is_empty() || v.len() > 128 || !v.chars().all(|c| c.is_ascii_alphanumeric() || "._+~^".contains(c)))
        {
            return Err(refuse(field, v, "is not an RPM version or release ([A-Za-z0-9._+~^], at most 128)"));
        }
    }
    if k.version.is_none() && k.release.is_some() {
        return Err(refuse("kata.release", k.release.as_deref().unwrap_or_default(), "is set without kata.version"));
    }
    Ok(())
}

fn refuse(field: &str, value: &str, why: &str) -> anyhow::Error {
    let shown: String = value.chars().take(200).collect();
    anyhow!(
        "the state file {INSTALL_DIR}/state.json is refused: `{field}` = {shown:?} {why}; nothing was changed ({START_OVER})"
    )
}

/// Reads the state file text, refusing one above [`MAX_STATE_BYTES`]; `None` if absent.
pub(crate) fn read_capped(dir: &Dir, name: &str) -> Result<Option<String>> {
    let f = match node::open_regular(dir, std::path::Path::new(name)) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) => return Err(e.context(format!("reading the state file {INSTALL_DIR}/{name}"))),
    };
    let mut text = String::new();
    f.take(MAX_STATE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| anyhow!(e).context(format!("reading the state file {INSTALL_DIR}/{name} (UTF-8 JSON)")))?;
    if text.len() as u64 > MAX_STATE_BYTES {
        bail!(
            "the state file {INSTALL_DIR}/{name} is larger than {MAX_STATE_BYTES} bytes: refused; nothing was \
             changed ({START_OVER})"
        );
    }
    Ok(Some(text))
}

/// A clean absolute node path (the shared grammar: `kata_addons_facts::check_path`).
pub(crate) fn check_node_path(field: &str, p: &str) -> Result<()> {
    use kata_addons_facts::PathError;
    match kata_addons_facts::check_path(p) {
        Ok(()) => Ok(()),
        Err(PathError::Relative(_)) => Err(refuse(field, p, "is not an absolute path")),
        Err(PathError::TooLong(_) | PathError::Control(..)) => {
            Err(refuse(field, p, "is too long or has control characters"))
        }
        Err(_) => Err(refuse(field, p, "is not a normalised path (no `.`, `..`, `//` or trailing `/`)")),
    }
}

/// A drop-in path: `<dir>/config.d/50-kata-addons.toml`, `<dir>` not the root.
pub(crate) fn check_drop_in_path(field: &str, p: &str) -> Result<()> {
    check_node_path(field, p)?;
    let suffix = format!("/config.d/{DROP_IN_NAME}");
    match p.strip_suffix(&suffix) {
        Some(dir) if !dir.is_empty() => Ok(()),
        _ => {
            Err(refuse(field, p, &format!("is not a runtime configuration's drop-in (<dir>/config.d/{DROP_IN_NAME})")))
        }
    }
}

/// A runtime configuration path (`<dir>/configuration*.toml`) and its drop-in beside it.
pub(crate) fn check_runtime_config(field: &str, config: &str, drop_in: &str) -> Result<()> {
    check_node_path(field, config)?;
    let (dir, name) = config.rsplit_once('/').unwrap_or(("", config));
    if dir.is_empty() || !kata_addons_facts::is_configuration_file_name(name) {
        return Err(refuse(field, config, "is not a Kata runtime configuration (<dir>/configuration*.toml)"));
    }
    if drop_in != format!("{dir}/config.d/{DROP_IN_NAME}") {
        return Err(refuse(field, config, &format!("does not match its drop-in {drop_in:?}")));
    }
    Ok(())
}

/// A version directory name: plain, of the version grammar, not the state file.
pub(crate) fn check_version_dir(field: &str, name: &str) -> Result<()> {
    let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    let all_ok = name.bytes().all(kata_addons_facts::is_version_char);
    if !first_ok || !all_ok || name.len() > MAX_DIR_NAME {
        return Err(refuse(
            field,
            name,
            "is not a version directory name (a plain name of [A-Za-z0-9._+-], starting with a letter or digit)",
        ));
    }
    if name == crate::state::STATE_FILE {
        return Err(refuse(field, name, "names the state file"));
    }
    Ok(())
}

/// An installed file's node path: `<install dir>/<version dir>/<plain name>`.
pub(crate) fn check_file_path(field: &str, p: &str, version_dir: &str) -> Result<()> {
    check_node_path(field, p)?;
    let name = p.strip_prefix(&format!("{INSTALL_DIR}/{version_dir}/")).unwrap_or_default();
    if !kata_addons_facts::is_plain_file_name(name) {
        return Err(refuse(field, p, &format!("is not a file of the version directory {INSTALL_DIR}/{version_dir}")));
    }
    Ok(())
}

/// Whether `text` starts with the header every kata-addons drop-in carries.
pub(crate) fn is_ours(text: &[u8]) -> bool {
    text.starts_with(HEADER.as_bytes())
}

/// What [`remove_drop_in`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropInRemoval {
    /// Removed.
    Removed,
    /// Nothing there.
    Absent,
    /// Left alone: not a regular file, or without kata-addons' header.
    NotOurs,
}

/// Removes the drop-in at node path `p` (already checked with [`check_drop_in_path`]) if it
/// is a regular file carrying kata-addons' header, whatever the state says of it: a state
/// is input, and a file kata-addons did not write is never deleted.
pub(crate) fn remove_drop_in(root: &Root, p: &str) -> Result<DropInRemoval> {
    let rel = node::rel_path(p);
    let meta = match root.dir().symlink_metadata(&rel) {
        Ok(m) => m,
        // ENOTDIR: a path component (`config.d`) is a file, so there is no drop-in either.
        Err(e) if node::is_absent(&e) => {
            return Ok(DropInRemoval::Absent);
        }
        Err(e) => return Err(anyhow!(e).context(format!("inspecting drop-in {p}"))),
    };
    if !meta.is_file() {
        tracing::warn!(drop_in = %p, "not a regular file: left alone");
        return Ok(DropInRemoval::NotOurs);
    }
    if !carries_header(root, p)? {
        tracing::warn!(drop_in = %p, "does not carry the kata-addons header: left alone");
        return Ok(DropInRemoval::NotOurs);
    }
    match root.dir().remove_file(&rel) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(DropInRemoval::Absent),
        Err(e) => return Err(anyhow!(e).context(format!("removing drop-in {p}"))),
    }
    if let Some(parent) = rel.parent()
        && let Ok(d) = root.dir().open_dir(parent)
    {
        node::fsync_dir(&d)?;
    }
    Ok(DropInRemoval::Removed)
}

/// Whether the regular file at node path `p` starts with kata-addons' drop-in header.
pub(crate) fn carries_header(root: &Root, p: &str) -> Result<bool> {
    let rel = node::rel_path(p);
    let mut head = Vec::new();
    let f = node::open_regular(root.dir(), &rel)
        .and_then(|f| f.ok_or_else(|| anyhow!("it is gone")))
        .map_err(|e| e.context(format!("opening drop-in {p}")))?;
    f.take(HEADER.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| anyhow!(e).context(format!("reading drop-in {p}")))?;
    Ok(is_ours(&head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_against_the_contract() {
        let ok = "/etc/kata-containers/kata-se/config.d/50-kata-addons.toml";
        assert!(check_drop_in_path("d", ok).is_ok());
        for bad in [
            "/etc/kata-containers/kata-se/configuration.toml",
            "/etc/kata-containers/kata-se/config.d/../configuration.toml",
            "/config.d/50-kata-addons.toml",
            "etc/x/config.d/50-kata-addons.toml",
            "/etc/x//config.d/50-kata-addons.toml",
            "/etc/x/config.d/50-kata-addons.toml/",
        ] {
            let e = check_drop_in_path("dropIn.path", bad).expect_err(bad);
            assert!(format!("{e}").contains("`dropIn.path`"), "{e}");
        }
        assert!(check_runtime_config("r", "/etc/kata-containers/kata-se/configuration.toml", ok).is_ok());
        assert!(check_runtime_config("r", "/etc/kata-containers/kata-tdx/configuration.toml", ok).is_err());
        assert!(check_runtime_config("r", "/etc/kata-containers/kata-se/passwd", ok).is_err());
        for good in ["v1-0123456789ab", "1.0+x_y-0123456789ab.2"] {
            assert!(check_version_dir("versionDir", good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "x/..", "a/b", ".staging-1", "state.json", "-x"] {
            assert!(check_version_dir("versionDir", bad).is_err(), "{bad:?}");
        }
        assert!(check_file_path("f", "/etc/kata-containers/addons/v1-0/vmlinuz", "v1-0").is_ok());
        assert!(check_file_path("f", "/etc/kata-containers/addons/v1-0/../x", "v1-0").is_err());
        assert!(check_file_path("f", "/etc/shadow", "v1-0").is_err());
    }
}
