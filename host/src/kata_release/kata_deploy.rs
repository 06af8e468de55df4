//! kata-deploy nodes: what kata-deploy leaves under its prefix (`--kata-prefix`, default
//! `/opt/kata`) and why none of it names the Kata release reliably. See
//! docs/design.md#node-kata-release.
//!
//! kata-deploy (tools/packaging/kata-deploy, binary/src/artifacts/install.rs) extracts the
//! per-component tarballs its image carries (`/opt/kata-artifacts/tarballs`) under the
//! prefix and copies `versions.yaml` beside them. `versions.yaml` lists the versions of the
//! components Kata is built from (kernel, QEMU, ...), not the Kata release. The `VERSION`
//! file that the merged release tarball carried (`kata-deploy-merge-builds.sh`: the
//! `VERSION` file on a release build, `git describe --tags` otherwise) is not written by
//! kata-deploy's per-component install, so one found there may be a leftover of an older
//! install; the binaries' own `--version` is never run. So no `kataVersion` is checked on
//! such a node: it is refused with this reason.

use anyhow::Result;

use crate::nodefs::{FilePath, Kind, NodeFs};

/// Why the Kata release of a kata-deploy node is not known, for messages.
pub(crate) const NOT_RECORDED: &str = "kata-deploy records no file naming the Kata release it installed (its versions.yaml lists component versions; a VERSION file is not written by its per-component install), and kata-addons never runs a node binary";

/// Whether kata-deploy's installation is on the node: `prefix` holds `bin` or
/// `share/defaults/kata-containers`.
pub(crate) fn present(fs: &NodeFs, prefix: &str) -> Result<bool> {
    let p = FilePath::node(prefix);
    for sub in ["bin", "share/defaults/kata-containers"] {
        if fs.kind(&p.join(sub))? == Some(Kind::Dir) {
            return Ok(true);
        }
    }
    Ok(false)
}
