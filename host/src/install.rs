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

use crate::cli::{LayoutArgs, NodeArgs};
use crate::fetch::{self, Wanted};
use crate::layout;
use crate::lock;
use crate::node::{self, Root};
use crate::policy::{DropIn, ImageSource, Plan, Policy};
use crate::preview::{kind_name, provider_name};
use crate::runtime;
use crate::source::{ImageRef, RegistryOptions};
use crate::state::{self, DropInRecord, FileRecord, State};

/// Prefix of staging directories inside the install directory.
const STAGING_PREFIX: &str = ".staging-";

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
    /// Drop-in file name inside each `config.d`.
    drop_in_name: String,
}

impl Target {
    /// Resolved runtime configuration node paths, as `render` takes them.
    fn runtime_configs(&self) -> Vec<String> {
        self.configs.iter().map(|c| c.runtime_config.clone()).collect()
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
    if !crate::policy::is_plain_file_name(&plan.drop_in_name) {
        bail!("drop-in name {} is not a plain file name", plan.drop_in_name);
    }
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
            drop_in_node_path: node::node_path(&config_d_rel.join(&plan.drop_in_name)),
            runtime_config: rc.resolved,
            config_dir,
            config_d,
        });
    }
    let addons = root.create_dir_all(&node::rel_path(&plan.install_dir))?;
    Ok(Target { addons, configs, drop_in_name: plan.drop_in_name.clone() })
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
/// there). On error, removes what it staged.
fn stage_drop_ins(t: &Target, drop_ins: &[(usize, &DropIn)]) -> Result<String> {
    let tmp_name = format!(".{}.kata-addons-tmp", t.drop_in_name);
    for (n, (i, d)) in drop_ins.iter().enumerate() {
        if let Err(e) = node::write_synced(&t.configs[*i].config_dir, &tmp_name, d.contents.as_bytes()) {
            for (j, _) in &drop_ins[..=n] {
                let _ = t.configs[*j].config_dir.remove_file(&tmp_name);
            }
            return Err(e);
        }
    }
    Ok(tmp_name)
}

/// Renames staged drop-ins into their `config.d` (the commit point of each).
fn commit_drop_ins(t: &Target, tmp_name: &str, drop_ins: &[(usize, &DropIn)]) -> Result<()> {
    for (i, d) in drop_ins {
        let c = &t.configs[*i];
        c.config_dir
            .rename(tmp_name, &c.config_d, &t.drop_in_name)
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
    let old = state::read(&t.addons)?;
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
            None => return repair_drop_ins(policy, plan, &root, &t, old),
            Some(why) => {
                tracing::warn!(step = "repair", version = %old.version, "drift: {why}; pulling {} again", old.manifest_digest)
            }
        }
    }

    node::ensure_writable(&t.addons, &plan.install_dir)?;
    for c in &t.configs {
        node::ensure_writable(&c.config_d, &c.drop_in_node_path)?;
    }

    // 1. Stage the files in a fresh directory inside the install directory.
    let staging = format!("{STAGING_PREFIX}{}", std::process::id());
    remove_entry(&t.addons, &staging)?;
    t.addons.create_dir(&staging).with_context(|| format!("creating staging directory {staging}"))?;
    let staged = stage(registry, &conns, &image, plan, &t, &staging).await;
    if let Some(r) = conns.trust() {
        trust = Some(r);
    }
    let (report_digest, files) = match staged {
        Ok(v) => v,
        Err(e) => {
            let _ = t.addons.remove_dir_all(&staging);
            return Err(e);
        }
    };
    let dir_name = pick_dir_name(&t.addons, plan, &report_digest, old.as_ref())?;
    t.addons.rename(&staging, &t.addons, &dir_name).with_context(|| format!("renaming {staging} to {dir_name}"))?;
    node::fsync_dir(&t.addons)?;
    tracing::info!(step = "stage", dir = %format!("{}/{dir_name}", plan.install_dir), "files staged");

    // 2. Render the drop-ins from the installed node paths and stage them outside config.d.
    let drop_ins = match render_for(policy, plan, &dir_name, &t) {
        Ok(d) => d,
        Err(e) => {
            let _ = t.addons.remove_dir_all(&dir_name);
            return Err(e);
        }
    };
    let all: Vec<(usize, &DropIn)> = drop_ins.iter().enumerate().collect();
    let tmp_name = match stage_drop_ins(&t, &all) {
        Ok(n) => n,
        Err(e) => {
            let _ = t.addons.remove_dir_all(&dir_name);
            return Err(e);
        }
    };

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
            })
            .collect(),
        drop_ins: new_drop_ins,
        previous_dirs,
        previous_drop_ins,
        trust,
    };
    if let Err(e) = state::write(&t.addons, &st) {
        for c in &t.configs {
            let _ = c.config_dir.remove_file(&tmp_name);
        }
        let _ = t.addons.remove_dir_all(&dir_name);
        return Err(e);
    }

    // 4. Commit: rename each drop-in into its config.d.
    commit_drop_ins(&t, &tmp_name, &all)?;

    // 5. Remove what the commit made obsolete.
    gc(&root, &t, &mut st)?;
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
fn repair_drop_ins(policy: &Policy, plan: &Plan, root: &Root, t: &Target, old: &State) -> Result<Outcome> {
    let drop_ins = render_for(policy, plan, &old.version_dir, t)?;
    let new_records = records(&drop_ins);
    let mut drifted: Vec<(usize, &DropIn)> = Vec::new();
    let mut what = Vec::new();
    for (i, (d, rec)) in drop_ins.iter().zip(&new_records).enumerate() {
        let on_disk = node::hash_file(&t.configs[i].config_d, Path::new(&t.drop_in_name));
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
        if !old.previous_dirs.is_empty() || !old.previous_drop_ins.is_empty() {
            gc(root, t, &mut st)?;
        }
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
    node::ensure_writable(&t.addons, &plan.install_dir)?;
    for (i, _) in &drifted {
        node::ensure_writable(&t.configs[*i].config_d, &t.configs[*i].drop_in_node_path)?;
    }
    let tmp_name = stage_drop_ins(t, &drifted)?;
    let mut st = old.clone();
    st.drop_ins = new_records;
    st.previous_drop_ins = obsolete;
    if let Err(e) = state::write(&t.addons, &st) {
        for (i, _) in &drifted {
            let _ = t.configs[*i].config_dir.remove_file(&tmp_name);
        }
        return Err(e);
    }
    commit_drop_ins(t, &tmp_name, &drifted)?;
    gc(root, t, &mut st)?;
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
    let wanted: Vec<Wanted> =
        plan.artifacts.iter().map(|a| Wanted { path: a.source.clone(), dest_name: a.file_name.clone() }).collect();
    let started = Instant::now();
    let report = fetch::fetch_files_with(registry, conns, image, &wanted, &dir)
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

/// Removes obsolete drop-ins and version directories recorded in `st` and leftover
/// staging directories, then records that nothing is pending.
fn gc(root: &Root, t: &Target, st: &mut State) -> Result<()> {
    for p in &st.previous_drop_ins {
        if state::validate::remove_drop_in(root, p, false)? == state::validate::DropInRemoval::Removed {
            tracing::info!(step = "gc", drop_in = %p, "removed obsolete drop-in");
        }
    }
    for d in &st.previous_dirs {
        remove_entry(&t.addons, d)?;
        tracing::info!(step = "gc", dir = %d, "removed previous version");
    }
    for entry in t.addons.entries().context("listing the install directory")? {
        let entry = entry.context("listing the install directory")?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().filter(|n| n.starts_with(STAGING_PREFIX)) {
            remove_entry(&t.addons, n)?;
        }
    }
    node::fsync_dir(&t.addons)?;
    if !st.previous_dirs.is_empty() || !st.previous_drop_ins.is_empty() {
        st.previous_dirs.clear();
        st.previous_drop_ins.clear();
        state::write(&t.addons, st)?;
    }
    Ok(())
}

/// What `uninstall` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// Nothing was installed.
    Nothing,
    /// This state was removed.
    Removed(Box<State>),
}

/// The install directory used when no plan is at hand (uninstall, status).
pub const DEFAULT_INSTALL_DIR: &str = "/etc/kata-containers/addons";

/// Opens the install directory if it exists (never creates it).
fn open_addons(root: &Root) -> Result<Option<Dir>> {
    match root.dir().open_dir(node::rel_path(DEFAULT_INSTALL_DIR)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e)
            .with_context(|| format!("opening {DEFAULT_INSTALL_DIR} (a symlink leading outside the root is refused)")),
    }
}

/// Removes exactly what the state records: drop-in(s) first (so the runtime stops using
/// the files), then the version directories, then the state.
pub fn uninstall(node_args: &NodeArgs) -> Result<Removed> {
    let root = Root::open(&node_args.root)?;
    let _lock = lock::acquire(&root, Duration::from_secs(node_args.lock_timeout))?;
    let Some(addons) = open_addons(&root)? else { return Ok(Removed::Nothing) };
    let Some(st) = state::read(&addons)? else { return Ok(Removed::Nothing) };
    for p in st.drop_ins.iter().map(|d| &d.path).chain(&st.previous_drop_ins) {
        if state::validate::remove_drop_in(&root, p, false)? == state::validate::DropInRemoval::Removed {
            tracing::info!(drop_in = %p, "removed drop-in");
        }
    }
    for d in std::iter::once(&st.version_dir).chain(&st.previous_dirs) {
        remove_entry(&addons, d)?;
        tracing::info!(dir = %d, "removed version directory");
    }
    addons.remove_file(state::STATE_FILE).context("removing the state file")?;
    node::fsync_dir(&addons)?;
    drop(addons);
    // The install directory is ours; remove it when it is empty.
    let _ = root.dir().remove_dir(node::rel_path(DEFAULT_INSTALL_DIR));
    Ok(Removed::Removed(Box::new(st)))
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
fn check_effective(root: &Root, d: &DropInRecord, problems: &mut Vec<String>) -> Result<Option<Effective>> {
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
    for d in &st.drop_ins {
        if let Some(e) = check_effective(&root, d, &mut problems)? {
            effective.push(e);
        }
    }
    Ok(Status { state: Some(st), problems, effective })
}
