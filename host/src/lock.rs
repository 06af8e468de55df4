//! The node-wide lock: `flock` on the node root directory itself (`--root`), so two runners
//! (rolling update, install and uninstall DaemonSets, the MachineConfig unit) never
//! interleave. Every runner of a node reaches the same directory (the node's `/`, bind
//! mounted at `/host` in a pod), and taking the lock creates nothing: a refusal on a fresh
//! node leaves it byte-identical. (Releases before this one locked `/run/kata-addons.lock`.)

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cap_std::fs::File;
use rustix::fs::{FlockOperation, flock};

use crate::node::Root;

/// Root-relative directory of the daemon's owner lock (tmpfs on a node: gone after reboot).
pub(crate) const LOCK_DIR: &str = "run";

/// How the node lock is named in messages.
const LOCK_NAME: &str = "the node lock (flock on the node root directory)";

/// A held node lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub(crate) struct NodeLock {
    _file: File,
}

/// Takes the node lock, waiting up to `timeout` for another run to finish.
pub(crate) fn acquire(root: &Root, timeout: Duration) -> Result<NodeLock> {
    // An open file description of its own (flock locks belong to one): every acquire, in
    // this process or another, contends with every other.
    let file = root
        .dir()
        .open(".")
        .with_context(|| format!("opening the node root {} for {LOCK_NAME}", root.path().display()))?;
    let start = Instant::now();
    let mut logged = false;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(NodeLock { _file: file }),
            Err(rustix::io::Errno::WOULDBLOCK) => {
                if !logged {
                    tracing::info!(root = %root.path().display(), "another kata-addons run holds the node lock; waiting");
                    logged = true;
                }
                if start.elapsed() >= timeout {
                    bail!(
                        "another kata-addons run held {LOCK_NAME} {} for more than {}s (--lock-timeout)",
                        root.path().display(),
                        timeout.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).with_context(|| format!("taking {LOCK_NAME}")),
        }
    }
}
