//! A raw-file layer of an OCI artifact (docs/design.md#oci-artifacts): the blob's bytes are
//! the file, written to its temporary file as they arrive, with no decompression and no tar
//! walk. The blob digest, verified while streaming, is the file's sha256.

use std::io::Write;

use anyhow::{Context, Result, bail};
use bytes::Bytes;

use super::sink::{WRITEBACK_STEP, start_writeback};

/// Bytes buffered before a write: registry chunks are often a few KiB.
const BUFFER: usize = 256 * 1024;

/// Writes every chunk received on `rx` to `file` (a temporary file named `tmp`) until the
/// channel closes, feeding `verity` (a measured image's tree) as the bytes pass; refuses
/// more than `size` bytes. Returns the bytes written and the tree. Runs on a blocking
/// thread; the file's data is made durable later, before its rename.
pub fn write_stream(
    file: cap_std::fs::File,
    tmp: &str,
    size: u64,
    mut verity: Option<crate::verity::Stream>,
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> Result<(u64, Option<crate::verity::Streamed>)> {
    let mut w = std::io::BufWriter::with_capacity(BUFFER, file);
    let (mut written, mut started) = (0u64, 0u64);
    while let Some(chunk) = rx.blocking_recv() {
        written += chunk.len() as u64;
        if written > size {
            bail!("more than the {size} bytes its descriptor says");
        }
        if let Some(v) = &mut verity {
            v.update(&chunk);
        }
        w.write_all(&chunk).with_context(|| format!("write temporary file {tmp}"))?;
        if written - started >= WRITEBACK_STEP {
            start_writeback(w.get_ref(), started, written - started);
            started = written;
        }
    }
    w.flush().with_context(|| format!("write temporary file {tmp}"))?;
    Ok((written, verity.and_then(crate::verity::Stream::finish)))
}
