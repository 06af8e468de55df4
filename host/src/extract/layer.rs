//! The walker: one pass over one layer's decompressed tar stream, indexing every entry
//! and copying the candidate files into temporary files in the destination directory.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

use super::decode::{Capped, Compression};
use super::tarstream::{Kind, TarStream};
use super::tempfiles::TempFiles;
use super::{IndexBudget, LayerIndex, Node, Resolution, View, normalize};

/// A file copied out of a layer into a temporary file.
#[derive(Debug, Clone)]
pub struct Capture {
    /// Temporary file name in the destination.
    pub tmp: String,
    /// sha256 (hex) of the content.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// The dm-verity tree computed while the file was copied (measured images only).
    pub streamed: Option<crate::verity::Streamed>,
}

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
    /// dm-verity parameters of files whose tree is computed while they are copied, by
    /// normalised path.
    pub streams: Arc<HashMap<String, crate::verity::Params>>,
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

/// Bytes written to a captured file between two requests to start writing them back.
pub(crate) const WRITEBACK_STEP: u64 = 4 << 20;

/// Asks the kernel to start writing `len` bytes at `offset` of `file` back to disk now,
/// without waiting, so that the final `fsync` overlaps decompression instead of following
/// it. Only a hint: failure is ignored (the `fsync` is what makes the data durable).
#[cfg(target_os = "linux")]
pub(crate) fn start_writeback(file: &cap_std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: a plain syscall on a descriptor we own; no memory is passed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn start_writeback(_file: &cap_std::fs::File, _offset: u64, _len: u64) {}

/// Temporary files open for writing during one layer pass, by path, and the copy buffer:
/// a later duplicate of a path rewrites its file in place, so a layer repeating the wanted
/// path 200,000 times costs no file creation, removal or fsync per copy (issue 10:
/// creating and fsyncing each copy cost 20 s of CPU for a 1 MiB layer).
#[derive(Default)]
struct Open {
    files: HashMap<String, (String, cap_std::fs::File)>,
    buf: Vec<u8>,
}

/// Copies an entry's data into the temporary file for `path` (a new one, or the one an
/// earlier copy of the same path in this layer used), hashing it. The data is not synced
/// here: the caller syncs the files it keeps before renaming them ([`super::tempfiles::sync_file`]).
fn copy_out<R: Read>(job: &LayerJob, open: &mut Open, path: &str, entry: &mut R, size: u64) -> Result<Capture> {
    use std::io::Seek;
    if size > job.max_file_size {
        bail!("/{path} is {size} bytes, more than the per-file limit of {} bytes", job.max_file_size);
    }
    job.temps.check_space(path, size)?;
    let (tmp, file) = match open.files.remove(path) {
        Some((tmp, mut file)) => {
            file.set_len(0).with_context(|| format!("truncate temporary file {tmp}"))?;
            file.rewind().with_context(|| format!("rewind temporary file {tmp}"))?;
            (tmp, file)
        }
        None => job.temps.create()?,
    };
    let mut w = std::io::BufWriter::with_capacity(64 * 1024, file);
    let mut hasher = crate::hash::Sha256::new();
    let mut stream = job.streams.get(path).map(|p| crate::verity::Stream::new(p.clone()));
    if open.buf.len() != 64 * 1024 {
        open.buf = vec![0u8; 64 * 1024];
    }
    let buf = &mut open.buf;
    let mut n_total = 0u64;
    let mut started = 0u64;
    loop {
        let n = entry.read(buf).with_context(|| format!("read /{path} from the layer"))?;
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
        hasher.update(&buf[..n]);
        if let Some(s) = &mut stream {
            s.update(&buf[..n]);
        }
        w.write_all(&buf[..n]).with_context(|| format!("write temporary file {tmp}"))?;
        if n_total - started >= WRITEBACK_STEP {
            start_writeback(w.get_ref(), started, n_total - started);
            started = n_total;
        }
    }
    let file = w.into_inner().map_err(|e| e.into_error()).with_context(|| format!("write temporary file {tmp}"))?;
    open.files.insert(path.to_string(), (tmp.clone(), file));
    let streamed = stream.and_then(crate::verity::Stream::finish);
    Ok(Capture { tmp, sha256: hasher.finish_hex(), size: n_total, streamed })
}

/// Walks one layer from a `Read` of its decompressed tar bytes.
pub fn run_decompressed<R: Read>(job: LayerJob, decompressed: R) -> Result<LayerOutput> {
    let mut captures: HashMap<String, Capture> = HashMap::new();
    let res = walk(&job, decompressed, &mut captures);
    if res.is_err() {
        for c in captures.values() {
            job.temps.remove(&c.tmp);
        }
    }
    res.map(|index| LayerOutput { index, captures })
}

fn capture<R: Read>(
    job: &LayerJob,
    open: &mut Open,
    captures: &mut HashMap<String, Capture>,
    path: &str,
    r: &mut R,
    size: u64,
) -> Result<()> {
    // An earlier copy of the same path is overwritten in place (same temporary file).
    captures.remove(path);
    let c = copy_out(job, open, path, r, size)?;
    captures.insert(path.to_string(), c);
    Ok(())
}

fn walk<R: Read>(job: &LayerJob, decompressed: R, captures: &mut HashMap<String, Capture>) -> Result<LayerIndex> {
    let capped = Capped::new(decompressed, job.max_decompressed);
    let mut tar = TarStream::new(capped);
    let mut index = LayerIndex::default();
    let mut visited = HashSet::new();
    let mut open = Open::default();
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
                capture(job, &mut open, captures, &path, &mut tar.data(), entry.size)?;
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
                    capture(job, &mut open, captures, &path, &mut tar.data(), entry.size)?;
                } else if let Some(old) = captures.remove(&path) {
                    // A later duplicate wins: the earlier copy is stale.
                    open.files.remove(&path);
                    job.temps.remove(&old.tmp);
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
        if !matches!(node, Node::File { .. })
            && let Some(old) = captures.remove(&path)
        {
            open.files.remove(&path);
            job.temps.remove(&old.tmp);
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

    /// A layer repeating the wanted file rewrites one temporary file in place (issue 10,
    /// `bench/hostile` case `duplicates`: a file created, fsynced and removed per copy cost
    /// 20 s of CPU for 233,000 copies in a 1 MiB layer).
    #[test]
    fn duplicates_of_a_wanted_file_reuse_one_temporary_file() {
        let mut tar = Vec::new();
        for i in 0..1000u32 {
            let mut h = tar::Header::new_gnu();
            h.set_path("boot/vmlinuz").expect("path");
            h.set_size(4);
            h.set_cksum();
            tar.extend_from_slice(h.as_bytes());
            let mut data = format!("{i:04}").into_bytes();
            data.resize(512, 0);
            tar.extend_from_slice(&data);
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = cap_std::fs::Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).expect("dir");
        let temps = TempFiles::new(dir, "the test directory");
        let job = LayerJob {
            number: 0,
            compression: Compression::None,
            upper: Vec::new(),
            mode: Mode::Discover(vec!["boot/vmlinuz".into()]),
            temps: temps.clone(),
            max_file_size: 1 << 20,
            max_total_size: 1 << 30,
            total: Arc::default(),
            max_decompressed: 1 << 30,
            streams: Arc::default(),
            budget: Arc::new(IndexBudget::default()),
        };
        let out = run_decompressed(job, tar.as_slice()).expect("walks");
        let c = &out.captures["boot/vmlinuz"];
        assert_eq!(std::fs::read(tmp.path().join(&c.tmp)).expect("read"), b"0999");
        assert_eq!(c.size, 4);
        assert_eq!(temps.created(), 1, "one temporary file for all copies");
        assert_eq!(std::fs::read_dir(tmp.path()).expect("list").count(), 1);
    }
}
