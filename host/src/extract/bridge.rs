//! The bridge between the async blob stream and the blocking walker: chunks go through a
//! bounded channel to the walker's thread ([`ChannelReader`]) while the digest is computed
//! on its own thread; the layer counts only once every byte matched its descriptor.

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::{Context, Result, bail};
use bytes::Bytes;

use super::decode::{Compression, decoder};
use super::layer::{LayerJob, LayerOutput, Mode, run_decompressed};
use super::tempfiles::TempFiles;
use super::{IndexBudget, LayerIndex, Limits};
use crate::source::blobhash::BlobHasher;
use crate::source::{Blob, Descriptor, Source};

/// A `BufRead` over chunks received from the async side (channel closed = end of data):
/// the decoder reads the received buffers in place, with no copy.
pub struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl ChannelReader {
    /// Wraps a receiver.
    pub fn new(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        ChannelReader { rx, cur: Bytes::new() }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = buf.len().min(avail.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for ChannelReader {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => break,
            }
        }
        Ok(&self.cur)
    }

    fn consume(&mut self, n: usize) {
        let _ = self.cur.split_to(n.min(self.cur.len()));
    }
}

/// Walks one layer's tar stream from `rx` (runs on a blocking thread).
pub fn run(job: LayerJob, rx: tokio::sync::mpsc::Receiver<Bytes>) -> Result<LayerOutput> {
    let decoded = decoder(job.compression, ChannelReader::new(rx))?;
    run_decompressed(job, decoded)
}

/// What every layer pass of one extraction shares.
pub struct Pass<'a> {
    /// The extraction limits.
    pub limits: &'a Limits,
    /// Where the blobs are read from.
    pub source: &'a dyn Source,
    /// The temporary files in the destination.
    pub temps: &'a TempFiles,
    /// Bytes extracted so far, all files together.
    pub total: Arc<AtomicU64>,
    /// The merged index's budget.
    pub budget: Arc<IndexBudget>,
    /// Measured files, whose tree is computed while they are copied, by normalised path.
    pub streams: Arc<HashMap<String, super::sink::Measured>>,
}

/// Streams layer `number` (blob `desc`, layers above it indexed in `upper`) through the
/// walker in `mode` while verifying its size and digest; the walker's output counts only
/// when the whole blob verified.
pub async fn read_layer(
    pass: &Pass<'_>,
    desc: &Descriptor,
    number: usize,
    upper: Vec<Arc<LayerIndex>>,
    mode: Mode,
) -> Result<LayerOutput> {
    let (limits, temps) = (pass.limits, pass.temps);
    let compression =
        Compression::from_media_type(&desc.media_type).with_context(|| format!("layer {}", desc.digest))?;
    if desc.size > limits.max_blob_size {
        bail!("layer {} is {} bytes, more than the {} byte limit", desc.digest, desc.size, limits.max_blob_size);
    }
    let mut blob = pass.source.open(desc).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let job = LayerJob {
        number,
        compression,
        upper,
        mode,
        temps: temps.clone(),
        max_file_size: limits.max_file_size,
        max_total_size: limits.max_total_size,
        total: pass.total.clone(),
        max_decompressed: super::limits::layer_cap(desc.size, limits.max_layer_ratio, limits.max_layer_bytes),
        budget: pass.budget.clone(),
        streams: pass.streams.clone(),
    };
    let thread = tokio::task::spawn_blocking(move || run(job, rx));
    let streamed = stream_verified(&mut *blob, desc, tx).await;
    let walked = thread.await.context("layer walker thread failed")?;
    match (streamed, walked) {
        (Err(e), Ok(out)) => {
            for c in out.captures.values() {
                temps.remove(&c.tmp);
            }
            Err(e)
        }
        (Err(e), Err(_)) => Err(e),
        (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(out)) => Ok(out),
    }
    .with_context(|| format!("layer {} ({})", desc.digest, desc.media_type))
}

/// Streams `blob` (of `desc`) to `tx` while hashing it on its own thread; refuses
/// a blob longer or shorter than its descriptor or whose digest differs. A receiver that
/// stops early does not stop the reading: every byte is verified.
pub async fn stream_verified(
    blob: &mut dyn Blob,
    desc: &Descriptor,
    tx: tokio::sync::mpsc::Sender<Bytes>,
) -> Result<()> {
    let bar = crate::progress::layer(&desc.digest, desc.size);
    let streamed: Result<()> = async {
        let mut tx = Some(tx);
        // The digest is computed on its own thread while the walker decompresses.
        let hasher = BlobHasher::start();
        let (mut n, mut chunks) = (0u64, 0u64);
        while let Some(chunk) = blob.next_chunk().await? {
            n += chunk.len() as u64;
            chunks += 1;
            bar.inc(chunk.len() as u64);
            crate::progress::pulled(chunk.len() as u64);
            if n > desc.size {
                bail!("blob is larger than its descriptor says ({} bytes): refused", desc.size);
            }
            hasher.update(chunk.clone()).await?;
            if let Some(t) = &tx
                && t.send(chunk).await.is_err()
            {
                // The walker stopped (error or end of tar): keep hashing to the end.
                tx = None;
            }
        }
        drop(tx);
        tracing::debug!("blob {}: {n} bytes in {chunks} chunks", desc.digest);
        if n != desc.size {
            bail!("blob is truncated: {n} of {} bytes", desc.size);
        }
        let actual = hasher.finish().await?;
        if actual != desc.digest {
            bail!("blob digest mismatch: content hashes to {actual}");
        }
        Ok(())
    }
    .await;
    bar.finish_and_clear();
    streamed
}
