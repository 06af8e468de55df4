//! The digest of a layer blob, computed on its own thread. The async side hands every
//! received chunk (reference-counted, not copied) both to this thread and to the tar walker,
//! so SHA-256 of the compressed stream and decompression + extraction run on two cores at
//! once instead of one after the other. The channel is bounded: memory stays constant, and
//! a slow hasher slows the download instead of buffering it.

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;

/// Chunks in flight to the hashing thread: as deep as the walker's queue. A chunk can pin a
/// whole receive buffer of the HTTP client, so this bounds memory (32 measured 41 MiB RSS).
const DEPTH: usize = 8;

/// A SHA-256 running on a blocking thread; feed it with [`BlobHasher::update`].
pub(crate) struct BlobHasher {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    thread: tokio::task::JoinHandle<String>,
}

impl BlobHasher {
    /// Starts the hashing thread (on the runtime's blocking pool).
    pub(crate) fn start() -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(DEPTH);
        let thread = tokio::task::spawn_blocking(move || {
            let mut h = crate::hash::Sha256::new();
            while let Some(chunk) = rx.blocking_recv() {
                h.update(&chunk);
            }
            format!("sha256:{}", h.finish_hex())
        });
        BlobHasher { tx, thread }
    }

    /// Queues the next chunk (waits while the thread is `DEPTH` chunks behind).
    pub(crate) async fn update(&self, chunk: Bytes) -> Result<()> {
        self.tx.send(chunk).await.map_err(|_| anyhow!("the blob hashing thread stopped"))
    }

    /// Ends the stream and returns the digest (`sha256:` + hex) of every chunk queued.
    pub(crate) async fn finish(self) -> Result<String> {
        drop(self.tx);
        self.thread.await.context("the blob hashing thread failed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn same_digest_as_one_pass() {
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i % 251) as u8).collect();
        let h = BlobHasher::start();
        for c in data.chunks(4099) {
            h.update(Bytes::copy_from_slice(c)).await.expect("update");
        }
        use sha2::Digest;
        let want = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&data)));
        assert_eq!(h.finish().await.expect("finish"), want);
        assert_eq!(
            BlobHasher::start().finish().await.expect("empty"),
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(b"")))
        );
    }
}
