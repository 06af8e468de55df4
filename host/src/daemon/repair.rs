//! Drift repair (docs/daemon.md#drift-repair): each check (periodic `--resync`, a change in
//! a watched directory) re-verifies the node against the state through the install
//! transaction with the recorded digest pinned; an installed file whose metadata (size,
//! inode, mtime, ctime) is what it was when last hashed is not hashed again, and every
//! `--verify-interval` every file is. Repairs are rate-limited: a repair within
//! `--failure-backoff-max` of the previous one (something keeps undoing it) makes the next
//! check wait as failed attempts do ([`super::backoff`]), and so does a failed repair.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::backoff::Backoff;
use super::{Daemon, parent};
use crate::configmap::Input;
use crate::install::{self, FileFacts, Observed, Outcome, Pin};
use crate::metrics::daemon::{InstalledInfo, Reconciled, Repair};
use crate::plan;
use crate::policy::Policy;
use crate::state::State;

/// How deep a check looks at the installed files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Depth {
    /// Hash only the files whose metadata changed.
    Metadata,
    /// Hash every file.
    Full,
}

/// What the checks remember between runs.
pub(super) struct Repairs {
    /// Installed files known intact and their metadata.
    pub facts: FileFacts,
    /// When every file was last hashed.
    pub last_full: Instant,
    /// Repairs in a row, each within `window` of the one before.
    consecutive: u32,
    /// When the last repair was made.
    last_repair: Option<Instant>,
    /// Repairs further apart than this are not in a row.
    window: Duration,
    /// When the next check may run after a repeated or failed repair.
    limit: Backoff,
    /// A check was asked for while `limit` held it back: run it when the wait is over.
    deferred: bool,
    /// Why the last check refused the node's Kata release (`kataVersion`, after a node
    /// upgrade): the daemon is not ready while it lasts.
    pub kata_refused: Option<String>,
}

/// Which kind of reconcile a result is of, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// A ConfigMap applied (a change, or the first action).
    Apply,
    /// A check of the node against the state; `current`: of the ConfigMap as it is now.
    Check { current: bool },
}

/// What is installed, from the state, for `kata_addons_installed_info`.
fn installed_info(st: &State) -> InstalledInfo {
    InstalledInfo {
        version: st.version.clone(),
        image: st.image.clone(),
        digest: st.manifest_digest.clone(),
        provider: st.provider.wit_name().to_string(),
        runtime_class: st.runtime_classes.join(","),
    }
}

/// The `VERSION-RELEASE` of the node's Kata package from the state's record of it
/// (`kata-containers 3.25.0-6.el9 (RPM database …)`); `None` when it was not known.
fn node_release(recorded: &str) -> Option<&str> {
    let rest = recorded.strip_prefix("kata-containers ")?;
    let evr = rest.split_once(" (").map_or(rest, |(evr, _)| evr);
    (!evr.is_empty() && !evr.contains(char::is_whitespace)).then_some(evr)
}

/// What a check did, for the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checked {
    /// It ran (the node matches the state again, or the failure was logged).
    Ran,
    /// Held back by the rate limit; it runs when the wait is over.
    Deferred,
}

impl Repairs {
    /// Nothing known yet; waits between repairs in a row (within `window` of each other)
    /// as `limit` says.
    pub(super) fn new(limit: Backoff, window: Duration) -> Repairs {
        Repairs {
            facts: FileFacts::new(),
            last_full: Instant::now(),
            consecutive: 0,
            last_repair: None,
            window,
            limit,
            deferred: false,
            kata_refused: None,
        }
    }

    /// After an install of new input: the files it verified, no repair history.
    pub(super) fn installed(&mut self, facts: FileFacts) {
        self.facts = facts;
        self.last_full = Instant::now();
        self.consecutive = 0;
        self.last_repair = None;
        self.limit.reset();
        self.deferred = false;
        self.kata_refused = None;
    }

    /// Whether a held-back check is due now.
    pub(super) fn deferred_due(&self, input: &str) -> bool {
        self.deferred && self.limit.pending(input).is_none()
    }

    /// The next check time while the rate limit holds checks back, for readiness.
    pub(super) fn waiting(&self, input: &str) -> Option<super::backoff::Retry> {
        self.limit.pending(input)
    }
}

impl Daemon {
    /// One check of the node against the state for `input` (digest `digest`; `current`:
    /// the ConfigMap as it is now), repairing drift; never fails the daemon.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn check(
        &self,
        policy: &Policy,
        input: &Input,
        digest: &str,
        current: bool,
        depth: Depth,
        why: &str,
        r: &mut Repairs,
    ) -> Checked {
        if let Some(retry) = r.limit.pending(digest) {
            if !r.deferred {
                tracing::info!(
                    trigger = why,
                    next_check = %httpdate::fmt_http_date(retry.at),
                    "repairs are rate-limited (the last ones were undone, or failed): the check waits; {}",
                    retry.describe()
                );
            }
            r.deferred = true;
            return Checked::Deferred;
        }
        r.deferred = false;
        let full = depth == Depth::Full || r.last_full.elapsed() >= self.o.verify_interval;
        let mut obs = Observed {
            facts: if full { FileFacts::new() } else { std::mem::take(&mut r.facts) },
            ..Default::default()
        };
        let result = self.planned_install(policy, input, Pin::Recorded, Pass::Check { current }, &mut obs).await;
        if full && result.is_ok() {
            r.last_full = Instant::now();
        }
        r.facts = std::mem::take(&mut obs.facts);
        r.kata_refused = result.as_ref().err().and_then(crate::kata_release::refused);
        let repaired = match result {
            Ok(Outcome::UpToDate(_)) => {
                tracing::debug!(trigger = why, hashed = obs.hashed, full, "resync: node matches the state");
                return Checked::Ran;
            }
            Ok(Outcome::Repaired(st, what)) => {
                tracing::info!(trigger = why, version = %st.version, repairs = what.len(), "resync: drift repaired");
                true
            }
            Ok(Outcome::Installed(st)) => {
                tracing::info!(trigger = why, version = %st.version, digest = %st.manifest_digest, "resync: reinstalled");
                true
            }
            Err(e) => {
                let retry = r.limit.failed(digest, obs.digest.as_deref());
                tracing::warn!(
                    trigger = why,
                    error = %format!("{e:#}"),
                    next_check = %httpdate::fmt_http_date(retry.at),
                    "resync: cannot repair now; {}",
                    retry.describe()
                );
                false
            }
        };
        if repaired {
            // A repair long after the last one is free; one needed again soon after means
            // something undoes it: wait before the next, longer each time.
            if r.last_repair.is_some_and(|t| t.elapsed() < r.window) {
                r.consecutive += 1;
            } else {
                r.consecutive = 1;
                r.limit.reset();
            }
            r.last_repair = Some(Instant::now());
            if r.consecutive >= 2 {
                let retry = r.limit.failed(digest, obs.digest.as_deref());
                tracing::warn!(
                    trigger = why,
                    repairs_in_a_row = r.consecutive,
                    next_check = %httpdate::fmt_http_date(retry.at),
                    "drift came back after a repair: something keeps undoing it; {}",
                    retry.describe()
                );
            }
        }
        Checked::Ran
    }

    /// Counts a reconcile that ended with `result` in the metrics (`pulled`: the pull
    /// counter before it, started at `started`).
    fn record(&self, result: &Result<Outcome>, pass: Pass, pulled: u64, started: Instant) {
        let m = &self.metrics;
        let current = match pass {
            Pass::Apply => true,
            Pass::Check { current } => current,
        };
        if crate::progress::pulled_bytes() > pulled {
            m.pulled(started.elapsed());
        }
        let st = match result {
            Ok(Outcome::UpToDate(st)) => {
                m.reconciled(Reconciled::up_to_date, current);
                st
            }
            Ok(Outcome::Repaired(st, _)) => {
                m.repaired(Repair::drop_in);
                m.reconciled(Reconciled::installed, current);
                st
            }
            Ok(Outcome::Installed(st)) => {
                if matches!(pass, Pass::Check { .. }) {
                    m.repaired(Repair::files);
                }
                m.reconciled(Reconciled::installed, current);
                st
            }
            Err(e) if crate::error::classify(e) == crate::error::Class::InvalidConfig => {
                m.reconciled(Reconciled::refused, current);
                return;
            }
            Err(_) => {
                m.reconciled(Reconciled::failed, current);
                return;
            }
        };
        m.installed(&installed_info(st));
        m.kata_release(st.kata.as_ref().and_then(|k| node_release(&k.node)));
    }

    /// The resync period with ±10 % jitter, so a fleet does not resync in step.
    pub(super) fn next_resync(&self) -> Option<Duration> {
        self.o.resync.map(|r| r.mul_f64(0.9 + 0.2 * fastrand::f64()))
    }

    /// Host paths of the directories whose changes can mean drift: each candidate runtime
    /// configuration's directory and `config.d` (or, while missing, its nearest existing
    /// ancestor, so a recreated `runtimes/<shim>` is noticed), and those of the recorded
    /// (resolved) runtime configurations.
    pub(super) fn watch_dirs(&self, policy: &Policy, input: &Input) -> BTreeSet<PathBuf> {
        let mut node_dirs: Vec<String> = Vec::new();
        let mut runtime_classes = false;
        if let Ok((_, plan)) = plan::of(policy, input, &self.o.selection.kata_prefix) {
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
                .and_then(|r| crate::kata_config::read_cri_configs(&r))
                .unwrap_or_default();
            // Only those that exist (a missing one would watch its parent, `/etc`); the
            // periodic resync notices a CRI directory created later.
            let root = &self.o.site.root;
            node_dirs.extend(
                crate::kata_config::watched_dirs(&configs)
                    .into_iter()
                    .filter(|d| root.join(d.trim_start_matches('/')).is_dir()),
            );
        }
        let mut out = BTreeSet::new();
        for d in node_dirs {
            let mut p = self.o.site.root.join(d.trim_start_matches('/'));
            if p.is_dir() {
                let config_d = p.join(crate::kata_config::CONFIG_D);
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

    /// Plans `input` and installs it pinned by `pin`, reporting in `obs`; the pass is
    /// recorded in the metrics (its pulled bytes and duration).
    async fn planned_install(
        &self,
        policy: &Policy,
        input: &Input,
        pin: Pin,
        pass: Pass,
        obs: &mut Observed,
    ) -> Result<Outcome> {
        let pulled = crate::progress::pulled_bytes();
        let started = Instant::now();
        let result = match plan::of(policy, input, &self.o.selection.kata_prefix) {
            Ok((_, plan)) => {
                install::install_observed(policy, &plan, &self.o.pull, &self.o.site, &self.o.selection, pin, obs).await
            }
            Err(e) => Err(e.into()),
        };
        self.record(&result, pass, pulled, started);
        result
    }

    /// Installs `input` (a ConfigMap change, or the first action), reporting in `obs` and
    /// in the metrics (a refusal or failure is counted by the caller, which classifies it).
    pub(super) async fn install(&self, policy: &Policy, input: &Input, obs: &mut Observed) -> Result<()> {
        let outcome = self.planned_install(policy, input, Pin::Reference, Pass::Apply, obs).await?;
        let attest = obs.attest.as_deref().unwrap_or("none published");
        match outcome {
            Outcome::UpToDate(st) => tracing::info!(version = %st.version, reference_values = %attest, "up to date"),
            Outcome::Repaired(st, _) => tracing::info!(version = %st.version, reference_values = %attest, "repaired"),
            Outcome::Installed(st) => tracing::info!(
                version = %st.version,
                digest = %st.manifest_digest,
                reference_values = %attest,
                "installed; reference values written"
            ),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kata_release::NodeRelease;

    /// The release label is read back from the state's record as install writes it.
    #[test]
    fn the_node_release_is_read_from_its_recorded_form() {
        let rpm = NodeRelease::Rpm {
            epoch: None,
            version: "3.25.0".into(),
            release: "6.el9".into(),
            db: "/usr/share/rpm/rpmdb.sqlite".into(),
        };
        assert_eq!(node_release(&rpm.to_string()), Some("3.25.0-6.el9"));
        let deploy = NodeRelease::KataDeploy { prefix: "/opt/kata".into() };
        assert_eq!(node_release(&deploy.to_string()), None);
        assert_eq!(node_release("unreadable: permission denied"), None);
    }
}
