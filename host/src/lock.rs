//! The node-wide lock: `flock` on `<root>/run/kata-addons.lock`, so two runners
//! (rolling update, install and uninstall DaemonSets) never interleave.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cap_std::fs::{File, OpenOptions, OpenOptionsExt};
use rustix::fs::{FlockOperation, flock};

use crate::node::Root;

/// Root-relative directory of the lock file (tmpfs on a node: gone after reboot).
pub(crate) const LOCK_DIR: &str = "run";
/// Lock file name.
pub(crate) const LOCK_FILE: &str = "kata-addons.lock";

/// A held node lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub(crate) struct NodeLock {
    _file: File,
}

/// Takes the node lock, waiting up to `timeout` for another run to finish.
pub(crate) fn acquire(root: &Root, timeout: Duration) -> Result<NodeLock> {
    let dir = root.create_dir_all(Path::new(LOCK_DIR))?;
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(true).mode(0o600);
    let file = dir.open_with(LOCK_FILE, &opts).context("opening the node lock /run/kata-addons.lock")?;
    let start = Instant::now();
    let mut logged = false;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(NodeLock { _file: file }),
            Err(rustix::io::Errno::WOULDBLOCK) => {
                if !logged {
                    tracing::info!(
                        lock = "/run/kata-addons.lock",
                        "another kata-addons run holds the node lock; waiting"
                    );
                    logged = true;
                }
                if start.elapsed() >= timeout {
                    bail!(
                        "another kata-addons run held the node lock /run/kata-addons.lock for more than {}s (--lock-timeout)",
                        timeout.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).context("locking /run/kata-addons.lock"),
        }
    }
}
