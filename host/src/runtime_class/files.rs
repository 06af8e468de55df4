//! Reading CRI configuration files beneath `--root`: node paths resolved as the node
//! resolves them ([`Root::resolve`]), opened through the root's cap-std handle, regular
//! files only, capped.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use crate::node::{self, Root};

/// Largest CRI configuration file read (containerd's and CRI-O's are a few KiB).
pub(crate) const MAX_FILE: u64 = 1 << 20;

/// What a node path is, symlinks followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// Anything else (a device, a FIFO, a socket).
    Other,
}

/// The kind of a node path, `None` when nothing is there (missing, or a dangling symlink).
pub(crate) fn kind(root: &Root, node_path: &str) -> Result<Option<Kind>> {
    let rel = root.resolve(node_path).with_context(|| format!("resolving {node_path} on the node"))?;
    match root.dir().metadata(if rel.as_os_str().is_empty() { PathBuf::from(".") } else { rel }) {
        Ok(m) if m.is_file() => Ok(Some(Kind::File)),
        Ok(m) if m.is_dir() => Ok(Some(Kind::Dir)),
        Ok(_) => Ok(Some(Kind::Other)),
        Err(e) if node::is_absent(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("inspecting {node_path} on the node")),
    }
}

/// The text of a regular node file, `None` when nothing is there; an error for a file
/// that is not regular, larger than [`MAX_FILE`] or not UTF-8.
pub(crate) fn read(root: &Root, node_path: &str) -> Result<Option<String>> {
    match kind(root, node_path)? {
        None => return Ok(None),
        Some(Kind::File) => {}
        Some(_) => bail!("{node_path} is not a regular file"),
    }
    let rel = root.resolve(node_path)?;
    let f = match root.dir().open(&rel) {
        Ok(f) => f,
        Err(e) if node::is_absent(&e) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("opening {node_path}")),
    };
    let mut text = String::new();
    f.take(MAX_FILE + 1).read_to_string(&mut text).with_context(|| format!("reading {node_path} (UTF-8 TOML)"))?;
    if text.len() as u64 > MAX_FILE {
        bail!("{node_path} is larger than {MAX_FILE} bytes; not read");
    }
    Ok(Some(text))
}

/// The entry names of a node directory (symlinks followed to reach it), sorted by bytes as
/// Go's `os.ReadDir` sorts them, each with whether it is a directory itself (not following
/// a symlink, as `filepath.Walk`'s `Lstat`); `None` when the directory is not there.
/// Names that are not UTF-8 are skipped: no configuration names them.
pub(crate) fn list(root: &Root, node_path: &str) -> Result<Option<Vec<(String, bool)>>> {
    if kind(root, node_path)? != Some(Kind::Dir) {
        return Ok(None);
    }
    let rel = root.resolve(node_path)?;
    let dir = root
        .dir()
        .open_dir(if rel.as_os_str().is_empty() { PathBuf::from(".") } else { rel })
        .with_context(|| format!("opening {node_path}"))?;
    let mut out = Vec::new();
    for entry in dir.entries().with_context(|| format!("listing {node_path}"))? {
        let entry = entry.with_context(|| format!("listing {node_path}"))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let is_dir = entry.file_type().with_context(|| format!("inspecting {node_path}/{name}"))?.is_dir();
        out.push((name, is_dir));
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(Some(out))
}

/// `dir/name` as a node path.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") }
}

/// Go's `filepath.Clean` of an absolute path: `.` and empty components dropped, `..`
/// removing the previous one (never above `/`), as the extractor normalises image paths.
pub(crate) fn clean_abs(p: &str) -> String {
    format!("/{}", crate::extract::normalize(p))
}
