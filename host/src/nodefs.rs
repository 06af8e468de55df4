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

use std::collections::HashSet;
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

/// Opens a file on the runner's own filesystem for reading without blocking on the open
/// (`O_NONBLOCK`: a FIFO in place of a file cannot stall the runner; on a regular file the
/// flag changes nothing). The caller checks what it opened with [`ensure_regular`].
pub(crate) fn open_local(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(p)
}

/// Refuses an opened file that is not a regular file (a FIFO, socket, device or
/// directory), naming it as `what`.
pub(crate) fn ensure_regular(f: &std::fs::File, what: &dyn fmt::Display) -> Result<()> {
    let t = f.metadata().with_context(|| format!("inspecting {what}"))?.file_type();
    if !t.is_file() {
        use std::os::unix::fs::FileTypeExt as _;
        let kind = match () {
            () if t.is_dir() => "a directory",
            () if t.is_fifo() => "a FIFO",
            () if t.is_socket() => "a socket",
            () if t.is_block_device() || t.is_char_device() => "a device",
            () => "not a file",
        };
        bail!("{what} is {kind}, not a regular file");
    }
    Ok(())
}

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
    /// Whether the entry itself is a symlink.
    pub link: bool,
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
        let rel = self.root.resolve(node_path).with_context(|| format!("resolving {node_path} on the node"))?;
        // The root itself: cap-std names it `.`, not the empty path.
        Ok(if rel.as_os_str().is_empty() { PathBuf::from(".") } else { rel })
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

    /// Opens a regular file for reading (non-blocking, so a FIFO swapped in after the check
    /// cannot stall the runner); `None` when it does not exist.
    fn open_regular(&self, path: &FilePath) -> Result<Option<std::fs::File>> {
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
            FilePath::Local(p) => open_local(p),
        };
        let file = match opened {
            Ok(f) => f,
            Err(e) if node::is_absent(&e) => return Ok(None),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("opening {path} (a node file is only read from inside the root)"));
            }
        };
        ensure_regular(&file, path)?;
        Ok(Some(file))
    }

    /// Opens a regular file for reading, for a caller that bounds what it reads itself;
    /// `None` when it does not exist.
    pub(crate) fn open_file(&self, path: &FilePath) -> Result<Option<std::fs::File>> {
        self.open_regular(path)
    }

    /// Reads a regular file of at most `cap` bytes; `None` when it does not exist.
    pub(crate) fn read(&self, path: &FilePath, cap: u64) -> Result<Option<Vec<u8>>> {
        let Some(file) = self.open_regular(path)? else { return Ok(None) };
        read_capped(file, path, cap).map(Some)
    }

    /// Reads a UTF-8 text file of at most `cap` bytes; `None` when it does not exist.
    pub(crate) fn read_string(&self, path: &FilePath, cap: u64) -> Result<Option<String>> {
        match self.read(path, cap)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b).map(Some).with_context(|| format!("{path} is not UTF-8 text")),
        }
    }

    /// Whether a node path resolves inside the root without a symlink leading out of it (an
    /// absolute target, or `..` past the root), which [`NodeFs::read`] would follow back into
    /// the root instead. For a directory that must be self-contained (a mounted ConfigMap).
    pub(crate) fn stays_inside(&self, node_path: &str) -> Result<bool> {
        self.root.resolves_inside(node_path).with_context(|| format!("resolving {node_path}"))
    }

    /// The entries of a directory, sorted by name, each with what it is after following
    /// symlinks the node's way; `None` when the directory does not exist. Names that are
    /// not UTF-8 are skipped (no configuration file name is). More than
    /// [`MAX_DIR_ENTRIES`] entries is an error naming the directory.
    pub(crate) fn list(&self, dir: &FilePath) -> Result<Option<Vec<Entry>>> {
        Ok(self.list_identified(dir, MAX_DIR_ENTRIES)?.map(|(_, entries)| entries))
    }

    /// [`NodeFs::list`] with at most `max` entries, and the directory's (device, inode).
    fn list_identified(&self, dir: &FilePath, max: usize) -> Result<Option<(FileId, Vec<Entry>)>> {
        match self.kind(dir)? {
            None => return Ok(None),
            Some(Kind::Dir) => {}
            Some(_) => bail!("{dir} is not a directory"),
        }
        let too_many = || anyhow::anyhow!("{dir} has more than {max} entries, the most kata-addons lists");
        let mut names = Vec::new();
        let (id, base) = match dir {
            FilePath::Node(p) => {
                let rel = self.resolve(p)?;
                let d = match self.root.dir().open_dir(&rel) {
                    Ok(d) => d,
                    Err(e) if node::is_absent(&e) => return Ok(None),
                    Err(e) => return Err(e).with_context(|| format!("opening the directory {dir}")),
                };
                let m = d.dir_metadata().with_context(|| format!("inspecting {dir}"))?;
                for e in d.entries().with_context(|| format!("listing {dir}"))? {
                    let e = e.with_context(|| format!("listing {dir}"))?;
                    names.extend(e.file_name().into_string().ok());
                    if names.len() > max {
                        return Err(too_many());
                    }
                }
                (FileId(cap_std::fs::MetadataExt::dev(&m), cap_std::fs::MetadataExt::ino(&m)), Some(rel))
            }
            FilePath::Local(p) => {
                let m = std::fs::metadata(p).with_context(|| format!("inspecting {dir}"))?;
                for e in std::fs::read_dir(p).with_context(|| format!("listing {dir}"))? {
                    let e = e.with_context(|| format!("listing {dir}"))?;
                    names.extend(e.file_name().into_string().ok());
                    if names.len() > max {
                        return Err(too_many());
                    }
                }
                (FileId(std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m)), None)
            }
        };
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let link = match (&base, dir) {
                (Some(rel), _) => self.root.dir().symlink_metadata(rel.join(&name)).map(|m| m.file_type().is_symlink()),
                (None, FilePath::Local(p)) => {
                    std::fs::symlink_metadata(p.join(&name)).map(|m| m.file_type().is_symlink())
                }
                (None, FilePath::Node(_)) => Ok(false),
            };
            let link = match link {
                Ok(l) => l,
                Err(e) if node::is_absent(&e) => continue, // gone since the listing
                Err(e) => return Err(e).with_context(|| format!("inspecting {path}")),
            };
            let kind = self.kind(&path)?;
            out.push(Entry { name, path, kind, link });
        }
        Ok(Some((id, out)))
    }

    /// A bounded walk of `what` (named in its errors) under `budget`.
    pub(crate) fn walk(&self, what: &'static str, budget: Budget) -> Walk<'_> {
        Walk {
            fs: self,
            what,
            budget,
            files_seen: HashSet::new(),
            dirs_seen: HashSet::new(),
            entries: 0,
            files: 0,
            bytes: 0,
        }
    }
}

/// Reads at most `cap` bytes of an opened file, an error naming `path` past that.
fn read_capped(file: std::fs::File, path: &FilePath, cap: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    file.take(cap.saturating_add(1)).read_to_end(&mut out).with_context(|| format!("reading {path}"))?;
    if out.len() as u64 > cap {
        bail!("{path} is larger than {cap} bytes, the most read from a configuration file");
    }
    Ok(out)
}

/// Most entries one directory listing holds (a configuration directory has a handful; a
/// ConfigMap at most a few hundred keys).
pub(crate) const MAX_DIR_ENTRIES: usize = 4096;

/// A file's identity: (device, inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FileId(u64, u64);

/// What one walk of node configuration may cost, all its directories and files together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Most directory entries listed.
    pub entries: usize,
    /// Most files read (a file reached again by another path counts again).
    pub files: usize,
    /// Most bytes read (a file reached again counts its size again: its caller holds it twice).
    pub bytes: u64,
    /// Deepest directory level [`Walk::tree`] descends below its top.
    pub depth: usize,
}

/// A file read by a [`Walk`].
#[derive(Debug)]
pub(crate) enum Visit {
    /// First read of this file in the walk: its bytes.
    Read(FileId, Vec<u8>),
    /// The same file (device and inode) was read before in this walk, by this or another path.
    Again(FileId),
}

/// One bounded pass over node configuration: every directory listed and every file read
/// through it counts against one [`Budget`], each file is read once (by device and inode),
/// and [`Walk::tree`] descends each directory once, never through a symlink, so a symlink
/// loop cannot make it loop. Every refusal names the file or directory.
pub(crate) struct Walk<'a> {
    fs: &'a NodeFs,
    what: &'static str,
    budget: Budget,
    files_seen: HashSet<FileId>,
    dirs_seen: HashSet<FileId>,
    entries: usize,
    files: usize,
    bytes: u64,
}

impl Walk<'_> {
    /// Reads a regular file of at most `cap` bytes; `None` when it does not exist.
    pub(crate) fn read(&mut self, path: &FilePath, cap: u64) -> Result<Option<Visit>> {
        let Some(file) = self.fs.open_regular(path)? else { return Ok(None) };
        let m = file.metadata().with_context(|| format!("inspecting {path}"))?;
        let id = FileId(std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m));
        self.files += 1;
        if self.files > self.budget.files {
            bail!("{path}: {} reads more than {} files, the most kata-addons reads", self.what, self.budget.files);
        }
        let left = self.budget.bytes.saturating_sub(self.bytes);
        let (what, total) = (self.what, self.budget.bytes);
        let over = || {
            anyhow::anyhow!(
                "{path}: with this file {what} is more than {total} bytes together, the most kata-addons reads"
            )
        };
        if !self.files_seen.insert(id) {
            if m.len() > left {
                return Err(over());
            }
            self.bytes += m.len();
            return Ok(Some(Visit::Again(id)));
        }
        let mut bytes = Vec::new();
        file.take(cap.min(left).saturating_add(1))
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {path}"))?;
        if bytes.len() as u64 > cap {
            bail!("{path} is larger than {cap} bytes, the most read from a configuration file");
        }
        if bytes.len() as u64 > left {
            return Err(over());
        }
        self.bytes += bytes.len() as u64;
        Ok(Some(Visit::Read(id, bytes)))
    }

    /// [`Walk::read`] for a reader that takes each name on its own: a file reached again is
    /// read again (and counted again).
    pub(crate) fn read_all(&mut self, path: &FilePath, cap: u64) -> Result<Option<Vec<u8>>> {
        match self.read(path, cap)? {
            None => Ok(None),
            Some(Visit::Read(_, b)) => Ok(Some(b)),
            Some(Visit::Again(_)) => self.fs.read(path, cap),
        }
    }

    /// [`NodeFs::list`], its entries counted against the budget.
    pub(crate) fn list(&mut self, dir: &FilePath) -> Result<Option<Vec<Entry>>> {
        let left = self.budget.entries.saturating_sub(self.entries).min(MAX_DIR_ENTRIES);
        let listed = self.fs.list_identified(dir, left).map_err(|e| {
            if left < MAX_DIR_ENTRIES {
                anyhow::anyhow!(
                    "{dir}: {} lists more than {} directory entries, the most kata-addons lists",
                    self.what,
                    self.budget.entries
                )
            } else {
                e
            }
        })?;
        Ok(listed.map(|(_, entries)| {
            self.entries += entries.len();
            entries
        }))
    }

    /// Every entry below `dir` that is not a directory, in the order Go's `filepath.Walk`
    /// visits them (lexical, depth first). Like it, a symlink is never descended: a symlink
    /// to a directory is returned as an entry (its `kind` says where it leads). A directory
    /// deeper than the budget's depth, or reached twice (a bind mount), is an error naming
    /// it. `None` when `dir` does not exist.
    pub(crate) fn tree(&mut self, dir: &FilePath) -> Result<Option<Vec<Entry>>> {
        let mut out = Vec::new();
        Ok(self.descend(dir, 0, &mut out)?.map(|()| out))
    }

    fn descend(&mut self, dir: &FilePath, depth: usize, out: &mut Vec<Entry>) -> Result<Option<()>> {
        let left = self.budget.entries.saturating_sub(self.entries).min(MAX_DIR_ENTRIES);
        let Some((id, entries)) = self.fs.list_identified(dir, left)? else { return Ok(None) };
        self.entries += entries.len();
        if !self.dirs_seen.insert(id) {
            bail!("{dir} is a directory already walked (a loop), reading {}", self.what);
        }
        for e in entries {
            if e.kind == Some(Kind::Dir) && !e.link {
                if depth >= self.budget.depth {
                    bail!(
                        "{}: a directory more than {} levels deep, the most kata-addons walks reading {}",
                        e.path,
                        self.budget.depth,
                        self.what
                    );
                }
                self.descend(&e.path, depth + 1, out)?;
            } else {
                out.push(e);
            }
        }
        Ok(Some(()))
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
