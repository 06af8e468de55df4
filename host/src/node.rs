//! The node's filesystem, reached only through capability-scoped directory handles
//! opened beneath `--root`: no symlink on the node can redirect a write outside it.

use std::io::{ErrorKind, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, DirBuilder, OpenOptions, Permissions};
use cap_std::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

/// Most symlinks followed while resolving one path (as Linux' `MAXSYMLINKS`).
const MAX_HOPS: usize = 40;

/// Where on the node a command works: the root (`--root`) and how long it waits for the
/// node lock (`--lock-timeout`).
#[derive(Debug, Clone)]
pub(crate) struct Site {
    /// The node's root filesystem (the DaemonSet mounts it at `/host`).
    pub root: PathBuf,
    /// Longest wait for another kata-addons run on this node.
    pub lock_timeout: std::time::Duration,
}

/// The node root (`--root`), opened once.
#[derive(Debug)]
pub struct Root {
    dir: Dir,
    path: PathBuf,
}

impl Root {
    /// Opens the node root directory; this is the only ambient-authority open.
    pub fn open(path: &Path) -> Result<Root> {
        let dir = Dir::open_ambient_dir(path, ambient_authority())
            .with_context(|| format!("opening the node root {}", path.display()))?;
        Ok(Root { dir, path: path.to_path_buf() })
    }

    /// The root as given on the command line.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The root directory handle.
    pub(crate) fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Resolves a node path the way the node would (symlinks followed, absolute targets
    /// meaning the node's `/`, `..` clamped at the root) but entirely inside the root.
    /// Returns the resolved path relative to the root; the last component may not exist.
    pub(crate) fn resolve(&self, node_path: &str) -> Result<PathBuf> {
        Ok(self.resolve_tracking(node_path)?.0)
    }

    /// Whether resolving a node path stays inside the root on its own: no symlink on the
    /// way has an absolute target or climbs past the root with `..` (which
    /// [`Root::resolve`] clamps to the root).
    pub(crate) fn resolves_inside(&self, node_path: &str) -> Result<bool> {
        Ok(!self.resolve_tracking(node_path)?.1)
    }

    /// [`Root::resolve`], and whether a symlink on the way led out of the root.
    fn resolve_tracking(&self, node_path: &str) -> Result<(PathBuf, bool)> {
        let mut escaped = false;
        let mut pending: Vec<String> = components(node_path).into_iter().rev().collect();
        let mut resolved: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(c) = pending.pop() {
            if c == ".." {
                escaped |= resolved.pop().is_none();
                continue;
            }
            let candidate: PathBuf = resolved.iter().chain(std::iter::once(&c)).collect();
            match self.dir.symlink_metadata(&candidate) {
                Ok(m) if m.is_symlink() => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        bail!("too many levels of symbolic links resolving {node_path} on the node");
                    }
                    let target = self
                        .dir
                        .read_link_contents(&candidate)
                        .with_context(|| format!("reading symlink /{}", candidate.display()))?;
                    let target = target
                        .to_str()
                        .with_context(|| format!("symlink /{} has a non-UTF-8 target", candidate.display()))?
                        .to_string();
                    if target.starts_with('/') {
                        escaped = true;
                        resolved.clear();
                    }
                    pending.extend(components(&target).into_iter().rev());
                }
                Ok(_) => resolved.push(c),
                Err(e) if is_absent(&e) => {
                    resolved.push(c);
                    // Nothing below a missing component can be a symlink.
                    while let Some(rest) = pending.pop() {
                        if rest == ".." {
                            escaped |= resolved.pop().is_none();
                        } else {
                            resolved.push(rest);
                        }
                    }
                }
                Err(e) => return Err(e).with_context(|| format!("inspecting /{} on the node", candidate.display())),
            }
        }
        Ok((resolved.iter().collect(), escaped))
    }

    /// Creates (if needed) and opens a directory at a root-relative path, refusing any
    /// symlink that would lead outside the root.
    pub(crate) fn create_dir_all(&self, rel: &Path) -> Result<Dir> {
        let mut b = DirBuilder::new();
        b.recursive(true).mode(0o755);
        match self.dir.create_dir_with(rel, &b) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| refused_or(rel, "creating")),
        }
        self.dir.open_dir(rel).with_context(|| refused_or(rel, "opening"))
    }
}

/// Directories one install created beneath the root, removed again (deepest first, only
/// while empty) when it is dropped before [`Created::keep`]: a refused install leaves the
/// node as it found it.
#[derive(Debug)]
pub(crate) struct Created {
    /// The root, to remove from.
    root: Dir,
    /// Root-relative directories created, in creation order.
    dirs: Vec<PathBuf>,
    /// Set once something the node keeps lives in them.
    keep: std::sync::atomic::AtomicBool,
}

impl Created {
    /// Nothing created yet beneath `root`.
    pub(crate) fn new(root: &Root) -> Result<Created> {
        let root = root.dir().try_clone().context("duplicating the node root handle")?;
        Ok(Created { root, dirs: Vec::new(), keep: std::sync::atomic::AtomicBool::new(false) })
    }

    /// Creates (if needed) and opens the directory at root-relative `rel`, recording each
    /// component created; a symlink that would lead outside the root is refused.
    pub(crate) fn dir_all(&mut self, rel: &Path) -> Result<Dir> {
        let mut b = DirBuilder::new();
        b.mode(0o755);
        let mut at = PathBuf::new();
        for c in rel.components() {
            at.push(c);
            match self.root.create_dir_with(&at, &b) {
                Ok(()) => self.dirs.push(at.clone()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).with_context(|| refused_or(&at, "creating")),
            }
        }
        self.root.open_dir(rel).with_context(|| refused_or(rel, "opening"))
    }

    /// What was created stays (the commit point is passed).
    pub(crate) fn keep(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.keep.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        for d in self.dirs.iter().rev() {
            match self.root.remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(dir = %node_path(d), "could not remove a directory this run created: {e}"),
            }
        }
    }
}

/// Context for a failed open or create of `rel` under the root: names the node path and
/// says a symlink leading outside the root is refused.
pub(crate) fn refused_or(rel: &Path, what: &str) -> String {
    format!("{what} /{} under the node root (a symlink that leads outside the root is refused)", rel.display())
}

/// The `/`-separated components of a path, without empty and `.` parts.
fn components(p: &str) -> Vec<String> {
    Path::new(p)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".to_string()),
            _ => None,
        })
        .collect()
}

/// Node path (`/etc/...`) of a root-relative path.
pub(crate) fn node_path(rel: &Path) -> String {
    format!("/{}", rel.display())
}

/// Root-relative path of a node path (`/etc/x` -> `etc/x`).
pub(crate) fn rel_path(node_path: &str) -> PathBuf {
    PathBuf::from(node_path.trim_start_matches('/'))
}

/// Whether an error opening or inspecting a path means "nothing there": `ENOENT`, or
/// `ENOTDIR` (a component of the path is a file).
pub(crate) fn is_absent(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
}

/// Flushes a directory's entries to disk (after a rename or create inside it).
pub(crate) fn fsync_dir(dir: &Dir) -> Result<()> {
    // cap-std directory handles are O_PATH; fsync needs a descriptor opened for reading.
    let d = dir.open(".").context("opening a directory for fsync")?;
    d.sync_all().context("fsync of a directory")
}

/// Fails with a clear error if `dir` lives on a read-only filesystem.
pub(crate) fn ensure_writable(dir: &Dir, what: &str) -> Result<()> {
    let st = rustix::fs::fstatvfs(dir).with_context(|| format!("statvfs of {what}"))?;
    if st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        bail!("{what} is on a read-only filesystem; nothing was changed");
    }
    Ok(())
}

/// A filesystem has less free space than a write needs (exit 1; nothing was installed).
#[derive(Debug, thiserror::Error)]
#[error(
    "not enough space on {place}: need {need} bytes ({size} bytes for {file} plus a margin of {margin}), have {have} bytes available"
)]
pub(crate) struct NoSpace {
    /// The directory written to (node path or as given).
    pub place: String,
    /// The file about to be written.
    pub file: String,
    /// Its size, from its tar header.
    pub size: u64,
    /// Bytes kept free beyond it.
    pub margin: u64,
    /// `size + margin`.
    pub need: u64,
    /// Bytes available on the filesystem (`f_bavail * f_frsize`).
    pub have: u64,
}

/// Bytes kept free on the destination filesystem beyond the files written: the state
/// file, drop-ins and filesystem metadata, and room for the node itself.
pub(crate) const FREE_SPACE_MARGIN: u64 = 16 << 20;

/// Fails with [`NoSpace`] unless the filesystem of `dir` has `size` plus
/// [`FREE_SPACE_MARGIN`] bytes available (to unprivileged users: root's reserve is kept).
pub(crate) fn check_free_space(dir: &Dir, place: &str, file: &str, size: u64) -> Result<()> {
    let st = rustix::fs::fstatvfs(dir).with_context(|| format!("statvfs of {place}"))?;
    let have = st.f_bavail.saturating_mul(st.f_frsize);
    let need = size.saturating_add(FREE_SPACE_MARGIN);
    if have < need {
        return Err(anyhow::Error::new(NoSpace {
            place: place.to_string(),
            file: file.to_string(),
            size,
            margin: FREE_SPACE_MARGIN,
            need,
            have,
        }));
    }
    Ok(())
}

/// Writes `data` as a regular 0644 file `name` in `dir` (created or truncated) and
/// fsyncs it; the caller renames it into place.
pub(crate) fn write_synced(dir: &Dir, name: &str, data: &[u8]) -> Result<()> {
    let mut opts = OpenOptions::new();
    opts.write(true).create(true).truncate(true).mode(0o644);
    let mut f = dir.open_with(name, &opts).with_context(|| format!("creating {name}"))?;
    f.write_all(data).with_context(|| format!("writing {name}"))?;
    f.set_permissions(Permissions::from_mode(0o644)).with_context(|| format!("chmod {name}"))?;
    f.sync_all().with_context(|| format!("fsync {name}"))
}

/// Writes `data` as a regular 0644 file `name` in `dir` atomically: temp name, fsync,
/// rename, fsync of the directory. A crash leaves either the old or the new file.
pub(crate) fn write_atomic(dir: &Dir, name: &str, data: &[u8]) -> Result<()> {
    let tmp = format!(".{name}.tmp-{}", std::process::id());
    let result = write_synced(dir, &tmp, data).and_then(|()| {
        dir.rename(&tmp, dir, name).with_context(|| format!("renaming {tmp} to {name}"))?;
        fsync_dir(dir)
    });
    if result.is_err() {
        let _ = dir.remove_file(&tmp);
    }
    result
}

/// Opens a regular file for reading; `None` if it is missing. A symlink or other
/// non-regular entry is an error. The open does not block (`O_NONBLOCK`: a FIFO swapped in
/// after the check cannot stall the runner) and what was opened is checked again.
pub(crate) fn open_regular(dir: &Dir, name: &Path) -> Result<Option<cap_std::fs::File>> {
    let meta = match dir.symlink_metadata(name) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", name.display())),
    };
    if !meta.is_file() {
        bail!("{} is not a regular file", name.display());
    }
    let mut o = OpenOptions::new();
    o.read(true).custom_flags(libc::O_NONBLOCK);
    let f = match dir.open_with(name, &o) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("opening {}", name.display())),
    };
    if !f.metadata().with_context(|| format!("inspecting {}", name.display()))?.is_file() {
        bail!("{} is not a regular file", name.display());
    }
    Ok(Some(f))
}

/// sha256 (hex) and size of a regular file, read in chunks; `None` if it is missing.
/// A symlink or other non-regular entry is an error.
pub(crate) fn hash_file(dir: &Dir, name: &Path) -> Result<Option<(String, u64)>> {
    let Some(mut f) = open_regular(dir, name)? else { return Ok(None) };
    let mut h = crate::hash::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = std::io::Read::read(&mut f, &mut buf).with_context(|| format!("reading {}", name.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(Some((h.finish_hex(), size)))
}

/// Removes a file or directory tree if it exists.
pub(crate) fn remove_entry(dir: &Dir, name: &str) -> Result<()> {
    match dir.symlink_metadata(name) {
        Ok(m) if m.is_dir() => dir.remove_dir_all(name).with_context(|| format!("removing {name}")),
        Ok(_) => dir.remove_file(name).with_context(|| format!("removing {name}")),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("inspecting {name}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_symlinks_inside_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        std::fs::create_dir_all(root.join("opt/kata/defaults")).expect("mkdir");
        std::fs::create_dir_all(root.join("etc/kata-containers/kata-se")).expect("mkdir");
        std::fs::write(root.join("opt/kata/defaults/configuration-se.toml"), "").expect("write");
        std::os::unix::fs::symlink(
            "/opt/kata/defaults/configuration-se.toml",
            root.join("etc/kata-containers/kata-se/configuration.toml"),
        )
        .expect("symlink");
        std::os::unix::fs::symlink("../../../../../../..", root.join("etc/up")).expect("symlink");
        let r = Root::open(root).expect("open");
        assert_eq!(
            r.resolve("/etc/kata-containers/kata-se/configuration.toml").expect("resolve"),
            PathBuf::from("opt/kata/defaults/configuration-se.toml")
        );
        // `..` is clamped at the root.
        assert_eq!(r.resolve("/etc/up/etc/passwd").expect("resolve"), PathBuf::from("etc/passwd"));
        std::os::unix::fs::symlink("loop", root.join("loop")).expect("symlink");
        assert!(r.resolve("/loop").is_err());
    }
}
