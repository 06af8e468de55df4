//! Download progress bars, drawn on stderr only when it is a terminal (indicatif hides
//! them otherwise, so logs and pipes stay clean), and the count of layer bytes this process
//! streamed (the daemon's `kata_addons_pull_bytes_total`, docs/metrics.md).

use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Bytes of layer blobs streamed by this process.
static PULLED: AtomicU64 = AtomicU64::new(0);

/// Counts `n` more bytes of a layer blob streamed.
pub(crate) fn pulled(n: u64) {
    PULLED.fetch_add(n, Ordering::Relaxed);
}

/// Bytes of layer blobs streamed by this process so far.
pub(crate) fn pulled_bytes() -> u64 {
    PULLED.load(Ordering::Relaxed)
}

/// A bar for one layer blob of `size` bytes.
pub(crate) fn layer(digest: &str, size: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    let short = digest.strip_prefix("sha256:").unwrap_or(digest);
    bar.set_prefix(format!("layer {}", short.get(..12).unwrap_or(short)));
    bar
}
