//! The install transaction: the atomic switch of docs/design.md#atomic-switch. Order: stage files in a new
//! version directory -> render the drop-ins (one per runtime configuration found) -> write
//! state -> rename each drop-in into its `config.d` (the commit point of that
//! configuration) -> remove the previous version. A crash at any instant leaves each
//! configuration with the old or the new drop-in, and both versions' files in place until
//! the next run finishes the switch.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;

use super::discovery::{known_config_dirs, open_dir_if_exists, our_drop_ins, version_dirs};
use super::facts::{FileFacts, FileMeta, Observed};
use super::integrity::Finding;
use super::sweep::{STAGING_PREFIX, sweep_leftovers, tmp_drop_in_name};
use super::target::{Target, target};
use kata_addons_facts::{DROP_IN_NAME, INSTALL_DIR};

use crate::attest::publish as attest;
use crate::fetch::{Pull, PullOptions, Wanted};
use crate::hash::sha256_hex;
use crate::kata_config::Selection;
use crate::kata_release;
use crate::layout;
use crate::lock;
use crate::node::{self, Root, Site, remove_entry};
use crate::policy::{DropIn, Plan, Policy};
use crate::source::ImageRef;
use crate::state::{self, DocumentRecord, DropInRecord, FileRecord, KataRecord, PublishedRecord, State, TrustRecord};

/// Work of one install not committed yet: the staging (then version) directory in the
/// install directory and the temporary drop-ins beside runtime configurations. Dropping
/// it removes them, whatever the exit path; [`Uncommitted::keep_dir`] once the state
/// refers to the directory, [`Uncommitted::committed`] once every drop-in is renamed.
struct Uncommitted<'a> {
    /// The install directory.
    addons: &'a Dir,
    /// The directory to remove on drop.
    dir: Option<String>,
    /// Directories holding a temporary drop-in named `tmp_name`.
    tmp_in: Vec<&'a Dir>,
    /// Temporary drop-in name of this process.
    tmp_name: String,
}

impl<'a> Uncommitted<'a> {
    /// Nothing staged yet.
    fn new(addons: &'a Dir, drop_in_name: &str) -> Self {
        Uncommitted { addons, dir: None, tmp_in: Vec::new(), tmp_name: tmp_drop_in_name(drop_in_name) }
    }

    /// The state now refers to the directory: it stays whatever happens next.
    fn keep_dir(&mut self) {
        self.dir = None;
    }

    /// Every staged drop-in was renamed into its `config.d`: nothing is left to undo.
    fn committed(mut self) {
        self.dir = None;
        self.tmp_in.clear();
    }
}

impl Drop for Uncommitted<'_> {
    fn drop(&mut self) {
        for d in &self.tmp_in {
            match d.remove_file(&self.tmp_name) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(file = %self.tmp_name, "could not remove a temporary drop-in: {e}"),
            }
        }
        if let Some(dir) = self.dir.take()
            && let Err(e) = self.addons.remove_dir_all(&dir)
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir, "could not remove an uncommitted directory: {e}");
        }
    }
}

/// What `install` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Everything already matched: nothing was written.
    UpToDate(State),
    /// The files were intact but drop-ins had drifted (rewritten from the state), or the
    /// installed version predates publishing and its reference values were written: what was done.
    Repaired(State, Vec<String>),
    /// A new version was committed.
    Installed(State),
}

/// The image reference of a plan, in the fetch layer's terms: converted part by part (the
/// policy parsed it with the shared grammar, and `Policy::plan` checked the parts).
pub fn image_ref(plan: &Plan) -> ImageRef {
    ImageRef::of_plan(&plan.source)
}

/// Takes the node lock without stalling the async runtime.
async fn lock_node(root: &Root, timeout: Duration) -> Result<lock::NodeLock> {
    tokio::task::block_in_place(|| lock::acquire(root, timeout))
}

/// Renders the drop-ins for every target and pairs each with its target (same order).
/// Every drop-in must leave a configuration Kata loads ([`crate::kata_config::check_loads`]).
fn render_for(
    policy: &Policy,
    plan: &Plan,
    dir_name: &str,
    root: &Root,
    t: &Target,
    checked: &[crate::measured::Checked],
) -> Result<Vec<DropIn>> {
    let installed = crate::measured::installed(layout::installed_files(plan, dir_name), checked);
    let drop_ins = policy.render(plan, &installed, &t.runtime_configs())?;
    if drop_ins.len() != t.configs.len() {
        bail!("the policy rendered {} drop-ins for {} runtime configurations", drop_ins.len(), t.configs.len());
    }
    for (d, c) in drop_ins.iter().zip(&t.configs) {
        if d.path != c.drop_in_node_path {
            bail!("the policy placed the drop-in for {} at {}, not {}", c.runtime_config, d.path, c.drop_in_node_path);
        }
        crate::kata_config::check_loads(root, &c.rel, &d.path, &d.contents)?;
    }
    Ok(drop_ins)
}

/// Stages each drop-in beside its `config.d` (never inside it: Kata parses every entry
/// there), registering each with `work` before writing, so any error removes them.
fn stage_drop_ins<'a>(t: &'a Target, drop_ins: &[(usize, &DropIn)], work: &mut Uncommitted<'a>) -> Result<()> {
    for (i, d) in drop_ins {
        let c = &t.configs[*i];
        work.tmp_in.push(&c.config_dir);
        node::write_synced(&c.config_dir, &work.tmp_name, d.contents.as_bytes())
            .with_context(|| format!("staging the drop-in for {}", c.runtime_config))?;
    }
    Ok(())
}

/// Renames staged drop-ins into their `config.d` (the commit point of each), creating a
/// missing `config.d` first.
fn commit_drop_ins(root: &Root, t: &Target, tmp_name: &str, drop_ins: &[(usize, &DropIn)]) -> Result<()> {
    for (i, d) in drop_ins {
        let c = &t.configs[*i];
        let created;
        let config_d = match &c.config_d {
            Some(d) => d,
            None => {
                created = root.create_dir_all(&c.config_d_rel)?;
                &created
            }
        };
        c.config_dir
            .rename(tmp_name, config_d, DROP_IN_NAME)
            .with_context(|| format!("committing the drop-in {}", c.drop_in_node_path))?;
        node::fsync_dir(config_d)?;
        node::fsync_dir(&c.config_dir)?;
        tracing::info!(step = "commit", drop_in = %d.path, sha256 = %sha256_hex(d.contents.as_bytes()), "drop-in committed");
    }
    Ok(())
}

/// Drop-in records for rendered drop-ins (in target order).
fn records(drop_ins: &[DropIn], t: &Target) -> Vec<DropInRecord> {
    drop_ins
        .iter()
        .zip(&t.configs)
        .map(|(d, c)| DropInRecord {
            runtime_config: d.runtime_config.clone(),
            path: d.path.clone(),
            sha256: sha256_hex(d.contents.as_bytes()),
            handler: c.handler.clone(),
        })
        .collect()
}

/// Drop-in paths of `old` (current and pending) that the new set no longer has.
fn obsolete_drop_ins(old: &State, new: &[DropInRecord]) -> Vec<String> {
    let mut out: Vec<String> = old.previous_drop_ins.clone();
    out.extend(old.drop_ins.iter().map(|d| d.path.clone()));
    out.retain(|p| !new.iter().any(|n| &n.path == p));
    out.sort();
    out.dedup();
    out
}

/// Which manifest an install puts on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// What the image reference names now (`install`: a moved tag is followed).
    Reference,
    /// When the state records this plan, exactly the recorded manifest digest (the
    /// daemon's drift repair: a moved tag is not followed).
    Recorded,
}

/// Installs (or confirms, or repairs) the addon described by `plan` on the node, trusting
/// the files of `obs.facts` whose metadata did not change (the daemon's checks) and
/// reporting the digest, the files known intact and the node's Kata release in `obs`.
pub async fn install_observed(
    policy: &Policy,
    plan: &Plan,
    opts: &PullOptions,
    site: &Site,
    selection: &Selection,
    pin: Pin,
    obs: &mut Observed,
) -> Result<Outcome> {
    let known = std::mem::take(&mut obs.facts);
    obs.digest = None;
    obs.attest = None;
    let started = Instant::now();
    let root = Root::open(&site.root)?;
    // The node's Kata release, and `kataVersion` checked against it before anything else
    // (docs/design.md#node-kata-release): a mismatch leaves the node as it is.
    let kata = kata_check(plan, site, selection)?;
    obs.kata_release = Some(kata.node.clone());
    // Image trust first (docs/registries-and-trust.md): nothing is written on the node for an image the policy
    // refuses. A policy that needs signatures is checked on the resolved digest now.
    let mut image = image_ref(plan);
    let pull = Pull::new(opts);
    pull.admit(&image).await?;
    // The host key documents the ConfigMap names: read before anything is written.
    let (host_keys, key_records) = attest::node_host_keys(&site.root, &plan.se_host_key_documents)?;
    let mut tx = Transaction::begin(policy, plan, root, site, selection, kata).await?;
    tx.host_keys = host_keys;
    tx.key_records = key_records;
    let recorded = tx.old.as_ref().filter(|o| pin == Pin::Recorded && same_request(plan, &o.manifest_digest, o));
    // Drift repair restores the recorded digest (trusted when it was installed).
    if let (Some(o), ImageRef::Registry { digest, .. }) = (recorded, &mut image) {
        *digest = Some(o.manifest_digest.clone());
    }
    // One connection per endpoint for resolving and fetching: authenticate once.
    // A digest-pinned reference that is already installed needs no registry round trip:
    // the content is immutable and the files are verified below (offline restarts work).
    let digest = match (layout::pinned_digest(plan), &tx.old) {
        (Some(pinned), Some(o)) if o.manifest_digest == pinned => pinned.to_string(),
        _ if recorded.is_some() => recorded.map(|o| o.manifest_digest.clone()).unwrap_or_default(),
        _ => pull.resolve(&image).await?.image.manifest_digest,
    };
    obs.digest = Some(digest.clone());
    if let Some(old) = &tx.old
        && same_request(plan, &digest, old)
    {
        match file_drift(plan, old, &tx.target, &known, obs)? {
            None => {
                let outcome = tx.rewrite_drop_ins(old);
                match &outcome {
                    Ok(Outcome::UpToDate(st) | Outcome::Repaired(st, _) | Outcome::Installed(st)) => {
                        obs.attest = published_summary(st)
                    }
                    Err(_) => obs.facts.clear(),
                }
                return outcome;
            }
            Some(why) => {
                tracing::warn!(step = "repair", version = %old.version, "drift: {why}; pulling {} again", old.manifest_digest)
            }
        }
    }
    let st = tx.switch(&pull, &image).await?;
    obs.digest = Some(st.manifest_digest.clone());
    obs.facts = installed_facts(plan, &st, &tx.target);
    obs.attest = published_summary(&st);
    tracing::info!(
        version = %st.version,
        digest = %st.manifest_digest,
        drop_ins = st.drop_ins.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "installed"
    );
    Ok(Outcome::Installed(st))
}

/// One install under the node lock: what the node holds (the state read), where the plan
/// goes, and which directories may hold kata-addons drop-ins.
struct Transaction<'a> {
    policy: &'a Policy,
    plan: &'a Plan,
    root: Root,
    target: Target,
    /// The state before this install; `None` when nothing was installed.
    old: Option<State>,
    /// Root-relative runtime configuration directories that may hold a kata-addons drop-in.
    known: Vec<PathBuf>,
    /// Directories this install created (the install directory on a fresh node): removed
    /// again unless a state is written into them.
    created: node::Created,
    /// The node's Kata release and the `kataVersion` checked, for the new state.
    kata: KataRecord,
    /// The IBM SE host key documents the plan names (`seHostKeyDocuments`), hashed.
    host_keys: Vec<(String, crate::attest::hkd::HostKey)>,
    /// What the state records of them.
    key_records: Vec<DocumentRecord>,
    _lock: lock::NodeLock,
}

impl<'a> Transaction<'a> {
    /// Takes the node lock, reads the state (a damaged one is refused before anything is
    /// touched), removes what killed runs left, and resolves where the plan goes.
    async fn begin(
        policy: &'a Policy,
        plan: &'a Plan,
        root: Root,
        site: &Site,
        selection: &Selection,
        kata: KataRecord,
    ) -> Result<Transaction<'a>> {
        let lock = lock_node(&root, site.lock_timeout).await?;
        let existing = open_dir_if_exists(&root, INSTALL_DIR)?;
        let old = match &existing {
            Some(a) => state::read(a)?,
            None => None,
        };
        let known = known_config_dirs(&root, &selection.kata_prefix, &selection.only, &plan.runtime_configs);
        sweep_leftovers(&root, existing.as_ref(), &known)?;
        drop(existing);
        let mut created = node::Created::new(&root)?;
        let target = target(&root, plan, selection, &mut created)?;
        for c in &target.configs {
            tracing::info!(
                step = "resolve",
                provider = %plan.provider,
                runtime_config = %c.runtime_config,
                drop_in = %c.drop_in_node_path,
                image = %plan.image,
                "resolved runtime config"
            );
        }
        Ok(Transaction {
            policy,
            plan,
            root,
            target,
            old,
            known,
            created,
            kata,
            host_keys: Vec::new(),
            key_records: Vec::new(),
            _lock: lock,
        })
    }

    /// The switch to a new version: stage, render, state, commit, collect.
    async fn switch(&self, pull: &Pull<'_>, image: &ImageRef) -> Result<State> {
        let (plan, t) = (self.plan, &self.target);
        node::ensure_writable(&t.addons, INSTALL_DIR)?;
        for c in &t.configs {
            node::ensure_writable(c.commit_dir(), &c.drop_in_node_path)?;
        }

        // 1. Stage the files in a fresh directory inside the install directory. From here on,
        // `work` removes whatever is not committed when this function returns early.
        let mut work = Uncommitted::new(&t.addons, DROP_IN_NAME);
        let staging = format!("{STAGING_PREFIX}{}", std::process::id());
        remove_entry(&t.addons, &staging)?;
        t.addons.create_dir(&staging).with_context(|| format!("creating staging directory {staging}"))?;
        work.dir = Some(staging.clone());
        let (report_digest, files, trust, checked) = stage(pull, image, plan, t, &staging).await?;
        let dir_name = pick_dir_name(&t.addons, plan, &report_digest, self.old.as_ref())?;
        t.addons.rename(&staging, &t.addons, &dir_name).with_context(|| format!("renaming {staging} to {dir_name}"))?;
        work.dir = Some(dir_name.clone());
        node::fsync_dir(&t.addons)?;
        tracing::info!(step = "stage", dir = %format!("{INSTALL_DIR}/{dir_name}"), "files staged");

        // 2. Render the drop-ins from the installed node paths and stage them outside config.d.
        let drop_ins = render_for(self.policy, plan, &dir_name, &self.root, t, &checked)?;
        let all: Vec<(usize, &DropIn)> = drop_ins.iter().enumerate().collect();
        stage_drop_ins(t, &all, &mut work)?;

        // 3. The reference values of what the commit will put in effect (an IBM SE kernel
        // without a header for a confidential guest is refused here), then the state.
        let mut st = self.new_state(&dir_name, report_digest, &files, &checked, records(&drop_ins, t), trust);
        st.published = self.publish(&dir_name, &drop_ins, &st.files, attest::PlainSeKernel::Refuse)?;
        st.host_key_documents = self.key_records.clone();
        state::write(&t.addons, &st)?;
        // The state refers to the new directory now: a failed commit leaves it for the next run.
        work.keep_dir();
        self.created.keep();

        // 4. Commit: rename each drop-in into its config.d.
        commit_drop_ins(&self.root, t, &work.tmp_name, &all)?;
        work.committed();

        // 5. Remove what the commit made obsolete.
        self.gc(&mut st)?;
        Ok(st)
    }

    /// Computes the reference values of the targets as the rendered drop-ins will leave
    /// them and writes them into the version directory `dir_name` (`docs/attestation.md`).
    fn publish(
        &self,
        dir_name: &str,
        drop_ins: &[DropIn],
        files: &[FileRecord],
        plain: attest::PlainSeKernel,
    ) -> Result<Vec<PublishedRecord>> {
        let t = &self.target;
        let pending: Vec<attest::Pending<'_>> = drop_ins
            .iter()
            .zip(&t.configs)
            .map(|(d, c)| attest::Pending {
                runtime_config: &c.runtime_config,
                rel: &c.rel,
                handler: c.handler.clone(),
                drop_in: &d.path,
                contents: &d.contents,
            })
            .collect();
        let targets = attest::pending_targets(&self.root, self.plan.provider, &pending, files, &self.host_keys)?;
        let dir = t.addons.open_dir(dir_name).with_context(|| format!("opening {INSTALL_DIR}/{dir_name}"))?;
        let records = attest::at_install(&targets, &dir, &format!("{INSTALL_DIR}/{dir_name}"), plain)?;
        node::fsync_dir(&dir)?;
        Ok(records)
    }

    /// The state of the new version in `dir_name`, with what it makes obsolete.
    fn new_state(
        &self,
        dir_name: &str,
        manifest_digest: String,
        files: &[(Option<String>, u64)],
        checked: &[crate::measured::Checked],
        drop_ins: Vec<DropInRecord>,
        trust: TrustRecord,
    ) -> State {
        let plan = self.plan;
        let mut previous_dirs: Vec<String> = Vec::new();
        let mut previous_drop_ins: Vec<String> = Vec::new();
        if let Some(old) = &self.old {
            previous_dirs.extend(old.previous_dirs.iter().cloned());
            previous_dirs.push(old.version_dir.clone());
            previous_drop_ins = obsolete_drop_ins(old, &drop_ins);
        }
        previous_dirs.retain(|d| d != dir_name);
        previous_dirs.dedup();
        let installed = layout::installed_files(plan, dir_name);
        State {
            schema: state::SCHEMA,
            image: plan.image.clone(),
            manifest_digest,
            version: plan.version.clone(),
            provider: plan.provider,
            version_dir: dir_name.to_string(),
            files: plan
                .artifacts
                .iter()
                .zip(&installed)
                .zip(files)
                .zip(checked)
                .map(|(((a, f), (sha, size)), c)| FileRecord {
                    kind: a.kind,
                    source: a.source.clone(),
                    path: f.path.clone(),
                    sha256: sha.clone(),
                    size: *size,
                    filesystem: crate::measured::record(c).0,
                    verity: crate::measured::record(c).1,
                })
                .collect(),
            drop_ins,
            previous_dirs,
            previous_drop_ins,
            trust: Some(trust),
            runtime_classes: super::target::plan_runtime_classes(plan).to_vec(),
            published: Vec::new(),
            kata: Some(self.kata.clone()),
            host_key_documents: Vec::new(),
        }
    }

    /// The installed files are what the plan asks for, and intact: the drop-ins are
    /// (re)written from the state without a pull when they drifted.
    fn rewrite_drop_ins(&self, old: &State) -> Result<Outcome> {
        let (plan, t) = (self.plan, &self.target);
        let drop_ins =
            render_for(self.policy, plan, &old.version_dir, &self.root, t, &crate::measured::from_records(&old.files))?;
        let new_records = records(&drop_ins, t);
        let mut drifted: Vec<(usize, &DropIn)> = Vec::new();
        let mut what = Vec::new();
        for (i, (d, rec)) in drop_ins.iter().zip(&new_records).enumerate() {
            let on_disk = match &t.configs[i].config_d {
                Some(config_d) => node::hash_file(config_d, Path::new(DROP_IN_NAME)),
                None => Ok(None),
            };
            let why = match on_disk {
                Ok(Some((sha, _))) if sha == rec.sha256 => continue,
                Ok(Some((sha, _))) => format!("drop-in {} was edited (sha256 {sha}, expected {})", d.path, rec.sha256),
                Ok(None) => format!("drop-in {} was missing", d.path),
                Err(e) => format!("drop-in {} was unreadable ({e:#})", d.path),
            };
            drifted.push((i, d));
            what.push(why);
        }
        let obsolete = obsolete_drop_ins(old, &new_records);
        // A version installed before kata-addons published reference values gets them now,
        // and other host key documents republish them, for the drop-ins as this run leaves
        // them (docs/attestation.md).
        let why = if old.published.is_empty() {
            Some("reference values published for the installed version (installed before kata-addons published them)")
        } else if old.host_key_documents != self.key_records {
            Some("reference values published again: the IBM SE host key documents (seHostKeyDocuments) changed")
        } else {
            None
        };
        let published = match why {
            Some(why) => {
                node::ensure_writable(&t.addons, INSTALL_DIR)?;
                let records = self.publish(&old.version_dir, &drop_ins, &old.files, attest::PlainSeKernel::Warn)?;
                let mut st = old.clone();
                st.published = records.clone();
                what.push(format!("{why}: {}", published_summary(&st).unwrap_or_default()));
                records
            }
            None => old.published.clone(),
        };
        if drifted.is_empty()
            && old.drop_ins == new_records
            && old.runtime_classes == super::target::plan_runtime_classes(plan)
        {
            let mut st = old.clone();
            if what.is_empty() {
                self.gc(&mut st)?;
                tracing::info!(version = %old.version, digest = %old.manifest_digest, "up to date; nothing changed");
                return Ok(Outcome::UpToDate(st));
            }
            st.published = published;
            st.host_key_documents = self.key_records.clone();
            state::write(&t.addons, &st)?;
            self.gc(&mut st)?;
            for w in &what {
                tracing::info!(step = "attest", version = %st.version, "{w}");
            }
            return Ok(Outcome::Repaired(st, what));
        }
        for rec in &old.drop_ins {
            if !new_records.iter().any(|n| n.path == rec.path) {
                what.push(format!(
                    "runtime configuration {} is no longer selected or installed; its drop-in {} is removed",
                    rec.runtime_config, rec.path
                ));
            }
        }
        node::ensure_writable(&t.addons, INSTALL_DIR)?;
        for (i, _) in &drifted {
            node::ensure_writable(t.configs[*i].commit_dir(), &t.configs[*i].drop_in_node_path)?;
        }
        let mut work = Uncommitted::new(&t.addons, DROP_IN_NAME);
        stage_drop_ins(t, &drifted, &mut work)?;
        let mut st = old.clone();
        st.drop_ins = new_records;
        st.published = published;
        st.host_key_documents = self.key_records.clone();
        st.previous_drop_ins = obsolete;
        st.runtime_classes = super::target::plan_runtime_classes(plan).to_vec();
        state::write(&t.addons, &st)?;
        commit_drop_ins(&self.root, t, &work.tmp_name, &drifted)?;
        work.committed();
        self.gc(&mut st)?;
        for w in &what {
            tracing::warn!(step = "repair", version = %st.version, "drift repaired: {w}");
        }
        Ok(Outcome::Repaired(st, what))
    }

    /// [`gc`] of this transaction's node.
    fn gc(&self, st: &mut State) -> Result<()> {
        gc(&self.root, &self.target, st, &self.known)
    }
}

/// Fetches the plan's artifacts into `staging` and checks pinned checksums.
/// Returns the manifest digest, `(sha256, size)` per artifact in plan order (no sha256 for
/// a measured file that did not pin one), the trust decision that admitted the image, and
/// what the check of each image and extension found (the guest's own view of the file,
/// before the commit point).
async fn stage(
    pull: &Pull<'_>,
    image: &ImageRef,
    plan: &Plan,
    t: &Target,
    staging: &str,
) -> Result<(String, Vec<(Option<String>, u64)>, TrustRecord, Vec<crate::measured::Checked>)> {
    let dir = t.addons.open_dir(staging).with_context(|| format!("opening {staging}"))?;
    let wanted: Vec<Wanted> = crate::measured::wanted(plan)?;
    let started = Instant::now();
    let report = pull.files(image, &wanted, &dir, INSTALL_DIR).await?;
    let bytes: u64 = report.files.iter().map(|f| f.size).sum();
    let secs = started.elapsed().as_secs_f64().max(1e-6);
    tracing::info!(
        step = "pull",
        digest = %report.manifest_digest,
        bytes,
        rate_mib_s = format!("{:.1}", bytes as f64 / secs / 1048576.0),
        "pulled"
    );
    let mut out = Vec::new();
    for a in &plan.artifacts {
        let f = report
            .files
            .iter()
            .find(|f| f.dest_name == a.file_name)
            .with_context(|| format!("the fetch did not produce {}", a.source))?;
        if f.size == 0 {
            bail!(
                "refusing {} {} in {}: the file is empty (0 bytes), nothing Kata can boot ({}Path must name a non-empty \
                 file); nothing was installed",
                a.kind,
                a.source,
                plan.image,
                a.kind
            );
        }
        if let Some(expected) = &a.sha256
            && f.sha256.as_ref() != Some(expected)
        {
            bail!(
                "checksum mismatch for {} {} in {}: expected sha256 {expected} ({}Sha256), got {}; nothing was installed",
                a.kind,
                a.source,
                plan.image,
                a.kind,
                f.sha256.as_deref().unwrap_or("(not computed)")
            );
        }
        let sha256 = f.sha256.as_deref().unwrap_or("(measured: its dm-verity tree is the record)");
        tracing::info!(step = "verify", kind = %a.kind, source = %a.source, sha256, size = f.size, "verified");
        out.push((f.sha256.clone(), f.size));
    }
    let checked = crate::measured::check_staged(&dir, plan, &report.files)?;
    node::fsync_dir(&dir)?;
    Ok((report.manifest_digest, out, report.trust, checked))
}

/// A version directory name that is not in use: `<version>-<digest12>`, with a
/// numeric suffix if that name is live (current or awaiting removal). A leftover
/// that no state refers to (a crash after staging) is removed.
fn pick_dir_name(addons: &Dir, plan: &Plan, digest: &str, old: Option<&State>) -> Result<String> {
    let base = layout::version_dir_name(&plan.version, Some(digest));
    let live = |n: &str| old.is_some_and(|s| s.version_dir == n || s.previous_dirs.iter().any(|d| d == n));
    for i in 0..1000 {
        let name = if i == 0 { base.clone() } else { format!("{base}.{i}") };
        if live(&name) {
            continue;
        }
        remove_entry(addons, &name)?;
        return Ok(name);
    }
    bail!("no free version directory name for {base}")
}

/// The state records exactly what `plan` asks for at `digest`: same image, version,
/// provider, artifacts and checked `kataVersion` (drop-ins are checked separately).
fn same_request(plan: &Plan, digest: &str, st: &State) -> bool {
    st.manifest_digest == digest
        && st.image == plan.image
        && st.version == plan.version
        && st.provider == plan.provider
        && st.files.len() == plan.artifacts.len()
        && st.kata.as_ref().and_then(KataRecord::wanted) == kata_release::wanted(plan)
}

/// Reads the node's Kata release and checks the plan's `kataVersion` against it: the
/// record for the state, or the one-line refusal.
fn kata_check(plan: &Plan, site: &Site, selection: &Selection) -> Result<KataRecord> {
    let node = kata_release::observe(&site.root, &selection.kata_prefix);
    let shown = match &node {
        Ok(n) => n.to_string(),
        Err(e) => format!("unreadable: {e}"),
    };
    let wanted = kata_release::wanted(plan);
    if let Some(w) = &wanted {
        kata_release::check(w, &node).map_err(|why| anyhow::Error::new(kata_release::Refused(why)))?;
    }
    Ok(KataRecord {
        node: shown,
        epoch: wanted.as_ref().and_then(|w| w.epoch),
        version: wanted.as_ref().map(|w| w.version.clone()),
        release: wanted.and_then(|w| w.release),
    })
}

/// `None` when every recorded file is where the plan puts it with the recorded (and
/// pinned) sha256; otherwise what differs. A file whose metadata is the one `known`
/// recorded when it was last hashed is not hashed again; `obs` gets the files known intact
/// (when none drifted) and the count of files hashed.
fn file_drift(plan: &Plan, st: &State, t: &Target, known: &FileFacts, obs: &mut Observed) -> Result<Option<String>> {
    let installed = layout::installed_files(plan, &st.version_dir);
    let (mut hashed, mut unchanged) = (0usize, 0usize);
    let mut facts = FileFacts::new();
    let mut drift = None;
    for ((a, f), rec) in plan.artifacts.iter().zip(&installed).zip(&st.files) {
        if rec.kind != a.kind || rec.source != a.source || rec.path != f.path {
            drift = Some(format!("the recorded {} {} is not what the plan asks for", rec.kind, rec.path));
            break;
        }
        if a.sha256.as_ref().is_some_and(|s| Some(s) != rec.sha256.as_ref()) {
            drift = Some(format!("the recorded {} does not have the pinned sha256", rec.kind));
            break;
        }
        let rel = Path::new(&st.version_dir).join(&a.file_name);
        // Taken before hashing: a write during the hash changes ctime, so it is seen next time.
        let meta = t.addons.symlink_metadata(&rel).ok().filter(|m| m.is_file()).map(|m| FileMeta::of(&m));
        if let Some(m) = meta
            && m.size == rec.size
            && known.get(&rec.path) == Some(&m)
        {
            unchanged += 1;
            facts.insert(rec.path.clone(), m);
            continue;
        }
        hashed += 1;
        let why = match super::integrity::check(&t.addons, &rel, rec) {
            Ok(Finding::Intact) => {
                if let Some(m) = meta {
                    facts.insert(rec.path.clone(), m);
                }
                continue;
            }
            Ok(Finding::Differs(what)) => format!("{} {} was edited ({what})", rec.kind, rec.path),
            Ok(Finding::Missing) => format!("{} {} was missing", rec.kind, rec.path),
            Err(e) => format!("{} {} is unusable ({e:#})", rec.kind, rec.path),
        };
        drift = Some(why);
        break;
    }
    if drift.is_none() {
        drift = published_drift(st, &t.addons);
    }
    tracing::debug!(hashed, unchanged, "installed files checked");
    obs.hashed += hashed;
    obs.facts = if drift.is_none() { facts } else { FileFacts::new() };
    Ok(drift)
}

/// Where the reference values of `st` are and what they hold, in one line.
fn published_summary(st: &State) -> Option<String> {
    st.published.iter().find_map(|p| p.summary.as_ref().map(|s| format!("{}: {s}", p.path)))
}

/// What differs of the files published for attestation (they are small: always hashed).
fn published_drift(st: &State, addons: &Dir) -> Option<String> {
    for p in &st.published {
        let name = p.path.rsplit('/').next().unwrap_or_default();
        let why = match node::hash_file(addons, &Path::new(&st.version_dir).join(name)) {
            Ok(Some((sha, _))) if sha == p.sha256 => continue,
            Ok(Some((sha, _))) => format!("{} was edited (sha256 {sha}, expected {})", p.path, p.sha256),
            Ok(None) => format!("{} was missing", p.path),
            Err(e) => format!("{} is unusable ({e:#})", p.path),
        };
        return Some(why);
    }
    None
}

/// The metadata of the files `st` records, just written and verified by the install.
fn installed_facts(plan: &Plan, st: &State, t: &Target) -> FileFacts {
    let mut facts = FileFacts::new();
    for (a, rec) in plan.artifacts.iter().zip(&st.files) {
        let rel = Path::new(&st.version_dir).join(&a.file_name);
        if let Ok(m) = t.addons.symlink_metadata(&rel)
            && m.is_file()
        {
            facts.insert(rec.path.clone(), FileMeta::of(&m));
        }
    }
    facts
}

/// Removes obsolete drop-ins and version directories recorded in `st`, then records that
/// nothing is pending; also removes version directories no state refers to (a kill after
/// staging, before the state write) when every kata-addons drop-in found in the known
/// runtime configuration directories is one `st` records (so none can point into them).
fn gc(root: &Root, t: &Target, st: &mut State, known: &[PathBuf]) -> Result<()> {
    for p in &st.previous_drop_ins {
        if state::validate::remove_drop_in(root, p)? == state::validate::DropInRemoval::Removed {
            tracing::info!(step = "gc", drop_in = %p, "removed obsolete drop-in");
        }
    }
    for d in &st.previous_dirs {
        remove_entry(&t.addons, d)?;
        tracing::info!(step = "gc", dir = %d, "removed previous version");
    }
    let orphans: Vec<String> = version_dirs(&t.addons)?
        .into_iter()
        .filter(|d| d != &st.version_dir && !st.previous_dirs.contains(d))
        .collect();
    if !orphans.is_empty() {
        let unrecorded: Vec<String> = our_drop_ins(root, known)
            .into_iter()
            .filter(|p| !st.drop_ins.iter().any(|d| &d.path == p) && !st.previous_drop_ins.contains(p))
            .collect();
        if unrecorded.is_empty() {
            for d in &orphans {
                remove_entry(&t.addons, d)?;
                tracing::info!(step = "gc", dir = %d, "removed a version directory no state refers to");
            }
        } else {
            tracing::warn!(
                step = "gc",
                "version directories {} are not in the state but kept: kata-addons drop-ins the state does not \
                 record may point into them ({}); `kata-addons uninstall` removes both",
                orphans.join(", "),
                unrecorded.join(", ")
            );
        }
    }
    if !st.previous_dirs.is_empty() || !st.previous_drop_ins.is_empty() || !orphans.is_empty() {
        node::fsync_dir(&t.addons)?;
    }
    if !st.previous_dirs.is_empty() || !st.previous_drop_ins.is_empty() {
        st.previous_dirs.clear();
        st.previous_drop_ins.clear();
        state::write(&t.addons, st)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncommitted_work_is_removed_on_drop_unless_kept() {
        let tmp = tempfile::tempdir().expect("tmp");
        let addons = Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).expect("open");
        let config = Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).expect("open");
        {
            let mut w = Uncommitted::new(&addons, "50-x.toml");
            addons.create_dir("stage").expect("mkdir");
            w.dir = Some("stage".into());
            w.tmp_in.push(&config);
            node::write_synced(&config, &w.tmp_name, b"x").expect("write");
        }
        assert!(addons.symlink_metadata("stage").is_err(), "staging kept");
        assert!(config.symlink_metadata(tmp_drop_in_name("50-x.toml")).is_err(), "temp drop-in kept");
        {
            let mut w = Uncommitted::new(&addons, "50-x.toml");
            addons.create_dir("v1").expect("mkdir");
            w.dir = Some("v1".into());
            w.tmp_in.push(&config);
            node::write_synced(&config, &w.tmp_name, b"x").expect("write");
            w.keep_dir();
        }
        assert!(addons.symlink_metadata("v1").is_ok(), "a directory the state refers to was removed");
        assert!(config.symlink_metadata(tmp_drop_in_name("50-x.toml")).is_err(), "temp drop-in kept");
    }
}
