//! The file writer of a layer pass: a thread of its own that hashes (SHA-256, through
//! [`crate::hash`]) and writes the bytes of the captured files while the walker inflates and
//! parses the next ones, and the blob hasher ([`crate::source::blobhash`]) digests the
//! compressed stream. The dm-verity tree of a measured image ([`crate::verity::Stream`]) is
//! computed on one more thread, fed the same chunks (on the writer's thread it made
//! the writer the critical stage, 1.39x the unmeasured install). Each stage has its own
//! thread, so the slowest alone sets the pace. The queue
//! is bounded ([`DEPTH`] chunks of at most [`CHUNK`] bytes), so memory stays constant and a
//! slow disk slows the walker instead of buffering. The thread starts at the first captured
//! file: a layer holding none of the wanted files costs no thread.
//!
//! The writer owns every file operation of the pass, in the order the walker sends them, so
//! a later duplicate of a path rewrites the first copy's temporary file in place.

use std::collections::HashMap;
use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::{Scope, ScopedJoinHandle};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;

use super::tempfiles::TempFiles;

/// Most bytes in one chunk sent to the writer.
pub(crate) const CHUNK: usize = 64 * 1024;

/// Chunks queued to the writer: 512 KiB at most in flight.
const DEPTH: usize = 8;

/// Chunks queued to the dm-verity thread of a measured file: 1 MiB at most in flight.
const VERITY_DEPTH: usize = 16;

/// Bytes written to a captured file between two requests to start writing them back.
pub(crate) const WRITEBACK_STEP: u64 = 4 << 20;

/// A measured file (an image or extension whose dm-verity parameters are known before the
/// fetch): its tree is computed as it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured {
    /// The parameters the tree is computed with.
    pub params: crate::verity::Params,
    /// Whether its sha256 is computed too: only when pinned, since the tree and the
    /// sha256 of the bytes outside the data blocks are its integrity record (a third pass
    /// over every byte cost 1.3x the unmeasured install on 2 cores).
    pub sha256: bool,
}

/// A file copied out of a layer into a temporary file.
#[derive(Debug, Clone)]
pub struct Capture {
    /// Temporary file name in the destination.
    pub tmp: String,
    /// sha256 (hex) of the content; `None` for a measured file that did not ask for it.
    pub sha256: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// The dm-verity tree computed while the file was copied (measured images only).
    pub streamed: Option<crate::verity::Streamed>,
}

/// What the walker asks of the writer.
enum Msg {
    /// Start the temporary file of a path: a new one, or the one an earlier copy of the
    /// same path in this layer used (truncated); for a measured image, its tree is
    /// computed as it is written.
    Begin(String, Option<Measured>),
    /// The next bytes of the file begun last.
    Data(Bytes),
    /// The file begun last is complete.
    End,
    /// A later entry replaced the path with something not copied: remove its copy.
    Discard(String),
}

/// The walker's end of the writer: starts the thread on first use.
pub(crate) struct Sink<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    temps: &'env TempFiles,
    tx: Option<SyncSender<Msg>>,
    writer: Option<ScopedJoinHandle<'scope, Result<HashMap<String, Capture>>>>,
}

impl<'scope, 'env> Sink<'scope, 'env> {
    /// A writer creating its temporary files in `temps`, run in `scope`.
    pub(crate) fn new(scope: &'scope Scope<'scope, 'env>, temps: &'env TempFiles) -> Self {
        Sink { scope, temps, tx: None, writer: None }
    }

    fn send(&mut self, m: Msg) -> Result<()> {
        let tx = match &self.tx {
            Some(tx) => tx,
            None => {
                let (tx, rx) = sync_channel(DEPTH);
                let temps = self.temps;
                let writer = std::thread::Builder::new()
                    .name("layer-writer".into())
                    .spawn_scoped(self.scope, move || write_files(temps, rx))
                    .context("starting the file writer thread")?;
                self.writer = Some(writer);
                self.tx.insert(tx)
            }
        };
        tx.send(m).map_err(|_| anyhow!("the file writer stopped"))
    }

    /// Starts (or restarts) the copy of `path`, computing its dm-verity tree if `measured`.
    pub(crate) fn begin(&mut self, path: &str, measured: Option<Measured>) -> Result<()> {
        self.send(Msg::Begin(path.to_string(), measured))
    }

    /// Queues the next bytes of the file begun last.
    pub(crate) fn data(&mut self, chunk: Bytes) -> Result<()> {
        self.send(Msg::Data(chunk))
    }

    /// Ends the file begun last.
    pub(crate) fn end(&mut self) -> Result<()> {
        self.send(Msg::End)
    }

    /// Removes the copy of `path` (it was begun earlier in this pass).
    pub(crate) fn discard(&mut self, path: &str) -> Result<()> {
        self.send(Msg::Discard(path.to_string()))
    }

    /// Waits for the writer; the files it completed, by path. On a writer error its
    /// temporary files are already removed.
    pub(crate) fn finish(mut self) -> Result<HashMap<String, Capture>> {
        drop(self.tx.take());
        match self.writer.take() {
            None => Ok(HashMap::new()),
            Some(w) => w.join().map_err(|_| anyhow!("the file writer thread panicked"))?,
        }
    }
}

/// The file being written.
struct Current {
    path: String,
    tmp: String,
    file: cap_std::fs::File,
    hasher: Option<crate::hash::Sha256>,
    verity: Option<VerityThread>,
    size: u64,
    started: u64,
}

/// Temporary files of this pass still open, by path: a later copy of a path rewrites its
/// file (creating and fsyncing each copy cost 20 s of CPU for a 1 MiB layer).
type Open = HashMap<String, (String, cap_std::fs::File)>;

/// The writer thread: applies the walker's messages in order until the channel closes.
fn write_files(temps: &TempFiles, rx: Receiver<Msg>) -> Result<HashMap<String, Capture>> {
    let mut open = Open::new();
    let mut captures: HashMap<String, Capture> = HashMap::new();
    let mut cur: Option<Current> = None;
    let res = apply(temps, &rx, &mut open, &mut captures, &mut cur);
    drop(rx); // after an error, the walker's next send fails: it stops
    // A file begun and not ended: the walker stopped inside it (its error is the cause).
    if let Some(c) = cur {
        temps.remove(&c.tmp);
    }
    if res.is_err() {
        for (tmp, _) in open.values() {
            temps.remove(tmp);
        }
    }
    res.map(|()| captures)
}

fn apply(
    temps: &TempFiles,
    rx: &Receiver<Msg>,
    open: &mut Open,
    captures: &mut HashMap<String, Capture>,
    cur: &mut Option<Current>,
) -> Result<()> {
    use std::io::Seek;
    for msg in rx {
        match msg {
            Msg::Begin(path, measured) => {
                captures.remove(&path);
                let (tmp, file) = match open.remove(&path) {
                    Some((tmp, mut file)) => {
                        file.set_len(0).with_context(|| format!("truncate temporary file {tmp}"))?;
                        file.rewind().with_context(|| format!("rewind temporary file {tmp}"))?;
                        (tmp, file)
                    }
                    None => temps.create()?,
                };
                let hasher = measured.as_ref().is_none_or(|m| m.sha256).then(crate::hash::Sha256::new);
                let verity = measured.map(|m| VerityThread::start(m.params)).transpose()?;
                *cur = Some(Current { path, tmp, file, hasher, verity, size: 0, started: 0 });
            }
            Msg::Data(chunk) => {
                let c = cur.as_mut().context("internal: file data sent outside a file")?;
                if let Some(v) = &c.verity {
                    v.send(chunk.clone());
                }
                if let Some(h) = &mut c.hasher {
                    h.update(&chunk);
                }
                c.file.write_all(&chunk).with_context(|| format!("write temporary file {}", c.tmp))?;
                c.size += chunk.len() as u64;
                if c.size - c.started >= WRITEBACK_STEP {
                    start_writeback(&c.file, c.started, c.size - c.started);
                    c.started = c.size;
                }
            }
            Msg::End => {
                let c = cur.take().context("internal: end of a file sent outside a file")?;
                let streamed = c.verity.and_then(VerityThread::finish);
                let sha256 = c.hasher.map(crate::hash::Sha256::finish_hex);
                let capture = Capture { tmp: c.tmp.clone(), sha256, size: c.size, streamed };
                captures.insert(c.path.clone(), capture);
                open.insert(c.path, (c.tmp, c.file));
            }
            Msg::Discard(path) => {
                captures.remove(&path);
                if let Some((tmp, _)) = open.remove(&path) {
                    temps.remove(&tmp);
                }
            }
        }
    }
    Ok(())
}

/// The dm-verity tree of the file being written, computed on a thread of its own from
/// the same chunks (shared, not copied). If the thread is gone the tree is simply not
/// streamed: verification then reads partition 1 from the written file.
struct VerityThread {
    tx: Option<SyncSender<Bytes>>,
    handle: std::thread::JoinHandle<Option<crate::verity::Streamed>>,
}

impl VerityThread {
    fn start(params: crate::verity::Params) -> Result<VerityThread> {
        let (tx, rx) = sync_channel::<Bytes>(VERITY_DEPTH);
        let handle = std::thread::Builder::new()
            .name("verity-stream".into())
            .spawn(move || {
                let mut stream = crate::verity::Stream::new(params);
                for chunk in rx {
                    stream.update(&chunk);
                }
                stream.finish()
            })
            .context("starting the dm-verity thread")?;
        Ok(VerityThread { tx: Some(tx), handle })
    }

    fn send(&self, chunk: Bytes) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(chunk);
        }
    }

    /// Waits for the tree over everything sent.
    fn finish(mut self) -> Option<crate::verity::Streamed> {
        drop(self.tx.take());
        self.handle.join().ok().flatten()
    }
}

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
