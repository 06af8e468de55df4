//! Extraction: a merged view over OCI layers (whiteouts, opaque directories, symlinks
//! and hardlinks resolved inside the image root) and a streaming per-layer walker.

pub mod layer;

use std::collections::{HashMap, HashSet};

use anyhow::{Result, bail};

/// Most symlinks followed while resolving one path (as Linux `MAXSYMLINKS`).
pub const MAX_HOPS: u32 = 40;

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
    /// A hard link to another path of the image (normalised).
    Hardlink(String),
    /// Anything else (device, fifo, sparse file…), with a description.
    Other(&'static str),
}

/// Everything one layer says: entries (last duplicate wins), whiteouts, opaque directories.
#[derive(Debug, Default)]
pub struct LayerIndex {
    entries: HashMap<String, Node>,
    implicit: HashSet<String>,
    whiteouts: HashSet<String>,
    opaque: HashSet<String>,
}

/// Splits a normalised path into its proper ancestors (excluding the root), shortest first.
fn ancestors(p: &str) -> impl Iterator<Item = &str> {
    p.match_indices('/').map(move |(i, _)| &p[..i])
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

impl LayerIndex {
    fn mark_ancestors(&mut self, p: &str) {
        for a in ancestors(p) {
            if !self.implicit.contains(a) {
                self.implicit.insert(a.to_string());
            }
        }
    }

    /// Records an entry (a later one for the same path replaces an earlier one).
    pub fn add(&mut self, path: String, node: Node) {
        self.mark_ancestors(&path);
        self.entries.insert(path, node);
    }

    /// Records a whiteout or opaque marker if `path`'s base name is one; returns whether it was.
    pub fn add_marker(&mut self, path: &str) -> bool {
        let (dir, base) = match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        };
        let Some(name) = base.strip_prefix(".wh.") else {
            return false;
        };
        self.mark_ancestors(path);
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
        true
    }

    /// Whether this layer hides `p` in the layers below it.
    fn hides_below(&self, p: &str) -> bool {
        if self.whiteouts.contains(p) || self.opaque.contains("") {
            return true;
        }
        ancestors(p).any(|a| {
            self.whiteouts.contains(a)
                || self.opaque.contains(a)
                || self.entries.get(a).is_some_and(|n| *n != Node::Dir)
        })
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

impl View<'_> {
    fn lookup(&self, p: &str, from: usize) -> Look {
        if p.is_empty() {
            return Look::Found(usize::MAX, Node::Dir);
        }
        let mut implicit = false;
        for (i, l) in self.layers.iter().enumerate().skip(from) {
            if let Some(n) = l.entries.get(p) {
                if implicit {
                    return match n {
                        Node::Dir | Node::Symlink(_) => Look::Found(i, n.clone()),
                        _ => Look::ImplicitDir,
                    };
                }
                return Look::Found(i, n.clone());
            }
            if l.implicit.contains(p) {
                implicit = true;
            }
            if l.hides_below(p) {
                return if implicit { Look::ImplicitDir } else { Look::Gone };
            }
        }
        match (implicit, self.all_read) {
            (true, true) => Look::ImplicitDir,
            (false, true) => Look::Gone,
            _ => Look::Unknown,
        }
    }

    /// Resolves an absolute in-image path to a regular file, following symlinks and
    /// hardlinks inside the image root.
    pub fn resolve(&self, wanted: &str) -> Resolution {
        let mut todo: Vec<String> =
            normalize(wanted).split('/').filter(|c| !c.is_empty()).rev().map(str::to_string).collect();
        let mut cur: Vec<String> = Vec::new();
        let mut hops = 0u32;
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
                cur.pop();
                continue;
            }
            cur.push(c);
            let p = cur.join("/");
            let last = todo.is_empty();
            match self.lookup(&p, 0) {
                Look::Unknown => {
                    return Resolution::Unknown { frontier: frontier(&cur, &todo) };
                }
                Look::Gone => return Resolution::Missing(format!("/{p} does not exist")),
                Look::ImplicitDir | Look::Found(_, Node::Dir) => {
                    if last {
                        return Resolution::Missing(format!("/{p} is a directory"));
                    }
                }
                Look::Found(_, Node::Symlink(target)) => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Resolution::Missing(format!("too many levels of symbolic links at /{p}"));
                    }
                    cur.pop();
                    if target.starts_with('/') {
                        cur.clear();
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
                Look::Found(i, Node::Hardlink(target)) => {
                    if !last {
                        return Resolution::Missing(format!("/{p} is not a directory"));
                    }
                    return self.resolve_hardlink(i, &p, target, hops);
                }
                Look::Found(_, Node::Other(what)) => {
                    return Resolution::Missing(format!("/{p} is a {what}, not a regular file"));
                }
            }
        }
        Resolution::Missing("/ is a directory".to_string())
    }

    fn resolve_hardlink(&self, layer: usize, from: &str, target: String, mut hops: u32) -> Resolution {
        let mut layer = layer;
        let mut target = target;
        loop {
            hops += 1;
            if hops > MAX_HOPS {
                return Resolution::Missing(format!("too many levels of links at /{from}"));
            }
            match self.lookup(&target, layer) {
                Look::Found(i, Node::File { size }) => {
                    return Resolution::File { layer: i, path: target, size };
                }
                Look::Found(i, Node::Hardlink(t)) => {
                    layer = i;
                    target = t;
                }
                Look::Unknown => return Resolution::Unknown { frontier: target },
                Look::Found(_, n) => {
                    return Resolution::Missing(format!(
                        "/{from} is a hard link to /{target}, which is not a regular file ({n:?})"
                    ));
                }
                Look::Gone | Look::ImplicitDir => {
                    return Resolution::Missing(format!("/{from} is a hard link to /{target}, which does not exist"));
                }
            }
        }
    }
}

/// Checks a wanted in-image path: absolute, normalised, no control characters, ≤ 4096 bytes.
pub fn check_wanted_path(p: &str) -> Result<String> {
    if !p.starts_with('/') {
        bail!("in-image path {p:?} must be absolute");
    }
    if p.len() > 4096 || p.chars().any(char::is_control) {
        bail!("in-image path {p:?} is too long or has control characters");
    }
    let n = normalize(p);
    if format!("/{n}") != p || n.is_empty() {
        bail!("in-image path {p:?} is not normalised (no `.`, `..`, `//` or trailing `/`)");
    }
    Ok(n)
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
        for (p, n) in entries {
            l.add(p.to_string(), n.clone());
        }
        for m in markers {
            assert!(l.add_marker(m));
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

    #[test]
    fn implicit_parent_is_undecided() {
        let top = layer(&[("a/b", f())], &[]);
        let v = View { layers: vec![&top], all_read: false };
        assert!(matches!(v.resolve("/a/b"), Resolution::Unknown { .. }));
        let v = View { layers: vec![&top], all_read: true };
        assert!(matches!(v.resolve("/a/b"), Resolution::File { .. }));
    }
}
