//! Which Kata runtime configurations exist on this node: the one place that turns the
//! plan's candidate paths (chosen by the policy) into resolved files under `--root`.
//!
//! Kata reads `config.d` beside the *resolved* `configuration*.toml` (symlinks followed),
//! so every candidate is resolved inside the root the way the node would resolve it, and
//! two candidates that resolve to the same file are one runtime configuration.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::node::{self, Root};
use crate::nodefs::{Budget, FilePath, Kind, MAX_DIR_ENTRIES, NodeFs};

/// Name of the drop-in directory beside a runtime configuration.
pub(crate) use kata_addons_facts::CONFIG_D;

/// One runtime configuration found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// The path that led here (a plan candidate), as the node names it.
    pub named: String,
    /// Root-relative path of the resolved file.
    pub rel: PathBuf,
    /// Node path of the resolved file.
    pub resolved: String,
}

impl RuntimeConfig {
    /// Root-relative path of the directory holding the resolved file.
    pub(crate) fn dir_rel(&self) -> PathBuf {
        self.rel.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    /// Root-relative path of the `config.d` the runtime reads for this configuration.
    pub(crate) fn config_d_rel(&self) -> PathBuf {
        self.dir_rel().join(CONFIG_D)
    }
}

/// Which runtime configurations get the drop-in: the candidates of kata-deploy's prefix
/// (`--kata-prefix`), narrowed or widened by the caller (`--runtime-config`,
/// `--allow-shared-config-d`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// kata-deploy's installation prefix on the node.
    pub kata_prefix: String,
    /// Node paths the set is restricted to (each a candidate, or a path resolving to one).
    pub only: Vec<String>,
    /// Write into a `config.d` that other `configuration*.toml` files also read.
    pub allow_shared_config_d: bool,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            kata_prefix: kata_addons_facts::DEFAULT_KATA_PREFIX.to_string(),
            only: Vec::new(),
            allow_shared_config_d: false,
        }
    }
}

/// Resolves one node path inside the root; `Some` if it leads to a regular file.
pub(crate) fn resolve_file(root: &Root, node_path: &str) -> Result<Option<RuntimeConfig>> {
    let rel = root.resolve(node_path).with_context(|| format!("resolving the runtime config {node_path}"))?;
    match root.dir().metadata(&rel) {
        Ok(m) if m.is_file() => {
            Ok(Some(RuntimeConfig { named: node_path.to_string(), resolved: node::node_path(&rel), rel }))
        }
        Ok(_) => bail!("the runtime config {node_path} (resolved to {}) is not a regular file", node::node_path(&rel)),
        // A dangling symlink (kata-deploy removed `runtimes/<shim>`) is "not installed".
        Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc_enotdir()) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("inspecting {}", node::node_path(&rel))),
    }
}

/// `ENOTDIR`: a path component that is a file, which also means "not there".
fn libc_enotdir() -> i32 {
    rustix::io::Errno::NOTDIR.raw_os_error()
}

/// Every candidate that exists on the node as a regular file, in candidate order,
/// one entry per resolved file. Never fails because nothing was found.
pub(crate) fn existing(root: &Root, candidates: &[String]) -> Result<Vec<RuntimeConfig>> {
    let mut out: Vec<RuntimeConfig> = Vec::new();
    for c in candidates {
        if let Some(rc) = resolve_file(root, c)?
            && !out.iter().any(|o| o.rel == rc.rel)
        {
            out.push(rc);
        }
    }
    Ok(out)
}

/// The other `configuration*.toml` files that read the same `config.d` as `rc`: entries of
/// its directory that resolve to a different regular file in that same directory.
pub(crate) fn sharing_config_d(root: &Root, rc: &RuntimeConfig) -> Result<Vec<String>> {
    let dir_rel = rc.dir_rel();
    let fs = NodeFs::open(root.path())?;
    let entries = fs.list(&FilePath::Node(node::node_path(&dir_rel)))?.unwrap_or_default();
    let mut others = Vec::new();
    for entry in entries {
        let name = entry.name.as_str();
        if !kata_addons_facts::is_configuration_file_name(name) {
            continue;
        }
        let path = node::node_path(&dir_rel.join(name));
        if let Some(other) = resolve_file(root, &path)?
            && other.rel != rc.rel
            && other.dir_rel() == dir_rel
        {
            others.push(other.resolved);
        }
    }
    others.sort();
    others.dedup();
    Ok(others)
}

/// The runtime configurations to install for: every candidate found (restricted by
/// `--runtime-config`), one per `config.d`. Errors when none is found (listing where it
/// looked), when a `--runtime-config` is not among them, and when a `config.d` is shared
/// with other configurations (naming them) unless that is explicitly allowed.
pub(crate) fn discover(root: &Root, candidates: &[String], sel: &Selection) -> Result<Vec<RuntimeConfig>> {
    let found = existing(root, candidates)?;
    let mut chosen: Vec<RuntimeConfig> = if sel.only.is_empty() {
        found.clone()
    } else {
        let mut chosen = Vec::new();
        for want in &sel.only {
            let hit = match resolve_file(root, want)? {
                Some(w) => found.iter().find(|f| f.named == *want || f.rel == w.rel),
                None => None,
            };
            match hit {
                Some(h) if !chosen.contains(h) => chosen.push(h.clone()),
                Some(_) => {}
                None => bail!(
                    "--runtime-config {want} is not one of this provider's runtime configurations found on the node \
                     (found: {}; candidates: {})",
                    list_or_none(found.iter().map(|f| f.resolved.as_str())),
                    candidates.join(", ")
                ),
            }
        }
        chosen
    };
    if chosen.is_empty() {
        bail!(
            "the Kata runtime for this provider is not installed on this node: no runtime configuration found \
             (under {}); looked at: {}",
            root.path().display(),
            candidates.join(", ")
        );
    }
    // One drop-in per config.d.
    let mut seen: Vec<PathBuf> = Vec::new();
    chosen.retain(|rc| {
        let d = rc.config_d_rel();
        if seen.contains(&d) {
            false
        } else {
            seen.push(d);
            true
        }
    });
    if !sel.allow_shared_config_d {
        for rc in &chosen {
            let others = sharing_config_d(root, rc)?;
            if !others.is_empty() {
                bail!(
                    "refusing to write into {}: it is read by {} and also by {} (a shared config.d, as in kata-deploy \
                     layouts before 2026), so the addon would change every one of them; pass --allow-shared-config-d \
                     to accept that, or --runtime-config to choose other configurations",
                    node::node_path(&rc.config_d_rel()),
                    rc.resolved,
                    others.join(", ")
                );
            }
        }
    }
    Ok(chosen)
}

/// Largest fragment read when computing the effective configuration.
const MAX_FRAGMENT: u64 = 1 << 20;

/// One file Kata reads for a runtime configuration, parsed (or why it does not parse).
#[derive(Debug, Clone)]
pub(crate) struct Fragment {
    /// Node path of the file.
    pub path: String,
    /// Its TOML table, or the reason Kata would fail to load it.
    pub table: std::result::Result<toml::Table, String>,
}

/// What Kata reads for a runtime configuration, in the order it applies it: the resolved
/// main file, then every entry of `config.d` in byte order of the name, whatever the name.
pub(crate) fn fragments(root: &Root, rc_rel: &Path) -> Result<Vec<Fragment>> {
    let mut out = vec![read_fragment(root, rc_rel)?];
    let config_d = rc_rel.parent().map(Path::to_path_buf).unwrap_or_default().join(CONFIG_D);
    let fs = NodeFs::open(root.path())?;
    let mut walk = fs.walk("a runtime configuration's config.d", CONFIG_D_BUDGET);
    let Some(entries) = walk.list(&FilePath::Node(node::node_path(&config_d)))? else { return Ok(out) };
    for e in entries {
        let table = match e.kind {
            // A dangling symlink: Kata cannot read it either.
            None => Err("unreadable (a dangling symlink): Kata fails to load this configuration".to_string()),
            Some(Kind::File) => match walk.read_all(&e.path, MAX_FRAGMENT) {
                Ok(Some(bytes)) => match String::from_utf8(bytes) {
                    Ok(text) => toml::from_str::<toml::Table>(&text)
                        .map_err(|e| format!("not valid TOML, Kata fails to load this configuration: {}", e.message())),
                    Err(_) => Err("not UTF-8 text: Kata fails to load this configuration".to_string()),
                },
                Ok(None) => Err("unreadable (gone while it was read)".to_string()),
                Err(err) => Err(format!("{err:#}; not read")),
            },
            Some(_) => Err("not a regular file: Kata fails to load this configuration".to_string()),
        };
        out.push(Fragment { path: e.path.to_string(), table });
    }
    Ok(out)
}

/// What reading one `config.d` may cost: kata-deploy writes a handful of small fragments.
const CONFIG_D_BUDGET: Budget = Budget { entries: MAX_DIR_ENTRIES, files: 256, bytes: 16 << 20, depth: 0 };

fn read_fragment(root: &Root, rel: &Path) -> Result<Fragment> {
    let path = node::node_path(rel);
    let meta = match root.dir().metadata(rel) {
        Ok(m) => m,
        // A dangling symlink or an entry leading outside the root: Kata cannot read it either.
        Err(e) => {
            return Ok(Fragment {
                path,
                table: Err(format!("unreadable ({e}): Kata fails to load this configuration")),
            });
        }
    };
    let table = if !meta.is_file() {
        Err("not a regular file: Kata fails to load this configuration".to_string())
    } else if meta.len() > MAX_FRAGMENT {
        Err(format!("larger than {MAX_FRAGMENT} bytes; not read"))
    } else {
        let text = root.dir().read_to_string(rel).with_context(|| format!("reading {path}"))?;
        toml::from_str::<toml::Table>(&text)
            .map_err(|e| format!("not valid TOML, Kata fails to load this configuration: {}", e.message()))
    };
    Ok(Fragment { path, table })
}

/// The effective value of one key after Kata merges the fragments (tables merge, later
/// values win), and the fragment it comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Setting {
    /// The value (strings as themselves, other values in TOML syntax).
    pub value: String,
    /// Node path of the fragment that set it last.
    pub from: String,
}

/// Looks up a dotted key path through the fragments: the last fragment that sets it wins.
pub(crate) fn effective(fragments: &[Fragment], key: &[&str]) -> Option<Setting> {
    effective_value(fragments, key).map(|(v, from)| Setting {
        value: v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()),
        from: from.to_string(),
    })
}

/// The TOML value of a dotted key path in effect after Kata merges the fragments, and the
/// node path of the fragment that set it last.
pub(crate) fn effective_value<'a>(fragments: &'a [Fragment], key: &[&str]) -> Option<(&'a toml::Value, &'a str)> {
    let mut found = None;
    for f in fragments {
        let Ok(table) = &f.table else { continue };
        let mut cur: Option<&toml::Value> = None;
        let mut t = Some(table);
        for k in key {
            cur = t.and_then(|t| t.get(*k));
            t = cur.and_then(toml::Value::as_table);
        }
        if let Some(v) = cur {
            found = Some((v, f.path.as_str()));
        }
    }
    found
}

/// Every leaf key path (dotted) of a table with its value, in order.
pub(crate) fn leaves(table: &toml::Table) -> Vec<(Vec<String>, toml::Value)> {
    let mut out = Vec::new();
    fn walk(prefix: &mut Vec<String>, t: &toml::Table, out: &mut Vec<(Vec<String>, toml::Value)>) {
        for (k, v) in t {
            prefix.push(k.clone());
            match v {
                toml::Value::Table(sub) => walk(prefix, sub, out),
                other => out.push((prefix.clone(), other.clone())),
            }
            prefix.pop();
        }
    }
    walk(&mut Vec::new(), table, &mut out);
    out
}

fn list_or_none<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = items.collect();
    if v.is_empty() { "none".to_string() } else { v.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, "[hypervisor.qemu]\n").expect("write");
    }

    #[test]
    fn finds_dedups_restricts_and_refuses_shared() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let r = tmp.path();
        let d = "opt/kata/share/defaults/kata-containers";
        write(r, &format!("{d}/runtimes/qemu-tdx/configuration-qemu-tdx.toml"));
        std::os::unix::fs::symlink(
            "runtimes/qemu-tdx/configuration-qemu-tdx.toml",
            r.join(format!("{d}/configuration-qemu-tdx.toml")),
        )
        .expect("symlink");
        // A dangling symlink is "not installed".
        std::fs::create_dir_all(r.join(format!("{d}/runtime-rs"))).expect("mkdir");
        std::os::unix::fs::symlink("runtimes/gone/x.toml", r.join(format!("{d}/runtime-rs/configuration-x.toml")))
            .expect("symlink");
        let root = Root::open(r).expect("root");
        let cands: Vec<String> = [
            "/etc/kata-containers/kata-tdx/configuration.toml".to_string(),
            format!("/{d}/configuration-qemu-tdx.toml"),
            format!("/{d}/runtimes/qemu-tdx/configuration-qemu-tdx.toml"),
            format!("/{d}/runtime-rs/configuration-x.toml"),
        ]
        .into();
        let got = discover(&root, &cands, &Selection::default()).expect("discover");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].resolved, format!("/{d}/runtimes/qemu-tdx/configuration-qemu-tdx.toml"));
        assert_eq!(got[0].named, format!("/{d}/configuration-qemu-tdx.toml"));

        let only = Selection {
            only: vec![format!("/{d}/runtimes/qemu-tdx/configuration-qemu-tdx.toml")],
            ..Default::default()
        };
        assert_eq!(discover(&root, &cands, &only).expect("restricted").len(), 1);
        let bad =
            Selection { only: vec!["/etc/kata-containers/kata-tdx/configuration.toml".into()], ..Default::default() };
        let e = format!("{:#}", discover(&root, &cands, &bad).expect_err("not found"));
        assert!(e.contains("--runtime-config /etc/kata-containers/kata-tdx/configuration.toml"), "{e}");

        let none = discover(&root, &cands[..1], &Selection::default()).expect_err("none");
        assert!(format!("{none:#}").contains("looked at: /etc/kata-containers/kata-tdx/configuration.toml"));

        // Pre-2026: plain files sharing one config.d.
        std::fs::remove_file(r.join(format!("{d}/configuration-qemu-tdx.toml"))).expect("rm");
        write(r, &format!("{d}/configuration-qemu-tdx.toml"));
        write(r, &format!("{d}/configuration-qemu.toml"));
        let shared = [format!("/{d}/configuration-qemu-tdx.toml")];
        let e = format!("{:#}", discover(&root, &shared, &Selection::default()).expect_err("shared"));
        assert!(e.contains(&format!("/{d}/configuration-qemu.toml")) && e.contains("--allow-shared-config-d"), "{e}");
        let allow = Selection { allow_shared_config_d: true, ..Default::default() };
        assert_eq!(discover(&root, &shared, &allow).expect("allowed").len(), 1);
    }
}
