//! `kata-addons daemon`: installs, reports readiness, follows ConfigMap changes mounted as
//! a directory (Kubernetes' `..data` symlink swap), keeps the last good addon on a bad
//! change, exits 0 on SIGTERM with the install kept, and fails fast instead of hanging.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kata_addons_tests::daemon::{ConfigMapDir, Daemon, log_lines_with, wait_for};
use kata_addons_tests::node::{Node, layout_with, noise};
use kata_addons_tests::{kata_addons_bin, sha256_hex, show};

fn kernel_sha(node: &Node) -> Option<String> {
    let k = node.qemu_key("se", "kernel")?;
    std::fs::read(node.path(&k)).ok().map(|d| sha256_hex(&d))
}

#[test]
fn daemon_installs_follows_changes_keeps_last_good_and_exits_on_sigterm() {
    let dir = tempfile::tempdir().expect("tmp");
    let k1 = noise(200_000, 21);
    let k2 = noise(200_000, 22);
    layout_with(&dir.path().join("l1"), "d1", &[("vmlinuz", &k1)]);
    layout_with(&dir.path().join("l2"), "d2", &[("vmlinuz", &k2)]);
    let img1 = format!("oci:{}:d1", dir.path().join("l1").display());
    let img2 = format!("oci:{}:d2", dir.path().join("l2").display());
    let node = Node::new();
    let mut cm = ConfigMapDir::new(&[("addonImage", &img1), ("kernelPath", "/vmlinuz")]);
    let ready = dir.path().join("ready");
    let d = Daemon::start(node.root(), cm.path(), &ready, dir.path().join("daemon.log"));

    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k1)));

    // A ConfigMap change is applied.
    cm.update(&[("addonImage", &img2), ("kernelPath", "/vmlinuz")]);
    wait_for("the upgrade", Duration::from_secs(30), || kernel_sha(&node) == Some(sha256_hex(&k2)), || d.log());

    // A bad change is logged and the node keeps the last good addon.
    cm.update(&[("addonImage", &img1), ("kernelPath", "/vmlinuz"), ("provider", "sev")]);
    wait_for("the error log", Duration::from_secs(30), || d.log().contains("keeps the last good addon"), || d.log());
    assert!(d.log().contains("provider"), "the log names the key: {}", d.log());
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k2)));

    // SIGTERM: exit 0, install kept.
    let mut d = d;
    let pid = d.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let start = Instant::now();
    let code = loop {
        if let Some(s) = d.child.try_wait().expect("try_wait") {
            break s.code();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "daemon did not exit on SIGTERM (a failure detector, not a timing bound): {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0), "{}", d.log());
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k2)));
    let st = Command::new(kata_addons_bin()).args(["status", "--root"]).arg(node.root()).output().expect("status");
    assert_eq!(st.status.code(), Some(0), "{}", show(&st));
}

#[test]
fn daemon_uninstall_then_ready() {
    let dir = tempfile::tempdir().expect("tmp");
    let k = noise(100_000, 23);
    layout_with(&dir.path().join("l"), "u1", &[("vmlinuz", &k)]);
    let node = Node::new();
    let o = Command::new(kata_addons_bin())
        .env_clear()
        .env("ADDON_IMAGE", format!("oci:{}:u1", dir.path().join("l").display()))
        .env("ADDON_KERNEL_PATH", "/vmlinuz")
        .args(["install", "--root"])
        .arg(node.root())
        .output()
        .expect("install");
    assert!(o.status.success(), "{}", show(&o));
    let ready = dir.path().join("ready");
    let mut child = Command::new(kata_addons_bin())
        .env_clear()
        .env("ADDON_ACTION", "uninstall")
        .args(["daemon", "--root"])
        .arg(node.root())
        .arg("--ready-file")
        .arg(&ready)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    wait_for("readiness", Duration::from_secs(30), || ready.exists(), String::new);
    assert!(node.config_d_entries("se").is_empty());
    let st = Command::new(kata_addons_bin()).args(["status", "--root"]).arg(node.root()).output().expect("status");
    assert_eq!(st.status.code(), Some(3));
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    assert_eq!(child.wait().expect("wait").code(), Some(0));
}

#[test]
fn daemon_fails_fast_when_the_install_cannot_succeed() {
    let node = Node::new();
    let dir = tempfile::tempdir().expect("tmp");
    let start = Instant::now();
    let o = Command::new(kata_addons_bin())
        .env_clear()
        .env("ADDON_IMAGE", format!("oci:{}/missing:v1", dir.path().display()))
        .env("ADDON_KERNEL_PATH", "/vmlinuz")
        .args(["daemon", "--root"])
        .arg(node.root())
        .arg("--ready-file")
        .arg(dir.path().join("ready"))
        .output()
        .expect("daemon");
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(!dir.path().join("ready").exists());
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing"), "{}", show(&o));
}

/// Drift repair by the periodic resync alone: with `--watch none` no change notification
/// can fire, so a deleted drop-in and an edited artifact are found and repaired only by
/// the resync, each within two periods, each with exactly one log line saying what drifted.
#[test]
fn periodic_resync_alone_repairs_drift_within_two_periods() {
    const RESYNC: f64 = 2.0;
    // The daemon sleeps `RESYNC * (0.9 + 0.2 * r)` between resyncs, r in [0, 1)
    // (`Daemon::next_resync`): at most 1.1 periods. A drift is found by the first resync
    // after it, so within one jittered period; two periods at the top of the jitter, plus
    // a margin for the repair itself (a re-pull from a local layout) and for scheduling on
    // a loaded 2-core test machine (load 6-7 while the suite runs in parallel).
    let within = Duration::from_secs_f64(2.0 * RESYNC * 1.1 + 4.0);
    let dir = tempfile::tempdir().expect("tmp");
    let k = noise(150_000, 24);
    layout_with(&dir.path().join("l"), "r1", &[("vmlinuz", &k)]);
    let node = Node::new();
    let ready = dir.path().join("ready");
    let log = dir.path().join("daemon.log");
    let child = Command::new(kata_addons_bin())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .env("ADDON_IMAGE", format!("oci:{}:r1", dir.path().join("l").display()))
        .env("ADDON_KERNEL_PATH", "/vmlinuz")
        // Debug lines (each resync's "node matches the state") make a failure readable;
        // the assertions count INFO and above only.
        .env("RUST_LOG", "info,kata_addons=debug")
        .args(["--log-format", "json", "daemon", "--watch", "none", "--start-jitter", "0"])
        .args(["--resync", &RESYNC.to_string(), "--root"])
        .arg(node.root())
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn daemon");
    let d = Daemon { child, log };
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    // The daemon says how it repairs drift right after it is ready.
    wait_for(
        "the drift repair line",
        Duration::from_secs(10),
        || !log_lines_with(&d.log(), "drift repair:").is_empty(),
        || d.log(),
    );
    let started = log_lines_with(&d.log(), "drift repair:");
    assert_eq!(started.len(), 1, "{}", d.log());
    assert_eq!(started[0]["watch"], "None", "no change notification: {}", d.log());
    let drop_in = node.config_dir("se").join("config.d/50-kata-addons.toml");
    let good_drop_in = std::fs::read(&drop_in).expect("drop-in");
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k)));

    // 1. A deleted drop-in.
    std::fs::remove_file(&drop_in).expect("rm drop-in");
    let t = Instant::now();
    wait_for("the deleted drop-in", within, || std::fs::read(&drop_in).ok() == Some(good_drop_in.clone()), || d.log());
    eprintln!("deleted drop-in repaired after {:?} (--resync {RESYNC}, --watch none)", t.elapsed());
    // The summary line of that resync is logged after the repair: give it a moment.
    wait_for(
        "the resync summary",
        Duration::from_secs(5),
        || !log_lines_with(&d.log(), "resync:").is_empty(),
        || d.log(),
    );
    let lines = log_lines_with(&d.log(), "drift repaired:");
    assert_eq!(lines.len(), 1, "exactly one line says what drifted: {}", d.log());
    let msg = lines[0]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("drop-in") && msg.contains("50-kata-addons.toml was missing"), "{msg}");
    let summary = log_lines_with(&d.log(), "resync:");
    assert!(summary.iter().all(|l| l["trigger"] == "periodic resync"), "only the resync repairs: {}", d.log());
    assert!(log_lines_with(&d.log(), "directory changed").is_empty(), "{}", d.log());

    // 2. An edited artifact: pulled again at the recorded digest.
    let kernel = node.path(&node.qemu_key("se", "kernel").expect("kernel key"));
    std::fs::write(&kernel, b"not the kernel").expect("edit kernel");
    let t = Instant::now();
    wait_for("the edited kernel", within, || kernel_sha(&node) == Some(sha256_hex(&k)), || d.log());
    eprintln!("edited kernel repaired after {:?} (--resync {RESYNC}, --watch none)", t.elapsed());
    let lines = log_lines_with(&d.log(), "was edited");
    assert_eq!(lines.len(), 1, "exactly one line says what drifted: {}", d.log());
    let msg = lines[0]["message"].as_str().unwrap_or_default();
    assert!(msg.starts_with("drift: kernel ") && msg.contains("; pulling sha256:"), "{msg}");
    assert_eq!(log_lines_with(&d.log(), "drift repaired:").len(), 1, "the drop-in did not drift again");
    assert!(log_lines_with(&d.log(), "directory changed").is_empty(), "{}", d.log());

    // 3. Nothing drifted: the next two resyncs (each logs "node matches the state" at
    // debug level) repair nothing.
    let matched = |log: &str| log.lines().filter(|l| l.contains("resync: node matches the state")).count();
    let seen = matched(&d.log());
    wait_for("two more resyncs", 2 * within, || matched(&d.log()) >= seen + 2, || d.log());
    assert_eq!(log_lines_with(&d.log(), "drift repaired:").len(), 1, "{}", d.log());
    assert_eq!(log_lines_with(&d.log(), "; pulling").len(), 1, "{}", d.log());
    assert_eq!(log_lines_with(&d.log(), "resync:").len(), 2, "one summary per repair: {}", d.log());
    let st = Command::new(kata_addons_bin()).args(["status", "--root"]).arg(node.root()).output().expect("status");
    assert_eq!(st.status.code(), Some(0), "{}", show(&st));
}

/// The DaemonSet entry point installs an OCI artifact pushed by a real ORAS client, from a
/// registry the node's registries.conf marks insecure, and follows a change to another one.
#[test]
fn daemon_installs_oci_artifacts() {
    let reg = kata_addons_tests::registry::Registry::start();
    let (k1, k2) = (noise(150_000, 31), noise(150_000, 32));
    let w = kata_addons_tests::oras::Workdir::new();
    for (tag, k) in [("v1", &k1), ("v2", &k2)] {
        w.file("vmlinuz", k);
        w.push(
            &reg.host(),
            &format!("kata/daemon:{tag}"),
            Some("application/vnd.kata-containers.kernel"),
            &["vmlinuz"],
        );
    }
    let node = Node::new();
    node.write(
        "/etc/containers/registries.conf",
        &format!("[[registry]]\nlocation = \"{}\"\ninsecure = true\n", reg.host()),
    );
    let image = |tag: &str| format!("{}/kata/daemon:{tag}", reg.host());
    let mut cm = ConfigMapDir::new(&[("addonImage", &image("v1")), ("kernelPath", "/vmlinuz")]);
    let dir = tempfile::tempdir().expect("tmp");
    let ready = dir.path().join("ready");
    let d = Daemon::start(node.root(), cm.path(), &ready, dir.path().join("daemon.log"));
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k1)), "{}", d.log());
    cm.update(&[("addonImage", &image("v2")), ("kernelPath", "/vmlinuz")]);
    wait_for("the upgrade", Duration::from_secs(60), || kernel_sha(&node) == Some(sha256_hex(&k2)), || d.log());
}
