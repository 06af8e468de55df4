//! The one way a configuration file is read: node files beneath `--root` resolved as the
//! node resolves them, flag-named files on the runner's own filesystem, both with one
//! capped read.
//!
//! A node path (`/etc/containers/policy.json`) is resolved by [`Root::resolve`]: every
//! symlink is followed as the node's kernel would follow it, an absolute target means the
//! node's `/` (the root) and `..` stops at the root, so nothing outside the root is ever
//! opened. The resolved path is opened through the root's directory handle (cap-std), which
//! refuses an escape even if the tree changes meanwhile. Only regular files are read
//! (opened non-blocking, so a FIFO cannot stall the runner), and at most a cap of bytes.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cap_std::fs::OpenOptionsExt;

use crate::node::{self, Root};

/// The most bytes read from one configuration file (registries.conf, policy.json, keys,
/// auth files, certificates, CA bundles: all far smaller).
pub(crate) const MAX_CONFIG_FILE: u64 = 4 << 20;

/// Where a file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FilePath {
    /// A node path (absolute, as on the node), read beneath the root.
    Node(String),
    /// A path on the runner's own filesystem, named by a flag or an environment variable.
    Local(PathBuf),
}

impl FilePath {
    /// A node path (`/etc/...`; a relative one is taken from the node's `/`).
    pub(crate) fn node(p: &str) -> FilePath {
        FilePath::Node(format!("/{}", p.trim_start_matches('/')))
    }

    /// The entry `name` of this directory.
    pub(crate) fn join(&self, name: &str) -> FilePath {
        match self {
            FilePath::Node(p) => FilePath::Node(format!("{}/{name}", p.trim_end_matches('/'))),
            FilePath::Local(p) => FilePath::Local(p.join(name)),
        }
    }
}

impl fmt::Display for FilePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FilePath::Node(p) => write!(f, "{p}"),
            FilePath::Local(p) => write!(f, "{}", p.display()),
        }
    }
}

/// What a path is, after following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// Anything else (device, FIFO, socket).
    Other,
}

impl Kind {
    fn of(is_file: bool, is_dir: bool) -> Kind {
        match (is_file, is_dir) {
            (true, _) => Kind::File,
            (_, true) => Kind::Dir,
            _ => Kind::Other,
        }
    }
}

/// One directory entry: its name, its path, and what it is (`None`: a dangling link).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The file name.
    pub name: String,
    /// The entry's path (a node path for a node directory).
    pub path: FilePath,
    /// What it is after following symlinks; `None` when the link leads nowhere.
    pub kind: Option<Kind>,
}

/// The node root, shared by everything that reads node files in one operation.
#[derive(Debug, Clone)]
pub(crate) struct NodeFs {
    root: Arc<Root>,
}

impl NodeFs {
    /// Opens the node root (`/` on the node itself, `/host` in the DaemonSet).
    pub(crate) fn open(root: &Path) -> Result<NodeFs> {
        Ok(NodeFs { root: Arc::new(Root::open(root)?) })
    }

    /// The root-relative path a node path resolves to (symlinks followed inside the root).
    fn resolve(&self, node_path: &str) -> Result<PathBuf> {
        self.root.resolve(node_path).with_context(|| format!("resolving {node_path} on the node"))
    }

    /// What `path` is (`None` when absent).
    pub(crate) fn kind(&self, path: &FilePath) -> Result<Option<Kind>> {
        let meta = match path {
            FilePath::Node(p) => {
                let rel = self.resolve(p)?;
                self.root.dir().symlink_metadata(&rel).map(|m| Kind::of(m.is_file(), m.is_dir()))
            }
            FilePath::Local(p) => std::fs::metadata(p).map(|m| Kind::of(m.is_file(), m.is_dir())),
        };
        match meta {
            Ok(k) => Ok(Some(k)),
            Err(e) if node::is_absent(&e) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("inspecting {path}")),
        }
    }

    /// Reads a regular file of at most `cap` bytes; `None` when it does not exist.
    pub(crate) fn read(&self, path: &FilePath, cap: u64) -> Result<Option<Vec<u8>>> {
        match self.kind(path)? {
            None => return Ok(None),
            Some(Kind::File) => {}
            Some(Kind::Dir) => bail!("{path} is a directory, a file was expected"),
            Some(Kind::Other) => bail!("{path} is not a regular file"),
        }
        let opened = match path {
            FilePath::Node(p) => {
                let rel = self.resolve(p)?;
                let mut o = cap_std::fs::OpenOptions::new();
                o.read(true).custom_flags(libc::O_NONBLOCK);
                self.root.dir().open_with(&rel, &o).map(|f| f.into_std())
            }
            FilePath::Local(p) => {
                use std::os::unix::fs::OpenOptionsExt as _;
                std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(p)
            }
        };
        let file = match opened {
            Ok(f) => f,
            Err(e) if node::is_absent(&e) => return Ok(None),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("opening {path} (a node file is only read from inside the root)"));
            }
        };
        if !file.metadata().with_context(|| format!("inspecting {path}"))?.is_file() {
            bail!("{path} is not a regular file");
        }
        let mut out = Vec::new();
        file.take(cap.saturating_add(1)).read_to_end(&mut out).with_context(|| format!("reading {path}"))?;
        if out.len() as u64 > cap {
            bail!("{path} is larger than {cap} bytes, the most read from a configuration file");
        }
        Ok(Some(out))
    }

    /// Reads a UTF-8 text file of at most `cap` bytes; `None` when it does not exist.
    pub(crate) fn read_string(&self, path: &FilePath, cap: u64) -> Result<Option<String>> {
        match self.read(path, cap)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b).map(Some).with_context(|| format!("{path} is not UTF-8 text")),
        }
    }

    /// The entries of a directory, sorted by name, each with what it is after following
    /// symlinks the node's way; `None` when the directory does not exist. Names that are
    /// not UTF-8 are skipped (no configuration file name is).
    pub(crate) fn list(&self, dir: &FilePath) -> Result<Option<Vec<Entry>>> {
        match self.kind(dir)? {
            None => return Ok(None),
            Some(Kind::Dir) => {}
            Some(_) => bail!("{dir} is not a directory"),
        }
        let mut names = Vec::new();
        match dir {
            FilePath::Node(p) => {
                let rel = self.resolve(p)?;
                let d = match self.root.dir().open_dir(&rel) {
                    Ok(d) => d,
                    Err(e) if node::is_absent(&e) => return Ok(None),
                    Err(e) => return Err(e).with_context(|| format!("opening the directory {dir}")),
                };
                for e in d.entries().with_context(|| format!("listing {dir}"))? {
                    let e = e.with_context(|| format!("listing {dir}"))?;
                    names.extend(e.file_name().into_string().ok());
                }
            }
            FilePath::Local(p) => {
                for e in std::fs::read_dir(p).with_context(|| format!("listing {dir}"))? {
                    let e = e.with_context(|| format!("listing {dir}"))?;
                    names.extend(e.file_name().into_string().ok());
                }
            }
        }
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let kind = self.kind(&path)?;
            out.push(Entry { name, path, kind });
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_resolve_inside_the_root() {
        let outer = tempfile::tempdir().expect("temp");
        let root = outer.path().join("root");
        std::fs::create_dir_all(root.join("etc/containers")).expect("mkdir");
        std::fs::create_dir_all(root.join("srv")).expect("mkdir");
        std::fs::write(root.join("srv/policy.json"), "node").expect("write");
        std::fs::write(outer.path().join("outside"), "pod").expect("write");
        symlink("/srv/policy.json", root.join("etc/containers/abs")).expect("link");
        symlink("../../srv/policy.json", root.join("etc/containers/rel")).expect("link");
        symlink("../../../outside", root.join("etc/containers/esc")).expect("link");
        symlink(outer.path().join("outside"), root.join("etc/containers/abs-out")).expect("link");
        std::fs::write(root.join("etc/file"), "x").expect("write");
        let fs = NodeFs::open(&root).expect("open");
        let r =
            |p: &str| fs.read(&FilePath::node(p), 100).expect("read").map(|b| String::from_utf8_lossy(&b).into_owned());
        assert_eq!(r("/etc/containers/abs").as_deref(), Some("node"));
        assert_eq!(r("/etc/containers/rel").as_deref(), Some("node"));
        assert_eq!(r("/etc/containers/esc"), None, "a link past the root resolves at the root");
        assert_eq!(r("/etc/containers/abs-out"), None, "an absolute target is a node path");
        assert_eq!(r("/etc/file/below"), None);
        let e = format!("{:#}", fs.read(&FilePath::node("/etc/containers/abs"), 2).expect_err("cap"));
        assert!(e.contains("/etc/containers/abs is larger than 2 bytes"), "{e}");
        let e = format!("{:#}", fs.read(&FilePath::node("/etc"), 2).expect_err("dir"));
        assert!(e.contains("is a directory"), "{e}");
        let list = fs.list(&FilePath::node("/etc/containers")).expect("list").expect("present");
        let kinds: Vec<_> = list.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(kinds, [("abs", Some(Kind::File)), ("abs-out", None), ("esc", None), ("rel", Some(Kind::File))]);
    }
}
