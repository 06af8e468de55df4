//! The extraction of wanted files from an image's layers: stream each layer top first
//! through the walker ([`super::layer`]) while its digest is verified, stop as soon as
//! every wanted path is decided, read a layer again only for a file the first pass did not
//! copy, then hand the files out (fsync, mode 0644, rename) once every layer read verified.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;

use super::bridge::Pass;
use super::decode::Compression;
use super::layers::capture_in_layers;
use super::sink::Capture;
use super::tempfiles::{TMP_PREFIX, TempFiles, sync_file};
use super::{IndexBudget, Limits};
use crate::source::{Descriptor, ResolvedImage, Source};

/// One file to take out of the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Absolute, normalised path inside the image.
    pub path: String,
    /// File name to write in the destination directory (no `/`).
    pub dest_name: String,
    /// dm-verity parameters known before the fetch (a measured image or extension): the
    /// tree is then computed while the file streams in ([`FetchedFile::streamed`]).
    pub verity: Option<crate::verity::Params>,
    /// Whether the content's sha256 is computed ([`FetchedFile::sha256`]). Always for an
    /// unmeasured file; for a measured one only when asked (a pinned sha256).
    pub sha256: bool,
}

/// One file written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedFile {
    /// Path inside the image, as asked.
    pub path: String,
    /// Name written in the destination directory.
    pub dest_name: String,
    /// sha256 of the content (64 lowercase hex); `None` for a measured file that did not
    /// ask for it ([`Wanted::sha256`]).
    pub sha256: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// The dm-verity tree computed while the file streamed in, when [`Wanted::verity`] was given.
    pub streamed: Option<crate::verity::Streamed>,
}

/// What an extraction wrote and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The files, in the order asked.
    pub files: Vec<FetchedFile>,
    /// Digests of the layer blobs read (a layer read twice appears twice).
    pub layers_read: Vec<String>,
}

/// Refuses a destination name that is not a plain file name, or one the extraction's own
/// temporary files could take.
pub fn check_dest_name(n: &str) -> Result<()> {
    if !kata_addons_facts::is_plain_file_name(n) || n.starts_with(TMP_PREFIX) {
        bail!("invalid destination file name {n:?}");
    }
    Ok(())
}

/// Extracts `wanted` (whose normalised paths are `paths`) from the layers of `resolved`,
/// or from its titled layers when it is an OCI artifact ([`super::artifact`]).
pub async fn extract(
    limits: &Limits,
    source: &dyn Source,
    resolved: &ResolvedImage,
    paths: &[String],
    wanted: &[Wanted],
    temps: &TempFiles,
) -> Result<Extracted> {
    let n = resolved.layers.len();
    if n > limits.max_layers {
        bail!(
            "{}: the image has {n} layers, more than the limit of {} (--max-layers)",
            resolved.origin,
            limits.max_layers
        );
    }
    let pass = Pass {
        limits,
        source,
        temps,
        total: Arc::new(AtomicU64::new(0)),
        budget: Arc::new(IndexBudget::new(limits.max_index_entries, limits.max_index_bytes)),
        streams: Arc::new(measured_paths(paths, wanted)),
    };
    let captured = match &resolved.artifact {
        Some(artifact) => super::artifact::extract(&pass, resolved, artifact, paths).await?,
        None => {
            // Refuse unknown media types before reading anything.
            for l in &resolved.layers {
                Compression::from_media_type(&l.media_type).with_context(|| format!("layer {}", l.digest))?;
            }
            let layers: Vec<&Descriptor> = resolved.layers.iter().collect();
            capture_in_layers(&pass, &layers, paths, &resolved.origin, &|_, _| Ok(())).await?
        }
    };
    let files = hand_out(&pass, wanted, &captured.files)?;
    Ok(Extracted { files, layers_read: captured.layers_read })
}

/// The measured files by normalised path. A path wanted twice (as two destinations) is
/// hashed when either asks for it.
fn measured_paths(paths: &[String], wanted: &[Wanted]) -> HashMap<String, super::sink::Measured> {
    let mut out = HashMap::new();
    for (p, w) in paths.iter().zip(wanted) {
        if let Some(v) = &w.verity {
            out.insert(p.clone(), super::sink::Measured { params: v.clone(), sha256: w.sha256 });
        }
    }
    for (p, w) in paths.iter().zip(wanted) {
        match out.get_mut(p) {
            Some(m) if w.sha256 || w.verity.as_ref() != Some(&m.params) => m.sha256 = true,
            _ => {}
        }
    }
    out
}

/// Every blob read was verified: renames the captured files to their destination names
/// (fsync, mode 0644; a capture named by two wanted paths is copied for the second).
fn hand_out(pass: &Pass<'_>, wanted: &[Wanted], captured: &[Capture]) -> Result<Vec<FetchedFile>> {
    let temps = pass.temps;
    let dir = temps.dir();
    let mut sum = 0u64;
    let mut files = Vec::new();
    let mut placed: HashMap<String, String> = HashMap::new(); // tmp -> dest name
    for (w, c) in wanted.iter().zip(captured) {
        sum += c.size;
        if sum > pass.limits.max_total_size {
            bail!("the files exceed the total limit of {} bytes", pass.limits.max_total_size);
        }
        let tmp = match placed.get(&c.tmp) {
            None => {
                sync_file(dir, &c.tmp)?;
                c.tmp.clone()
            }
            Some(first) => copy_within(temps, first, &w.dest_name)?,
        };
        set_mode_0644(dir, &tmp)?;
        dir.rename(&tmp, dir, &w.dest_name)
            .with_context(|| format!("rename {tmp} to {} in the destination", w.dest_name))?;
        temps.keep(&tmp);
        placed.insert(c.tmp.clone(), w.dest_name.clone());
        files.push(FetchedFile {
            path: w.path.clone(),
            dest_name: w.dest_name.clone(),
            sha256: c.sha256.clone(),
            size: c.size,
            streamed: c.streamed.clone(),
        });
    }
    sync_dir(dir)?;
    Ok(files)
}

fn copy_within(temps: &TempFiles, from: &str, to: &str) -> Result<String> {
    let dir = temps.dir();
    let mut src = dir.open(from).with_context(|| format!("reopen {from} in the destination"))?;
    let size = src.metadata().with_context(|| format!("inspecting {from} in the destination"))?.len();
    temps.check_space(to, size)?;
    let (tmp, mut dst) = temps.create()?;
    std::io::copy(&mut src, &mut dst).with_context(|| format!("copy {from} for {to}"))?;
    dst.sync_all().with_context(|| format!("fsync {tmp}"))?;
    Ok(tmp)
}

fn set_mode_0644(dir: &Dir, name: &str) -> Result<()> {
    use cap_std::fs::PermissionsExt;
    dir.set_permissions(name, cap_std::fs::Permissions::from_mode(0o644)).with_context(|| format!("chmod 0644 {name}"))
}

fn sync_dir(dir: &Dir) -> Result<()> {
    crate::node::fsync_dir(dir).context("fsync of the destination directory")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(salt: &str) -> crate::verity::Params {
        crate::verity::Params::from_hex(&"ab".repeat(32), salt, 8, 4096, 4096).expect("params")
    }

    fn wanted(path: &str, verity: Option<crate::verity::Params>, sha256: bool) -> Wanted {
        Wanted { path: path.into(), dest_name: path.replace('/', "_"), verity, sha256 }
    }

    #[test]
    fn a_measured_file_is_hashed_only_when_a_destination_asks() {
        let paths: Vec<String> = ["img", "img", "pinned", "other"].iter().map(|s| s.to_string()).collect();
        let only = measured_paths(&paths[..1], &[wanted("img", Some(params("aa")), false)]);
        assert_eq!(only.get("img").map(|m| m.sha256), Some(false));
        let w = [
            wanted("img", Some(params("aa")), false),
            wanted("img", None, true),
            wanted("pinned", Some(params("aa")), true),
            wanted("other", None, true),
        ];
        let m = measured_paths(&paths, &w);
        assert_eq!(m.get("img").map(|m| m.sha256), Some(true), "wanted unmeasured as well: hashed");
        assert_eq!(m.get("pinned").map(|m| m.sha256), Some(true));
        assert!(!m.contains_key("other"));
        let w = [wanted("img", Some(params("aa")), false), wanted("img", Some(params("bb")), false)];
        assert_eq!(measured_paths(&paths[..2], &w).get("img").map(|m| m.sha256), Some(true), "two trees: hashed");
    }
}
