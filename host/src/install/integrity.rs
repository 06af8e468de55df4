//! How an installed file is checked against its state record (`status`, a drift check of
//! `install` and the daemon): by its sha256, or, for a measured file recorded without one,
//! as the install verified it: the dm-verity tree of partition 1 (root hash and hash area,
//! [`crate::verity::check`]) and the sha256 of its bytes outside the data blocks. Either way
//! every byte of the file is covered.

use std::path::Path;

use anyhow::{Result, bail};
use cap_std::fs::Dir;

use crate::node;
use crate::policy::ArtifactKind;
use crate::state::FileRecord;
use crate::verity::{self, Refused, Role};

/// What a check of an installed file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finding {
    /// As recorded.
    Intact,
    /// Not there.
    Missing,
    /// There, with other contents: what differs.
    Differs(String),
}

/// Checks the file `rel` of `dir` against `rec`. An unusable file (not a regular file,
/// unreadable) is an error.
pub(crate) fn check(dir: &Dir, rel: &Path, rec: &FileRecord) -> Result<Finding> {
    // The recorded size first: cheap, and a record whose size no file has is not vouched for
    // by a matching digest of some other length.
    let Some(file) = node::open_regular(dir, rel)? else { return Ok(Finding::Missing) };
    let size = file.metadata().map_err(|e| anyhow::anyhow!(e).context(format!("inspecting {}", rec.path)))?.len();
    if size != rec.size {
        return Ok(Finding::Differs(format!("{size} bytes, expected {}", rec.size)));
    }
    drop(file);
    if let Some(expected) = &rec.sha256 {
        return Ok(match node::hash_file(dir, rel)? {
            None => Finding::Missing,
            Some((sha, n)) if &sha == expected && n == rec.size => Finding::Intact,
            Some((sha, n)) if &sha == expected => Finding::Differs(format!("{n} bytes, expected {}", rec.size)),
            Some((sha, _)) => Finding::Differs(format!("sha256 {sha}, expected {expected}")),
        });
    }
    let Some((v, outside)) = rec.verity.as_ref().and_then(|v| Some((v, v.outside_sha256.as_ref()?))) else {
        bail!("the state records neither a sha256 nor a dm-verity record for {}", rec.path);
    };
    let role = match rec.kind {
        ArtifactKind::Image => Role::Image,
        ArtifactKind::Extension => Role::Extension,
        ArtifactKind::Kernel | ArtifactKind::Initrd => {
            bail!("the state records a dm-verity tree for the {} {}, which is never measured", rec.kind, rec.path)
        }
    };
    let Some(file) = node::open_regular(dir, rel)? else { return Ok(Finding::Missing) };
    let file = file.into_std();
    let params = verity::Params::from_hex(&v.root_hash, &v.salt, v.data_blocks, v.data_block_size, v.hash_block_size)
        .map_err(|e| anyhow::anyhow!("the state's dm-verity parameters for {}: {e}", rec.path))?;
    let found = match verity::check(&file, &rec.path, role, Some(&params), None) {
        Ok(found) => found,
        Err(e) => {
            return match e.downcast_ref::<Refused>() {
                Some(r) => Ok(Finding::Differs(format!("dm-verity: {}", r.what))),
                None => Err(e),
            };
        }
    };
    if found.outside_sha256.as_ref() != Some(outside) {
        return Ok(Finding::Differs(format!(
            "the bytes outside the dm-verity data blocks have sha256 {}, expected {outside}",
            found.outside_sha256.as_deref().unwrap_or("?")
        )));
    }
    if rec.filesystem.as_deref().is_some_and(|fs| fs != found.filesystem.wit_name()) {
        return Ok(Finding::Differs(format!(
            "partition 1 holds {}, expected {}",
            found.filesystem.wit_name(),
            rec.filesystem.as_deref().unwrap_or("?")
        )));
    }
    Ok(Finding::Intact)
}

/// How a record names the contents it expects, for messages: `sha256 <hex>`, or the
/// dm-verity root hash of a measured file recorded without one.
pub(crate) fn describe(rec: &FileRecord) -> String {
    match (&rec.sha256, &rec.verity) {
        (Some(sha), _) => format!("sha256 {sha}"),
        (None, Some(v)) => format!("dm-verity root_hash {}", v.root_hash),
        (None, None) => "(no digest)".to_string(),
    }
}
