//! Reference values at install and on demand: the targets of an install about to be
//! committed (the rendered drop-ins merged in as Kata will merge them) or of what the state
//! records, the refusal of an IBM SE kernel without a valid header for a confidential
//! guest, and the files written into the version directory (`docs/attestation.md`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;

use super::report::{Published, TargetValues};
use super::{Overrides, Target, hkd, se};
use crate::hash::sha256_hex;
use crate::kata_config::{self, Fragment};
use crate::node::{self, Root};
use crate::policy::Provider;
use crate::state::{DocumentRecord, FileRecord, PublishedRecord, State};

/// The reference values, beside the installed files.
pub(crate) const REFERENCE_VALUES_FILE: &str = "reference-values.json";
/// The IBM SE image header (`pvextract-hdr`'s output), which the KBS needs to create
/// attestation requests.
pub(crate) const SE_HEADER_FILE: &str = "se-header.bin";

/// One runtime configuration an install is about to commit a drop-in for.
pub(crate) struct Pending<'a> {
    /// Node path of the resolved runtime configuration.
    pub(crate) runtime_config: &'a str,
    /// Its root-relative path.
    pub(crate) rel: &'a Path,
    /// The RuntimeClass handler, if any.
    pub(crate) handler: Option<String>,
    /// Node path of the drop-in.
    pub(crate) drop_in: &'a str,
    /// The rendered drop-in.
    pub(crate) contents: &'a str,
}

/// The fragments Kata will read once the drop-in of `p` is committed: the node's, with
/// kata-addons' replaced by the rendered one, in Kata's order (main file, then `config.d`
/// in byte order of the name).
fn fragments_with(root: &Root, p: &Pending<'_>) -> Result<Vec<Fragment>> {
    let name = p.drop_in.rsplit('/').next().unwrap_or_default();
    let mut all = kata_config::fragments_without(root, p.rel, name)?;
    let ours = Fragment {
        path: p.drop_in.to_string(),
        table: toml::from_str::<toml::Table>(p.contents).map_err(|e| e.message().to_string()),
    };
    let at = all
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, f)| f.path.rsplit('/').next().unwrap_or_default().as_bytes() > name.as_bytes())
        .map(|(i, _)| i)
        .unwrap_or(all.len());
    all.insert(at.max(1).min(all.len()), ours);
    Ok(all)
}

/// The targets of an install about to be committed, with the host key documents `keys`.
pub(crate) fn pending_targets<'r>(
    root: &'r Root,
    provider: Provider,
    pending: &[Pending<'_>],
    files: &[FileRecord],
    keys: &[(String, hkd::HostKey)],
) -> Result<Vec<Target<'r>>> {
    pending
        .iter()
        .map(|p| {
            let mut t = Target::new(
                root,
                provider,
                p.runtime_config,
                p.handler.clone(),
                fragments_with(root, p)?,
                files.to_vec(),
                Overrides::default(),
            );
            t.host_keys = keys.to_vec();
            Ok(t)
        })
        .collect()
}

/// The targets of what the state records, narrowed to the RuntimeClass handlers `only`
/// (every recorded target when empty; a handler the state does not record is an error).
pub(crate) fn recorded_targets<'r>(
    root: &'r Root,
    st: &State,
    only: &[String],
    overrides: &Overrides,
    host_keys: &[(String, hkd::HostKey)],
) -> Result<Vec<Target<'r>>> {
    for h in only {
        if !st.drop_ins.iter().any(|d| d.handler.as_deref() == Some(h.as_str())) {
            let recorded: Vec<&str> = st.drop_ins.iter().filter_map(|d| d.handler.as_deref()).collect();
            bail!(
                "--runtime-class {h}: the addon is not installed for that RuntimeClass handler (installed for: {})",
                if recorded.is_empty() {
                    "the provider's standard configurations".to_string()
                } else {
                    recorded.join(", ")
                }
            );
        }
    }
    let mut out = Vec::new();
    for d in &st.drop_ins {
        if !only.is_empty() && !d.handler.as_ref().is_some_and(|h| only.contains(h)) {
            continue;
        }
        let fragments = kata_config::fragments(root, &node::rel_path(&d.runtime_config))?;
        let mut t = Target::new(
            root,
            st.provider,
            &d.runtime_config,
            d.handler.clone(),
            fragments,
            st.files.clone(),
            overrides.clone(),
        );
        t.host_keys = host_keys.to_vec();
        out.push(t);
    }
    Ok(out)
}

/// Whether a target's effective `confidential_guest` is `true`.
fn confidential(t: &Target<'_>) -> bool {
    t.confidential_guest.as_ref().is_some_and(|s| s.value == "true")
}

/// Whether a plain kernel for a confidential IBM SE target refuses the install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlainSeKernel {
    /// A new version: refused before the commit point.
    Refuse,
    /// A version installed before kata-addons published values: it is already in effect, so
    /// its values are published (the `se.*` ones as not computed) and the kernel is warned about.
    Warn,
}

/// Before the commit point: refuses an IBM SE install whose kernel has no valid SE header
/// for a confidential target (a plain kernel does not start a protected guest; `plain`),
/// computes every target's values, and writes `reference-values.json` (and `se-header.bin`)
/// into the version directory `dir` (node path `dir_path`). Returns what the state records.
pub(crate) fn at_install(
    targets: &[Target<'_>],
    dir: &Dir,
    dir_path: &str,
    plain: PlainSeKernel,
) -> Result<Vec<PublishedRecord>> {
    let mut header: Option<se::Header> = None;
    for t in targets.iter().filter(|t| t.provider == Provider::Se) {
        let Some(kernel) = &t.kernel else { continue };
        let found = t.open(&kernel.value).and_then(|(f, _)| se::find(&f, &kernel.value));
        match found {
            Ok(h) => {
                if kernel.value.starts_with(&format!("{dir_path}/")) && header.is_none() {
                    header = Some(h);
                }
            }
            Err(e) if confidential(t) && plain == PlainSeKernel::Warn => tracing::warn!(
                step = "attest",
                runtime_config = %t.runtime_config,
                "the installed kernel of a confidential IBM Secure Execution guest is not an SE image: {e:#}"
            ),
            Err(e) if confidential(t) => bail!(
                "refusing the IBM Secure Execution install for {}: its effective confidential_guest = true (set by \
                 {}), but {e:#}; nothing was installed",
                t.runtime_config,
                t.confidential_guest.as_ref().map(|s| s.from.as_str()).unwrap_or("?")
            ),
            Err(_) => {}
        }
    }
    let published = Published { targets: targets.iter().map(TargetValues::of).collect() };
    let mut records = Vec::new();
    if let Some(h) = &header {
        records.push(write(dir, dir_path, SE_HEADER_FILE, &h.bytes, None)?);
    }
    let json = published.json()?;
    records.push(write(dir, dir_path, REFERENCE_VALUES_FILE, json.as_bytes(), Some(published.summary()))?);
    tracing::info!(step = "attest", file = %format!("{dir_path}/{REFERENCE_VALUES_FILE}"), "{}", published.summary());
    Ok(records)
}

fn write(dir: &Dir, dir_path: &str, name: &str, bytes: &[u8], summary: Option<String>) -> Result<PublishedRecord> {
    node::write_atomic(dir, name, bytes).with_context(|| format!("writing {dir_path}/{name}"))?;
    Ok(PublishedRecord {
        path: format!("{dir_path}/{name}"),
        sha256: sha256_hex(bytes),
        size: bytes.len() as u64,
        summary,
    })
}

/// Reads and hashes host key documents (local files named by `--host-key-document`).
pub(crate) fn host_keys(root: &Path, files: &[std::path::PathBuf]) -> Result<Vec<(String, hkd::HostKey)>> {
    let fs = crate::nodefs::NodeFs::open(root)?;
    let mut out = Vec::new();
    for f in files {
        let path = crate::nodefs::FilePath::Local(f.clone());
        let name = f.display().to_string();
        let Some(bytes) = fs.read(&path, hkd::MAX_DOCUMENT)? else {
            bail!("--host-key-document {name}: no such file");
        };
        out.push((name.clone(), hkd::parse(&bytes, &format!("--host-key-document {name}"))?));
    }
    Ok(out)
}

/// Host key documents by name, with their key hashes.
pub(crate) type HostKeys = Vec<(String, hkd::HostKey)>;

/// The ConfigMap key naming host key documents on the node.
pub(crate) const HOST_KEY_DOCUMENTS_KEY: &str = "seHostKeyDocuments";

/// Host key documents named by node path (`seHostKeyDocuments`, or what a state records),
/// read beneath `root` with a size cap and hashed, and what the state records of them; a
/// missing or unparsable document is an error naming the key and the file.
pub(crate) fn node_host_keys(root: &Path, docs: &[String]) -> Result<(HostKeys, Vec<DocumentRecord>)> {
    let (mut keys, mut records) = (Vec::new(), Vec::new());
    if docs.is_empty() {
        return Ok((keys, records));
    }
    let fs = crate::nodefs::NodeFs::open(root)?;
    for d in docs {
        let what = format!("{HOST_KEY_DOCUMENTS_KEY}: {d}");
        let Some(bytes) =
            fs.read(&crate::nodefs::FilePath::node(d), hkd::MAX_DOCUMENT).with_context(|| what.clone())?
        else {
            bail!(
                "{what}: no such file on the node (a host key document is the X.509 certificate of an IBM Z \
                 machine's EC P-521 host key); the node is unchanged"
            );
        };
        let key = hkd::parse(&bytes, &what).map_err(|e| anyhow::anyhow!("{e:#}; the node is unchanged"))?;
        keys.push((d.clone(), key));
        records.push(DocumentRecord { path: d.clone(), sha256: sha256_hex(&bytes) });
    }
    Ok((keys, records))
}

/// The reference values of what the state records, from the node's files now.
pub(crate) fn of_state(
    root: &Root,
    st: &State,
    only: &[String],
    overrides: &Overrides,
    host_keys: &[(String, hkd::HostKey)],
) -> Result<Published> {
    let targets = recorded_targets(root, st, only, overrides, host_keys)?;
    Ok(Published { targets: targets.iter().map(TargetValues::of).collect() })
}
