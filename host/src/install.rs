//! `install`, `uninstall` and `status`: the node lifecycle with the atomic switch of
//! DESIGN.md §4. Order: stage files in a new version directory -> render the drop-in ->
//! write state -> rename the drop-in into `config.d` (the commit point) -> remove the
//! previous version. A crash at any instant leaves the old or the new configuration.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;
use sha2::{Digest, Sha256};

use crate::cli::NodeArgs;
use crate::fetch::{self, Wanted};
use crate::layout;
use crate::lock;
use crate::node::{self, Root};
use crate::policy::{ImageSource, Plan, Policy};
use crate::preview::{kind_name, provider_name};
use crate::source::{ImageRef, RegistryOptions};
use crate::state::{self, DropInRecord, FileRecord, State};

/// Prefix of staging directories inside the install directory.
const STAGING_PREFIX: &str = ".staging-";

/// What `install` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Everything already matched: nothing was written.
    UpToDate(State),
    /// A new version was committed.
    Installed(State),
}

/// The runtime-side places of a plan on this node.
struct Target {
    /// The install directory (`/etc/kata-containers/addons`).
    addons: Dir,
    /// The directory holding the resolved `configuration.toml`.
    config_dir: Dir,
    /// `config.d` beside it.
    config_d: Dir,
    /// Drop-in file name.
    drop_in_name: String,
    /// Node path of the drop-in (resolved location).
    drop_in_node_path: String,
    /// Node path of the resolved runtime configuration file.
    runtime_config_node_path: String,
}

/// Resolves where a plan's files and drop-in go, creating directories as needed.
fn target(root: &Root, plan: &Plan) -> Result<Target> {
    let provider = provider_name(plan.provider);
    let config_rel = root
        .resolve(&plan.runtime_config)
        .with_context(|| format!("resolving the {provider} runtime config {}", plan.runtime_config))?;
    match root.dir().metadata(&config_rel) {
        Ok(m) if m.is_file() => {}
        Ok(_) => bail!("the {provider} runtime config {} is not a regular file", plan.runtime_config),
        Err(e) if e.kind() == ErrorKind::NotFound => bail!(
            "the Kata runtime for provider `{provider}` is not installed on this node: {} (resolved to {}) does not exist",
            plan.runtime_config,
            node::node_path(&config_rel)
        ),
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", node::node_path(&config_rel))),
    }
    let config_dir_rel = config_rel.parent().map(Path::to_path_buf).unwrap_or_default();
    let config_dir = root
        .dir()
        .open_dir(if config_dir_rel.as_os_str().is_empty() { Path::new(".") } else { &config_dir_rel })
        .with_context(|| format!("opening {}", node::node_path(&config_dir_rel)))?;
    let config_d_rel = config_dir_rel.join("config.d");
    let config_d = root.create_dir_all(&config_d_rel)?;
    let drop_in_name = plan
        .drop_in_path
        .rsplit('/')
        .next()
        .filter(|n| crate::policy::is_plain_file_name(n))
        .with_context(|| format!("drop-in path {} has no file name", plan.drop_in_path))?
        .to_string();
    let addons = root.create_dir_all(&node::rel_path(&plan.install_dir))?;
    Ok(Target {
        addons,
        config_dir,
        config_d,
        drop_in_node_path: node::node_path(&config_d_rel.join(&drop_in_name)),
        drop_in_name,
        runtime_config_node_path: node::node_path(&config_rel),
    })
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

/// Installs (or confirms) the addon described by `plan` on the node.
pub async fn install(
    policy: &Policy,
    plan: &Plan,
    registry: &RegistryOptions,
    node_args: &NodeArgs,
) -> Result<Outcome> {
    let started = Instant::now();
    let root = Root::open(&node_args.root)?;
    // Image trust first (issue 9): nothing is written on the node for an image the policy
    // refuses. A policy that needs signatures is checked on the resolved digest now.
    let image = image_ref(plan)?;
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
    let t = target(&root, plan)?;
    tracing::info!(
        step = "resolve",
        provider = provider_name(plan.provider),
        drop_in = %t.drop_in_node_path,
        image = %plan.image,
        "resolved runtime config"
    );
    let old = state::read(&t.addons)?;

    // One connection per endpoint for resolving and fetching: authenticate once.
    // A digest-pinned reference that is already installed needs no registry round trip:
    // the content is immutable and the files are verified below (offline restarts work).
    let digest = match (layout::pinned_digest(plan), &old) {
        (Some(pinned), Some(o)) if o.manifest_digest == pinned => pinned.to_string(),
        _ => fetch::resolve_digest_with(registry, &conns, &image)
            .await
            .with_context(|| format!("resolving {}", plan.image))?,
    };
    if let Some(old) = &old
        && up_to_date(policy, plan, &digest, old, &t)?
    {
        if !old.previous_dirs.is_empty() || !old.previous_drop_ins.is_empty() {
            let mut st = old.clone();
            gc(&root, &t, &mut st)?;
        }
        tracing::info!(version = %old.version, digest = %digest, "up to date; nothing changed");
        return Ok(Outcome::UpToDate(old.clone()));
    }

    node::ensure_writable(&t.addons, &plan.install_dir)?;
    node::ensure_writable(&t.config_d, &t.drop_in_node_path)?;

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

    // 2. Render the drop-in from the installed node paths and stage it outside config.d.
    let installed = layout::installed_files(plan, &dir_name);
    let text = match policy.render(plan, &installed) {
        Ok(t) => t,
        Err(e) => {
            let _ = t.addons.remove_dir_all(&dir_name);
            return Err(e.into());
        }
    };
    // Staged beside config.d, never inside it: Kata parses every entry there.
    let tmp_name = format!(".{}.kata-addons-tmp", t.drop_in_name);
    if let Err(e) = node::write_synced(&t.config_dir, &tmp_name, text.as_bytes()) {
        let _ = t.addons.remove_dir_all(&dir_name);
        return Err(e);
    }

    // 3. Write the state, naming what the commit will make obsolete.
    let mut previous_dirs: Vec<String> = Vec::new();
    let mut previous_drop_ins: Vec<String> = Vec::new();
    if let Some(old) = &old {
        previous_dirs.extend(old.previous_dirs.iter().cloned());
        previous_dirs.push(old.version_dir.clone());
        previous_drop_ins.extend(old.previous_drop_ins.iter().cloned());
        for d in &old.drop_ins {
            if d.path != t.drop_in_node_path {
                previous_drop_ins.push(d.path.clone());
            }
        }
    }
    previous_dirs.retain(|d| d != &dir_name);
    previous_dirs.dedup();
    previous_drop_ins.retain(|p| p != &t.drop_in_node_path);
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
        drop_ins: vec![DropInRecord {
            runtime_config: t.runtime_config_node_path.clone(),
            path: t.drop_in_node_path.clone(),
            sha256: sha256_hex(text.as_bytes()),
        }],
        previous_dirs,
        previous_drop_ins,
        trust,
    };
    if let Err(e) = state::write(&t.addons, &st) {
        let _ = t.config_dir.remove_file(&tmp_name);
        let _ = t.addons.remove_dir_all(&dir_name);
        return Err(e);
    }

    // 4. Commit: rename the drop-in into config.d.
    t.config_dir
        .rename(&tmp_name, &t.config_d, &t.drop_in_name)
        .with_context(|| format!("committing the drop-in {}", t.drop_in_node_path))?;
    node::fsync_dir(&t.config_d)?;
    node::fsync_dir(&t.config_dir)?;
    tracing::info!(step = "commit", drop_in = %t.drop_in_node_path, sha256 = %sha256_hex(text.as_bytes()), "drop-in committed");

    // 5. Remove what the commit made obsolete.
    gc(&root, &t, &mut st)?;
    tracing::info!(
        version = %st.version,
        digest = %st.manifest_digest,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "installed"
    );
    Ok(Outcome::Installed(st))
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

/// True when the node already has exactly what `plan` asks for: same image digest,
/// version, provider, artifacts, intact files and the same drop-in text.
fn up_to_date(policy: &Policy, plan: &Plan, digest: &str, st: &State, t: &Target) -> Result<bool> {
    if st.manifest_digest != digest
        || st.image != plan.image
        || st.version != plan.version
        || st.provider != provider_name(plan.provider)
        || st.drop_ins.len() != 1
        || st.drop_ins.iter().any(|d| d.path != t.drop_in_node_path)
        || st.files.len() != plan.artifacts.len()
    {
        return Ok(false);
    }
    let installed = layout::installed_files(plan, &st.version_dir);
    for ((a, f), rec) in plan.artifacts.iter().zip(&installed).zip(&st.files) {
        if rec.kind != kind_name(a.kind) || rec.source != a.source || rec.path != f.path {
            return Ok(false);
        }
        if a.sha256.as_ref().is_some_and(|s| s != &rec.sha256) {
            return Ok(false);
        }
        match node::hash_file(&t.addons, &Path::new(&st.version_dir).join(&a.file_name)) {
            Ok(Some((sha, _))) if sha == rec.sha256 => {}
            _ => return Ok(false),
        }
    }
    let Some(recorded) = st.drop_ins.first() else { return Ok(false) };
    match node::hash_file(&t.config_d, Path::new(&t.drop_in_name)) {
        Ok(Some((sha, _))) if sha == recorded.sha256 => {}
        _ => return Ok(false),
    }
    let text = policy.render(plan, &installed)?;
    Ok(sha256_hex(text.as_bytes()) == recorded.sha256)
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

/// Verifies every recorded file and the drop-in by sha256.
pub fn status(node_args: &NodeArgs) -> Result<Status> {
    let root = Root::open(&node_args.root)?;
    let Some(addons) = open_addons(&root)? else { return Ok(Status { state: None, problems: vec![] }) };
    let Some(st) = state::read(&addons)? else { return Ok(Status { state: None, problems: vec![] }) };
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
    Ok(Status { state: Some(st), problems })
}
