//! The daemon's lifecycle (docs/daemon.md): SIGTERM/SIGINT end it within a bound whatever it is
//! doing, and an install it abandons leaves the old state; failed attempts back off and a
//! failing image is not downloaded on every tick; one daemon owns a node root (a second
//! one with other input refuses, `uninstall` is refused while it runs, a dead owner is
//! taken over); drift checks compare metadata and hash only what changed.
//!
//! Real parts: the kata-addons binary, the Debian registry behind the fault-injecting
//! proxy, flock(1) holding the node lock, real directories. Every wait is on a file or a
//! log line; the timeouts are failure detectors, never measurements.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kata_addons_tests::daemon::{ConfigMapDir, Daemon, json_lines_with, log_lines_with, wait_for};
use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::node::{Node, content_snapshot, layout_with, noise};
use kata_addons_tests::prometheus::{free_port, get};
use kata_addons_tests::proxy::{Proxy, Rules};
use kata_addons_tests::registry::Registry;
use kata_addons_tests::{kata_addons_bin, run_kata_env, sha256_hex, show};

/// The failure detector for "exits within 2 s": generous, so a loaded machine cannot fail
/// it, yet far below what an install that ignores the signal takes (the --timeout of 30 s).
const EXIT_DETECTOR: Duration = Duration::from_secs(12);

const ADDONS: &str = "/etc/kata-containers/addons";

fn kernel_sha(node: &Node) -> Option<String> {
    let k = node.qemu_key("se", "kernel")?;
    std::fs::read(node.path(&k)).ok().map(|d| sha256_hex(&d))
}

/// What an install leaves: the install directory (without what a killed run leaves for
/// the next run to sweep, and without the owner record, which is the daemon's, not the
/// install's) and the drop-in.
fn installed(node: &Node) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = content_snapshot(&node.path(ADDONS))
        .into_iter()
        .filter(|(k, _)| !k.starts_with('.') && k != "owner.json")
        .collect();
    let drop_in = node.config_dir("se").join("config.d/50-kata-addons.toml");
    out.push(("drop-in".into(), std::fs::read_to_string(drop_in).unwrap_or_default()));
    out
}

fn status(node: &Node) -> std::process::Output {
    Command::new(kata_addons_bin()).args(["status", "--root"]).arg(node.root()).output().expect("status")
}

/// In-image files (name, content) of one image.
type Files<'a> = &'a [(&'a str, &'a [u8])];

/// A registry with `kata/k:<tag>` images (one layer each) behind a proxy the node's
/// registries.conf names as an insecure registry.
struct Images {
    _reg: Registry,
    proxy: Proxy,
}

impl Images {
    fn new(node: &Node, images: &[(&str, Files)]) -> (Images, Vec<(String, String)>) {
        let reg = Registry::start();
        let mut digests = Vec::new();
        for (tag, files) in images {
            let mut layer = LayerBuilder::new();
            for (name, data) in *files {
                layer.file(name, data);
            }
            let layer = layer.build(Compress::Gzip);
            let layer_digest = layer.digest.clone();
            let manifest = reg.push("kata/k", tag, &Image::new(vec![layer]));
            digests.push((manifest, layer_digest));
        }
        let proxy = Proxy::start(reg.addr, Rules::default());
        node.write(
            "/etc/containers/registries.conf",
            &format!("[[registry]]\nlocation = \"{}\"\ninsecure = true\n", proxy.host()),
        );
        (Images { _reg: reg, proxy }, digests)
    }

    fn image(&self, tag: &str) -> String {
        format!("{}/kata/k:{tag}", self.proxy.host())
    }
}

/// SIGTERM while a pull stalls: the daemon exits 0 within the bound, and the node keeps
/// the old install exactly (state, files, drop-in), as after a crash.
#[test]
fn sigterm_during_a_stalled_pull_exits_at_once_and_keeps_the_old_install() {
    let node = Node::new();
    let (k1, k2) = (noise(150_000, 41), noise(2_000_000, 42));
    let (imgs, digests) = Images::new(&node, &[("v1", &[("vmlinuz", &k1)]), ("v2", &[("vmlinuz", &k2)])]);
    let mut cm = ConfigMapDir::new(&[("addonImage", &imgs.image("v1")), ("kernelPath", "/vmlinuz")]);
    let dir = tempfile::tempdir().expect("tmp");
    let ready = dir.path().join("ready");
    let mut d = Daemon::start(node.root(), cm.path(), &ready, dir.path().join("daemon.log"));
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k1)));
    let before = installed(&node);

    // v2's layer stalls after 64 KiB: the pull is in progress when the signal comes.
    imgs.proxy.set_rules(Rules { stall_blob_after: Some(64 << 10), ..Rules::default() });
    cm.update(&[("addonImage", &imgs.image("v2")), ("kernelPath", "/vmlinuz")]);
    let v2_layer = &digests[1].1;
    wait_for(
        "the v2 layer download",
        Duration::from_secs(30),
        || !imgs.proxy.requests_matching(v2_layer).is_empty(),
        || d.log(),
    );
    d.signal("TERM");
    assert_eq!(d.wait_exit(EXIT_DETECTOR), Some(0), "{}", d.log());
    assert!(d.log().contains("SIGTERM"), "{}", d.log());
    assert_eq!(installed(&node), before, "the interrupted install changed the node:\n{}", d.log());
    let st = status(&node);
    assert_eq!(st.status.code(), Some(0), "{}", show(&st));
}

/// SIGINT while the daemon waits for the node lock (flock(1) on the node root holds it, as
/// another run would): it exits 0 within the bound instead of waiting out --lock-timeout.
#[test]
fn sigint_while_waiting_for_the_node_lock_exits_at_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let (k1, k2) = (noise(100_000, 43), noise(100_000, 44));
    layout_with(&dir.path().join("l1"), "v1", &[("vmlinuz", &k1)]);
    layout_with(&dir.path().join("l2"), "v2", &[("vmlinuz", &k2)]);
    let node = Node::new();
    let img = |n: &str, t: &str| format!("oci:{}:{t}", dir.path().join(n).display());
    let mut cm = ConfigMapDir::new(&[("addonImage", &img("l1", "v1")), ("kernelPath", "/vmlinuz")]);
    let ready = dir.path().join("ready");
    let mut d = Daemon::start(node.root(), cm.path(), &ready, dir.path().join("daemon.log"));
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    let before = installed(&node);

    // Another run holds the node lock until its stdin closes.
    let marker = dir.path().join("locked");
    let mut holder = Command::new("flock")
        .arg(node.root())
        .arg("-c")
        .arg(format!("touch '{}'; exec cat >/dev/null", marker.display()))
        .stdin(Stdio::piped())
        .spawn()
        .expect("flock(1)");
    wait_for("flock(1) to hold the lock", Duration::from_secs(10), || marker.exists(), String::new);
    cm.update(&[("addonImage", &img("l2", "v2")), ("kernelPath", "/vmlinuz")]);
    wait_for("the lock wait", Duration::from_secs(30), || d.log().contains("holds the node lock; waiting"), || d.log());
    d.signal("INT");
    assert_eq!(d.wait_exit(EXIT_DETECTOR), Some(0), "{}", d.log());
    drop(holder.stdin.take());
    let _ = holder.wait();
    assert_eq!(installed(&node), before, "{}", d.log());
}

/// A valid image without the file the ConfigMap asks for: each attempt downloads its layer
/// once, attempts are spaced by the backoff (1 s doubling to 4 s here, less at most 25 %),
/// the log and the readiness file give the next attempt, the node keeps v1, and a changed
/// ConfigMap is applied at once.
#[test]
fn a_failing_image_backs_off_and_is_not_downloaded_on_every_tick() {
    let node = Node::new();
    let (k1, other, k3) = (noise(100_000, 45), noise(1 << 20, 46), noise(100_000, 47));
    let (imgs, digests) = Images::new(
        &node,
        &[("v1", &[("vmlinuz", &k1)]), ("v2", &[("not-the-kernel", &other)]), ("v3", &[("vmlinuz", &k3)])],
    );
    let mut cm = ConfigMapDir::new(&[("addonImage", &imgs.image("v1")), ("kernelPath", "/vmlinuz")]);
    let dir = tempfile::tempdir().expect("tmp");
    let ready = dir.path().join("ready");
    let d = Daemon::spawn(
        &["--log-format", "json"],
        &["--failure-backoff", "1", "--failure-backoff-max", "4"],
        node.root(),
        Some(cm.path()),
        &ready,
        dir.path().join("daemon.log"),
    );
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());

    cm.update(&[("addonImage", &imgs.image("v2")), ("kernelPath", "/vmlinuz")]);
    let failures = || log_lines_with(&d.log(), "could not be applied");
    wait_for("four failed attempts", Duration::from_secs(90), || failures().len() >= 4, || d.log());
    let fails = failures();
    let v2_layer = &digests[1].1;
    let gets: Vec<_> = imgs
        .proxy
        .events()
        .into_iter()
        .filter(|e| e.line.starts_with("GET") && e.line.contains(v2_layer.as_str()))
        .collect();
    // One download per attempt (the attempt after the last logged one may have started),
    // whereas the daemon ticked every 0.2 s all along.
    assert!(gets.len() <= fails.len() + 1, "{} downloads for {} attempts:\n{}", gets.len(), fails.len(), d.log());
    // Spacing as the registry side saw it: after failure k the wait is at least 75 % of
    // min(1 s · 2^(k-1), 4 s).
    for (k, w) in gets.windows(2).enumerate() {
        let floor = Duration::from_secs_f64(0.75 * f64::min(2f64.powi(k as i32), 4.0));
        let gap = w[1].at.duration_since(w[0].at);
        assert!(
            gap >= floor,
            "attempt {} came {gap:?} after the one before (backoff floor {floor:?}):\n{}",
            k + 2,
            d.log()
        );
    }
    for (k, l) in fails.iter().enumerate() {
        assert_eq!(l["failures"], k as u64 + 1, "{l}");
        assert_eq!(l["image_digest"], digests[1].0.as_str(), "the failed image is remembered by digest: {l}");
        assert!(l["next_attempt"].as_str().is_some_and(|s| s.ends_with("GMT")), "{l}");
        assert!(l["message"].as_str().is_some_and(|m| m.contains("next attempt at")), "{l}");
    }
    let readiness = std::fs::read_to_string(&ready).expect("ready file");
    assert!(readiness.starts_with("ready\n"), "{readiness}");
    assert!(readiness.contains("failing: ") && readiness.contains("retry: next attempt at "), "{readiness}");
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k1)), "the node keeps the last good addon");
    // The readiness probe's view: ready (the node keeps v1), with the retry.
    let ready_s = ready.to_str().expect("utf8");
    let o = run_kata_env(&["status", "--root", node.root().to_str().expect("utf8"), "--ready-file", ready_s], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("daemon: ready") && out.contains("retry: next attempt at "), "{}", show(&o));

    // Another input is not held back by v2's backoff.
    cm.update(&[("addonImage", &imgs.image("v3")), ("kernelPath", "/vmlinuz")]);
    wait_for("v3", Duration::from_secs(60), || kernel_sha(&node) == Some(sha256_hex(&k3)), || d.log());
    wait_for(
        "the readiness file without the retry",
        Duration::from_secs(10),
        || std::fs::read_to_string(&ready).is_ok_and(|r| !r.contains("retry:")),
        || d.log(),
    );
}

fn owner_pid(node: &Node) -> Option<u64> {
    let text = std::fs::read_to_string(node.path(&format!("{ADDONS}/owner.json"))).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["pid"].as_u64()
}

/// Two daemons, one root: the second, with another ConfigMap, refuses to act (not ready,
/// the log names the owner) and nothing is reinstalled; one with the same ConfigMap stands
/// by, ready; when the owner is killed (its record stays), the waiting one takes over.
#[test]
fn one_daemon_owns_a_root_and_a_dead_owner_is_taken_over() {
    let dir = tempfile::tempdir().expect("tmp");
    let (k1, k2) = (noise(100_000, 48), noise(100_000, 49));
    layout_with(&dir.path().join("l1"), "v1", &[("vmlinuz", &k1)]);
    layout_with(&dir.path().join("l2"), "v2", &[("vmlinuz", &k2)]);
    let img = |n: &str, t: &str| format!("oci:{}:{t}", dir.path().join(n).display());
    let node = Node::new();
    let data_a = [("addonImage", img("l1", "v1")), ("kernelPath", "/vmlinuz".to_string())];
    let data_a: Vec<(&str, &str)> = data_a.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let cm_a = ConfigMapDir::new(&data_a);
    let json = ["--log-format", "json"];
    // Each daemon serves metrics: `kata_addons_ready` is the readiness file's decision.
    let spawn = |name: &str, cm: &Path| {
        let ready = dir.path().join(format!("ready-{name}"));
        let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let m = addr.to_string();
        let args = ["--metrics-address", m.as_str()];
        let d = Daemon::spawn(&json, &args, node.root(), Some(cm), &ready, dir.path().join(format!("{name}.log")));
        (d, ready, addr)
    };
    let ready_metric = |addr: std::net::SocketAddr| {
        get(addr, "/metrics", &[]).ok().and_then(|(_, t)| {
            t.lines().find_map(|l| l.strip_prefix("kata_addons_ready ").map(|v| v.trim().to_string()))
        })
    };
    let (mut a, ready_a, _) = spawn("a", cm_a.path());
    wait_for("a ready", Duration::from_secs(60), || ready_a.exists(), || a.log());
    assert_eq!(owner_pid(&node), Some(u64::from(a.child.id())), "{}", a.log());
    let pid_a = format!("pid {} ", a.child.id());

    // Same input: stands by, ready, names the owner.
    let cm_c = ConfigMapDir::new(&data_a);
    let (mut c, ready_c, metrics_c) = spawn("c", cm_c.path());
    wait_for("c standing by", Duration::from_secs(30), || ready_c.exists(), || c.log());
    wait_for("c's ready 1", Duration::from_secs(30), || ready_metric(metrics_c).as_deref() == Some("1"), || c.log());
    let readiness = std::fs::read_to_string(&ready_c).expect("ready c");
    assert!(readiness.contains("standby: owned by the daemon ") && readiness.contains(&pid_a), "{readiness}");
    c.signal("TERM");
    assert_eq!(c.wait_exit(EXIT_DETECTOR), Some(0), "{}", c.log());
    assert_eq!(owner_pid(&node), Some(u64::from(a.child.id())), "a standby's exit leaves the owner's record");

    // Other input: refuses, not ready, nothing reinstalled.
    let before = installed(&node);
    let cm_b = ConfigMapDir::new(&[("addonImage", &img("l2", "v2")), ("kernelPath", "/vmlinuz")]);
    let (b, ready_b, metrics_b) = spawn("b", cm_b.path());
    wait_for(
        "b refusing",
        Duration::from_secs(30),
        || !log_lines_with(&b.log(), "refusing to act").is_empty(),
        || b.log(),
    );
    let refusal = &log_lines_with(&b.log(), "refusing to act")[0];
    assert!(refusal["owner"].as_str().is_some_and(|o| o.starts_with(&pid_a)), "the log names the owner: {refusal}");
    assert!(!ready_b.exists(), "a refusing daemon is not ready");
    assert_eq!(ready_metric(metrics_b).as_deref(), Some("0"), "and says so in its metrics: {}", b.log());
    let probe = |ready: &Path| {
        run_kata_env(
            &["status", "--root", node.root().to_str().expect("utf8"), "--ready-file", ready.to_str().expect("utf8")],
            &[],
        )
    };
    let o = probe(&ready_b);
    assert_eq!(o.status.code(), Some(1), "the readiness probe fails for it: {}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the daemon is not ready"), "{}", show(&o));
    assert_eq!(probe(&ready_a).status.code(), Some(0), "the owner is ready");
    assert_eq!(installed(&node), before, "{}\n{}", a.log(), b.log());
    assert!(log_lines_with(&a.log(), "reconciling").is_empty(), "the owner did not reinstall: {}", a.log());

    // The owner is killed: b takes over and applies its input.
    a.signal("KILL");
    let _ = a.wait_exit(EXIT_DETECTOR);
    wait_for("b ready", Duration::from_secs(60), || ready_b.exists(), || b.log());
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k2)), "{}", b.log());
    let took = log_lines_with(&b.log(), "previous owner no longer runs");
    assert!(took.first().is_some_and(|l| l["owner"].as_str().is_some_and(|o| o.starts_with(&pid_a))), "{}", b.log());
    assert_eq!(owner_pid(&node), Some(u64::from(b.child.id())));
}

/// `uninstall` and `install` while a daemon owns the root are refused (exit 1, naming it),
/// the node unchanged; `--force` overrides; after the daemon's clean exit `uninstall` succeeds and
/// the node is clean. A stale record (a process of another boot) is taken over.
#[test]
fn uninstall_and_install_are_refused_while_a_daemon_owns_the_root() {
    let dir = tempfile::tempdir().expect("tmp");
    let k = noise(100_000, 50);
    layout_with(&dir.path().join("l"), "v1", &[("vmlinuz", &k)]);
    let node = Node::new();
    std::fs::create_dir_all(node.path(ADDONS)).expect("mkdir");
    std::fs::write(
        node.path(&format!("{ADDONS}/owner.json")),
        r#"{"pid": 3999999, "host": "old", "bootId": "00000000-0000-0000-0000-000000000000", "started": 1, "input": "sha256:00"}"#,
    )
    .expect("stale record");
    let cm = ConfigMapDir::new(&[
        ("addonImage", &format!("oci:{}:v1", dir.path().join("l").display())),
        ("kernelPath", "/vmlinuz"),
    ]);
    let ready = dir.path().join("ready");
    let mut d =
        Daemon::spawn(&["--log-format", "json"], &[], node.root(), Some(cm.path()), &ready, dir.path().join("d.log"));
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    let took = log_lines_with(&d.log(), "previous owner no longer runs");
    assert!(
        took.first().is_some_and(|l| l["owner"].as_str().is_some_and(|o| o.starts_with("pid 3999999 on old"))),
        "{}",
        d.log()
    );
    let pid = format!("pid {} ", d.child.id());

    let before = kata_addons_tests::node::snapshot(node.root());
    let root = node.root().to_str().expect("utf8");
    let o = run_kata_env(&["uninstall", "--root", root], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&pid) && err.contains("--force"), "the refusal names the owner and the way out: {}", show(&o));
    assert_eq!(kata_addons_tests::node::snapshot(node.root()), before, "a refused uninstall changed the node");
    // So is a hand-run `install`: the daemon would put back the addon of its own ConfigMap.
    let cm_dir = cm.path().to_str().expect("utf8");
    let o = run_kata_env(&["install", "--configmap-dir", cm_dir, "--root", root], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("install refused") && err.contains(&pid) && err.contains("--force"),
        "the refusal names the owner and the way out: {}",
        show(&o)
    );
    assert_eq!(kata_addons_tests::node::snapshot(node.root()), before, "a refused install changed the node");

    let o = run_kata_env(&["uninstall", "--root", root, "--force"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&pid), "--force warns naming the owner: {}", show(&o));
    // As the warning says, the running daemon puts the addon back.
    wait_for(
        "the daemon's reinstall",
        Duration::from_secs(60),
        || kernel_sha(&node) == Some(sha256_hex(&k)),
        || d.log(),
    );
    wait_for("a clean state", Duration::from_secs(30), || status(&node).status.code() == Some(0), || d.log());

    d.signal("TERM");
    assert_eq!(d.wait_exit(EXIT_DETECTOR), Some(0), "{}", d.log());
    assert_eq!(owner_pid(&node), None, "a clean exit removes the owner record");
    let o = run_kata_env(&["uninstall", "--root", root], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(!node.path(ADDONS).exists(), "{}", show(&o));
    assert!(node.config_d_entries("se").is_empty(), "{}", show(&o));
}

/// A daemon (JSON log, `args`, `env`) installing a kernel `k` from an OCI layout in `dir`
/// onto a fresh node, ready and watching; the ConfigMap volume is returned to keep it.
fn watching_daemon(dir: &Path, k: &[u8], args: &[&str], env: &[(&str, &str)]) -> (Node, ConfigMapDir, Daemon) {
    layout_with(&dir.join("l"), "v1", &[("vmlinuz", k)]);
    let node = Node::new();
    let cm = ConfigMapDir::new(&[
        ("addonImage", &format!("oci:{}:v1", dir.join("l").display())),
        ("kernelPath", "/vmlinuz"),
    ]);
    let ready = dir.join("ready");
    let d = Daemon::spawn_env(
        &["--log-format", "json"],
        args,
        env,
        node.root(),
        Some(cm.path()),
        &ready,
        dir.join("d.log"),
    );
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    wait_for(
        "the watch",
        Duration::from_secs(10),
        || !log_lines_with(&d.log(), "drift repair:").is_empty(),
        || d.log(),
    );
    (node, cm, d)
}

/// Event-triggered checks compare metadata: an unrelated config.d file rewritten again and
/// again causes no hash of the installed kernel; a changed kernel is still hashed and
/// repaired by the next event-triggered check.
#[test]
fn drift_checks_hash_only_changed_files() {
    let dir = tempfile::tempdir().expect("tmp");
    let k = noise(1 << 20, 51);
    let (node, _cm, d) =
        watching_daemon(dir.path(), &k, &["--watch", "inotify"], &[("RUST_LOG", "info,kata_addons=debug")]);
    let checks = || json_lines_with(&d.log(), "installed files checked");
    let unrelated = node.config_dir("se").join("config.d/90-unrelated.toml");
    for i in 0..6 {
        let n = checks().len();
        std::fs::write(&unrelated, format!("# rewrite {i}\n")).expect("rewrite");
        wait_for("the check after a rewrite", Duration::from_secs(30), || checks().len() > n, || d.log());
    }
    let lines = checks();
    assert!(lines.len() >= 6, "{}", d.log());
    for l in &lines {
        assert_eq!((l["hashed"].as_u64(), l["unchanged"].as_u64()), (Some(0), Some(1)), "a hash without a change: {l}");
    }

    let kernel = node.path(&node.qemu_key("se", "kernel").expect("kernel key"));
    std::fs::write(&kernel, b"not the kernel").expect("edit kernel");
    std::fs::write(&unrelated, "# one more\n").expect("rewrite");
    wait_for("the repaired kernel", Duration::from_secs(60), || kernel_sha(&node) == Some(sha256_hex(&k)), || d.log());
    assert!(checks().iter().any(|l| l["hashed"] == 1), "the changed kernel was hashed: {}", d.log());
}

/// Seconds of the day of a JSON log line's `timestamp` (`…T01:05:34.137510Z`).
fn time_of_day(line: &serde_json::Value) -> f64 {
    let ts = line["timestamp"].as_str().expect("timestamp");
    let t = ts.split_once('T').map(|(_, t)| t.trim_end_matches('Z')).expect("RFC 3339");
    let parts: Vec<f64> = t.split(':').map(|p| p.parse().expect("number")).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

/// Something deletes the drop-in again and again: the first repairs run at once, then a
/// repair needed again soon after the last one waits (3 s here, less at most 25 %), with a
/// warning that names the next check; the drop-in comes back each time.
#[test]
fn repairs_undone_again_and_again_are_rate_limited() {
    let dir = tempfile::tempdir().expect("tmp");
    let k = noise(100_000, 52);
    let flags = ["--watch", "inotify", "--failure-backoff", "3", "--failure-backoff-max", "60"];
    let (node, _cm, d) = watching_daemon(dir.path(), &k, &flags, &[]);
    let drop_in = node.config_dir("se").join("config.d/50-kata-addons.toml");
    let good = std::fs::read(&drop_in).expect("drop-in");
    let repaired = || log_lines_with(&d.log(), "drift repaired:");
    for n in 1..=3 {
        std::fs::remove_file(&drop_in).expect("rm drop-in");
        wait_for(
            "the repair",
            Duration::from_secs(60),
            || repaired().len() >= n && std::fs::read(&drop_in).ok().as_ref() == Some(&good),
            || d.log(),
        );
    }
    let lines = repaired();
    assert_eq!(lines.len(), 3, "one repair per deletion: {}", d.log());
    let warned = log_lines_with(&d.log(), "drift came back after a repair");
    assert!(!warned.is_empty() && warned[0]["next_check"].as_str().is_some_and(|s| s.ends_with("GMT")), "{}", d.log());
    let gap = time_of_day(&lines[2]) - time_of_day(&lines[1]);
    assert!(
        gap >= 0.75 * 3.0,
        "the third repair came {gap:.2} s after the second, inside the 3 s backoff:\n{}",
        d.log()
    );
}

/// The readiness probe (`status --ready-file`, every 30 s) checks the artifacts by presence
/// and size only, leaving hashes to the daemon (metadata-triggered, and every
/// `--verify-interval`): a same-size edit is left to the daemon, while a truncated artifact
/// fails the probe, naming the file. Plain `status` still hashes everything.
#[test]
fn the_readiness_probe_checks_artifacts_by_size_and_status_by_hash() {
    let dir = tempfile::tempdir().expect("tmp");
    let k = noise(100_000, 60);
    layout_with(&dir.path().join("l"), "v1", &[("vmlinuz", &k)]);
    let node = Node::new();
    let root = node.root().to_str().expect("utf8").to_string();
    let image = format!("oci:{}:v1", dir.path().join("l").display());
    let o = run_kata_env(
        &["install", "--root", &root],
        &[("ADDON_IMAGE", image.as_str()), ("ADDON_KERNEL_PATH", "/vmlinuz")],
    );
    assert!(o.status.success(), "{}", show(&o));
    let ready = dir.path().join("ready");
    std::fs::write(&ready, "ready\n").expect("ready file");
    let ready = ready.to_str().expect("utf8");
    let kernel = node.path(&node.qemu_key("se", "kernel").expect("kernel"));
    let probe = || run_kata_env(&["status", "--root", &root, "--ready-file", ready], &[]);
    assert_eq!(probe().status.code(), Some(0), "{}", show(&probe()));

    let mut edited = k.clone();
    edited[10] ^= 1;
    std::fs::write(&kernel, &edited).expect("same-size edit");
    assert_eq!(probe().status.code(), Some(0), "the probe does not hash: {}", show(&probe()));
    let full = status(&node);
    assert_eq!(full.status.code(), Some(4), "{}", show(&full));
    assert!(String::from_utf8_lossy(&full.stdout).contains("sha256"), "{}", show(&full));

    std::fs::write(&kernel, &k[..1000]).expect("truncate");
    let o = probe();
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("1000 bytes, expected 100000"), "{}", show(&o));
}
