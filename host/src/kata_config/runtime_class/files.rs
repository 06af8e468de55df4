//! Reading CRI configuration files beneath `--root`, through the runner's one node-file
//! reader ([`NodeFs`]: node paths resolved as the node resolves them, inside the root,
//! regular files only, one capped read), in the shapes containerd's and CRI-O's loaders
//! need.

use anyhow::Result;

use crate::node::Root;
use crate::nodefs::{FilePath, NodeFs};

pub(crate) use crate::nodefs::{Budget, Entry, FileId, Kind, Visit, Walk};

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

    /// A bounded walk of the node's CRI configuration files (`what` names it in errors).
    pub(crate) fn walk(&self, what: &'static str, budget: Budget) -> Walk<'_> {
        self.fs.walk(what, budget)
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
