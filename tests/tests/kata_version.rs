//! `kataVersion` through the node's life (docs/configuration.md#kataversion): a node whose
//! RPM database (built by Debian's rpm 4.18, laid out as RHCOS lays it out) holds
//! `kata-containers`; a mismatched `kataVersion` is refused naming both values with the
//! node byte-identical, a matching one installs; after the RPM is upgraded under the addon,
//! `status` exits 4 naming both releases and the daemon is not ready with the reason while
//! the addon stays; the ConfigMap updated to the new release installs again.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use kata_addons_tests::daemon::{ConfigMapDir, Daemon, wait_for};
use kata_addons_tests::node::{Node, content_snapshot, layout_with, noise};
use kata_addons_tests::rpmdb::{Builder, Pkg, have_rpm, install as rpm_install};
use kata_addons_tests::{kata_addons_bin, run_kata_env, show};

const K25: Pkg = Pkg("kata-containers", None, "3.25.0", "6.el9");
const K26: Pkg = Pkg("kata-containers", None, "3.26.0", "1.el9");

fn out(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn install(node: &Node, image: &str, kata: &str) -> Output {
    run_kata_env(
        &["install", "--root", node.root().to_str().expect("utf-8")],
        &[("ADDON_IMAGE", image), ("ADDON_KERNEL_PATH", "/vmlinuz"), ("ADDON_KATA_VERSION", kata)],
    )
}

fn status(root: &Path, extra: &[&str]) -> Output {
    std::process::Command::new(kata_addons_bin())
        .args(["status", "--root"])
        .arg(root)
        .args(extra)
        .output()
        .expect("status")
}

#[test]
fn kata_version_follows_the_nodes_rpm() {
    assert!(have_rpm(), "Debian's rpm and rpmbuild are needed (tests/run installs the `rpm` package)");
    let dir = tempfile::tempdir().expect("tmp");
    let mut rpms = Builder::new(&dir.path().join("rpms"));
    let (k25, k26) = (rpms.rpm(K25), rpms.rpm(K26));
    let node = Node::new();
    std::fs::create_dir_all(node.path("/usr/share/rpm")).expect("mkdir");
    std::fs::create_dir_all(node.path("/var/lib")).expect("mkdir");
    std::os::unix::fs::symlink("../../usr/share/rpm", node.path("/var/lib/rpm")).expect("link");
    rpm_install(node.root(), "/usr/share/rpm", std::slice::from_ref(&k25), false);
    layout_with(&dir.path().join("l"), "v1", &[("vmlinuz", &noise(50_000, 7))]);
    let image = format!("oci:{}:v1", dir.path().join("l").display());

    // A mismatch: refused, exit 1, one line naming both values and sources, node unchanged.
    let before = content_snapshot(node.root());
    let o = install(&node, &image, "3.26.0");
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err.lines().find(|l| l.contains("kataVersion")).unwrap_or_default();
    for want in ["kataVersion 3.26.0", "kata-containers 3.25.0-6.el9", "RPM database /usr/share/rpm/rpmdb.sqlite"] {
        assert!(line.contains(want), "{want} not in {line:?}\n{}", show(&o));
    }
    assert!(content_snapshot(node.root()) == before, "a refused install changed the node");
    let o = install(&node, &image, "3.25.0-7.el9");
    assert_eq!(o.status.code(), Some(1), "a release that differs: {}", show(&o));

    // A match installs; the summary and status print the node's release.
    let o = install(&node, &image, "3.25.0-6.el9");
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        out(&o).contains("kata    kata-containers 3.25.0-6.el9 (RPM database /usr/share/rpm/rpmdb.sqlite)"),
        "{}",
        show(&o)
    );
    let o = status(node.root(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(out(&o).contains("kataVersion 3.25.0-6.el9: checked at install"), "{}", show(&o));

    // The daemon runs the addon (up to date: ready).
    let mut cm =
        ConfigMapDir::new(&[("addonImage", &image), ("kernelPath", "/vmlinuz"), ("kataVersion", "3.25.0-6.el9")]);
    let ready = dir.path().join("ready");
    let daemon =
        Daemon::spawn(&[], &["--resync", "0.5"], node.root(), Some(cm.path()), &ready, dir.path().join("d.log"));
    let probe = || status(node.root(), &["--ready-file", ready.to_str().expect("utf-8")]);
    wait_for("the daemon is ready", Duration::from_secs(60), || probe().status.success(), || daemon.log());

    // The node's RPM is upgraded under the addon: status 4 naming both releases; the daemon
    // leaves the addon as it is and is not ready, with the reason.
    let addons = || -> Vec<(String, String)> {
        content_snapshot(&node.path("/etc/kata-containers/addons"))
            .into_iter()
            .filter(|(k, _)| k != "owner.json" && !k.starts_with('.'))
            .collect()
    };
    let installed = addons();
    rpm_install(node.root(), "/usr/share/rpm", std::slice::from_ref(&k26), true);
    let o = status(node.root(), &[]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(out(&o).contains("3.25.0-6.el9") && out(&o).contains("kata-containers 3.26.0-1.el9"), "{}", show(&o));
    wait_for(
        "the daemon is not ready, naming the node's new release",
        Duration::from_secs(60),
        || {
            let o = probe();
            !o.status.success() && out(&o).contains("not ready: kataVersion 3.25.0-6.el9")
        },
        || format!("{}\n{}", show(&probe()), daemon.log()),
    );
    assert!(out(&probe()).contains("kata-containers 3.26.0-1.el9"), "{}", show(&probe()));
    assert!(daemon.log().contains("does not match the node's Kata release"), "{}", daemon.log());
    assert_eq!(addons(), installed, "the daemon changed the installed addon");

    // The ConfigMap names the new release: installed again, ready.
    cm.update(&[("addonImage", &image), ("kernelPath", "/vmlinuz"), ("kataVersion", "3.26.0")]);
    wait_for(
        "ready after the ConfigMap names the node's release",
        Duration::from_secs(60),
        || probe().status.success(),
        || format!("{}\n{}", show(&probe()), daemon.log()),
    );
    let o = status(node.root(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(out(&o).contains("kataVersion 3.26.0: checked at install"), "{}", show(&o));
}
