//! Decoding a layer blob: its compression from the media type, the decompressing reader,
//! and the cap on what it may decompress to (a decompression bomb is refused).

use std::io::{BufRead, Read};

use anyhow::{Context, Result, bail};

/// How a layer's bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain tar.
    None,
    /// gzip (possibly several members).
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The compression for a layer media type; unknown types are refused.
    pub fn from_media_type(mt: &str) -> Result<Self> {
        Ok(match mt {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Compression::None,
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Compression::Gzip,
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Compression::Zstd,
            other => bail!("unsupported layer media type {other:?}"),
        })
    }
}

/// The decompressing reader for a layer blob's bytes (read in place from `reader`'s buffer).
pub fn decoder<'a, R: BufRead + 'a>(compression: Compression, reader: R) -> Result<Box<dyn Read + 'a>> {
    Ok(match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(reader)),
        Compression::Zstd => {
            let mut d = zstd::stream::read::Decoder::with_buffer(reader).context("zstd decoder")?;
            // Bounded memory: refuse frames needing a window above 16 MiB.
            d.window_log_max(24).context("zstd decoder")?;
            Box::new(d)
        }
    })
}

/// A reader that fails once more than `cap` bytes went through it.
pub struct Capped<R> {
    inner: R,
    read: u64,
    cap: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.cap {
            return Err(std::io::Error::other(format!(
                "the layer decompresses to more than {} bytes: refused as a decompression bomb (the cap is \
                 min(max(--max-layer-ratio × compressed size, {} MiB), --max-layer-bytes))",
                self.cap,
                super::limits::RATIO_FLOOR >> 20
            )));
        }
        Ok(n)
    }
}

impl<R> Capped<R> {
    /// `inner`, failing once more than `cap` bytes went through it.
    pub fn new(inner: R, cap: u64) -> Self {
        Capped { inner, read: 0, cap }
    }

    /// Whether more than the cap went through (the error a read returned was the cap's).
    pub fn over_cap(&self) -> bool {
        self.read > self.cap
    }
}
