//! `kata-addons daemon`: the DaemonSet entry point. Performs the action, writes a
//! readiness marker, then waits for SIGTERM/SIGINT (exit 0, install kept). With
//! `--configmap-dir` it re-reconciles when the mounted ConfigMap changes; an invalid
//! change is logged and the node keeps the last good addon.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{Action, ConfigArgs, NodeArgs};
use crate::configmap::Input;
use crate::install::{self, Outcome, Removed};
use crate::policy::Policy;
use crate::preview;
use crate::source::RegistryOptions;

/// Everything the daemon needs.
pub struct Daemon {
    /// What to do.
    pub action: Action,
    /// Configuration source.
    pub config: ConfigArgs,
    /// Registry access.
    pub registry: RegistryOptions,
    /// Node location.
    pub node: NodeArgs,
    /// Readiness marker.
    pub ready_file: PathBuf,
    /// How often to look at `--configmap-dir`.
    pub poll_interval: Duration,
    /// Longest random wait before the first install (`--start-jitter`).
    pub start_jitter: Duration,
}

impl Daemon {
    /// Runs until SIGTERM/SIGINT; an error means the first action failed.
    pub async fn run(self, policy: &Policy) -> Result<()> {
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut applied = match self.action {
            Action::Install => {
                let input = Input::load(&self.config)?;
                if !self.start_jitter.is_zero() {
                    let wait = self.start_jitter.mul_f64(fastrand::f64());
                    tracing::info!(
                        wait_ms = wait.as_millis() as u64,
                        "start-up jitter: waiting {:.2} s (of at most {} s) before contacting the registry",
                        wait.as_secs_f64(),
                        self.start_jitter.as_secs_f64()
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
                let node = self.node.clone();
                match tokio::task::spawn_blocking(move || install::uninstall(&node))
                    .await
                    .context("uninstall task")??
                {
                    Removed::Nothing => tracing::info!("nothing installed; nothing to remove"),
                    Removed::Removed(st) => tracing::info!(version = %st.version, "uninstalled"),
                }
                None
            }
        };
        write_ready(&self.ready_file)?;
        tracing::info!(ready_file = %self.ready_file.display(), "ready; waiting for SIGTERM");
        let watch = self.action == Action::Install && self.config.configmap_dir.is_some();
        let mut tick = tokio::time::interval(self.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: exiting, install kept"); break; }
                _ = int.recv() => { tracing::info!("SIGINT: exiting, install kept"); break; }
                _ = tick.tick(), if watch => {
                    let input = match Input::load(&self.config) {
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
                            // Operational failures (registry down, disk full) are retried.
                            if crate::configmap::is_invalid_config(&e) || e.downcast_ref::<crate::policy::PolicyError>().is_some() {
                                applied = Some(input);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn install(&self, policy: &Policy, input: &Input) -> Result<()> {
        let (_, plan) = preview::plan(policy, input)?;
        match install::install(policy, &plan, &self.registry, &self.node).await? {
            Outcome::UpToDate(st) => tracing::info!(version = %st.version, "up to date"),
            Outcome::Installed(st) => tracing::info!(version = %st.version, digest = %st.manifest_digest, "installed"),
        }
        Ok(())
    }
}

fn write_ready(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, b"ready\n").with_context(|| format!("writing the readiness marker {}", path.display()))
}
