//! The walker: one pass over one layer's decompressed tar stream, indexing every entry
//! and copying the candidate files into temporary files in the destination directory.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};
use bytes::Bytes;

use super::decode::{Capped, Compression};
use super::sink::{CHUNK, Capture, Sink};
use super::tarstream::{Kind, TarStream};
use super::tempfiles::TempFiles;
use super::{IndexBudget, LayerIndex, Node, Resolution, View, normalize};

/// Which files of a layer to copy out.
pub enum Mode {
    /// Whatever the wanted paths may lead to, as far as known (recomputed after links).
    Discover(Vec<String>),
    /// Exactly these paths (second pass over a layer already indexed).
    Exact(HashSet<String>),
}

/// Inputs of one layer pass.
pub struct LayerJob {
    /// Layer number, 0 = top.
    pub number: usize,
    /// Compression of the blob.
    pub compression: Compression,
    /// Indexes of the layers above, top first.
    pub upper: Vec<Arc<LayerIndex>>,
    /// What to copy out.
    pub mode: Mode,
    /// Where temporary files go.
    pub temps: TempFiles,
    /// Largest single file.
    pub max_file_size: u64,
    /// Largest total copied (shared across layers).
    pub max_total_size: u64,
    /// Bytes copied so far (shared across layers).
    pub total: Arc<AtomicU64>,
    /// Most decompressed bytes this layer may produce ([`super::limits::layer_cap`]).
    pub max_decompressed: u64,
    /// The merged index's budget (shared across layers).
    pub budget: Arc<IndexBudget>,
    /// Measured files, whose tree is computed while they are copied, by normalised path.
    pub streams: Arc<HashMap<String, super::sink::Measured>>,
}

/// What one layer pass produced.
pub struct LayerOutput {
    /// The layer's index.
    pub index: LayerIndex,
    /// Files copied out, by normalised path.
    pub captures: HashMap<String, Capture>,
}

fn candidates(job: &LayerJob, index: &LayerIndex, wanted: &[String], visited: &mut HashSet<String>) -> HashSet<String> {
    let mut layers: Vec<&LayerIndex> = job.upper.iter().map(|a| a.as_ref()).collect();
    layers.push(index);
    let view = View { layers, all_read: false };
    let mut out = HashSet::new();
    for w in wanted {
        match view.resolve_tracked(w, visited) {
            Resolution::File { layer, path, .. } if layer == job.number => {
                out.insert(path);
            }
            Resolution::Unknown { frontier } => {
                out.insert(frontier);
            }
            _ => {}
        }
    }
    out
}

/// Walks one layer from a `Read` of its decompressed tar bytes; the captured files are
/// hashed and written by the writer thread ([`Sink`]) while the walk goes on.
pub fn run_decompressed<R: Read>(job: LayerJob, decompressed: R) -> Result<LayerOutput> {
    std::thread::scope(|scope| {
        let mut sink = Sink::new(scope, &job.temps);
        let walked = walk(&job, decompressed, &mut sink);
        // A writer error (the disk) is the cause of a walker error "the file writer stopped".
        let captures = sink.finish()?;
        match walked {
            Ok(index) => Ok(LayerOutput { index, captures }),
            Err(e) => {
                for c in captures.values() {
                    job.temps.remove(&c.tmp);
                }
                Err(e)
            }
        }
    })
}

/// Sends an entry's data to the writer as the copy of `path` (a new temporary file, or the
/// one an earlier copy of the same path in this layer used), checking the size limits. The
/// data is not synced: the caller syncs the files it keeps before renaming them
/// ([`super::tempfiles::sync_file`]).
fn capture<R: Read>(
    job: &LayerJob,
    sink: &mut Sink<'_, '_>,
    captured: &mut HashSet<String>,
    path: &str,
    entry: &mut R,
    size: u64,
) -> Result<()> {
    if size > job.max_file_size {
        bail!("/{path} is {size} bytes, more than the per-file limit of {} bytes", job.max_file_size);
    }
    job.temps.check_space(path, size)?;
    sink.begin(path, job.streams.get(path).cloned())?;
    captured.insert(path.to_string());
    let mut n_total = 0u64;
    loop {
        // The decoder inflates straight into the chunk handed to the writer: no copy.
        let mut chunk = Vec::with_capacity(CHUNK);
        let n = (&mut *entry)
            .take(CHUNK as u64)
            .read_to_end(&mut chunk)
            .with_context(|| format!("read /{path} from the layer"))?;
        if n == 0 {
            break;
        }
        n_total += n as u64;
        if n_total > job.max_file_size {
            bail!("/{path} exceeds the per-file limit of {} bytes", job.max_file_size);
        }
        let total = job.total.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if total > job.max_total_size {
            bail!("extracted files exceed the total limit of {} bytes", job.max_total_size);
        }
        sink.data(Bytes::from(chunk))?;
    }
    sink.end()
}

/// Drops the copy of `path` if this pass made one (a later entry replaced it).
fn discard(sink: &mut Sink<'_, '_>, captured: &mut HashSet<String>, path: &str) -> Result<()> {
    if captured.remove(path) { sink.discard(path) } else { Ok(()) }
}

fn walk<R: Read>(job: &LayerJob, decompressed: R, sink: &mut Sink<'_, '_>) -> Result<LayerIndex> {
    let capped = Capped::new(decompressed, job.max_decompressed);
    let mut tar = TarStream::new(capped);
    let mut index = LayerIndex::default();
    let mut visited = HashSet::new();
    let mut captured = HashSet::new();
    let (wanted, exact): (&[String], bool) = match &job.mode {
        Mode::Discover(w) => (w, false),
        Mode::Exact(_) => (&[], true),
    };
    let mut cands = match &job.mode {
        Mode::Discover(w) => candidates(job, &index, w, &mut visited),
        Mode::Exact(set) => set.clone(),
    };
    while let Some(entry) = tar.next_entry().context("malformed tar entry")? {
        let Ok(raw) = String::from_utf8(entry.path) else {
            tracing::debug!("skipping a tar entry with a non-UTF-8 name");
            continue;
        };
        let path = normalize(&raw);
        if path.is_empty() {
            continue;
        }
        if exact {
            // Second pass: the layer is already indexed; copy exactly the asked files.
            if entry.kind == Kind::Regular && cands.contains(&path) {
                capture(job, sink, &mut captured, &path, &mut tar.data(), entry.size)?;
            }
            continue;
        }
        if index.add_marker(&path, &job.budget)? {
            continue;
        }
        let link_text = |l: &Option<Vec<u8>>| l.as_ref().and_then(|t| std::str::from_utf8(t).ok().map(str::to_string));
        let mut relink = false;
        let node = match entry.kind {
            Kind::Regular => {
                if cands.contains(&path) {
                    capture(job, sink, &mut captured, &path, &mut tar.data(), entry.size)?;
                } else {
                    // A later duplicate wins: an earlier copy is stale.
                    discard(sink, &mut captured, &path)?;
                }
                Node::File { size: entry.size }
            }
            Kind::Dir => Node::Dir,
            Kind::Symlink => {
                relink = true;
                match link_text(&entry.link) {
                    Some(t) if !t.is_empty() => Node::Symlink(t),
                    Some(_) => Node::Other("symbolic link without a target"),
                    None => Node::Other("symbolic link with an unusable target"),
                }
            }
            Kind::Hardlink => {
                relink = true;
                match link_text(&entry.link).map(|t| normalize(&t)) {
                    Some(t) if !t.is_empty() => Node::Hardlink { target: t, below: false },
                    _ => Node::Other("hard link with an unusable target"),
                }
            }
            Kind::Char => Node::Other("character device"),
            Kind::Block => Node::Other("block device"),
            Kind::Fifo => Node::Other("fifo"),
            Kind::Sparse => Node::Sparse,
            Kind::Other(_) => Node::Other("unsupported tar entry"),
        };
        if !matches!(node, Node::File { .. }) {
            discard(sink, &mut captured, &path)?;
        }
        // Only a link at a path the wanted paths went through can change where they lead.
        let relevant = relink && visited.contains(&path);
        index.add(path, node, &job.budget)?;
        if relevant && job.budget.take_recompute() {
            visited.clear();
            cands = candidates(job, &index, wanted, &mut visited);
        }
    }
    // Drain the rest of the stream (end-of-archive padding), still under the cap.
    let mut rest = tar.into_inner();
    if let Err(e) = std::io::copy(&mut rest, &mut std::io::sink()) {
        if rest.over_cap() {
            return Err(e).context("reading the end of the layer");
        }
        // Garbage after the end of the archive: the blob digest was verified, the tar is complete.
        tracing::debug!("ignoring unreadable bytes after the end of the tar archive: {e}");
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::fs::Dir;

    /// A tar entry (GNU header) of `kind` at `path` with `data`.
    fn entry(tar: &mut Vec<u8>, path: &str, kind: tar::EntryType, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_path(path).expect("path");
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_cksum();
        tar.extend_from_slice(h.as_bytes());
        tar.extend_from_slice(data);
        tar.resize(tar.len().next_multiple_of(512), 0);
    }

    /// Walks `tar` (uncompressed) wanting `/boot/vmlinuz`, in a fresh directory.
    fn walk_wanting_vmlinuz(tar: &[u8]) -> (tempfile::TempDir, TempFiles, Result<LayerOutput>) {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).expect("dir");
        let temps = TempFiles::new(dir, "the test directory");
        let job = LayerJob {
            number: 0,
            compression: Compression::None,
            upper: Vec::new(),
            mode: Mode::Discover(vec!["boot/vmlinuz".into()]),
            temps: temps.clone(),
            max_file_size: 1 << 30,
            max_total_size: 1 << 30,
            total: Arc::default(),
            max_decompressed: 1 << 30,
            streams: Arc::default(),
            budget: Arc::new(IndexBudget::default()),
        };
        let out = run_decompressed(job, tar);
        (tmp, temps, out)
    }

    /// A layer repeating the wanted file rewrites one temporary file in place
    /// (`bench/hostile` case `duplicates`: a file created, fsynced and removed per copy cost
    /// 20 s of CPU for 233,000 copies in a 1 MiB layer).
    #[test]
    fn duplicates_of_a_wanted_file_reuse_one_temporary_file() {
        let mut tar = Vec::new();
        for i in 0..1000u32 {
            entry(&mut tar, "boot/vmlinuz", tar::EntryType::Regular, format!("{i:04}").as_bytes());
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let (tmp, temps, out) = walk_wanting_vmlinuz(&tar);
        let out = out.expect("walks");
        let c = &out.captures["boot/vmlinuz"];
        assert_eq!(std::fs::read(tmp.path().join(&c.tmp)).expect("read"), b"0999");
        assert_eq!(c.size, 4);
        assert_eq!(temps.created(), 1, "one temporary file for all copies");
        assert_eq!(std::fs::read_dir(tmp.path()).expect("list").count(), 1);
    }

    /// The writer thread gets a file of many chunks whole, with its SHA-256; a later entry
    /// replacing the path with a directory removes the copy (the writer owns
    /// the file operations, in the walker's order).
    #[test]
    fn the_writer_thread_writes_hashes_and_discards_in_order() {
        let big: Vec<u8> = (0..(5 * CHUNK + 123) as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let mut tar = Vec::new();
        entry(&mut tar, "boot/vmlinuz", tar::EntryType::Regular, &big);
        tar.extend_from_slice(&[0u8; 1024]);
        let (tmp, _temps, out) = walk_wanting_vmlinuz(&tar);
        let out = out.expect("walks");
        let c = &out.captures["boot/vmlinuz"];
        assert_eq!(std::fs::read(tmp.path().join(&c.tmp)).expect("read"), big);
        assert_eq!((c.sha256.as_deref(), c.size), (Some(crate::hash::sha256_hex(&big).as_str()), big.len() as u64));

        let mut tar = Vec::new();
        entry(&mut tar, "boot/vmlinuz", tar::EntryType::Regular, &big);
        entry(&mut tar, "boot/vmlinuz", tar::EntryType::Directory, b"");
        tar.extend_from_slice(&[0u8; 1024]);
        let (tmp, temps, out) = walk_wanting_vmlinuz(&tar);
        let out = out.expect("walks");
        assert!(out.captures.is_empty());
        assert_eq!(temps.created(), 1);
        assert_eq!(std::fs::read_dir(tmp.path()).expect("list").count(), 0, "the stale copy is removed");
    }

    /// A file cut short by the end of the stream is an error and leaves no temporary file.
    #[test]
    fn a_truncated_wanted_file_leaves_nothing() {
        let mut tar = Vec::new();
        entry(&mut tar, "boot/vmlinuz", tar::EntryType::Regular, &vec![7u8; 3 * CHUNK]);
        tar.truncate(512 + 2 * CHUNK + 100);
        let (tmp, temps, out) = walk_wanting_vmlinuz(&tar);
        let err = format!("{:#}", out.err().expect("refused"));
        assert!(err.contains("/boot/vmlinuz"), "{err}");
        assert_eq!(temps.created(), 1);
        assert_eq!(std::fs::read_dir(tmp.path()).expect("list").count(), 0);
    }
}
