//! `kata-addons daemon`: the DaemonSet entry point. Performs the action, writes a
//! readiness marker, then waits for SIGTERM/SIGINT (exit 0, install kept). With
//! `--configmap-dir` it re-reconciles when the mounted ConfigMap changes; an invalid
//! change is logged and the node keeps the last good addon. After an install it also
//! re-verifies the node every `--resync` seconds (with jitter) and whenever a watched
//! runtime configuration directory changes, and repairs drift from the state.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};

use crate::configmap::{self, Input};
use crate::error::{Class, classify};
use crate::fetch::PullOptions;
use crate::install::{self, Outcome, Pin};
use crate::node::Site;
use crate::policy::Policy;
use crate::preview;
use crate::runtime::Selection;

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
    /// How often to look at a mounted ConfigMap directory.
    pub poll_interval: Duration,
    /// How often to re-verify and repair the node; `None` = never.
    pub resync: Option<Duration>,
    /// Longest random wait before the first install.
    pub start_jitter: Duration,
    /// How changes of the runtime configuration directories are noticed.
    pub watch: Watch,
}

/// The daemon: its options, for the life of the process.
pub struct Daemon {
    o: DaemonOptions,
}

impl Daemon {
    /// A daemon with these options.
    pub fn new(options: DaemonOptions) -> Self {
        Daemon { o: options }
    }

    /// Runs until SIGTERM/SIGINT; an error means the first action failed.
    pub async fn run(self, policy: &Policy) -> Result<()> {
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut applied = match self.o.action {
            Action::Install => {
                let input = Input::load(&self.o.config)?;
                if !self.o.start_jitter.is_zero() {
                    let wait = self.o.start_jitter.mul_f64(fastrand::f64());
                    tracing::info!(
                        wait_ms = wait.as_millis() as u64,
                        "start-up jitter: waiting {:.2} s (of at most {} s) before contacting the registry",
                        wait.as_secs_f64(),
                        self.o.start_jitter.as_secs_f64()
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = term.recv() => { tracing::info!("SIGTERM during start-up jitter: exiting"); return Ok(()); }
                        _ = int.recv() => { tracing::info!("SIGINT during start-up jitter: exiting"); return Ok(()); }
                    }
                }
                self.install(policy, &input).await?;
                Some(input)
            }
            Action::Uninstall => {
                let (site, selection) = (self.o.site.clone(), self.o.selection.clone());
                let done = tokio::task::spawn_blocking(move || install::uninstall(&site, &selection))
                    .await
                    .context("uninstall task")??;
                match &done.state {
                    _ if done.nothing() => tracing::info!("nothing installed; nothing to remove"),
                    Some(st) => tracing::info!(version = %st.version, "uninstalled"),
                    None => tracing::info!(
                        drop_ins = ?done.drop_ins,
                        dirs = ?done.dirs,
                        "no state recorded an install; removed what kata-addons had left on the node"
                    ),
                }
                None
            }
        };
        write_ready(&self.o.ready_file)?;
        tracing::info!(ready_file = %self.o.ready_file.display(), "ready; waiting for SIGTERM");
        let watch = self.o.action == Action::Install && self.o.config.is_dir();
        let mut tick = tokio::time::interval(self.o.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Drift repair: periodic resync plus change notification on the runtime dirs.
        let repairing = self.o.action == Action::Install;
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut dirs =
            DirWatch::new(changed_tx, self.o.poll_interval, if repairing { self.o.watch } else { Watch::None });
        if repairing && let Some(input) = &applied {
            dirs.update(self.watch_dirs(policy, input));
            tracing::info!(
                resync_seconds = self.o.resync.map(|r| r.as_secs_f64()),
                watch = ?self.o.watch,
                "drift repair: periodic resync (0 = off) and change notification (--watch)"
            );
        }
        let resync_sleep = tokio::time::sleep(self.next_resync().unwrap_or(Duration::MAX / 4));
        tokio::pin!(resync_sleep);
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: exiting, install kept"); break; }
                _ = int.recv() => { tracing::info!("SIGINT: exiting, install kept"); break; }
                _ = &mut resync_sleep, if repairing && self.o.resync.is_some() => {
                    if let Some(input) = &applied {
                        self.repair(policy, input, "periodic resync").await;
                        dirs.update(self.watch_dirs(policy, input));
                    }
                    let next = self.next_resync().unwrap_or(Duration::MAX / 4);
                    resync_sleep.as_mut().reset(tokio::time::Instant::now() + next);
                }
                Some(()) = changed.recv(), if repairing => {
                    // Let a burst of changes (kata-deploy rewriting its fragments) settle.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    while changed.try_recv().is_ok() {}
                    if let Some(input) = &applied {
                        self.repair(policy, input, "runtime configuration directory changed").await;
                        dirs.update(self.watch_dirs(policy, input));
                    }
                }
                _ = tick.tick(), if watch => {
                    let input = match Input::load(&self.o.config) {
                        Ok(i) => i,
                        Err(e) => { tracing::error!(error = %format!("{e:#}"), "reading the ConfigMap failed; keeping the current addon"); continue; }
                    };
                    if applied.as_ref() == Some(&input) {
                        continue;
                    }
                    tracing::info!("ConfigMap changed; reconciling");
                    match self.install(policy, &input).await {
                        Ok(()) => applied = Some(input),
                        Err(e) => {
                            tracing::error!(error = %format!("{e:#}"), "the changed ConfigMap could not be applied; the node keeps the last good addon");
                            // An invalid configuration stays invalid: do not retry it on every tick.
                            // Operational failures (registry down, disk full, a policy that
                            // timed out or trapped) are retried: the exit-code classes of main.
                            if classify(&e) == Class::InvalidConfig {
                                applied = Some(input);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The resync period with ±10 % jitter, so a fleet does not resync in step.
    fn next_resync(&self) -> Option<Duration> {
        self.o.resync.map(|r| r.mul_f64(0.9 + 0.2 * fastrand::f64()))
    }

    /// Re-verifies the node against the state and repairs drift; never fails the daemon.
    async fn repair(&self, policy: &Policy, input: &Input, why: &str) {
        let result = match preview::plan_for(policy, input, &self.o.selection.kata_prefix) {
            Ok((_, plan)) => {
                install::install(policy, &plan, &self.o.pull, &self.o.site, &self.o.selection, Pin::Recorded).await
            }
            Err(e) => Err(e.into()),
        };
        match result {
            Ok(Outcome::UpToDate(_)) => tracing::debug!(trigger = why, "resync: node matches the state"),
            Ok(Outcome::Repaired(st, what)) => {
                tracing::info!(trigger = why, version = %st.version, repairs = what.len(), "resync: drift repaired")
            }
            Ok(Outcome::Installed(st)) => {
                tracing::info!(trigger = why, version = %st.version, digest = %st.manifest_digest, "resync: reinstalled")
            }
            Err(e) => tracing::warn!(
                trigger = why,
                error = %format!("{e:#}"),
                "resync: cannot repair now; waiting for the next change or resync"
            ),
        }
    }

    /// Host paths of the directories whose changes can mean drift: each candidate runtime
    /// configuration's directory and `config.d` (or, while missing, its nearest existing
    /// ancestor, so a recreated `runtimes/<shim>` is noticed), and those of the recorded
    /// (resolved) runtime configurations.
    fn watch_dirs(&self, policy: &Policy, input: &Input) -> BTreeSet<PathBuf> {
        let mut node_dirs: Vec<String> = Vec::new();
        let mut runtime_classes = false;
        if let Ok((_, plan)) = preview::plan_for(policy, input, &self.o.selection.kata_prefix) {
            node_dirs.extend(plan.runtime_configs.iter().map(|c| parent(c).to_string()));
            runtime_classes |= !install::target::plan_runtime_classes(&plan).is_empty();
        }
        // The recorded state only: `status` would hash every artifact on each event.
        if let Ok(Some(st)) = install::recorded_state(&self.o.site) {
            node_dirs.extend(st.drop_ins.iter().map(|d| parent(&d.runtime_config).to_string()));
            runtime_classes |= !st.runtime_classes.is_empty();
        }
        // RuntimeClass handlers: a change of the CRI configuration can move a handler to
        // another Kata configuration (drift), so CRI-O's and containerd's files are watched.
        if runtime_classes {
            let configs = crate::node::Root::open(&self.o.site.root)
                .and_then(|r| crate::runtime_class::read_cri_configs(&r))
                .unwrap_or_default();
            // Only those that exist (a missing one would watch its parent, `/etc`); the
            // periodic resync notices a CRI directory created later.
            let root = &self.o.site.root;
            node_dirs.extend(
                crate::runtime_class::watched_dirs(&configs)
                    .into_iter()
                    .filter(|d| root.join(d.trim_start_matches('/')).is_dir()),
            );
        }
        let mut out = BTreeSet::new();
        for d in node_dirs {
            let mut p = self.o.site.root.join(d.trim_start_matches('/'));
            if p.is_dir() {
                let config_d = p.join(crate::runtime::CONFIG_D);
                if config_d.is_dir() {
                    out.insert(config_d);
                }
                out.insert(p);
                continue;
            }
            while !p.is_dir() && p != self.o.site.root {
                if !p.pop() {
                    break;
                }
            }
            out.insert(p);
        }
        out
    }

    async fn install(&self, policy: &Policy, input: &Input) -> Result<()> {
        let (_, plan) = preview::plan_for(policy, input, &self.o.selection.kata_prefix)?;
        match install::install(policy, &plan, &self.o.pull, &self.o.site, &self.o.selection, Pin::Reference).await? {
            Outcome::UpToDate(st) => tracing::info!(version = %st.version, "up to date"),
            Outcome::Repaired(st, _) => tracing::info!(version = %st.version, "repaired"),
            Outcome::Installed(st) => tracing::info!(version = %st.version, digest = %st.manifest_digest, "installed"),
        }
        Ok(())
    }
}

/// The directory part of a node path.
fn parent(p: &str) -> &str {
    p.rsplit_once('/').map_or("", |(d, _)| d)
}

/// Change notification on a set of directories (non-recursive): inotify, or polling when
/// inotify is unavailable. Each relevant event sends one `()`.
struct DirWatch {
    watcher: Option<Box<dyn notify::Watcher + Send>>,
    watched: BTreeSet<PathBuf>,
}

impl DirWatch {
    fn new(tx: tokio::sync::mpsc::UnboundedSender<()>, poll: Duration, how: Watch) -> DirWatch {
        let handler = move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res
                && !matches!(ev.kind, notify::EventKind::Access(_))
            {
                let _ = tx.send(());
            }
        };
        let poller = |handler| -> Option<Box<dyn notify::Watcher + Send>> {
            match notify::PollWatcher::new(handler, notify::Config::default().with_poll_interval(poll)) {
                Ok(w) => Some(Box::new(w)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the runtime configuration directories; resync only");
                    None
                }
            }
        };
        let watcher: Option<Box<dyn notify::Watcher + Send>> = match how {
            Watch::None => None,
            Watch::Poll => poller(handler),
            Watch::Inotify => match notify::recommended_watcher(handler.clone()) {
                Ok(w) => Some(Box::new(w)),
                Err(e) => {
                    tracing::warn!(error = %e, "inotify unavailable; polling the runtime configuration directories");
                    poller(handler)
                }
            },
        };
        DirWatch { watcher, watched: BTreeSet::new() }
    }

    /// Watches exactly `dirs` from now on. Everything is re-watched: a directory that was
    /// removed and recreated (kata-deploy's uninstall + install) has lost its inotify watch.
    fn update(&mut self, dirs: BTreeSet<PathBuf>) {
        let Some(w) = self.watcher.as_mut() else { return };
        for old in std::mem::take(&mut self.watched) {
            let _ = w.unwatch(&old);
        }
        for dir in dirs {
            match w.watch(&dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir);
                }
                Err(e) => tracing::debug!(dir = %dir.display(), error = %e, "cannot watch directory"),
            }
        }
    }
}

fn write_ready(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, b"ready\n").with_context(|| format!("writing the readiness marker {}", path.display()))
}
