//! The temporary files an extraction writes in the destination directory: named with
//! [`TMP_PREFIX`], removed unless kept, checked against the free space before data is written.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use cap_std::fs::{Dir, OpenOptions};

/// Prefix of temporary files created in the destination directory.
pub const TMP_PREFIX: &str = ".kata-addons-tmp.";

/// Temporary files created in the destination; whatever is still listed when the
/// set is dropped is removed.
#[derive(Clone)]
pub struct TempFiles {
    dir: Arc<Dir>,
    names: Arc<Mutex<HashSet<String>>>,
    counter: Arc<AtomicU64>,
    /// How the destination is named in messages (a free-space refusal).
    place: Arc<str>,
}

impl TempFiles {
    /// How many temporary files were created so far.
    #[cfg(test)]
    pub(crate) fn created(&self) -> u64 {
        self.counter.load(Ordering::Relaxed)
    }

    /// A set of temporary files in `dir`, named `place` in messages.
    pub fn new(dir: Dir, place: &str) -> Self {
        TempFiles { dir: Arc::new(dir), names: Arc::default(), counter: Arc::default(), place: Arc::from(place) }
    }

    /// Refuses a file of `size` bytes (as its tar header declares, before any of its data is
    /// read) unless the destination's filesystem has room for it plus a margin.
    pub fn check_space(&self, path: &str, size: u64) -> Result<()> {
        crate::node::check_free_space(&self.dir, &self.place, &format!("/{path}"), size)
    }

    /// The destination directory.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Creates a new temporary file (mode 0644, exclusive).
    pub fn create(&self) -> Result<(String, cap_std::fs::File)> {
        use cap_std::fs::OpenOptionsExt;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let name = format!("{TMP_PREFIX}{}.{n}", std::process::id());
        let mut oo = OpenOptions::new();
        oo.write(true).create_new(true).mode(0o644);
        let f = self
            .dir
            .open_with(&name, &oo)
            .with_context(|| format!("create temporary file {name} in the destination"))?;
        self.names.lock().map_err(|_| anyhow::anyhow!("temp file list poisoned"))?.insert(name.clone());
        Ok((name, f))
    }

    /// Removes a temporary file now.
    pub fn remove(&self, name: &str) {
        if let Ok(mut n) = self.names.lock() {
            n.remove(name);
        }
        let _ = self.dir.remove_file(name);
    }

    /// Marks a temporary file as kept (it was renamed to its final name).
    pub fn keep(&self, name: &str) {
        if let Ok(mut n) = self.names.lock() {
            n.remove(name);
        }
    }

    /// Removes every temporary file not kept.
    pub fn cleanup(&self) {
        let names: Vec<String> = match self.names.lock() {
            Ok(mut n) => n.drain().collect(),
            Err(_) => return,
        };
        for n in names {
            let _ = self.dir.remove_file(&n);
        }
    }
}

/// Makes a temporary file's data durable (before it is renamed to its final name).
pub fn sync_file(dir: &Dir, tmp: &str) -> Result<()> {
    let f = dir.open(tmp).with_context(|| format!("reopen temporary file {tmp}"))?;
    f.sync_all().with_context(|| format!("fsync temporary file {tmp}"))
}
