//! A throwaway node root for lifecycle tests: a sample Kata configuration per provider,
//! tree snapshots, and the effective configuration Kata would compute
//! (`configuration.toml` + every `config.d` entry in lexical order, keys overridden).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::image::{Compress, Image, LayerBuilder};

/// A node root in a temp directory.
pub struct Node {
    /// The temp directory (the node's `/`).
    pub dir: tempfile::TempDir,
}

/// Base runtime configuration: sets `image`, as kata-deploy's configs do.
pub const BASE_CONFIG: &str = "[hypervisor.qemu]\npath = \"/usr/bin/qemu-system-x86_64\"\nkernel = \"/usr/share/kata-containers/vmlinuz\"\nimage = \"/usr/share/kata-containers/kata-containers.img\"\n\n[runtime]\nenable_debug = false\n";

impl Node {
    /// A node with runtime configs for `se`, `tdx` and `snp`; `se`'s is reached through an
    /// absolute symlink (as kata-deploy installs it), so `config.d` lives beside the target.
    pub fn new() -> Node {
        let dir = tempfile::tempdir().expect("node root");
        let root = dir.path();
        let defaults = root.join("opt/kata/share/defaults/kata-containers");
        std::fs::create_dir_all(&defaults).expect("mkdir defaults");
        std::fs::write(defaults.join("configuration-se.toml"), BASE_CONFIG).expect("write se config");
        std::fs::create_dir_all(root.join("etc/kata-containers/kata-se")).expect("mkdir");
        std::os::unix::fs::symlink(
            "/opt/kata/share/defaults/kata-containers/configuration-se.toml",
            root.join("etc/kata-containers/kata-se/configuration.toml"),
        )
        .expect("symlink se config");
        for p in ["tdx", "snp"] {
            let d = root.join(format!("etc/kata-containers/kata-{p}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("configuration.toml"), BASE_CONFIG).expect("write config");
        }
        Node { dir }
    }

    /// The root path.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Host path of a node path (`/etc/x` -> `<root>/etc/x`).
    pub fn path(&self, node_path: &str) -> PathBuf {
        self.root().join(node_path.trim_start_matches('/'))
    }

    /// The directory of the resolved runtime config of a provider.
    pub fn config_dir(&self, provider: &str) -> PathBuf {
        match provider {
            "se" => self.path("/opt/kata/share/defaults/kata-containers"),
            p => self.path(&format!("/etc/kata-containers/kata-{p}")),
        }
    }

    /// Names of the entries in a provider's `config.d` (sorted).
    pub fn config_d_entries(&self, provider: &str) -> Vec<String> {
        let d = self.config_dir(provider).join("config.d");
        let mut v: Vec<String> = match std::fs::read_dir(&d) {
            Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
            Err(_) => Vec::new(),
        };
        v.sort();
        v
    }

    /// The effective configuration of a provider, as Kata computes it.
    pub fn effective(&self, provider: &str) -> toml::Table {
        let dir = self.config_dir(provider);
        let base_name = if provider == "se" { "configuration-se.toml" } else { "configuration.toml" };
        let base = std::fs::read_to_string(dir.join(base_name)).expect("base config");
        let mut doc: toml::Table = toml::from_str(&base).expect("base config parses");
        for name in self.config_d_entries(provider) {
            let text = std::fs::read_to_string(dir.join("config.d").join(&name)).expect("drop-in readable");
            let drop: toml::Table =
                toml::from_str(&text).unwrap_or_else(|e| panic!("config.d/{name} is not valid TOML: {e}\n{text}"));
            merge(&mut doc, drop);
        }
        doc
    }

    /// A `[hypervisor.qemu]` key of the effective configuration.
    pub fn qemu_key(&self, provider: &str, key: &str) -> Option<String> {
        let doc = self.effective(provider);
        doc.get("hypervisor")?.get("qemu")?.get(key)?.as_str().map(str::to_string)
    }

    /// Content, mode, inode and mtime of every entry under the root (directories included).
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        snapshot(self.root())
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}

/// Keys of `over` override those of `base`; tables merge recursively.
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Every entry under `root` with its type, mode, size, inode, mtime and content hash:
/// equal snapshots mean nothing was written.
pub fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, true, &mut out);
    out
}

/// Type, mode and content of every entry under `root`, empty directories left out: for
/// "identical apart from empty directories" comparisons.
pub fn content_snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    walk(root, root, false, &mut all);
    let non_dirs: Vec<String> = all.iter().filter(|(_, v)| !v.starts_with("dir ")).map(|(k, _)| k.clone()).collect();
    all.retain(|k, v| !v.starts_with("dir ") || non_dirs.iter().any(|o| o.starts_with(&format!("{k}/"))));
    all
}

fn walk(root: &Path, dir: &Path, identity: bool, out: &mut BTreeMap<String, String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let rel = p.strip_prefix(root).map(|r| r.display().to_string()).unwrap_or_default();
        let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
        let desc = if m.file_type().is_symlink() {
            format!("link -> {}", std::fs::read_link(&p).map(|t| t.display().to_string()).unwrap_or_default())
        } else if m.is_dir() {
            format!("dir {:o}", m.mode() & 0o7777)
        } else {
            let data = std::fs::read(&p).unwrap_or_default();
            let id = if identity {
                format!(" ino={} mtime={}.{}", m.ino(), m.mtime(), m.mtime_nsec())
            } else {
                String::new()
            };
            format!("file {:o} {}{id} sha={}", m.mode() & 0o7777, m.len(), crate::sha256_hex(&data))
        };
        out.insert(rel, desc);
        if m.is_dir() && !m.file_type().is_symlink() {
            walk(root, &p, identity, out);
        }
    }
}

/// An OCI layout with `files` (in-image path without leading `/`, content) in a top layer
/// above a base layer, written to `dir` with `tag`. Returns the manifest digest.
pub fn layout_with(dir: &Path, tag: &str, files: &[(&str, &[u8])]) -> String {
    let base = LayerBuilder::new().dir("etc").file("etc/os-release", b"ID=test\n").build(Compress::Gzip);
    let mut top = LayerBuilder::new();
    for (p, data) in files {
        top.file(p, data);
    }
    let img = Image::new(vec![base, top.build(Compress::Gzip)]);
    img.write_layout(dir, tag);
    img.digest()
}

/// Deterministic pseudo-random bytes (incompressible, like a compressed kernel).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
