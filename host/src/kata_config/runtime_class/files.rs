//! Reading CRI configuration files beneath `--root`, through the runner's one node-file
//! reader ([`NodeFs`]: node paths resolved as the node resolves them, inside the root,
//! regular files only, one capped read), in the shapes containerd's and CRI-O's loaders
//! need.

use anyhow::Result;

use crate::node::Root;
use crate::nodefs::{FilePath, NodeFs};

pub(crate) use crate::nodefs::Kind;

/// Largest CRI configuration file read (containerd's and CRI-O's are a few KiB).
pub(crate) const MAX_FILE: u64 = 1 << 20;

/// The node files of one `--root`.
pub(crate) struct Files {
    fs: NodeFs,
}

impl Files {
    /// The node files beneath `root`.
    pub(crate) fn open(root: &Root) -> Result<Files> {
        Ok(Files { fs: NodeFs::open(root.path())? })
    }

    /// The kind of a node path, `None` when nothing is there (missing, or a dangling symlink).
    pub(crate) fn kind(&self, node_path: &str) -> Result<Option<Kind>> {
        self.fs.kind(&FilePath::node(node_path))
    }

    /// The text of a regular node file, `None` when nothing is there; an error for a file
    /// that is not regular, larger than [`MAX_FILE`] or not UTF-8.
    pub(crate) fn read(&self, node_path: &str) -> Result<Option<String>> {
        self.fs.read_string(&FilePath::node(node_path), MAX_FILE)
    }

    /// The entry names of a node directory, sorted by bytes as Go's `os.ReadDir` sorts them,
    /// each with whether it is a directory (symlinks followed); `None` when the directory
    /// is not there. A dangling symlink is listed as a file (reading it fails, as it does
    /// for the runtime).
    pub(crate) fn list(&self, node_path: &str) -> Result<Option<Vec<(String, bool)>>> {
        Ok(self
            .fs
            .list(&FilePath::node(node_path))?
            .map(|entries| entries.into_iter().map(|e| (e.name, e.kind == Some(Kind::Dir))).collect()))
    }
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
