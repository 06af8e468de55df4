//! `kata-addons daemon`: the DaemonSet entry point. Performs the action, writes a
//! readiness marker, then waits for SIGTERM/SIGINT (exit 0, install kept). With
//! `--configmap-dir` it re-reconciles when the mounted ConfigMap changes; an invalid
//! change is logged and the node keeps the last good addon. After an install it also
//! re-verifies the node every `--resync` seconds (with jitter) and whenever a watched
//! runtime configuration directory changes, and repairs drift from the state.
//!
//! Rooms: [`lifecycle`] (the loop: what happens when), [`signals`] (SIGTERM/SIGINT within
//! a bound, whatever runs), [`ownership`] (one daemon per node root), [`backoff`] (failed
//! attempts and repairs spaced exponentially), [`repair`] (drift checks: metadata first,
//! hashes on a change or on the periodic full verify), [`dirwatch`] (change notification)
//! and [`ready`] (the readiness file).

mod backoff;
mod dirwatch;
mod lifecycle;
mod ownership;
mod ready;
mod repair;
mod signals;

pub(crate) use ready::NOT_READY;
pub use ready::read as read_ready;

use std::path::PathBuf;
use std::time::Duration;

use crate::configmap;
use crate::fetch::PullOptions;
use crate::kata_config::Selection;
use crate::metrics::daemon::DaemonMetrics;
use crate::node::Site;

/// `daemon` actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Install (and keep reconciling).
    Install,
    /// Uninstall.
    Uninstall,
}

/// How the daemon notices changes of the runtime configuration directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// inotify; polling where inotify is unavailable.
    Inotify,
    /// Poll the directories every poll interval (filesystems without inotify).
    Poll,
    /// No change notification: drift is found by the periodic resync only.
    None,
}

/// Everything the daemon needs, checked by the command layer.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// What to do.
    pub action: Action,
    /// Configuration source.
    pub config: configmap::Source,
    /// Registry access, trust and extraction limits.
    pub pull: PullOptions,
    /// Where on the node.
    pub site: Site,
    /// Runtime configuration selection.
    pub selection: Selection,
    /// Readiness marker.
    pub ready_file: PathBuf,
    /// How often to look at a mounted ConfigMap directory (and at the node root's owner).
    pub poll_interval: Duration,
    /// How often to re-verify and repair the node; `None` = never.
    pub resync: Option<Duration>,
    /// How often every installed file is hashed again (between, metadata is compared).
    pub verify_interval: Duration,
    /// Longest random wait before the first install.
    pub start_jitter: Duration,
    /// How changes of the runtime configuration directories are noticed.
    pub watch: Watch,
    /// Wait after the first failed attempt (doubled per failure)…
    pub backoff_min: Duration,
    /// …up to this.
    pub backoff_max: Duration,
    /// Where to serve Prometheus metrics, if anywhere (started by the command layer).
    pub metrics: Option<std::net::SocketAddr>,
}

/// The daemon: its options and metrics, for the life of the process.
pub struct Daemon {
    o: DaemonOptions,
    metrics: DaemonMetrics,
}

impl Daemon {
    /// A daemon with these options, recording into `metrics`.
    pub(crate) fn new(options: DaemonOptions, metrics: DaemonMetrics) -> Self {
        Daemon { o: options, metrics }
    }
}

/// The directory part of a node path.
fn parent(p: &str) -> &str {
    p.rsplit_once('/').map_or("", |(d, _)| d)
}
