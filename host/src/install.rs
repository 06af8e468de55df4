//! `install`, `uninstall` and `status`: the node lifecycle with the atomic switch of
//! DESIGN.md §4. Order: stage files in a new version directory -> render the drop-ins (one
//! per runtime configuration found) -> write state -> rename each drop-in into its
//! `config.d` (the commit point of that configuration) -> remove the previous version. A
//! crash at any instant leaves each configuration with the old or the new drop-in, and
//! both versions' files in place until the next run finishes the switch.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;
use sha2::{Digest, Sha256};

use kata_addons_facts::{DROP_IN_NAME, INSTALL_DIR};

use crate::cli::{LayoutArgs, NodeArgs};
use crate::fetch::{self, Wanted};
use crate::layout;
use crate::lock;
use crate::node::{self, Root};
use crate::policy::{DropIn, ImageSource, Plan, Policy, path_only_facts};
use crate::preview::{kind_name, provider_name};
use crate::runtime;
use crate::source::{ImageRef, RegistryOptions};
use crate::state::{self, DropInRecord, FileRecord, State};

/// Prefix of staging directories inside the install directory (`.staging-<pid>`).
const STAGING_PREFIX: &str = ".staging-";

/// What follows `.<drop-in name>` in a temporary drop-in beside a runtime configuration:
/// `.50-kata-addons.toml.kata-addons-tmp-<pid>` (without `-<pid>`: the name releases
/// before this one used, written only under the node lock).
const TMP_DROP_IN_SUFFIX: &str = ".kata-addons-tmp";

/// Prefix of the state file's temporary name (`node::write_atomic`: `.state.json.tmp-<pid>`).
fn state_tmp_prefix() -> String {
    format!(".{}.tmp-", state::STATE_FILE)
}

/// The temporary name this process stages drop-ins under, beside each `config.d`.
fn tmp_drop_in_name(drop_in_name: &str) -> String {
    format!(".{drop_in_name}{TMP_DROP_IN_SUFFIX}-{}", std::process::id())
}

/// The owner pid of a leftover name's `<pid>` suffix, parsed strictly: decimal digits only,
/// no sign, no leading zero, 1 to `i32::MAX`. Anything else is not a name this program makes.
fn owner_pid(suffix: &str) -> Option<i32> {
    if suffix.is_empty() || suffix.len() > 10 || !suffix.bytes().all(|b| b.is_ascii_digit()) || suffix.starts_with('0')
    {
        return None;
    }
    suffix.parse::<i32>().ok().filter(|p| *p > 0)
}

/// Whether the leftover of process `pid` may be removed: this process (which has created
/// nothing yet when the sweep runs), or a process that no longer exists. A live process'
/// leftovers are left alone (under the node lock that cannot be another kata-addons run,
/// but a pid reused by anything else is not guessed about).
fn owner_gone(pid: i32) -> bool {
    if u32::try_from(pid).is_ok_and(|p| p == std::process::id()) {
        return true;
    }
    match rustix::process::Pid::from_raw(pid) {
        Some(p) => rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH),
        None => false,
    }
}

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
    /// The files were intact but drop-ins had drifted: these were rewritten from the state.
    Repaired(State, Vec<String>),
    /// A new version was committed.
    Installed(State),
}

/// One runtime configuration's side of an install.
struct ConfigTarget {
    /// Node path of the resolved `configuration*.toml`.
    runtime_config: String,
    /// The directory holding it (drop-ins are staged here, beside `config.d`).
    config_dir: Dir,
    /// `config.d` beside it.
    config_d: Dir,
    /// Node path of the drop-in.
    drop_in_node_path: String,
}

/// The node-side places of a plan.
struct Target {
    /// The install directory (`/etc/kata-containers/addons`).
    addons: Dir,
    /// Every runtime configuration that gets the drop-in, in discovery order.
    configs: Vec<ConfigTarget>,
}

impl Target {
    /// The facts of each resolved runtime configuration, as `render` takes them.
    fn runtime_configs(&self) -> Vec<crate::policy::RuntimeConfigFacts> {
        self.configs.iter().map(|c| path_only_facts(&c.runtime_config)).collect()
    }
}

/// The runtime configuration selection from the command line.
pub fn selection(layout: &LayoutArgs) -> runtime::Selection {
    runtime::Selection { only: layout.runtime_configs.clone(), allow_shared_config_d: layout.allow_shared_config_d }
}

/// Resolves where a plan's files and drop-ins go, creating `config.d` directories as needed.
fn target(root: &Root, plan: &Plan, layout: &LayoutArgs) -> Result<Target> {
    let provider = provider_name(plan.provider);
    let found = runtime::discover(root, &plan.runtime_configs, &selection(layout))
        .with_context(|| format!("finding the Kata runtime configurations of provider `{provider}`"))?;
    let mut configs = Vec::new();
    for rc in found {
        let dir_rel = rc.dir_rel();
        let config_dir = root
            .dir()
            .open_dir(if dir_rel.as_os_str().is_empty() { Path::new(".") } else { &dir_rel })
            .with_context(|| format!("opening {}", node::node_path(&dir_rel)))?;
        let config_d_rel = rc.config_d_rel();
        let config_d = root.create_dir_all(&config_d_rel)?;
        configs.push(ConfigTarget {
            drop_in_node_path: node::node_path(&config_d_rel.join(DROP_IN_NAME)),
            runtime_config: rc.resolved,
            config_dir,
            config_d,
        });
    }
    let addons = root.create_dir_all(&node::rel_path(INSTALL_DIR))?;
    Ok(Target { addons, configs })
}

/// The image reference of a plan, in the fetch layer's terms.
pub fn image_ref(plan: &Plan) -> Result<ImageRef> {
    match &plan.source {
        // The guest validated the reference; the host's one parser checks it again.
        ImageSource::Registry(r) => {
            ImageRef::registry(&r.registry, &r.repository, r.tag.as_deref(), r.digest.as_deref())
        }
        ImageSource::Layout(l) => Ok(ImageRef::Layout { path: PathBuf::from(&l.path), tag: l.tag.clone() }),
    }
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Takes the node lock without stalling the async runtime.
async fn lock_node(root: &Root, timeout: Duration) -> Result<lock::NodeLock> {
    tokio::task::block_in_place(|| lock::acquire(root, timeout))
}

/// Renders the drop-ins for every target and pairs each with its target (same order).
fn render_for(policy: &Policy, plan: &Plan, dir_name: &str, t: &Target) -> Result<Vec<DropIn>> {
    let installed = layout::installed_files(plan, dir_name);
    let drop_ins = policy.render(plan, &installed, &t.runtime_configs())?;
    for (d, c) in drop_ins.iter().zip(&t.configs) {
        if d.path != c.drop_in_node_path {
            bail!("the policy placed the drop-in for {} at {}, not {}", c.runtime_config, d.path, c.drop_in_node_path);
        }
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

/// Renames staged drop-ins into their `config.d` (the commit point of each).
fn commit_drop_ins(t: &Target, tmp_name: &str, drop_ins: &[(usize, &DropIn)]) -> Result<()> {
    for (i, d) in drop_ins {
        let c = &t.configs[*i];
        c.config_dir
            .rename(tmp_name, &c.config_d, DROP_IN_NAME)
            .with_context(|| format!("committing the drop-in {}", c.drop_in_node_path))?;
        node::fsync_dir(&c.config_d)?;
        node::fsync_dir(&c.config_dir)?;
        tracing::info!(step = "commit", drop_in = %d.path, sha256 = %sha256_hex(d.contents.as_bytes()), "drop-in committed");
    }
    Ok(())
}

/// Drop-in records for rendered drop-ins.
fn records(drop_ins: &[DropIn]) -> Vec<DropInRecord> {
    drop_ins
        .iter()
        .map(|d| DropInRecord {
            runtime_config: d.runtime_config.clone(),
            path: d.path.clone(),
            sha256: sha256_hex(d.contents.as_bytes()),
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

/// Installs (or confirms, or repairs) the addon described by `plan` on the node.
pub async fn install(
    policy: &Policy,
    plan: &Plan,
    registry: &RegistryOptions,
    node_args: &NodeArgs,
    layout_args: &LayoutArgs,
) -> Result<Outcome> {
    install_inner(policy, plan, registry, node_args, layout_args, false).await
}

/// Like [`install`], but when the state records this plan, restores exactly the recorded
/// manifest digest (a moved tag is not followed): the daemon's drift repair.
pub async fn repair(
    policy: &Policy,
    plan: &Plan,
    registry: &RegistryOptions,
    node_args: &NodeArgs,
    layout_args: &LayoutArgs,
) -> Result<Outcome> {
    install_inner(policy, plan, registry, node_args, layout_args, true).await
}

async fn install_inner(
    policy: &Policy,
    plan: &Plan,
    registry: &RegistryOptions,
    node_args: &NodeArgs,
    layout_args: &LayoutArgs,
    from_state: bool,
) -> Result<Outcome> {
    let started = Instant::now();
    let root = Root::open(&node_args.root)?;
    // Image trust first (issue 9): nothing is written on the node for an image the policy
    // refuses. A policy that needs signatures is checked on the resolved digest now.
    let mut image = image_ref(plan)?;
    let conns = fetch::Connections::new();
    let mut trust = match crate::trust::gate(&registry.trust, &image)? {
        crate::trust::Gate::Decided(r) => Some(r),
        crate::trust::Gate::NeedsSignatures => {
            fetch::resolve_digest_with(registry, &conns, &image)
                .await
                .with_context(|| format!("resolving {}", plan.image))?;
            conns.trust()
        }
    };
    let _lock = lock_node(&root, Duration::from_secs(node_args.lock_timeout)).await?;
    // A damaged state is refused before anything is touched; then leftovers of killed runs go.
    let existing = open_dir_if_exists(&root, INSTALL_DIR)?;
    let old = match &existing {
        Some(a) => state::read(a)?,
        None => None,
    };
    let known = known_config_dirs(&root, &layout_args.kata_prefix, &layout_args.runtime_configs, &plan.runtime_configs);
    sweep_leftovers(&root, existing.as_ref(), &known)?;
    drop(existing);
    let t = target(&root, plan, layout_args)?;
    for c in &t.configs {
        tracing::info!(
            step = "resolve",
            provider = provider_name(plan.provider),
            runtime_config = %c.runtime_config,
            drop_in = %c.drop_in_node_path,
            image = %plan.image,
            "resolved runtime config"
        );
    }
    let recorded = old.as_ref().filter(|o| from_state && same_request(plan, &o.manifest_digest, o));
    // Drift repair restores the recorded digest (trusted when it was installed).
    if let (Some(o), ImageRef::Registry { digest, .. }) = (recorded, &mut image) {
        *digest = Some(o.manifest_digest.clone());
    }

    // One connection per endpoint for resolving and fetching: authenticate once.
    // A digest-pinned reference that is already installed needs no registry round trip:
    // the content is immutable and the files are verified below (offline restarts work).
    let digest = match (layout::pinned_digest(plan), &old) {
        (Some(pinned), Some(o)) if o.manifest_digest == pinned => pinned.to_string(),
        _ if recorded.is_some() => recorded.map(|o| o.manifest_digest.clone()).unwrap_or_default(),
        _ => fetch::resolve_digest_with(registry, &conns, &image)
            .await
            .with_context(|| format!("resolving {}", plan.image))?,
    };
    if let Some(old) = &old
        && same_request(plan, &digest, old)
    {
        match file_drift(plan, old, &t)? {
            None => return repair_drop_ins(policy, plan, &root, &t, old, &known),
            Some(why) => {
                tracing::warn!(step = "repair", version = %old.version, "drift: {why}; pulling {} again", old.manifest_digest)
            }
        }
    }

    node::ensure_writable(&t.addons, INSTALL_DIR)?;
    for c in &t.configs {
        node::ensure_writable(&c.config_d, &c.drop_in_node_path)?;
    }

    // 1. Stage the files in a fresh directory inside the install directory. From here on,
    // `work` removes whatever is not committed when this function returns early.
    let mut work = Uncommitted::new(&t.addons, DROP_IN_NAME);
    let staging = format!("{STAGING_PREFIX}{}", std::process::id());
    remove_entry(&t.addons, &staging)?;
    t.addons.create_dir(&staging).with_context(|| format!("creating staging directory {staging}"))?;
    work.dir = Some(staging.clone());
    let staged = stage(registry, &conns, &image, plan, &t, &staging).await;
    if let Some(r) = conns.trust() {
        trust = Some(r);
    }
    let (report_digest, files) = staged?;
    let dir_name = pick_dir_name(&t.addons, plan, &report_digest, old.as_ref())?;
    t.addons.rename(&staging, &t.addons, &dir_name).with_context(|| format!("renaming {staging} to {dir_name}"))?;
    work.dir = Some(dir_name.clone());
    node::fsync_dir(&t.addons)?;
    tracing::info!(step = "stage", dir = %format!("{INSTALL_DIR}/{dir_name}"), "files staged");

    // 2. Render the drop-ins from the installed node paths and stage them outside config.d.
    let drop_ins = render_for(policy, plan, &dir_name, &t)?;
    let all: Vec<(usize, &DropIn)> = drop_ins.iter().enumerate().collect();
    stage_drop_ins(&t, &all, &mut work)?;

    // 3. Write the state, naming what the commit will make obsolete.
    let new_drop_ins = records(&drop_ins);
    let mut previous_dirs: Vec<String> = Vec::new();
    let mut previous_drop_ins: Vec<String> = Vec::new();
    if let Some(old) = &old {
        previous_dirs.extend(old.previous_dirs.iter().cloned());
        previous_dirs.push(old.version_dir.clone());
        previous_drop_ins = obsolete_drop_ins(old, &new_drop_ins);
    }
    previous_dirs.retain(|d| d != &dir_name);
    previous_dirs.dedup();
    let installed = layout::installed_files(plan, &dir_name);
    let mut st = State {
        schema: state::SCHEMA,
        image: plan.image.clone(),
        manifest_digest: report_digest.clone(),
        version: plan.version.clone(),
        provider: provider_name(plan.provider).to_string(),
        version_dir: dir_name.clone(),
        files: plan
            .artifacts
            .iter()
            .zip(&installed)
            .zip(&files)
            .map(|((a, f), (sha, size))| FileRecord {
                kind: kind_name(a.kind).to_string(),
                source: a.source.clone(),
                path: f.path.clone(),
                sha256: sha.clone(),
                size: *size,
                filesystem: None,
                verity: None,
            })
            .collect(),
        drop_ins: new_drop_ins,
        previous_dirs,
        previous_drop_ins,
        trust,
    };
    state::write(&t.addons, &st)?;
    // The state refers to the new directory now: a failed commit leaves it for the next run.
    work.keep_dir();

    // 4. Commit: rename each drop-in into its config.d.
    commit_drop_ins(&t, &work.tmp_name, &all)?;
    work.committed();

    // 5. Remove what the commit made obsolete.
    gc(&root, &t, &mut st, &known)?;
    tracing::info!(
        version = %st.version,
        digest = %st.manifest_digest,
        drop_ins = st.drop_ins.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "installed"
    );
    Ok(Outcome::Installed(st))
}

/// The installed files are what `plan` asks for, and intact: the drop-ins can be
/// (re)written from the state without a pull.
fn repair_drop_ins(
    policy: &Policy,
    plan: &Plan,
    root: &Root,
    t: &Target,
    old: &State,
    known: &[PathBuf],
) -> Result<Outcome> {
    let drop_ins = render_for(policy, plan, &old.version_dir, t)?;
    let new_records = records(&drop_ins);
    let mut drifted: Vec<(usize, &DropIn)> = Vec::new();
    let mut what = Vec::new();
    for (i, (d, rec)) in drop_ins.iter().zip(&new_records).enumerate() {
        let on_disk = node::hash_file(&t.configs[i].config_d, Path::new(DROP_IN_NAME));
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
    if drifted.is_empty() && old.drop_ins == new_records {
        let mut st = old.clone();
        gc(root, t, &mut st, known)?;
        tracing::info!(version = %old.version, digest = %old.manifest_digest, "up to date; nothing changed");
        return Ok(Outcome::UpToDate(st));
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
        node::ensure_writable(&t.configs[*i].config_d, &t.configs[*i].drop_in_node_path)?;
    }
    let mut work = Uncommitted::new(&t.addons, DROP_IN_NAME);
    stage_drop_ins(t, &drifted, &mut work)?;
    let mut st = old.clone();
    st.drop_ins = new_records;
    st.previous_drop_ins = obsolete;
    state::write(&t.addons, &st)?;
    commit_drop_ins(t, &work.tmp_name, &drifted)?;
    work.committed();
    gc(root, t, &mut st, known)?;
    for w in &what {
        tracing::warn!(step = "repair", version = %st.version, "drift repaired: {w}");
    }
    Ok(Outcome::Repaired(st, what))
}

/// Fetches the plan's artifacts into `staging` and checks pinned checksums.
/// Returns the manifest digest and `(sha256, size)` per artifact, in plan order.
async fn stage(
    registry: &RegistryOptions,
    conns: &fetch::Connections,
    image: &ImageRef,
    plan: &Plan,
    t: &Target,
    staging: &str,
) -> Result<(String, Vec<(String, u64)>)> {
    let dir = t.addons.open_dir(staging).with_context(|| format!("opening {staging}"))?;
    let wanted: Vec<Wanted> = plan
        .artifacts
        .iter()
        .map(|a| Wanted { path: a.source.clone(), dest_name: a.file_name.clone(), verity: None })
        .collect();
    let started = Instant::now();
    let report = fetch::fetch_files_into(registry, conns, image, &wanted, &dir, INSTALL_DIR)
        .await
        .with_context(|| format!("pulling {}", plan.image))?;
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
        if let Some(expected) = &a.sha256
            && &f.sha256 != expected
        {
            bail!(
                "checksum mismatch for {} {} in {}: expected sha256 {expected} ({}Sha256), got {}; nothing was installed",
                kind_name(a.kind),
                a.source,
                plan.image,
                kind_name(a.kind),
                f.sha256
            );
        }
        tracing::info!(step = "verify", kind = kind_name(a.kind), source = %a.source, sha256 = %f.sha256, size = f.size, "verified");
        out.push((f.sha256.clone(), f.size));
    }
    node::fsync_dir(&dir)?;
    Ok((report.manifest_digest, out))
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

/// Removes a file or directory tree if it exists.
fn remove_entry(dir: &Dir, name: &str) -> Result<()> {
    match dir.symlink_metadata(name) {
        Ok(m) if m.is_dir() => dir.remove_dir_all(name).with_context(|| format!("removing {name}")),
        Ok(_) => dir.remove_file(name).with_context(|| format!("removing {name}")),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("inspecting {name}")),
    }
}

/// The state records exactly what `plan` asks for at `digest`: same image, version,
/// provider and artifacts (drop-ins are checked separately).
fn same_request(plan: &Plan, digest: &str, st: &State) -> bool {
    st.manifest_digest == digest
        && st.image == plan.image
        && st.version == plan.version
        && st.provider == provider_name(plan.provider)
        && st.files.len() == plan.artifacts.len()
}

/// `None` when every recorded file is where the plan puts it with the recorded (and
/// pinned) sha256; otherwise what differs.
fn file_drift(plan: &Plan, st: &State, t: &Target) -> Result<Option<String>> {
    let installed = layout::installed_files(plan, &st.version_dir);
    for ((a, f), rec) in plan.artifacts.iter().zip(&installed).zip(&st.files) {
        if rec.kind != kind_name(a.kind) || rec.source != a.source || rec.path != f.path {
            return Ok(Some(format!("the recorded {} {} is not what the plan asks for", rec.kind, rec.path)));
        }
        if a.sha256.as_ref().is_some_and(|s| s != &rec.sha256) {
            return Ok(Some(format!("the recorded {} does not have the pinned sha256", rec.kind)));
        }
        match node::hash_file(&t.addons, &Path::new(&st.version_dir).join(&a.file_name)) {
            Ok(Some((sha, _))) if sha == rec.sha256 => {}
            Ok(Some((sha, _))) => {
                return Ok(Some(format!(
                    "{} {} was edited (sha256 {sha}, expected {})",
                    rec.kind, rec.path, rec.sha256
                )));
            }
            Ok(None) => return Ok(Some(format!("{} {} was missing", rec.kind, rec.path))),
            Err(e) => return Ok(Some(format!("{} {} is unusable ({e:#})", rec.kind, rec.path))),
        }
    }
    Ok(None)
}

/// Removes obsolete drop-ins and version directories recorded in `st`, then records that
/// nothing is pending; also removes version directories no state refers to (a kill after
/// staging, before the state write) when every kata-addons drop-in found in the known
/// runtime configuration directories is one `st` records (so none can point into them).
fn gc(root: &Root, t: &Target, st: &mut State, known: &[PathBuf]) -> Result<()> {
    for p in &st.previous_drop_ins {
        if state::validate::remove_drop_in(root, p, false)? == state::validate::DropInRemoval::Removed {
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

/// Names of the directories in the install directory that have the shape of a version
/// directory (the state's grammar); staging directories and files are not among them.
fn version_dirs(addons: &Dir) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in addons.entries().context("listing the install directory")? {
        let entry = entry.context("listing the install directory")?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let is_dir = entry.file_type().with_context(|| format!("inspecting {name}"))?.is_dir();
        // `lost+found`: the install directory may be a filesystem of its own.
        if is_dir && name != "lost+found" && state::validate::check_version_dir("versionDir", &name).is_ok() {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Opens a node directory if it exists (never creates it).
fn open_dir_if_exists(root: &Root, node_dir: &str) -> Result<Option<Dir>> {
    match root.dir().open_dir(node::rel_path(node_dir)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if node::is_absent(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("opening {node_dir} (a symlink leading outside the root is refused)")),
    }
}

/// Root-relative directories that may hold a runtime configuration kata-addons wrote a
/// drop-in for: for every known candidate of every provider (the policy's own list, for
/// `kata_prefix`), every `--runtime-config` given and the plan's candidates, the directory
/// of the file as named and of the file it resolves to. A candidate that cannot be
/// resolved (a symlink loop) is skipped with a warning.
fn known_config_dirs(root: &Root, kata_prefix: &str, given: &[String], plan: &[String]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let candidates = kata_addons_facts::known_runtime_configs(kata_prefix);
    for c in candidates.iter().chain(given).chain(plan) {
        if !crate::policy::is_clean_abs_path(c) {
            continue;
        }
        let parent = c.rsplit_once('/').map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
        for p in [root.resolve(parent), root.resolve(c).map(|r| r.parent().map(Path::to_path_buf).unwrap_or_default())]
        {
            match p {
                Ok(rel) if !rel.as_os_str().is_empty() && !out.contains(&rel) => {
                    if root.dir().metadata(&rel).is_ok_and(|m| m.is_dir()) {
                        out.push(rel);
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(candidate = %c, "skipped while looking for kata-addons files: {e:#}"),
            }
        }
    }
    out
}

/// Node paths of the drop-ins carrying kata-addons' header in the `config.d` of `dirs`; one
/// that cannot be inspected is listed too (it may be ours), with a warning.
fn our_drop_ins(root: &Root, dirs: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for d in dirs {
        let p = node::node_path(&d.join(runtime::CONFIG_D).join(DROP_IN_NAME));
        let ours = match root.dir().symlink_metadata(node::rel_path(&p)) {
            Ok(m) if m.is_file() => state::validate::carries_header(root, &p),
            Ok(_) => Ok(false),
            Err(e) if node::is_absent(&e) => Ok(false),
            Err(e) => Err(anyhow::Error::new(e).context(format!("inspecting {p}"))),
        };
        match ours {
            Ok(false) => {}
            Ok(true) => out.push(p),
            Err(e) => {
                tracing::warn!(drop_in = %p, "cannot tell whether this is a kata-addons drop-in: {e:#}");
                out.push(p);
            }
        }
    }
    out
}

/// Removes what killed runs left behind (DESIGN §4 keeps them out of `config.d`, but they
/// still take space): staging directories and temporary state files in the install
/// directory, temporary drop-ins beside the runtime configurations of `dirs`. Only names
/// this program makes are touched, and only when their owner process is gone.
/// Returns the node paths removed.
fn sweep_leftovers(root: &Root, addons: Option<&Dir>, dirs: &[PathBuf]) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    if let Some(addons) = addons {
        let state_tmp = state_tmp_prefix();
        for entry in addons.entries().context("listing the install directory")? {
            let entry = entry.context("listing the install directory")?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
            let Some(suffix) = name.strip_prefix(STAGING_PREFIX).or_else(|| name.strip_prefix(state_tmp.as_str()))
            else {
                continue;
            };
            match owner_pid(suffix) {
                Some(pid) if owner_gone(pid) => {
                    remove_entry(addons, &name)?;
                    tracing::info!(step = "sweep", leftover = %name, pid, "removed what a killed run left in the install directory");
                    removed.push(format!("{}/{name}", INSTALL_DIR));
                }
                Some(pid) => {
                    tracing::warn!(leftover = %name, pid, "left alone: process {pid} is running")
                }
                None => tracing::warn!(leftover = %name, "left alone: not a name kata-addons makes"),
            }
        }
        if !removed.is_empty() {
            node::fsync_dir(addons)?;
        }
    }
    let legacy = format!(".{}{TMP_DROP_IN_SUFFIX}", DROP_IN_NAME);
    let prefix = format!("{legacy}-");
    for d in dirs {
        // Not our directory: what cannot be read here is warned about, never fatal.
        match sweep_config_dir(root, d, &legacy, &prefix, &mut removed) {
            Ok(()) => {}
            Err(e) => tracing::warn!(dir = %node::node_path(d), "not swept for leftovers: {e:#}"),
        }
    }
    Ok(removed)
}

/// Removes the temporary drop-ins of dead processes (and the legacy fixed name) in the
/// runtime configuration directory `d`, adding their node paths to `removed`.
fn sweep_config_dir(root: &Root, d: &Path, legacy: &str, prefix: &str, removed: &mut Vec<String>) -> Result<()> {
    let dir = match root.dir().open_dir(d) {
        Ok(dir) => dir,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", node::node_path(d))),
    };
    let mut here = false;
    for entry in dir.entries().with_context(|| format!("listing {}", node::node_path(d)))? {
        let entry = entry.with_context(|| format!("listing {}", node::node_path(d)))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let stale = if name == legacy {
            true
        } else if let Some(suffix) = name.strip_prefix(prefix) {
            owner_pid(suffix).is_some_and(owner_gone)
        } else {
            continue;
        };
        let path = node::node_path(&d.join(&name));
        if !stale || !entry.file_type().with_context(|| format!("inspecting {path}"))?.is_file() {
            tracing::warn!(leftover = %path, "left alone: owned by a running process, or not a regular file");
            continue;
        }
        dir.remove_file(&name).with_context(|| format!("removing {path}"))?;
        tracing::info!(step = "sweep", leftover = %path, "removed a temporary drop-in a killed run left");
        removed.push(path);
        here = true;
    }
    if here {
        node::fsync_dir(&dir)?;
    }
    Ok(())
}

/// What `uninstall` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uninstalled {
    /// The state record that was removed; `None` when none was recorded (lost or never written).
    pub state: Option<Box<State>>,
    /// Node paths of the drop-ins removed.
    pub drop_ins: Vec<String>,
    /// Version directories removed (names inside the install directory).
    pub dirs: Vec<String>,
    /// Node paths of what killed runs left behind, removed.
    pub leftovers: Vec<String>,
    /// Node paths found and left alone: not written by kata-addons, or owned by a running process.
    pub left_alone: Vec<String>,
}

impl Uninstalled {
    /// Nothing was installed and nothing was found to remove.
    pub fn nothing(&self) -> bool {
        self.state.is_none() && self.drop_ins.is_empty() && self.dirs.is_empty() && self.leftovers.is_empty()
    }
}

/// Opens the install directory if it exists (never creates it).
fn open_addons(root: &Root) -> Result<Option<Dir>> {
    open_dir_if_exists(root, INSTALL_DIR)
}

/// `--kata-prefix` and `--runtime-config` of a command that has no plan (uninstall): the
/// same shapes the policy accepts for install, else invalid configuration (exit 2).
fn check_layout_args(layout: &LayoutArgs) -> Result<()> {
    let invalid = |m: String| anyhow::Error::new(crate::configmap::ConfigError(m));
    if !crate::policy::is_clean_abs_path(&layout.kata_prefix) {
        return Err(invalid(format!(
            "--kata-prefix {:?} is not a clean absolute path (no `.`, `..`, `//` or trailing `/`)",
            layout.kata_prefix
        )));
    }
    for rc in &layout.runtime_configs {
        let name = rc.rsplit('/').next().unwrap_or("");
        if !(crate::policy::is_clean_abs_path(rc) && name.starts_with("configuration") && name.ends_with(".toml")) {
            return Err(invalid(format!(
                "--runtime-config {rc:?} is not the clean absolute node path of a Kata configuration*.toml"
            )));
        }
    }
    Ok(())
}

/// Puts the node back as it was before kata-addons: removes what the state records
/// (drop-ins first, so the runtime stops using the files, then the version directories,
/// then the state) and, whether or not a state exists, every drop-in carrying kata-addons'
/// header at its fixed name in the `config.d` of every known runtime configuration (all
/// providers and layouts under `--kata-prefix`, plus each `--runtime-config`), every
/// version directory and what killed runs left in the install directory. A drop-in without
/// the header is never removed (it is reported). A damaged state is refused (exit 1).
pub fn uninstall(node_args: &NodeArgs, layout_args: &LayoutArgs) -> Result<Uninstalled> {
    check_layout_args(layout_args)?;
    let root = Root::open(&node_args.root)?;
    let _lock = lock::acquire(&root, Duration::from_secs(node_args.lock_timeout))?;
    let addons = open_addons(&root)?;
    let st = match &addons {
        Some(a) => state::read(a)?,
        None => None,
    };
    let known = known_config_dirs(&root, &layout_args.kata_prefix, &layout_args.runtime_configs, &[]);
    let mut out = Uninstalled { leftovers: sweep_leftovers(&root, addons.as_ref(), &known)?, ..Default::default() };
    if let Some(st) = &st {
        for p in st.drop_ins.iter().map(|d| &d.path).chain(&st.previous_drop_ins) {
            if state::validate::remove_drop_in(&root, p, false)? == state::validate::DropInRemoval::Removed {
                tracing::info!(drop_in = %p, "removed drop-in");
                out.drop_ins.push(p.clone());
            }
        }
    }
    // Drop-ins no state records: a lost state, or one older than the drop-in.
    for d in &known {
        let p = node::node_path(&d.join(runtime::CONFIG_D).join(DROP_IN_NAME));
        if out.drop_ins.contains(&p) {
            continue;
        }
        match state::validate::remove_drop_in(&root, &p, true) {
            Ok(state::validate::DropInRemoval::Removed) => {
                tracing::info!(drop_in = %p, "removed a kata-addons drop-in no state recorded");
                out.drop_ins.push(p);
            }
            Ok(state::validate::DropInRemoval::NotOurs) => out.left_alone.push(p),
            Ok(state::validate::DropInRemoval::Absent) => {}
            Err(e) => {
                tracing::warn!(drop_in = %p, "left alone: cannot inspect it: {e:#}");
                out.left_alone.push(p);
            }
        }
    }
    let Some(addons) = addons else { return Ok(out) };
    if let Some(st) = &st {
        for d in std::iter::once(&st.version_dir).chain(&st.previous_dirs) {
            if addons.symlink_metadata(d).is_ok() {
                remove_entry(&addons, d)?;
                tracing::info!(dir = %d, "removed version directory");
                out.dirs.push(d.clone());
            }
        }
    }
    for d in version_dirs(&addons)? {
        remove_entry(&addons, &d)?;
        tracing::info!(dir = %d, "removed a version directory no state recorded");
        out.dirs.push(d);
    }
    if st.is_some() {
        addons.remove_file(state::STATE_FILE).context("removing the state file")?;
    }
    node::fsync_dir(&addons)?;
    for entry in addons.entries().context("listing the install directory")? {
        let entry = entry.context("listing the install directory")?;
        let p = format!("{INSTALL_DIR}/{}", entry.file_name().to_string_lossy());
        tracing::warn!(path = %p, "left alone: not something kata-addons writes");
        out.left_alone.push(p);
    }
    drop(addons);
    // The install directory is ours; remove it when it is empty (else it holds what was reported).
    let _ = root.dir().remove_dir(node::rel_path(INSTALL_DIR));
    out.state = st.map(Box::new);
    Ok(out)
}

/// Result of `status`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The recorded state, if any.
    pub state: Option<State>,
    /// One line per mismatch between the node and the state.
    pub problems: Vec<String>,
    /// The boot paths Kata will use, per recorded runtime configuration, after merging
    /// the main file and every `config.d` fragment in order.
    pub effective: Vec<Effective>,
}

/// The effective boot paths of one runtime configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Effective {
    /// Node path of the resolved runtime configuration.
    pub runtime_config: String,
    /// The hypervisor table our drop-in sets keys in (e.g. `hypervisor.qemu`).
    pub table: String,
    /// Effective `kernel`, with the fragment that set it.
    pub kernel: Option<runtime::Setting>,
    /// Effective `initrd`.
    pub initrd: Option<runtime::Setting>,
    /// Effective `image`.
    pub image: Option<runtime::Setting>,
}

/// Merges every fragment of one recorded runtime configuration; reports fragments Kata
/// cannot load and every key of our drop-in that a later fragment overrides.
fn check_effective(
    root: &Root,
    d: &DropInRecord,
    installed: &[String],
    problems: &mut Vec<String>,
) -> Result<Option<Effective>> {
    let rc_rel = node::rel_path(&d.runtime_config);
    match root.dir().metadata(&rc_rel) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            problems.push(format!("{}: not a regular file", d.runtime_config));
            return Ok(None);
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            problems.push(format!(
                "{}: the runtime configuration is gone (Kata uninstalled?); its drop-in is restored when it returns",
                d.runtime_config
            ));
            return Ok(None);
        }
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", d.runtime_config)),
    }
    let fragments = runtime::fragments(root, &rc_rel)?;
    for f in &fragments {
        if let Err(why) = &f.table {
            problems.push(format!("{}: {why}", f.path));
        }
    }
    let ours = fragments.iter().find(|f| f.path == d.path).and_then(|f| f.table.as_ref().ok());
    let mut table = vec!["hypervisor".to_string(), "qemu".to_string()];
    if let Some(ours) = ours {
        let leaves = runtime::leaves(ours);
        if let Some((k, _)) = leaves.first() {
            table = k[..k.len().saturating_sub(1)].to_vec();
        }
        for (key, _) in &leaves {
            let key_ref: Vec<&str> = key.iter().map(String::as_str).collect();
            if let Some(eff) = runtime::effective(&fragments, &key_ref)
                && eff.from != d.path
            {
                problems.push(format!(
                    "{}: {} is {:?}, set by {} which Kata reads after {}",
                    d.runtime_config,
                    key.join("."),
                    eff.value,
                    eff.from,
                    d.path
                ));
            }
        }
    }
    let table_ref: Vec<&str> = table.iter().map(String::as_str).collect();
    problems.extend(crate::runtime_facts::stale_extensions(&fragments, &d.path, &table_ref, installed));
    let get = |k: &str| {
        let mut path: Vec<&str> = table.iter().map(String::as_str).collect();
        path.push(k);
        runtime::effective(&fragments, &path)
    };
    Ok(Some(Effective {
        runtime_config: d.runtime_config.clone(),
        table: table.join("."),
        kernel: get("kernel"),
        initrd: get("initrd"),
        image: get("image"),
    }))
}

impl Status {
    /// Exit code per DESIGN §5: 0 healthy, 3 nothing installed, 4 drifted.
    pub fn exit_code(&self) -> u8 {
        match (&self.state, self.problems.is_empty()) {
            (None, _) => 3,
            (Some(_), true) => 0,
            (Some(_), false) => 4,
        }
    }
}

/// Verifies every recorded file and drop-in by sha256, and that no later `config.d`
/// fragment overrides what a drop-in sets.
pub fn status(node_args: &NodeArgs) -> Result<Status> {
    let root = Root::open(&node_args.root)?;
    let nothing = || Status { state: None, problems: vec![], effective: vec![] };
    let Some(addons) = open_addons(&root)? else { return Ok(nothing()) };
    let Some(st) = state::read(&addons)? else { return Ok(nothing()) };
    let mut problems = Vec::new();
    let mut check = |path: &str, expected: &str| match node::hash_file(root.dir(), &node::rel_path(path)) {
        Ok(Some((sha, _))) if sha == expected => {}
        Ok(Some((sha, _))) => problems.push(format!("{path}: sha256 {sha}, expected {expected}")),
        Ok(None) => problems.push(format!("{path}: missing")),
        Err(e) => problems.push(format!("{path}: {e:#}")),
    };
    for f in &st.files {
        check(&f.path, &f.sha256);
    }
    for d in &st.drop_ins {
        check(&d.path, &d.sha256);
    }
    let mut effective = Vec::new();
    let installed: Vec<String> = st.files.iter().map(|f| f.path.clone()).collect();
    for d in &st.drop_ins {
        if let Some(e) = check_effective(&root, d, &installed, &mut problems)? {
            effective.push(e);
        }
    }
    Ok(Status { state: Some(st), problems, effective })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pids_are_parsed_strictly() {
        assert_eq!(owner_pid("1234"), Some(1234));
        assert_eq!(owner_pid("2147483647"), Some(i32::MAX));
        for bad in ["", "0", "01", "-1", "+1", "12a", "1 ", " 1", "2147483648", "99999999999", "1.0", "\u{0661}"] {
            assert_eq!(owner_pid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn own_and_dead_owners_are_gone_live_ones_not() {
        assert!(owner_gone(i32::try_from(std::process::id()).expect("pid")));
        let mut c = std::process::Command::new("true").spawn().expect("spawn");
        let pid = i32::try_from(c.id()).expect("pid");
        c.wait().expect("wait");
        assert!(owner_gone(pid));
        let mut live = std::process::Command::new("sleep").arg("30").spawn().expect("spawn");
        assert!(!owner_gone(i32::try_from(live.id()).expect("pid")));
        let _ = live.kill();
        let _ = live.wait();
    }

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
