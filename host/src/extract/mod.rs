//! Extraction: a merged view over OCI layers (whiteouts, opaque directories, symlinks
//! and hardlinks resolved inside the image root, this file) and the rooms around it:
//! [`image`] (the algorithm over an image's layers), [`bridge`] (async blob stream to the
//! blocking walker, digest verified), [`decode`] (compression, decompression-bomb cap),
//! [`layer`] (the walker), [`sink`] (the file writer thread: file hash, verity tree, write),
//! [`tarstream`] (the tar reader), [`tempfiles`] and [`limits`].

pub(crate) mod artifact;
pub(crate) mod bridge;
pub(crate) mod decode;
pub(crate) mod image;
pub(crate) mod layer;
pub(crate) mod layers;
pub(crate) mod limits;
pub(crate) mod raw;
pub(crate) mod sink;
pub(crate) mod tarstream;
pub(crate) mod tempfiles;

pub(crate) use image::check_dest_name;
pub use image::{FetchedFile, Wanted};
pub use limits::Limits;
pub(crate) use tempfiles::TempFiles;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};

/// Most symlinks followed while resolving one path (as Linux `MAXSYMLINKS`).
pub const MAX_HOPS: u32 = 40;

/// Most bytes of paths looked up while resolving one wanted path (all hops together): a
/// real resolution takes a few hundred; this bounds the CPU a crafted symlink maze costs.
pub const MAX_RESOLVE_BYTES: usize = 64 * 1024;

/// Most times the candidate files are recomputed after a link entry in one fetch (all
/// layers together); after that, the second pass over a layer catches what was missed.
pub const MAX_RECOMPUTES: u64 = 256;

/// Index bytes charged per entry on top of its path (map node, `Node`, allocation).
pub const ENTRY_OVERHEAD: u64 = 96;

/// What a layer says about one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory.
    Dir,
    /// A regular file.
    File {
        /// Size from the tar header.
        size: u64,
    },
    /// A symbolic link (raw target).
    Symlink(String),
    /// A hard link to another path of the image (normalised). Tar semantics: it names a
    /// file that exists when the link is extracted, i.e. an *earlier* entry of the same
    /// layer (`below == false`) or else a file of the layers below (`below == true`).
    Hardlink {
        /// Normalised target path.
        target: String,
        /// The target was not an earlier entry of this layer: look it up below.
        below: bool,
    },
    /// A sparse file (any encoding): refused when wanted.
    Sparse,
    /// Anything else (device, fifo…), with a description.
    Other(&'static str),
}

/// The merged index's budget, shared by every layer of one fetch: caps the entries and
/// bytes all layer indexes together may hold, so memory stays bounded by a constant.
#[derive(Debug)]
pub struct IndexBudget {
    entries: AtomicU64,
    bytes: AtomicU64,
    max_entries: u64,
    max_bytes: u64,
    recomputes: AtomicU64,
}

impl IndexBudget {
    /// A budget of `max_entries` entries and `max_bytes` bytes (paths plus
    /// [`ENTRY_OVERHEAD`] per entry).
    pub fn new(max_entries: u64, max_bytes: u64) -> Self {
        IndexBudget {
            entries: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            max_entries,
            max_bytes,
            recomputes: AtomicU64::new(0),
        }
    }

    /// Takes one candidate recomputation from the fetch-wide allowance; false when spent.
    pub fn take_recompute(&self) -> bool {
        self.recomputes.fetch_add(1, Ordering::Relaxed) < MAX_RECOMPUTES
    }

    fn charge(&self, bytes: u64) -> Result<()> {
        let e = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
        if e > self.max_entries {
            bail!(
                "the image has more than {} tar entries in the layers read (limit --max-index-entries)",
                self.max_entries
            );
        }
        let b = self.bytes.fetch_add(bytes + ENTRY_OVERHEAD, Ordering::Relaxed) + bytes + ENTRY_OVERHEAD;
        if b > self.max_bytes {
            bail!(
                "the index of the layers read exceeds {} bytes (paths of {e} entries; limit --max-index-bytes)",
                self.max_bytes
            );
        }
        Ok(())
    }
}

impl Default for IndexBudget {
    fn default() -> Self {
        IndexBudget::new(u64::MAX, u64::MAX)
    }
}

/// Everything one layer says: entries (last duplicate wins), whiteouts, opaque directories.
/// Ordered maps: "is `p` an implied directory" is a range query, so no prefix of any path
/// is stored (memory is linear in the bytes of the layer's paths).
#[derive(Debug, Default)]
pub struct LayerIndex {
    entries: BTreeMap<String, Node>,
    whiteouts: BTreeSet<String>,
    opaque: BTreeSet<String>,
    /// Targets of this layer's hard links to earlier entries of this layer.
    link_targets: HashSet<String>,
}

/// Normalises an in-image path: root-relative, no `.`/empty components, `..` clamped at the root.
pub fn normalize(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out.join("/")
}

fn parent_of(p: &str) -> &str {
    p.rfind('/').map(|i| &p[..i]).unwrap_or("")
}

/// Whether an ordered set of paths holds a path strictly below `p`.
fn has_below<'a>(mut keys: impl Iterator<Item = &'a String>, p: &str) -> bool {
    if p.is_empty() {
        return keys.next().is_some();
    }
    keys.next().is_some_and(|k| k.len() > p.len() && k.starts_with(p) && k.as_bytes()[p.len()] == b'/')
}

impl LayerIndex {
    /// Records an entry (a later one for the same path replaces an earlier one), charging
    /// `budget`. A hard link's `below` flag is computed here from the entries so far.
    pub fn add(&mut self, path: String, node: Node, budget: &IndexBudget) -> Result<()> {
        let extra = match &node {
            Node::Symlink(t) => t.len(),
            Node::Hardlink { target, .. } => target.len(),
            _ => 0,
        };
        budget.charge((path.len() + extra) as u64)?;
        if self.link_targets.contains(&path) {
            bail!("/{path} replaces the target of an earlier hard link in the same layer (not supported)");
        }
        let node = match node {
            Node::Hardlink { target, .. } => {
                let below = !self.entries.contains_key(&target);
                if !below {
                    self.link_targets.insert(target.clone());
                }
                Node::Hardlink { target, below }
            }
            n => n,
        };
        self.entries.insert(path, node);
        Ok(())
    }

    /// Records a whiteout or opaque marker if `path`'s base name is one; returns whether it was.
    pub fn add_marker(&mut self, path: &str, budget: &IndexBudget) -> Result<bool> {
        let (dir, base) = match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        };
        let Some(name) = base.strip_prefix(".wh.") else {
            return Ok(false);
        };
        budget.charge(path.len() as u64)?;
        if name == ".wh..opq" {
            self.opaque.insert(dir.to_string());
            if !dir.is_empty() {
                self.entries.entry(dir.to_string()).or_insert(Node::Dir);
            }
        } else if name.starts_with(".wh.") || name.is_empty() {
            // Other AUFS metadata: not part of the image.
        } else {
            let target = if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") };
            self.whiteouts.insert(target);
        }
        Ok(true)
    }

    /// The first path this layer records (entry, whiteout or opaque marker) that is not
    /// the directory `dir` or beneath it (an OCI artifact's unpacked directory,
    /// docs/design.md#oci-artifacts).
    pub fn first_outside(&self, dir: &str) -> Option<&str> {
        let below = |p: &str| p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/';
        let entries = self.entries.keys().find(|p| p.as_str() != dir && !below(p));
        let markers = self.whiteouts.iter().chain(self.opaque.iter()).find(|p| !below(p));
        entries.or(markers).map(String::as_str)
    }

    /// Whether this layer implies `p` is a directory (something below it is recorded).
    fn implies_dir(&self, p: &str) -> bool {
        if p.is_empty() {
            return !(self.entries.is_empty() && self.whiteouts.is_empty() && self.opaque.is_empty());
        }
        let from = format!("{p}/");
        let r = (Bound::Included(from.as_str()), Bound::Unbounded);
        has_below(self.entries.range::<str, _>(r).map(|(k, _)| k), p)
            || has_below(self.whiteouts.range::<str, _>(r), p)
            || has_below(self.opaque.range::<str, _>(r), p)
    }

    /// Whether this layer cuts the layers below it off from the children of directory
    /// `p`: `p` is opaque, whited out or not a directory here.
    fn cuts_children(&self, p: &str) -> bool {
        self.opaque.contains(p) || self.whiteouts.contains(p) || self.entries.get(p).is_some_and(|n| *n != Node::Dir)
    }

    /// Number of entries recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the layer recorded no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Result of looking one exact path up in the merged view.
#[derive(Debug)]
enum Look {
    Found(usize, Node),
    ImplicitDir,
    Gone,
    Unknown,
}

/// The layers read so far, top first, and whether they are all of the image's layers.
pub struct View<'a> {
    /// Layer indexes, top layer first.
    pub layers: Vec<&'a LayerIndex>,
    /// True when no lower layer remains unread.
    pub all_read: bool,
}

/// Where a wanted path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// A regular file: layer number (0 = top) and its path in that layer.
    File {
        /// Layer number, 0 = top.
        layer: usize,
        /// Normalised path of the file entry in that layer.
        path: String,
        /// Size from the tar header.
        size: u64,
    },
    /// Not decided by the layers read so far; `frontier` is the literal path reached.
    Unknown {
        /// Path at which resolution stopped.
        frontier: String,
    },
    /// Decided: there is no regular file there (reason).
    Missing(String),
}

/// No layer cuts off a directory's children: every layer (read or not) may add some.
const NO_CUT: usize = usize::MAX;

impl View<'_> {
    /// The layer limit for the children of directory `p` whose own limit is `limit`:
    /// layers at or after the returned index cannot contribute children of `p`.
    fn child_limit(&self, p: &str, limit: usize) -> usize {
        self.child_limit_from(p, limit, 0)
    }

    /// [`View::child_limit`], looking only at the cuts of layers `from` and below.
    fn child_limit_from(&self, p: &str, limit: usize, from: usize) -> usize {
        let end = limit.min(self.layers.len());
        for (i, l) in self.layers.iter().enumerate().take(end).skip(from) {
            if l.cuts_children(p) {
                return i + 1;
            }
        }
        limit
    }

    /// The layer limit for the children of a literal directory path (no symlinks), as
    /// layers `from` and below make it: what upper layers do to the directory does not
    /// matter to a hard link made in layer `from`.
    fn dir_limit_from(&self, dir: &str, from: usize) -> usize {
        let mut limit = self.child_limit_from("", NO_CUT, from);
        if dir.is_empty() {
            return limit;
        }
        for (i, _) in dir.match_indices('/').chain(std::iter::once((dir.len(), ""))) {
            limit = self.child_limit_from(&dir[..i], limit, from);
        }
        limit
    }

    /// Looks up exactly `p` in layers `from..limit` (`limit`: from the parent directory).
    fn lookup(&self, p: &str, from: usize, limit: usize) -> Look {
        let mut implicit = false;
        let end = limit.min(self.layers.len());
        for (i, l) in self.layers.iter().enumerate().take(end).skip(from) {
            if let Some(n) = l.entries.get(p) {
                if implicit {
                    return match n {
                        Node::Dir | Node::Symlink(_) => Look::Found(i, n.clone()),
                        _ => Look::ImplicitDir,
                    };
                }
                return Look::Found(i, n.clone());
            }
            if l.implies_dir(p) {
                implicit = true;
            }
            if l.whiteouts.contains(p) {
                return if implicit { Look::ImplicitDir } else { Look::Gone };
            }
        }
        match (implicit, self.all_read || limit <= self.layers.len()) {
            (true, true) => Look::ImplicitDir,
            (false, true) => Look::Gone,
            _ => Look::Unknown,
        }
    }

    /// Resolves an absolute in-image path to a regular file, following symlinks and
    /// hardlinks inside the image root. The work is bounded: at most [`MAX_HOPS`] links,
    /// paths of at most [`tarstream::MAX_PATH`] bytes and [`MAX_RESOLVE_BYTES`] bytes of
    /// lookups, whatever the layers hold.
    pub fn resolve(&self, wanted: &str) -> Resolution {
        self.resolve_tracked(wanted, &mut HashSet::new())
    }

    /// [`View::resolve`], recording every path looked up in `visited`.
    pub fn resolve_tracked(&self, wanted: &str, visited: &mut HashSet<String>) -> Resolution {
        let mut todo: Vec<String> =
            normalize(wanted).split('/').filter(|c| !c.is_empty()).rev().map(str::to_string).collect();
        let mut cur: Vec<String> = Vec::new();
        // limits[k]: layer limit for the children of the directory cur[..k].
        let root_limit = self.child_limit("", NO_CUT);
        let mut limits: Vec<usize> = vec![root_limit];
        let mut hops = 0u32;
        let mut spent = 0usize;
        let frontier = |cur: &[String], todo: &[String]| {
            let mut v: Vec<&str> = cur.iter().map(String::as_str).collect();
            v.extend(todo.iter().rev().map(String::as_str));
            normalize(&v.join("/"))
        };
        while let Some(c) = todo.pop() {
            if c == "." {
                continue;
            }
            if c == ".." {
                if cur.pop().is_some() {
                    limits.pop();
                }
                continue;
            }
            cur.push(c);
            let p = cur.join("/");
            spent += p.len();
            if p.len() > tarstream::MAX_PATH || spent > MAX_RESOLVE_BYTES {
                return Resolution::Missing(format!("resolving {wanted} leads to too long a path (at /{p:.64}…)"));
            }
            visited.insert(p.clone());
            let last = todo.is_empty();
            let limit = *limits.last().unwrap_or(&root_limit);
            match self.lookup(&p, 0, limit) {
                Look::Unknown => {
                    return Resolution::Unknown { frontier: frontier(&cur, &todo) };
                }
                Look::Gone => return Resolution::Missing(format!("/{p} does not exist")),
                Look::ImplicitDir | Look::Found(_, Node::Dir) => {
                    if last {
                        return Resolution::Missing(format!("/{p} is a directory"));
                    }
                    limits.push(self.child_limit(&p, limit));
                }
                Look::Found(_, Node::Symlink(target)) => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Resolution::Missing(format!("too many levels of symbolic links at /{p}"));
                    }
                    cur.pop();
                    if target.starts_with('/') {
                        cur.clear();
                        limits.truncate(1);
                    }
                    if target.ends_with('/') {
                        // A trailing slash: what the target names must be a directory.
                        todo.push(".".to_string());
                    }
                    for t in target.split('/').rev().filter(|t| !t.is_empty()) {
                        todo.push(t.to_string());
                    }
                }
                Look::Found(i, Node::File { size }) => {
                    if !last {
                        return Resolution::Missing(format!("/{p} is not a directory"));
                    }
                    return Resolution::File { layer: i, path: p, size };
                }
                Look::Found(i, Node::Hardlink { target, below }) => {
                    if !last {
                        return Resolution::Missing(format!("/{p} is not a directory"));
                    }
                    return self.resolve_hardlink(i, below, &p, target, hops, visited);
                }
                Look::Found(_, Node::Sparse) => {
                    return Resolution::Missing(format!("sparse files are not supported: /{p}"));
                }
                Look::Found(_, Node::Other(what)) => {
                    return Resolution::Missing(format!("/{p} is a {what}, not a regular file"));
                }
            }
        }
        Resolution::Missing(format!("/{} is a directory", cur.join("/")))
    }

    fn resolve_hardlink(
        &self,
        layer: usize,
        below: bool,
        from: &str,
        target: String,
        mut hops: u32,
        visited: &mut HashSet<String>,
    ) -> Resolution {
        let mut layer = layer;
        let mut below = below;
        let mut target = target;
        loop {
            hops += 1;
            if hops > MAX_HOPS {
                return Resolution::Missing(format!("too many levels of links at /{from}"));
            }
            visited.insert(target.clone());
            let start = if below { layer + 1 } else { layer };
            // The link was made when its layer was applied: later (upper) layers removing
            // the target's directory do not take the linked file away.
            let limit = self.dir_limit_from(parent_of(&target), layer);
            match self.lookup(&target, start, limit) {
                Look::Found(i, Node::File { size }) => {
                    return Resolution::File { layer: i, path: target, size };
                }
                Look::Found(i, Node::Hardlink { target: t, below: b }) => {
                    layer = i;
                    below = b;
                    target = t;
                }
                Look::Unknown => return Resolution::Unknown { frontier: target },
                Look::Found(_, Node::Sparse) => {
                    return Resolution::Missing(format!("sparse files are not supported: /{target}"));
                }
                Look::Found(_, n) => {
                    return Resolution::Missing(format!(
                        "/{from} is a hard link to /{target}, which is not a regular file ({n:?})"
                    ));
                }
                Look::Gone | Look::ImplicitDir => {
                    return Resolution::Missing(format!(
                        "/{from} is a hard link to /{target}, which does not exist before it"
                    ));
                }
            }
        }
    }
}

/// Checks a wanted in-image path (the shared clean-path grammar) and returns it without
/// its leading `/`.
pub fn check_wanted_path(p: &str) -> Result<String> {
    use kata_addons_facts::PathError;
    match kata_addons_facts::check_path(p) {
        Ok(()) => Ok(p[1..].to_string()),
        Err(PathError::Relative(_)) => bail!("in-image path {p:?} must be absolute"),
        Err(PathError::TooLong(_) | PathError::Control(..)) => {
            bail!("in-image path {p:?} is too long or has control characters")
        }
        Err(_) => bail!("in-image path {p:?} is not normalised (no `.`, `..`, `//` or trailing `/`)"),
    }
}

/// Parent of a normalised path (for tests and messages).
pub fn parent(p: &str) -> &str {
    parent_of(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(entries: &[(&str, Node)], markers: &[&str]) -> LayerIndex {
        let mut l = LayerIndex::default();
        let b = IndexBudget::default();
        for (p, n) in entries {
            l.add(p.to_string(), n.clone(), &b).expect("add");
        }
        for m in markers {
            assert!(l.add_marker(m, &b).expect("marker"));
        }
        l
    }

    fn f() -> Node {
        Node::File { size: 1 }
    }

    #[test]
    fn whiteouts_opaque_symlinks() {
        let top = layer(
            &[("boot", Node::Dir), ("boot/vmlinuz", Node::Symlink("../k/vmlinuz-6".into())), ("etc", Node::Dir)],
            &["etc/.wh.gone", "opq/.wh..wh..opq"],
        );
        let low = layer(
            &[
                ("k", Node::Dir),
                ("k/vmlinuz-6", f()),
                ("etc", Node::Dir),
                ("etc/gone", f()),
                ("opq", Node::Dir),
                ("opq/hidden", f()),
                ("loop", Node::Symlink("loop".into())),
            ],
            &[],
        );
        let v = View { layers: vec![&top, &low], all_read: true };
        assert_eq!(v.resolve("/boot/vmlinuz"), Resolution::File { layer: 1, path: "k/vmlinuz-6".into(), size: 1 });
        assert!(matches!(v.resolve("/etc/gone"), Resolution::Missing(_)));
        assert!(matches!(v.resolve("/opq/hidden"), Resolution::Missing(_)));
        assert!(matches!(v.resolve("/loop"), Resolution::Missing(m) if m.contains("too many")));
        let v = View { layers: vec![&top], all_read: false };
        assert!(matches!(v.resolve("/boot/vmlinuz"), Resolution::Unknown { frontier } if frontier == "k/vmlinuz-6"));
    }

    /// Found by tests/tests/fuzz.rs: a symlink whose target ends in `/` names a directory;
    /// a file there is "not a directory" (as the kernel says), not the file.
    #[test]
    fn symlink_with_a_trailing_slash_to_a_file_is_not_a_file() {
        let l = layer(&[("boot", Node::Dir), ("boot/k", f()), ("boot/vmlinuz", Node::Symlink("k/".into()))], &[]);
        let v = View { layers: vec![&l], all_read: true };
        assert!(matches!(v.resolve("/boot/vmlinuz"), Resolution::Missing(m) if m.contains("not a directory")));
        let l = layer(&[("boot", Node::Dir), ("boot/k", f()), ("boot/vmlinuz", Node::Symlink("/boot//k".into()))], &[]);
        let v = View { layers: vec![&l], all_read: true };
        assert!(matches!(v.resolve("/boot/vmlinuz"), Resolution::File { .. }));
    }

    /// Found by tests/tests/fuzz.rs: a hard link made by a lower layer keeps its file when
    /// an upper layer removes the directory of the link's target (the link is its own
    /// directory entry of the same inode).
    #[test]
    fn hard_link_survives_its_target_directory_removed_above() {
        let low = layer(
            &[
                ("opt", Node::Dir),
                ("opt/a", f()),
                ("usr", Node::Dir),
                ("usr/b", Node::Hardlink { target: "opt/a".into(), below: false }),
            ],
            &[],
        );
        let top = layer(&[("x", f())], &[".wh.opt"]);
        let v = View { layers: vec![&top, &low], all_read: true };
        assert_eq!(v.resolve("/usr/b"), Resolution::File { layer: 1, path: "opt/a".into(), size: 1 });
        assert!(matches!(v.resolve("/opt/a"), Resolution::Missing(_)));
        let top = layer(&[("opt", Node::Dir)], &["opt/.wh..wh..opq"]);
        let v = View { layers: vec![&top, &low], all_read: true };
        assert_eq!(v.resolve("/usr/b"), Resolution::File { layer: 1, path: "opt/a".into(), size: 1 });
    }

    #[test]
    fn implicit_parent_is_undecided() {
        let top = layer(&[("a/b", f())], &[]);
        let v = View { layers: vec![&top], all_read: false };
        assert!(matches!(v.resolve("/a/b"), Resolution::Unknown { .. }));
        let v = View { layers: vec![&top], all_read: true };
        assert!(matches!(v.resolve("/a/b"), Resolution::File { .. }));
    }
}
