//! Guest images and extension images at install (docs/design.md#measured-guests): their
//! dm-verity parameters (from the plan, or an in-image file fetched with them and parsed
//! with the one shared parser), and the check of each staged file the way the guest will
//! use it, before the commit point. What the check found goes to `render` and into the
//! state.

use std::io::Read;

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;

use crate::fetch::{FetchedFile, Wanted};
use crate::policy::{Artifact, ArtifactKind, Filesystem, InstalledFile, Plan, VerityParams, VeritySource};
use crate::state::{FileRecord, VerityRecord};
use crate::verity::{self, Role};

/// Staged name of an artifact's fetched verity parameters file (removed before the commit).
fn verity_file_name(a: &Artifact) -> String {
    format!("{}.verity-params", a.file_name)
}

/// Largest in-image verity parameters file read: its first line holds at most
/// [`kata_addons_facts::verity::MAX_LEN`] bytes of parameters.
const MAX_VERITY_FILE: u64 = 4096;

/// What the check of one artifact found (nothing for a kernel or initrd).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    /// Filesystem of the data partition.
    pub filesystem: Option<Filesystem>,
    /// The parameters the file verified against.
    pub verity: Option<VerityParams>,
    /// When measured, the sha256 of the file's bytes outside the data blocks
    /// ([`crate::verity::Verified::outside_sha256`]).
    pub outside_sha256: Option<String>,
}

/// The role a kind of artifact has for the guest, if it is checked at all.
fn role(kind: ArtifactKind) -> Option<Role> {
    match kind {
        ArtifactKind::Image => Some(Role::Image),
        ArtifactKind::Extension => Some(Role::Extension),
        ArtifactKind::Kernel | ArtifactKind::Initrd => None,
    }
}

/// Decodes checked WIT parameters for the verifier.
fn params(v: &VerityParams) -> Result<verity::Params> {
    verity::Params::from_hex(&v.root_hash, &v.salt, v.data_blocks, v.data_block_size, v.hash_block_size)
        .map_err(|e| anyhow::anyhow!("internal: the policy passed dm-verity parameters that do not decode: {e}"))
}

/// The files to fetch for `plan`: its artifacts (with the parameters known before the
/// fetch, so the tree is computed while the file streams in, and then the sha256 only when
/// pinned: the tree is the record) and their verity files.
pub(crate) fn wanted(plan: &Plan) -> Result<Vec<Wanted>> {
    let mut out = Vec::new();
    for a in &plan.artifacts {
        let streaming = match &a.verity {
            Some(VeritySource::Params(p)) => Some(params(p)?),
            _ => None,
        };
        let sha256 = streaming.is_none() || a.sha256.is_some();
        out.push(Wanted { path: a.source.clone(), dest_name: a.file_name.clone(), verity: streaming, sha256 });
    }
    for a in &plan.artifacts {
        if let Some(VeritySource::File(path)) = &a.verity {
            out.push(Wanted { path: path.clone(), dest_name: verity_file_name(a), verity: None, sha256: true });
        }
    }
    Ok(out)
}

/// Reads and parses a fetched verity parameters file: its first line.
fn read_verity_file(dir: &Dir, a: &Artifact, in_image: &str) -> Result<VerityParams> {
    let name = verity_file_name(a);
    let f = dir.open(&name).with_context(|| format!("opening the fetched {in_image}"))?;
    let mut text = Vec::new();
    f.take(MAX_VERITY_FILE + 1).read_to_end(&mut text).with_context(|| format!("reading the fetched {in_image}"))?;
    let _ = dir.remove_file(&name);
    if text.len() as u64 > MAX_VERITY_FILE {
        bail!("the verity parameters file {in_image} in the image is larger than {MAX_VERITY_FILE} bytes: refused");
    }
    let text =
        String::from_utf8(text).map_err(|_| anyhow::anyhow!("the verity parameters file {in_image} is not UTF-8"))?;
    let line = text.lines().next().unwrap_or("").trim();
    let p = kata_addons_facts::verity::parse(line)
        .map_err(|e| anyhow::anyhow!("the first line of the verity parameters file {in_image} in the image: {e}"))?;
    Ok(p.into())
}

/// Checks every staged image and extension in `dir` (the fetch's `files`), in plan order,
/// and removes the fetched verity files. A refusal names the in-image file and what differs.
pub(crate) fn check_staged(dir: &Dir, plan: &Plan, files: &[FetchedFile]) -> Result<Vec<Checked>> {
    let mut out = Vec::new();
    for a in &plan.artifacts {
        let Some(role) = role(a.kind) else {
            out.push(Checked::default());
            continue;
        };
        let verity = match &a.verity {
            None => None,
            Some(VeritySource::Params(p)) => Some(p.clone()),
            Some(VeritySource::File(path)) => Some(read_verity_file(dir, a, path)?),
        };
        let streamed = files.iter().find(|f| f.dest_name == a.file_name).and_then(|f| f.streamed.clone());
        let file = dir.open(&a.file_name).with_context(|| format!("opening the staged {}", a.source))?.into_std();
        let p = verity.as_ref().map(params).transpose()?;
        let found = verity::check(&file, &a.source, role, p.as_ref(), streamed)?;
        tracing::info!(
            step = "verify",
            kind = %a.file_name,
            source = %a.source,
            filesystem = found.filesystem.wit_name(),
            root_hash = found.root_hash.as_deref().unwrap_or("(unmeasured)"),
            "checked as the guest will use it"
        );
        out.push(Checked { filesystem: Some(found.filesystem), verity, outside_sha256: found.outside_sha256 });
    }
    Ok(out)
}

/// The installed files as `render` takes them, with what their checks found.
pub(crate) fn installed(mut files: Vec<InstalledFile>, checked: &[Checked]) -> Vec<InstalledFile> {
    for (f, c) in files.iter_mut().zip(checked) {
        f.filesystem = c.filesystem;
        f.verity = c.verity.clone();
    }
    files
}

/// What the state records of a check.
pub(crate) fn record(c: &Checked) -> (Option<String>, Option<VerityRecord>) {
    (
        c.filesystem.map(|f| f.wit_name().to_string()),
        c.verity.as_ref().map(|v| VerityRecord {
            root_hash: v.root_hash.clone(),
            salt: v.salt.clone(),
            data_blocks: v.data_blocks,
            data_block_size: v.data_block_size,
            hash_block_size: v.hash_block_size,
            outside_sha256: c.outside_sha256.clone(),
        }),
    )
}

/// What the state says the checks of the installed files found (a drift repair re-renders
/// from it without pulling), in the order of `files`.
pub(crate) fn from_records(files: &[FileRecord]) -> Vec<Checked> {
    files
        .iter()
        .map(|f| Checked {
            filesystem: f.filesystem.as_deref().and_then(Filesystem::from_wit_name),
            verity: f.verity.as_ref().map(|v| VerityParams {
                root_hash: v.root_hash.clone(),
                salt: v.salt.clone(),
                data_blocks: v.data_blocks,
                data_block_size: v.data_block_size,
                hash_block_size: v.hash_block_size,
            }),
            outside_sha256: f.verity.as_ref().and_then(|v| v.outside_sha256.clone()),
        })
        .collect()
}

/// What `preview` can know without the image: parameters given in the ConfigMap.
pub(crate) fn preview(plan: &Plan) -> Vec<Checked> {
    plan.artifacts
        .iter()
        .map(|a| Checked {
            filesystem: None,
            verity: match &a.verity {
                Some(VeritySource::Params(p)) => Some(p.clone()),
                _ => None,
            },
            outside_sha256: None,
        })
        .collect()
}

/// What `preview` cannot show: dm-verity parameters that come from a file in the image.
pub(crate) fn preview_note(plan: &Plan) -> Option<String> {
    let files: Vec<String> = plan
        .artifacts
        .iter()
        .filter_map(|a| match &a.verity {
            Some(VeritySource::File(p)) => Some(format!("{p} (for the {})", a.file_name)),
            _ => None,
        })
        .collect();
    (!files.is_empty()).then(|| {
        format!(
            "dm-verity parameters come from {} in the image: install reads and verifies them, the preview shows them empty",
            files.join(", ")
        )
    })
}
