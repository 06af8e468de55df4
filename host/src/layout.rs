//! Node layout names shared by `preview` and `install`: where a version's files go.

use crate::policy::{InstalledFile, Plan};

/// Placeholder for the manifest digest when it is not known without a pull (`preview`).
pub(crate) const UNKNOWN_DIGEST: &str = "<digest>";

/// Directory name of one installed version: `<version>-<first 12 hex of manifest digest>`,
/// so two different images with the same version label never share a directory.
pub(crate) fn version_dir_name(version: &str, manifest_digest: Option<&str>) -> String {
    let short = manifest_digest
        .map(|d| d.strip_prefix("sha256:").unwrap_or(d))
        .map(|h| h.get(..12).unwrap_or(h).to_string())
        .unwrap_or_else(|| UNKNOWN_DIGEST.to_string());
    format!("{version}-{short}")
}

/// Node paths (as the node sees them) of the plan's artifacts in version directory `dir`.
pub fn installed_files(plan: &Plan, dir: &str) -> Vec<InstalledFile> {
    plan.artifacts
        .iter()
        .map(|a| InstalledFile {
            kind: a.kind,
            path: format!("{}/{dir}/{}", kata_addons_facts::INSTALL_DIR, a.file_name),
            filesystem: None,
            verity: None,
        })
        .collect()
}

/// The pinned manifest digest of a plan's image, if the reference has one.
pub(crate) fn pinned_digest(plan: &Plan) -> Option<&str> {
    crate::source::reference::pinned_digest(&plan.source)
}
