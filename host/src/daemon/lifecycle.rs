//! The daemon's loop: what happens when. Every step that can take long (the node lock, a
//! pull, a hash, the debounce of a burst of changes) runs against the stop request
//! ([`super::signals`]); failed attempts wait their backoff ([`super::backoff`]); only the
//! owner of the node root acts ([`super::ownership`]).

use std::time::Duration;

use anyhow::{Context, Result};

use super::backoff::Backoff;
use super::dirwatch::DirWatch;
use super::ownership::{self, Claim};
use super::ready::NOT_READY;
use super::repair::{Checked, Depth, Repairs};
use super::signals::Stop;
use super::{Action, Daemon, ready};
use crate::configmap::Input;
use crate::error::{Class, classify};
use crate::install::owner::{OwnerLock, OwnerRecord};
use crate::install::{self, Observed};
use crate::policy::Policy;

/// Where this daemon stands, and what it has applied.
struct Run<'a> {
    d: &'a Daemon,
    policy: &'a Policy,
    /// The owner lock, while this daemon owns the node root.
    lock: Option<OwnerLock>,
    /// This daemon's owner record.
    me: OwnerRecord,
    /// The configuration as last read, and its digest.
    input: Input,
    digest: String,
    /// The last input applied successfully (what repairs restore).
    good: Option<Input>,
    /// The digest of the last input not to try again: applied, or invalid.
    settled: Option<String>,
    /// Failed attempts of a new input.
    backoff: Backoff,
    /// The last failure of a new input (first line), for readiness.
    failing: Option<String>,
    repairs: Repairs,
    /// The owner of the root while another daemon owns it, as last logged.
    owned_by: Option<Option<OwnerRecord>>,
    /// What the readiness file says now (`None`: absent).
    readiness: Option<Vec<String>>,
    /// The watched directories need recomputing.
    watch_stale: bool,
    /// The "drift repair:" line was logged.
    announced: bool,
    /// Where the reference values of the applied input are and what they hold.
    attest: Option<String>,
}

impl Daemon {
    /// Runs until SIGTERM/SIGINT; an error means the first action failed.
    pub async fn run(self, policy: &Policy) -> Result<()> {
        let mut stop = Stop::install()?;
        match self.o.action {
            Action::Uninstall => self.run_uninstall(&mut stop).await,
            Action::Install => self.run_install(policy, &mut stop).await,
        }
    }

    async fn run_uninstall(&self, stop: &mut Stop) -> Result<()> {
        let (site, selection) = (self.o.site.clone(), self.o.selection.clone());
        let task = tokio::task::spawn_blocking(move || install::uninstall(&site, &selection, false));
        let Some(done) = stop.unless_stopped(task).await else { return Ok(()) };
        let done = done.context("uninstall task")??;
        match &done.state {
            _ if done.nothing() => tracing::info!("nothing installed; nothing to remove"),
            Some(st) => tracing::info!(version = %st.version, "uninstalled"),
            None => tracing::info!(
                drop_ins = ?done.drop_ins,
                dirs = ?done.dirs,
                "no state recorded an install; removed what kata-addons had left on the node"
            ),
        }
        ready::write(&self.o.ready_file, &[])?;
        self.metrics.ready(true);
        tracing::info!(ready_file = %self.o.ready_file.display(), "ready; waiting for SIGTERM");
        let s = stop.wait().await;
        tracing::info!("{s}: exiting");
        Ok(())
    }

    async fn run_install(&self, policy: &Policy, stop: &mut Stop) -> Result<()> {
        let input = Input::load(&self.o.config)?;
        let digest = ownership::input_digest(&input);
        let mut run = Run {
            d: self,
            policy,
            lock: None,
            me: OwnerRecord::this_process(&digest),
            input,
            digest,
            good: None,
            settled: None,
            backoff: Backoff::new(self.o.backoff_min, self.o.backoff_max),
            failing: None,
            repairs: Repairs::new(Backoff::new(self.o.backoff_min, self.o.backoff_max), self.o.backoff_max),
            owned_by: None,
            readiness: None,
            watch_stale: true,
            announced: false,
            attest: None,
        };
        let result = run.start(stop).await;
        if let Some(lock) = run.lock.take() {
            ownership::release(&self.o.site, lock);
        }
        result
    }
}

impl Run<'_> {
    /// Claims the root and performs the first install (its failure ends the daemon), or
    /// leaves the root to its live owner; then loops.
    async fn start(&mut self, stop: &mut Stop) -> Result<()> {
        let d = self.d;
        let o = &d.o;
        let Some(claim) = stop.unless_stopped(ownership::claim(&o.site, &self.me)).await else { return Ok(()) };
        match claim? {
            Claim::Owner(lock, previous) => {
                self.took_over(lock, previous);
                if !o.start_jitter.is_zero() {
                    let wait = o.start_jitter.mul_f64(fastrand::f64());
                    tracing::info!(
                        wait_ms = wait.as_millis() as u64,
                        "start-up jitter: waiting {:.2} s (of at most {} s) before contacting the registry",
                        wait.as_secs_f64(),
                        o.start_jitter.as_secs_f64()
                    );
                    if stop.unless_stopped(tokio::time::sleep(wait)).await.is_none() {
                        return Ok(());
                    }
                }
                let mut obs = Observed::default();
                let Some(done) = stop.unless_stopped(self.d.install(self.policy, &self.input, &mut obs)).await else {
                    return Ok(());
                };
                done?;
                self.applied(obs);
            }
            Claim::Taken(owner) => self.owned(owner),
        }
        self.main_loop(stop).await
    }

    async fn main_loop(&mut self, stop: &mut Stop) -> Result<()> {
        let d = self.d;
        let o = &d.o;
        let mut tick = tokio::time::interval(o.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut dirs = DirWatch::new(changed_tx, o.poll_interval, o.watch);
        let far = Duration::from_secs(100 * 365 * 86400);
        let resync = tokio::time::sleep(self.d.next_resync().unwrap_or(far));
        tokio::pin!(resync);
        let verify = tokio::time::sleep(o.verify_interval);
        tokio::pin!(verify);
        // Watch first, then publish (here and after each event): a change right after
        // readiness must not fall between the two (it would wait for the next resync).
        self.refresh_watch(&mut dirs);
        self.publish()?;
        loop {
            let go_on = tokio::select! {
                s = stop.wait() => {
                    tracing::info!("{s}: exiting, install kept");
                    false
                }
                _ = &mut resync, if o.resync.is_some() => {
                    resync.as_mut().reset(tokio::time::Instant::now() + self.d.next_resync().unwrap_or(far));
                    self.check(stop, Depth::Metadata, "periodic resync").await
                }
                _ = &mut verify => {
                    verify.as_mut().reset(tokio::time::Instant::now() + o.verify_interval);
                    self.check(stop, Depth::Full, "periodic full verify").await
                }
                Some(()) = changed.recv() => {
                    // Let a burst of changes (kata-deploy rewriting its fragments) settle.
                    if stop.unless_stopped(tokio::time::sleep(Duration::from_millis(300))).await.is_none() {
                        false
                    } else {
                        while changed.try_recv().is_ok() {}
                        self.check(stop, Depth::Metadata, "runtime configuration directory changed").await
                    }
                }
                _ = tick.tick() => self.on_tick(stop).await,
            };
            if !go_on {
                return Ok(());
            }
            self.refresh_watch(&mut dirs);
            self.publish()?;
        }
    }

    /// Every poll interval: claim a root whose owner is gone, follow the ConfigMap, retry
    /// a failed input when its backoff is over, run a check the rate limit held back.
    /// `false` = stop.
    async fn on_tick(&mut self, stop: &mut Stop) -> bool {
        let d = self.d;
        let o = &d.o;
        if o.config.is_dir() {
            match Input::load(&o.config) {
                Ok(i) if i != self.input => {
                    self.digest = ownership::input_digest(&i);
                    self.input = i;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "reading the ConfigMap failed; keeping the current addon");
                    return true;
                }
            }
        }
        if self.lock.is_none() {
            self.me.input = self.digest.clone();
            match stop.unless_stopped(ownership::claim(&o.site, &self.me)).await {
                None => return false,
                Some(Ok(Claim::Owner(lock, previous))) => self.took_over(lock, previous),
                Some(Ok(Claim::Taken(owner))) => {
                    self.owned(owner);
                    return true;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot look at the node root's owner; trying again");
                    return true;
                }
            }
        }
        if self.settled.as_deref() == Some(self.digest.as_str()) {
            if self.repairs.deferred_due(&self.good_digest()) {
                return self.check(stop, Depth::Metadata, "check held back by the rate limit").await;
            }
            return true;
        }
        if self.backoff.pending(&self.digest).is_some() {
            return true;
        }
        if self.me.input != self.digest {
            self.me.input = self.digest.clone();
            match stop.unless_stopped(ownership::record(&o.site, &self.me)).await {
                None => return false,
                Some(Err(e)) => tracing::warn!(error = %format!("{e:#}"), "could not update the owner record"),
                Some(Ok(())) => {}
            }
        }
        if self.good.is_some() {
            tracing::info!("ConfigMap changed; reconciling");
        } else {
            tracing::info!("reconciling");
        }
        let input = self.input.clone();
        let mut obs = Observed::default();
        let Some(result) = stop.unless_stopped(self.d.install(self.policy, &input, &mut obs)).await else {
            return false;
        };
        match result {
            Ok(()) => self.applied(obs),
            Err(e) if classify(&e) == Class::InvalidConfig => {
                // An invalid configuration stays invalid: not tried again until it changes.
                tracing::error!(error = %format!("{e:#}"), "the changed ConfigMap could not be applied; the node keeps the last good addon");
                self.settled = Some(self.digest.clone());
                self.failing = None;
                self.backoff.reset();
            }
            Err(e) => {
                // Operational (registry down, disk full, an image without the file asked
                // for): the same attempt waits its backoff; another input is tried at once.
                let retry = self.backoff.failed(&self.digest, obs.digest.as_deref());
                tracing::error!(
                    error = %format!("{e:#}"),
                    input = %self.digest,
                    image_digest = obs.digest.as_deref().unwrap_or("unresolved"),
                    failures = retry.failures,
                    next_attempt = %httpdate::fmt_http_date(retry.at),
                    next_attempt_in_s = retry.wait.as_secs_f64(),
                    "the changed ConfigMap could not be applied; the node keeps the last good addon; {}",
                    retry.describe()
                );
                self.failing = Some(format!("{e:#}").lines().next().unwrap_or_default().to_string());
            }
        }
        true
    }

    /// A check of the node, when this daemon owns it and has applied an input. `false` = stop.
    async fn check(&mut self, stop: &mut Stop, depth: Depth, why: &str) -> bool {
        let Some(input) = self.good.clone().filter(|_| self.lock.is_some()) else { return true };
        let digest = ownership::input_digest(&input);
        let current = input == self.input;
        let work = self.d.check(self.policy, &input, &digest, current, depth, why, &mut self.repairs);
        match stop.unless_stopped(work).await {
            None => false,
            Some(Checked::Deferred) => true,
            Some(Checked::Ran) => {
                self.watch_stale = true;
                true
            }
        }
    }

    fn good_digest(&self) -> String {
        self.good.as_ref().map(ownership::input_digest).unwrap_or_default()
    }

    /// This daemon owns the root now.
    fn took_over(&mut self, lock: OwnerLock, previous: Option<OwnerRecord>) {
        if let Some(p) = previous {
            tracing::info!(owner = %p.describe(), "the node root's previous owner no longer runs: taking over");
        }
        if self.owned_by.take().is_some() {
            tracing::info!("the node root's owner is gone: this daemon owns it now");
        }
        tracing::info!(pid = self.me.pid, input = %self.me.input, "this daemon owns the node root");
        self.lock = Some(lock);
        self.settled = None;
        self.backoff.reset();
    }

    /// A live daemon owns the root: stand by (same input) or refuse (other input).
    fn owned(&mut self, owner: Option<OwnerRecord>) {
        if self.owned_by.as_ref() == Some(&owner) {
            return;
        }
        let who = owner.as_ref().map_or_else(|| "an unidentified daemon".to_string(), |r| r.describe());
        if owner.as_ref().is_some_and(|r| r.input == self.digest) {
            tracing::info!(owner = %who, "another kata-addons daemon owns this node root with the same input: standing by (ready; taking over when it stops)");
        } else {
            tracing::error!(
                owner = %who,
                input = %self.digest,
                "refusing to act: another kata-addons daemon owns this node root with other input (not ready; taking over when it stops)"
            );
        }
        self.owned_by = Some(owner);
    }

    /// `input` is on the node.
    fn applied(&mut self, obs: Observed) {
        if obs.attest.is_some() {
            self.attest = obs.attest.clone();
        }
        self.good = Some(self.input.clone());
        self.settled = Some(self.digest.clone());
        self.failing = None;
        self.backoff.reset();
        self.repairs.installed(obs.facts);
        self.watch_stale = true;
    }

    /// Writes or removes the readiness file when what it says changed.
    fn publish(&mut self) -> Result<()> {
        let d = self.d;
        let o = &d.o;
        let lines = match &self.owned_by {
            Some(Some(r)) if r.input == self.digest => {
                Some(vec![format!("standby: owned by the daemon {}", r.describe())])
            }
            Some(_) => None,
            None if self.good.is_none() => None,
            None => {
                let mut l = vec![format!("owner: this daemon, pid {}", self.me.pid)];
                if let Some(a) = &self.attest {
                    l.push(format!("reference values: {a}"));
                }
                if let (Some(f), Some(retry)) = (&self.failing, self.backoff.pending(&self.digest)) {
                    l.push(format!("failing: {f}"));
                    l.push(format!("retry: {}", retry.describe()));
                }
                if let Some(why) = &self.repairs.kata_refused {
                    l.push(format!("{NOT_READY}{why}"));
                }
                if let Some(retry) = self.repairs.waiting(&self.good_digest()) {
                    l.push(format!("repairs: rate-limited, {}", retry.describe()));
                }
                Some(l)
            }
        };
        // The wait shrinks every tick: compare without it.
        let key = |l: &Option<Vec<String>>| {
            l.as_ref()
                .map(|v| v.iter().map(|s| s.split(" (in ").next().unwrap_or_default().to_string()).collect::<Vec<_>>())
        };
        let waiting = self.backoff.pending(&self.digest).or_else(|| self.repairs.waiting(&self.good_digest()));
        d.metrics.backoff(waiting.map(|r| r.wait));
        // Ready as `status --ready-file` decides: the file, and no `not ready:` line in it.
        d.metrics.ready(lines.as_ref().is_some_and(|l| !l.iter().any(|x| x.starts_with(NOT_READY))));
        if key(&lines) == key(&self.readiness) {
            return Ok(());
        }
        match &lines {
            Some(l) => {
                ready::write(&o.ready_file, l)?;
                if self.readiness.is_none() {
                    tracing::info!(ready_file = %o.ready_file.display(), "ready; waiting for SIGTERM");
                }
            }
            None => ready::remove(&o.ready_file)?,
        }
        self.readiness = lines;
        Ok(())
    }

    /// Re-watches the directories whose changes can mean drift, after what may move them.
    fn refresh_watch(&mut self, dirs: &mut DirWatch) {
        if !self.watch_stale || self.lock.is_none() {
            return;
        }
        let Some(input) = &self.good else { return };
        self.watch_stale = false;
        dirs.update(self.d.watch_dirs(self.policy, input));
        if !self.announced {
            self.announced = true;
            let d = self.d;
            let o = &d.o;
            tracing::info!(
                resync_seconds = o.resync.map(|r| r.as_secs_f64()),
                verify_seconds = o.verify_interval.as_secs_f64(),
                watch = ?o.watch,
                "drift repair: periodic resync (0 = off), change notification (--watch), full verify every --verify-interval"
            );
        }
    }
}
