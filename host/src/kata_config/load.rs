//! "Kata must load the result" (docs/design.md#kata-must-load): before a drop-in is committed, the
//! configuration Kata would compute with it (the main file, then every `config.d` entry in
//! byte order, ours at its place) is checked against what both Kata runtimes refuse to
//! load: an `image` and an `initrd` set together (kata-containers 7c6ba40,
//! `src/runtime/pkg/katautils/config.go:1365` "having both an image and an initrd defined
//! in the configuration file is not supported", `src/libs/kata-types/src/config/hypervisor/mod.rs:535`
//! "Can not configure both initrd and image for boot"). kata-deploy's
//! `10-installation-prefix.toml` on a non-default prefix sets both (artifacts/install.rs
//! `generate_installation_prefix_drop_in`); an initrd or image addon clears the other key,
//! a kernel-only addon cannot say which one the node meant, so it is refused naming the
//! fragments.

use anyhow::{Result, bail};

use crate::kata_config::files::{self as runtime, Fragment};
use crate::node::{self, Root};

/// Checks that the runtime configuration `rc_rel` (root-relative, resolved) loads with
/// `contents` as its drop-in at node path `drop_in`; the error names the fragments that
/// make it fail and what would fix it.
pub(crate) fn check(root: &Root, rc_rel: &std::path::Path, drop_in: &str, contents: &str) -> Result<()> {
    let rc = node::node_path(rc_rel);
    let ours = match toml::from_str::<toml::Table>(contents) {
        Ok(t) => t,
        Err(e) => bail!("the drop-in for {rc} is not valid TOML ({}); nothing was changed", e.message()),
    };
    let mut fragments: Vec<Fragment> =
        runtime::fragments(root, rc_rel)?.into_iter().filter(|f| f.path != drop_in).collect();
    let name = |p: &str| p.rsplit('/').next().unwrap_or(p).as_bytes().to_vec();
    let at = fragments.iter().skip(1).position(|f| name(&f.path) > name(drop_in)).map_or(fragments.len(), |i| i + 1);
    fragments.insert(at, Fragment { path: drop_in.to_string(), table: Ok(ours) });
    let set = |k: &str| runtime::effective(&fragments, &["hypervisor", "qemu", k]).filter(|s| !s.value.is_empty());
    if let (Some(image), Some(initrd)) = (set("image"), set("initrd")) {
        bail!(
            "refusing to write {drop_in}: Kata would not load {rc} with it, because `image` ({:?}, set by {}) and \
             `initrd` ({:?}, set by {}) would both be set and both Kata runtimes refuse that; the addon sets \
             neither, so it cannot tell which one the node means: remove one of them from {}, or install an image or \
             initrd addon (its drop-in clears the other key); nothing was changed",
            image.value,
            image.from,
            initrd.value,
            initrd.from,
            if image.from == initrd.from { image.from.clone() } else { format!("{} or {}", image.from, initrd.from) }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_only_drop_in_over_the_installation_prefix_fragment_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path().join("opt/kata-x/share/defaults/kata-containers/runtimes/qemu-snp");
        std::fs::create_dir_all(d.join("config.d")).expect("mkdir");
        std::fs::write(d.join("configuration-qemu-snp.toml"), "[hypervisor.qemu]\nimage = \"/a.img\"\n").expect("w");
        std::fs::write(
            d.join("config.d/10-installation-prefix.toml"),
            "[hypervisor.qemu]\nkernel = \"/k\"\nimage = \"/i.img\"\ninitrd = \"/i.initrd\"\n",
        )
        .expect("w");
        let root = Root::open(tmp.path()).expect("root");
        let rel = std::path::Path::new(
            "opt/kata-x/share/defaults/kata-containers/runtimes/qemu-snp/configuration-qemu-snp.toml",
        );
        let drop_in = "/opt/kata-x/share/defaults/kata-containers/runtimes/qemu-snp/config.d/50-kata-addons.toml";
        let e =
            format!("{:#}", check(&root, rel, drop_in, "[hypervisor.qemu]\nkernel = \"/new\"\n").expect_err("refused"));
        assert!(e.contains("10-installation-prefix.toml") && e.contains("`image`") && e.contains("`initrd`"), "{e}");
        check(&root, rel, drop_in, "[hypervisor.qemu]\nkernel = \"/new\"\ninitrd = \"/new.initrd\"\nimage = \"\"\n")
            .expect("an initrd addon clears image");
        // A later fragment that sets the key again wins over ours.
        std::fs::write(d.join("config.d/60-user.toml"), "[hypervisor.qemu]\nimage = \"/user.img\"\n").expect("w");
        let e = format!(
            "{:#}",
            check(&root, rel, drop_in, "[hypervisor.qemu]\ninitrd = \"/new.initrd\"\nimage = \"\"\n")
                .expect_err("refused")
        );
        assert!(e.contains("60-user.toml") && e.contains(drop_in), "{e}");
    }
}
