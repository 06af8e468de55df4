//! Node lifecycle with real parts: the real binary, OCI layouts and a real registry,
//! real directories. install -> status -> reinstall -> upgrade -> drift -> uninstall,
//! providers, checksums, hostile node layouts, read-only and full filesystems,
//! concurrency.

use std::process::{Command, Output};

use kata_addons_tests::node::{Node, Tmpfs, content_snapshot, layout_with, noise};
use kata_addons_tests::registry::Registry;
use kata_addons_tests::{kata_addons_bin, run_kata_env as kata, sha256_hex, show};

fn root_arg(node: &Node) -> String {
    node.root().display().to_string()
}

fn install(node: &Node, env: &[(&str, &str)]) -> Output {
    kata(&["install", "--root", &root_arg(node)], env)
}

fn status(node: &Node) -> Output {
    kata(&["status", "--root", &root_arg(node), "--output", "json"], &[])
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Two versions of an SE kernel in OCI layouts.
struct Images {
    _dir: tempfile::TempDir,
    v1: String,
    v2: String,
    k1: Vec<u8>,
    k2: Vec<u8>,
}

fn images() -> Images {
    let dir = tempfile::tempdir().expect("images dir");
    let k1 = noise(300_000, 1);
    let k2 = noise(400_000, 2);
    layout_with(&dir.path().join("v1"), "v1", &[("artifacts/kernel/vmlinuz", &k1)]);
    layout_with(&dir.path().join("v2"), "v2", &[("artifacts/kernel/vmlinuz", &k2)]);
    Images {
        v1: format!("oci:{}:v1", dir.path().join("v1").display()),
        v2: format!("oci:{}:v2", dir.path().join("v2").display()),
        _dir: dir,
        k1,
        k2,
    }
}

fn se_env(image: &str) -> Vec<(&'static str, String)> {
    vec![("ADDON_IMAGE", image.to_string()), ("ADDON_KERNEL_PATH", "/artifacts/kernel/vmlinuz".to_string())]
}

fn as_refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn read_node_file(node: &Node, node_path: &str) -> Vec<u8> {
    std::fs::read(node.path(node_path)).unwrap_or_else(|e| panic!("{node_path}: {e}"))
}

#[test]
fn install_status_reinstall_upgrade_drift_uninstall() {
    let imgs = images();
    let node = Node::new();
    let before = content_snapshot(node.root());

    // install v1
    let e1 = se_env(&imgs.v1);
    let o = install(&node, &as_refs(&e1));
    assert!(o.status.success(), "{}", show(&o));
    let kernel = node.qemu_key("se", "kernel").expect("effective kernel");
    assert!(kernel.starts_with("/etc/kata-containers/addons/v1-"), "{kernel}");
    assert_eq!(read_node_file(&node, &kernel), imgs.k1);
    assert_eq!(node.config_d_entries("se"), vec!["50-kata-addons.toml"]);
    // The base configuration is never edited.
    let base = std::fs::read_to_string(node.config_dir("se").join("configuration-se.toml")).expect("base");
    assert_eq!(base, kata_addons_tests::node::BASE_CONFIG);

    // status: healthy
    let o = status(&node);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status json");
    assert_eq!(st["healthy"], true);
    assert_eq!(st["state"]["version"], "v1");
    assert_eq!(st["state"]["files"][0]["sha256"], sha256_hex(&imgs.k1));

    // reinstall: no write at all
    let snap = node.snapshot();
    let o = install(&node, &as_refs(&e1));
    assert!(o.status.success(), "{}", show(&o));
    assert!(stdout(&o).contains("up to date"), "{}", show(&o));
    assert_eq!(node.snapshot(), snap, "reinstall with the same inputs wrote to the node");

    // upgrade to v2: new kernel effective, old files gone, one drop-in
    let e2 = se_env(&imgs.v2);
    let o = install(&node, &as_refs(&e2));
    assert!(o.status.success(), "{}", show(&o));
    let kernel2 = node.qemu_key("se", "kernel").expect("effective kernel");
    assert!(kernel2.starts_with("/etc/kata-containers/addons/v2-"), "{kernel2}");
    assert_eq!(read_node_file(&node, &kernel2), imgs.k2);
    assert!(!node.path(&kernel).exists(), "old kernel {kernel} left behind");
    let addons: Vec<String> = std::fs::read_dir(node.path("/etc/kata-containers/addons"))
        .expect("addons dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(addons.len(), 2, "expected the v2 directory and state.json: {addons:?}");
    assert_eq!(node.config_d_entries("se"), vec!["50-kata-addons.toml"]);

    // drift: a changed kernel is reported (exit 4), and install repairs it
    std::fs::write(node.path(&kernel2), b"tampered").expect("tamper");
    let o = status(&node);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(stdout(&o).contains(&kernel2), "{}", show(&o));
    let o = install(&node, &as_refs(&e2));
    assert!(o.status.success(), "{}", show(&o));
    let kernel3 = node.qemu_key("se", "kernel").expect("effective kernel");
    assert_eq!(read_node_file(&node, &kernel3), imgs.k2);
    assert_eq!(status(&node).status.code(), Some(0));
    // A changed drop-in is drift too.
    let drop_in = node.config_dir("se").join("config.d/50-kata-addons.toml");
    std::fs::write(&drop_in, "[hypervisor.qemu]\nkernel = \"/evil\"\n").expect("tamper drop-in");
    assert_eq!(status(&node).status.code(), Some(4));
    let o = install(&node, &as_refs(&e2));
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(status(&node).status.code(), Some(0));

    // uninstall: back to the tree we started with (apart from empty directories)
    let o = kata(&["uninstall", "--root", &root_arg(&node)], &[]);
    assert!(o.status.success(), "{}", show(&o));
    let mut after = content_snapshot(node.root());
    after.retain(|k, _| !k.starts_with("run"));
    assert_eq!(after, before, "uninstall did not restore the node");
    assert_eq!(status(&node).status.code(), Some(3));
    // uninstall again: nothing installed, exit 0
    let o = kata(&["uninstall", "--root", &root_arg(&node)], &[]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(stdout(&o).contains("nothing installed"));
}

#[test]
fn tdx_kernel_and_initrd_override_the_base_image() {
    let dir = tempfile::tempdir().expect("tmp");
    let k = noise(100_000, 3);
    let i = noise(200_000, 4);
    layout_with(&dir.path().join("l"), "t1", &[("boot/vmlinuz", &k), ("boot/initrd.img", &i)]);
    let image = format!("oci:{}:t1", dir.path().join("l").display());
    let node = Node::new();
    let o = install(
        &node,
        &[
            ("ADDON_IMAGE", &image),
            ("ADDON_PROVIDER", "tdx"),
            ("ADDON_KERNEL_PATH", "/boot/vmlinuz"),
            ("ADDON_INITRD_PATH", "/boot/initrd.img"),
            ("ADDON_INITRD_SHA256", &sha256_hex(&i)),
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(node.qemu_key("tdx", "image").as_deref(), Some(""), "image must be overridden with \"\"");
    let initrd = node.qemu_key("tdx", "initrd").expect("initrd");
    assert_eq!(read_node_file(&node, &initrd), i);
    let kernel = node.qemu_key("tdx", "kernel").expect("kernel");
    assert_eq!(read_node_file(&node, &kernel), k);
    // Other providers are untouched.
    assert!(node.config_d_entries("se").is_empty());
    assert!(node.config_d_entries("snp").is_empty());
    // Installed files are regular 0644 files.
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::symlink_metadata(node.path(&initrd)).expect("meta");
    assert!(m.file_type().is_file());
    assert_eq!(m.permissions().mode() & 0o7777, 0o644);
}

#[test]
fn provider_switch_moves_the_drop_in() {
    let imgs = images();
    let node = Node::new();
    let o = install(&node, &as_refs(&se_env(&imgs.v1)));
    assert!(o.status.success(), "{}", show(&o));
    let mut env = se_env(&imgs.v2);
    env.push(("ADDON_PROVIDER", "snp".into()));
    let o = install(&node, &as_refs(&env));
    assert!(o.status.success(), "{}", show(&o));
    assert!(node.config_d_entries("se").is_empty(), "the se drop-in must be removed");
    assert_eq!(node.config_d_entries("snp"), vec!["50-kata-addons.toml"]);
    let kernel = node.qemu_key("snp", "kernel").expect("kernel");
    assert_eq!(read_node_file(&node, &kernel), imgs.k2);
}

#[test]
fn checksum_mismatch_and_bad_config_change_nothing() {
    let imgs = images();
    let node = Node::new();
    let o = install(&node, &as_refs(&se_env(&imgs.v1)));
    assert!(o.status.success(), "{}", show(&o));
    let snap = node.snapshot();

    // Wrong pinned sha256: exit 1, names the key, node unchanged.
    let mut env = se_env(&imgs.v2);
    env.push(("ADDON_KERNEL_SHA256", "0".repeat(64)));
    let o = install(&node, &as_refs(&env));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("checksum mismatch") && err.contains("kernelSha256"), "{err}");
    assert_eq!(node.snapshot(), snap, "a refused install changed the node");

    // Invalid configuration: exit 2, one line per problem, node unchanged.
    let o = install(
        &node,
        &[("ADDON_IMAGE", "not a reference"), ("ADDON_INITRD_PATH", "relative/path"), ("ADDON_PROVIDER", "sev")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for key in ["ADDON_IMAGE", "ADDON_INITRD_PATH", "ADDON_PROVIDER"] {
        assert!(err.contains(key), "{key} not named: {err}");
    }
    assert_eq!(node.snapshot(), snap);

    // A missing file in the image: exit 1, names the path, node unchanged.
    let o = install(&node, &[("ADDON_IMAGE", &imgs.v2), ("ADDON_KERNEL_PATH", "/no/such/vmlinuz")]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/no/such/vmlinuz"), "{}", show(&o));
    assert_eq!(node.snapshot(), snap);
}

#[test]
fn missing_runtime_is_a_clear_error() {
    let imgs = images();
    let node = Node::new();
    std::fs::remove_file(node.path("/etc/kata-containers/kata-tdx/configuration.toml")).expect("rm");
    let mut env = se_env(&imgs.v1);
    env.push(("ADDON_PROVIDER", "tdx".into()));
    let before = node.snapshot();
    let o = install(&node, &as_refs(&env));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tdx") && err.contains("not installed"), "{err}");
    let mut after = node.snapshot();
    after.retain(|k, _| !k.starts_with("run"));
    assert_eq!(after, before);
}

#[test]
fn symlinks_planted_on_the_node_cannot_redirect_writes() {
    let imgs = images();
    let outside = tempfile::tempdir().expect("outside");
    let outside_before = kata_addons_tests::node::snapshot(outside.path());

    // addons/ is a symlink to a directory outside the root.
    let node = Node::new();
    std::fs::create_dir_all(node.path("/etc/kata-containers")).expect("mkdir");
    std::os::unix::fs::symlink(outside.path(), node.path("/etc/kata-containers/addons")).expect("symlink");
    let o = install(&node, &as_refs(&se_env(&imgs.v1)));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(node.config_d_entries("se").is_empty(), "no drop-in may be committed");
    assert_eq!(kata_addons_tests::node::snapshot(outside.path()), outside_before);

    // config.d is a symlink to a directory outside the root.
    let node = Node::new();
    std::os::unix::fs::symlink(outside.path(), node.config_dir("se").join("config.d")).expect("symlink");
    let o = install(&node, &as_refs(&se_env(&imgs.v1)));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("outside the root"), "{}", show(&o));
    assert_eq!(kata_addons_tests::node::snapshot(outside.path()), outside_before);

    // The runtime config symlink points at `/../../..`-style targets: clamped at the root.
    let node = Node::new();
    let link = node.path("/etc/kata-containers/kata-se/configuration.toml");
    std::fs::remove_file(&link).expect("rm");
    std::os::unix::fs::symlink(
        "../../../../../../../../opt/kata/share/defaults/kata-containers/configuration-se.toml",
        &link,
    )
    .expect("symlink");
    let o = install(&node, &as_refs(&se_env(&imgs.v1)));
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(node.config_d_entries("se"), vec!["50-kata-addons.toml"]);
    assert_eq!(kata_addons_tests::node::snapshot(outside.path()), outside_before);
}

#[test]
fn concurrent_installs_are_serialised() {
    let imgs = images();
    let node = Node::new();
    let env = se_env(&imgs.v1);
    let root = root_arg(&node);
    let spawn = || {
        let mut c = Command::new(kata_addons_bin());
        c.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for (k, v) in &env {
            c.env(k, v);
        }
        c.args(["install", "--root", &root]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        c.spawn().expect("spawn")
    };
    let children: Vec<_> = (0..4).map(|_| spawn()).collect();
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().expect("wait")).collect();
    for o in &outputs {
        assert!(o.status.success(), "{}", show(o));
    }
    let installed = outputs.iter().filter(|o| stdout(o).starts_with("installed")).count();
    let up_to_date = outputs.iter().filter(|o| stdout(o).contains("up to date")).count();
    assert_eq!((installed, up_to_date), (1, 3), "exactly one run installs, the others find it done");
    assert_eq!(status(&node).status.code(), Some(0));
    assert_eq!(node.config_d_entries("se"), vec!["50-kata-addons.toml"]);
}

#[test]
#[cfg_attr(not_root, ignore = "needs root to mount a tmpfs")]
fn full_disk_fails_cleanly() {
    let dir = tempfile::tempdir().expect("tmp");
    let big = noise(3 << 20, 9);
    layout_with(&dir.path().join("l"), "big", &[("vmlinuz", &big)]);
    let image = format!("oci:{}:big", dir.path().join("l").display());
    let node = Node::new();
    let _fs = Tmpfs::mount(&node.path("/etc/kata-containers/addons"), "size=1m,mode=0755");
    let o = install(&node, &[("ADDON_IMAGE", &image), ("ADDON_KERNEL_PATH", "/vmlinuz")]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
    // Refused by the free-space check before the data is written, not by ENOSPC.
    assert!(err.contains("not enough space on /etc/kata-containers/addons: need"), "{err}");
    assert!(node.config_d_entries("se").is_empty(), "no drop-in after a failed install");
    let left: Vec<_> = std::fs::read_dir(node.path("/etc/kata-containers/addons"))
        .expect("addons")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "partial files left behind: {left:?}");
}

#[test]
#[cfg_attr(not_root, ignore = "needs root to mount a tmpfs")]
fn read_only_config_location_is_a_clear_error() {
    let imgs = images();
    let node = Node::new();
    let cfg = node.config_dir("tdx");
    let _fs = Tmpfs::mount(&cfg, "size=1m,mode=0755");
    std::fs::write(cfg.join("configuration.toml"), kata_addons_tests::node::BASE_CONFIG).expect("config");
    std::fs::create_dir(cfg.join("config.d")).expect("config.d");
    let o = Command::new("mount").args(["-o", "remount,ro"]).arg(&cfg).output().expect("remount");
    assert!(o.status.success(), "{}", show(&o));
    let mut env = se_env(&imgs.v1);
    env.push(("ADDON_PROVIDER", "tdx".into()));
    let o = install(&node, &as_refs(&env));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("read-only"), "{}", show(&o));
    // Nothing was staged in the install directory either.
    let addons = node.path("/etc/kata-containers/addons");
    let left: Vec<_> = std::fs::read_dir(&addons)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn install_from_a_real_registry() {
    let reg = Registry::start();
    let k = noise(500_000, 5);
    let base = kata_addons_tests::image::LayerBuilder::new()
        .file("usr/lib/big", &noise(2_000_000, 6))
        .build(kata_addons_tests::image::Compress::Gzip);
    // Parent directories are explicit, as image builders write them: the base layer cannot
    // change what the top layer says about `/artifacts/kernel/vmlinuz`, so it is not read.
    let top = kata_addons_tests::image::LayerBuilder::new()
        .dir("artifacts")
        .dir("artifacts/kernel")
        .file("artifacts/kernel/vmlinuz", &k)
        .build(kata_addons_tests::image::Compress::Gzip);
    let img = kata_addons_tests::image::Image::new(vec![base.clone(), top]);
    reg.push("kata/se-artifacts", "v1.0", &img);
    let node = Node::new();
    let image = format!("{}/kata/se-artifacts:v1.0", reg.host());
    let root = root_arg(&node);
    let args = ["install", "--root", root.as_str(), "--insecure-registry", &reg.host()];
    let env = [("ADDON_IMAGE", image.as_str()), ("ADDON_KERNEL_PATH", "/artifacts/kernel/vmlinuz")];
    let o = kata(&args, &env);
    assert!(o.status.success(), "{}", show(&o));
    let kernel = node.qemu_key("se", "kernel").expect("kernel");
    assert_eq!(read_node_file(&node, &kernel), k);
    // Only the top layer was downloaded.
    assert!(reg.requests_matching(&base.digest).is_empty(), "the base layer was downloaded: {}", reg.log());
    // Same again: up to date (only the manifest is fetched).
    let o = kata(&args, &env);
    assert!(stdout(&o).contains("up to date"), "{}", show(&o));
}

#[test]
fn pinned_install_is_up_to_date_without_the_registry() {
    let reg = Registry::start();
    let k = noise(300_000, 7);
    let top = kata_addons_tests::image::LayerBuilder::new()
        .dir("boot")
        .file("boot/vmlinuz", &k)
        .build(kata_addons_tests::image::Compress::Gzip);
    let img = kata_addons_tests::image::Image::new(vec![top]);
    let digest = reg.push("kata/pinned", "v1", &img);
    let node = Node::new();
    let image = format!("{}/kata/pinned@{digest}", reg.host());
    let root = root_arg(&node);
    let host = reg.host();
    let args = ["install", "--root", root.as_str(), "--insecure-registry", host.as_str(), "--timeout", "2"];
    let env = [("ADDON_IMAGE", image.as_str()), ("ADDON_KERNEL_PATH", "/boot/vmlinuz"), ("ADDON_VERSION", "v1")];
    let o = kata(&args, &env);
    assert!(o.status.success(), "{}", show(&o));
    drop(reg);
    // The registry is gone: a digest-pinned, intact install is still up to date.
    let snap = node.snapshot();
    let o = kata(&args, &env);
    assert!(o.status.success() && stdout(&o).contains("up to date"), "{}", show(&o));
    assert_eq!(node.snapshot(), snap);
    // A tampered file needs the registry again, and says which one it could not reach.
    let kernel = node.qemu_key("se", "kernel").expect("kernel");
    std::fs::write(node.path(&kernel), b"tampered").expect("tamper");
    let o = kata(&args, &env);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&host), "{}", show(&o));
}
