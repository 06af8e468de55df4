//! Hostile node configuration and ConfigMaps, against the real binary: a symlink loop in
//! CRI-O's drop-in directory, a containerd import fan-out, a ConfigMap nested 520,000
//! levels deep, 20,000 RuntimeClass handlers, a mounted ConfigMap key leading out of the
//! mount, and bidirectional-override characters in an error. Each refusal exits 1 or 2
//! as the contract says, names the file or key, takes well under 10 s of CPU in a release build (a generous failure
//! detector, not a timing assertion), at most 128 MiB of peak RSS (the DaemonSet's limit,
//! measured through `/proc` and `/usr/bin/time`), never panics or aborts, and leaves the
//! node as it was; the daemon survives each as a ConfigMap change and as a node edit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kata_addons_tests::cri::KataDeploy;
use kata_addons_tests::daemon::{ConfigMapDir, Daemon, wait_for};
use kata_addons_tests::hostile::{NODE_SHIM, containerd_fan_out, crio_loops, nested_configmap};
use kata_addons_tests::kata_addons_bin;
use kata_addons_tests::measure::{Measured, run_measured};
use kata_addons_tests::node::{Node, content_snapshot, layout_with, noise};

/// A refusal that costs more CPU than this is a hang (a failure detector; an unoptimised
/// binary compiles the policy in a fresh HOME for up to ~5 s of it).
const CPU_BOUND: Duration = Duration::from_secs(30);
/// Wall time bound (the machine running the tests may be loaded: a failure detector only).
const TIME_BOUND: Duration = Duration::from_secs(120);
/// The DaemonSet's memory limit.
const RSS_LIMIT_MIB: f64 = 128.0;
/// A run still going after this is killed (and fails its assertions).
const KILL_AFTER: Duration = Duration::from_secs(60);
/// The kata-deploy shim the RuntimeClass cases target.
const SHIM: &str = NODE_SHIM.0;
/// Its handler.
const HANDLER: &str = NODE_SHIM.1;

/// The node without the lock file the runner keeps under `/run`.
fn snap(node: &Node) -> BTreeMap<String, String> {
    let mut m = content_snapshot(node.root());
    m.retain(|k, _| !k.starts_with("run"));
    m
}

/// An SNP node as kata-deploy sets it up for CRI-O: the shim's configuration and the
/// CRI-O drop-in defining its handler.
fn crio_node() -> Node {
    let node = Node::new();
    let kd = KataDeploy::new(&node);
    kd.install_shim(SHIM);
    kd.crio_drop_in(&[SHIM], &[]);
    node
}

/// A kernel addon in an OCI layout under `dir`; its `oci:` reference.
fn addon(dir: &Path) -> String {
    layout_with(&dir.join("l"), "v1", &[("boot/vmlinuz", &noise(60_000, 7))]);
    format!("oci:{}:v1", dir.join("l").display())
}

/// A ConfigMap file holding `data` (values quoted as JSON strings, which YAML reads as they are).
fn configmap(dir: &Path, name: &str, data: &[(&str, &str)]) -> PathBuf {
    let mut text = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kata-addon-artifacts\ndata:\n");
    for (k, v) in data {
        text.push_str(&format!("  {k}: {}\n", serde_json::to_string(v).expect("json string")));
    }
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write ConfigMap");
    p
}

/// The addon's ConfigMap keys, with `runtimeClass` when given.
fn data<'a>(image: &'a str, runtime_class: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut d = vec![("addonImage", image), ("provider", "snp"), ("kernelPath", "/boot/vmlinuz")];
    if let Some(rc) = runtime_class {
        d.push(("runtimeClass", rc));
    }
    d
}

/// `kata-addons ARGS --root NODE`, measured.
fn run(node: &Node, args: &[&str]) -> Measured {
    let root = node.root().to_str().expect("utf-8 root");
    let mut all = args.to_vec();
    all.extend(["--root", root]);
    run_measured(&kata_addons_bin(), &all, KILL_AFTER)
}

/// Exited on its own, without a panic or an abort, within the time bound and the memory limit.
fn bounded(m: &Measured, what: &str) {
    eprintln!(
        "cost of {what}: exit {:?}, peak RSS {:.1} MiB, CPU {:.2} s, wall {:.2} s",
        m.code,
        m.peak_rss_mib(),
        m.cpu.as_secs_f64(),
        m.wall.as_secs_f64()
    );
    assert!(m.signal.is_none(), "{what}: killed or aborted\n{}", m.summary());
    assert!(!m.stderr.contains("panicked"), "{what}: panicked\n{}", m.summary());
    assert!(m.wall < TIME_BOUND, "{what}: not done within {TIME_BOUND:?}\n{}", m.summary());
    assert!(m.cpu < CPU_BOUND, "{what}: more than {CPU_BOUND:?} of CPU\n{}", m.summary());
    assert!(m.peak_rss_mib() <= RSS_LIMIT_MIB, "{what}: peak RSS over {RSS_LIMIT_MIB} MiB\n{}", m.summary());
}

/// Refused with `code`, naming each of `needles`, node unchanged.
fn refused(node: &Node, before: &BTreeMap<String, String>, m: &Measured, code: i32, needles: &[&str], what: &str) {
    bounded(m, what);
    assert_eq!(m.code, Some(code), "{what}\n{}", m.summary());
    for n in needles {
        assert!(m.stderr.contains(n), "{what}: stderr lacks {n:?}\n{}", m.summary());
    }
    assert_eq!(&snap(node), before, "{what}: the node changed");
}

/// `install` with the handler is refused (exit 1, node unchanged, `needles` in the message)
/// over the node's `what`; `install` of the standard configurations and `uninstall` go on,
/// each within the bounds.
fn refused_for_the_handler_only(
    node: &Node,
    dir: &Path,
    image: &str,
    before: &BTreeMap<String, String>,
    needles: &[&str],
    what: &str,
) {
    let rc = configmap(dir, "rc.yaml", &data(image, Some(HANDLER)));
    let m = run(node, &["install", "--configmap", rc.to_str().expect("utf-8")]);
    refused(node, before, &m, 1, needles, &format!("install with runtimeClass over {what}"));
    let plain = configmap(dir, "plain.yaml", &data(image, None));
    let m = run(node, &["install", "--configmap", plain.to_str().expect("utf-8")]);
    bounded(&m, &format!("install over {what}"));
    assert_eq!(m.code, Some(0), "{}", m.summary());
    let m = run(node, &["uninstall"]);
    bounded(&m, &format!("uninstall over {what}"));
    assert_eq!(m.code, Some(0), "{}", m.summary());
}

fn remove_crio_loops(node: &Node) {
    for i in 0..5 {
        std::fs::remove_file(node.path(&format!("/etc/crio/crio.conf.d/loop{i}"))).expect("rm loop link");
    }
}

/// Loop links in crio.conf.d (CRI-O reads each as a file and fails to load its
/// configuration): `install` with the handler refuses naming the first link, within the
/// bounds; `install` of the standard configurations and `uninstall` go on (they read the
/// CRI configuration only for the handlers it defines), also within the bounds. Before:
/// past 400 s each (the walk followed every link 8 levels deep).
#[test]
fn crio_symlink_loops_are_refused_at_once() {
    let node = crio_node();
    let dir = tempfile::tempdir().expect("tmp");
    let image = addon(dir.path());
    crio_loops(node.root());
    let before = snap(&node);
    refused_for_the_handler_only(
        &node,
        dir.path(),
        &image,
        &before,
        &["/etc/crio/crio.conf.d/loop0 is a symlink to a directory", HANDLER],
        "crio.conf.d loops",
    );
}

/// Real directories deeper than CRI-O's drop-ins ever are: refused naming the directory,
/// not walked without end.
#[test]
fn crio_drop_in_directories_nested_too_deep_are_refused() {
    let node = crio_node();
    let dir = tempfile::tempdir().expect("tmp");
    let image = addon(dir.path());
    let deep: String = (0..12).map(|i| format!("/d{i}")).collect();
    node.write(&format!("/etc/crio/crio.conf.d{deep}/x.conf"), "");
    let before = snap(&node);
    let rc = configmap(dir.path(), "rc.yaml", &data(&image, Some(HANDLER)));
    let m = run(&node, &["install", "--configmap", rc.to_str().expect("utf-8")]);
    refused(&node, &before, &m, 1, &["levels deep", "/etc/crio/crio.conf.d/d0/d1"], "deep crio.conf.d");
}

/// 255 containerd files of about 1 MB, each importing all the others: each file is read
/// once and the load stops, naming the file, at the byte total; the handler is refused
/// (its runtime's configuration is not read whole), the standard install and `uninstall`
/// go on. Before: 1.26 GB peak RSS and 16.6 s before the refusal.
#[test]
fn containerd_import_fan_out_is_bounded() {
    let node = Node::new();
    let kd = KataDeploy::new(&node);
    kd.install_shim(SHIM);
    containerd_fan_out(node.root(), 255, 1_000_000);
    let dir = tempfile::tempdir().expect("tmp");
    let image = addon(dir.path());
    let before = snap(&node);
    refused_for_the_handler_only(
        &node,
        dir.path(),
        &image,
        &before,
        &["/etc/containerd/conf.d/f0", "bytes together, the most kata-addons reads", HANDLER],
        "an import fan-out",
    );
}

/// `addonImage: [[[…]]]` nested 20,000 and 520,000 levels (under the 1 MiB cap): exit 2
/// naming the key and the limit, for `preview` and `install`, checked while parsing.
/// Before: 2.5 s and past 900 s.
#[test]
fn deeply_nested_yaml_is_refused_while_parsing() {
    let node = Node::new();
    let dir = tempfile::tempdir().expect("tmp");
    for levels in [20_000, 520_000] {
        let text = nested_configmap(levels);
        assert!(text.len() < 1 << 20);
        let cm = dir.path().join(format!("deep-{levels}.yaml"));
        std::fs::write(&cm, text).expect("write");
        let before = snap(&node);
        for cmd in ["preview", "install"] {
            let m = if cmd == "preview" {
                run_measured(&kata_addons_bin(), &["preview", "--configmap", cm.to_str().expect("utf-8")], KILL_AFTER)
            } else {
                run(&node, &[cmd, "--configmap", cm.to_str().expect("utf-8")])
            };
            refused(
                &node,
                &before,
                &m,
                2,
                &["nested more than 64 deep under `addonImage`", cm.to_str().expect("utf-8")],
                &format!("{cmd} of a ConfigMap nested {levels} levels"),
            );
        }
    }
}

/// 20,000 RuntimeClass handlers: exit 2 naming the key and the limit, within the policy's
/// deadline. Before: exit 1, the 1 s policy deadline hit (the dedupe was quadratic).
#[test]
fn twenty_thousand_runtime_classes_are_a_limit_on_the_key() {
    let node = crio_node();
    let dir = tempfile::tempdir().expect("tmp");
    let image = addon(dir.path());
    let handlers: Vec<String> = (0..20_000).map(|i| format!("kata-{i}")).collect();
    let handlers = handlers.join(",");
    let cm = configmap(dir.path(), "many.yaml", &data(&image, Some(&handlers)));
    let before = snap(&node);
    let m = run(&node, &["install", "--configmap", cm.to_str().expect("utf-8")]);
    refused(&node, &before, &m, 2, &["runtimeClass", "20000 comma-separated entries: at most 64"], "20,000 handlers");
}

/// A mounted ConfigMap key that is a symlink out of the mount (absolute, or climbing out
/// with `..`): exit 2 naming the key; nothing of the target is read or shown. kubelet's
/// own layout (`key -> ..data/key`, `..data -> ..<timestamp>`) is read as before.
#[test]
fn configmap_dir_keys_must_stay_inside_the_mount() {
    let node = Node::new();
    let dir = tempfile::tempdir().expect("tmp");
    let image = addon(dir.path());
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "quay.io/TOPSECRET-CONTENT/never-shown:v1").expect("secret");
    let before = snap(&node);
    for target in [secret.display().to_string(), "../secret".to_string()] {
        let cm = dir.path().join(format!("cm-{}", target.len()));
        std::fs::create_dir(&cm).expect("mkdir");
        std::fs::write(cm.join("kernelPath"), "/boot/vmlinuz").expect("key");
        std::os::unix::fs::symlink(&target, cm.join("addonImage")).expect("key link");
        let m = run(&node, &["install", "--configmap-dir", cm.to_str().expect("utf-8")]);
        refused(
            &node,
            &before,
            &m,
            2,
            &["ConfigMap key addonImage", "leading out of the directory"],
            &format!("a key linked to {target}"),
        );
        assert!(!m.stderr.contains("TOPSECRET"), "the target's content is shown\n{}", m.summary());
    }
    let cm = ConfigMapDir::new(&[("addonImage", &image), ("kernelPath", "/boot/vmlinuz")]);
    let m = run(&node, &["install", "--configmap-dir", cm.path().to_str().expect("utf-8")]);
    bounded(&m, "kubelet's layout");
    assert_eq!(m.code, Some(0), "{}", m.summary());
}

/// Control and bidirectional characters from input never reach stderr raw: a ConfigMap
/// value with U+202E and an escape sequence is echoed escaped.
#[test]
fn bidi_and_control_characters_are_escaped_in_messages() {
    let node = Node::new();
    let dir = tempfile::tempdir().expect("tmp");
    let cm = configmap(
        dir.path(),
        "bidi.yaml",
        &[("addonImage", "quay.io/a/b:v1"), ("kernelPath", "/boot/vmlinuz\u{202e}zg.\u{1b}[2J\u{85}")],
    );
    let m = run(&node, &["install", "--configmap", cm.to_str().expect("utf-8")]);
    bounded(&m, "bidi value");
    assert_eq!(m.code, Some(2), "{}", m.summary());
    for c in ['\u{202e}', '\u{1b}', '\u{85}'] {
        assert!(!m.stderr.contains(c), "{c:?} printed raw\n{}", m.summary());
    }
    assert!(m.stderr.contains("\\u{202e}"), "{}", m.summary());
}

/// The daemon survives each case as a ConfigMap change and as a node edit: each is
/// logged, the last good addon stays installed, and the daemon goes on following changes.
#[test]
fn the_daemon_survives_each_case() {
    let node = crio_node();
    let dir = tempfile::tempdir().expect("tmp");
    let image = addon(dir.path());
    let good = data(&image, Some(HANDLER));
    let mut cm = ConfigMapDir::new(&good);
    let ready = dir.path().join("ready");
    let log = dir.path().join("daemon.log");
    // Debug lines show each resync ("node matches the state").
    let env = [("RUST_LOG", "info,kata_addons=debug")];
    let mut d = Daemon::spawn_env(&[], &[], &env, node.root(), Some(cm.path()), &ready, log);
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    let config_d = KataDeploy::new(&node).config_path(SHIM).replace(&format!("configuration-{SHIM}.toml"), "config.d");
    let drop_in = node.path(&format!("{config_d}/50-kata-addons.toml"));
    assert!(drop_in.exists(), "{}", d.log());
    let alive = |d: &mut Daemon, what: &str| {
        assert!(d.child.try_wait().expect("try_wait").is_none(), "the daemon exited after {what}: {}", d.log());
        assert!(!d.log().contains("panicked"), "{what}: {}", d.log());
        assert!(drop_in.exists(), "{what}: the last good addon is gone: {}", d.log());
    };
    let mark = |d: &Daemon| d.log().len();
    let logged_after = |d: &Daemon, from: usize, needle: &str| d.log().get(from..).is_some_and(|l| l.contains(needle));

    // Node edits: CRI-O loops, then a containerd fan-out; each found by the watch.
    let from = mark(&d);
    crio_loops(node.root());
    wait_for("the loop refusal", Duration::from_secs(30), || logged_after(&d, from, "loop0"), || d.log());
    alive(&mut d, "crio.conf.d loops");
    remove_crio_loops(&node);
    let from = mark(&d);
    containerd_fan_out(node.root(), 64, 200_000);
    wait_for(
        "the fan-out refusal",
        Duration::from_secs(30),
        || logged_after(&d, from, "the most kata-addons reads") || logged_after(&d, from, "node matches the state"),
        || d.log(),
    );
    alive(&mut d, "an import fan-out");
    std::fs::remove_dir_all(node.path("/etc/containerd")).expect("rm containerd");

    // ConfigMap changes: 20,000 handlers, a key leading out of the mount, a 1 MiB nested value.
    let handlers: Vec<String> = (0..20_000).map(|i| format!("kata-{i}")).collect();
    let handlers = handlers.join(",");
    let from = mark(&d);
    cm.update(&data(&image, Some(&handlers)));
    wait_for("the handler-count refusal", Duration::from_secs(30), || logged_after(&d, from, "at most 64"), || d.log());
    alive(&mut d, "20,000 handlers");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "TOPSECRET").expect("secret");
    cm.update(&good);
    let gen_dir = std::fs::read_link(cm.path().join("..data")).expect("..data");
    let from = mark(&d);
    let key = cm.path().join(&gen_dir).join("addonImage");
    std::fs::remove_file(&key).expect("rm key");
    std::os::unix::fs::symlink(&secret, &key).expect("key link");
    wait_for(
        "the escaping key refusal",
        Duration::from_secs(30),
        || logged_after(&d, from, "leading out of the directory"),
        || d.log(),
    );
    alive(&mut d, "a key leading out of the mount");
    assert!(!d.log().contains("TOPSECRET"), "{}", d.log());
    let deep = format!("{}{}", "[".repeat(500_000), "]".repeat(500_000));
    let from = mark(&d);
    cm.update(&[("addonImage", &deep), ("provider", "snp"), ("kernelPath", "/boot/vmlinuz")]);
    wait_for("the nested value refusal", Duration::from_secs(30), || logged_after(&d, from, "addonImage"), || d.log());
    alive(&mut d, "a nested value");

    // Still following changes: back to the good ConfigMap, the node as installed.
    cm.update(&good);
    wait_for("the good ConfigMap", Duration::from_secs(30), || drop_in.exists(), || d.log());
    alive(&mut d, "the good ConfigMap again");
}

/// A daemon started on a deeply nested ConfigMap file (the MachineConfig unit's input)
/// exits 2 at once naming the key, instead of parsing for minutes.
#[test]
fn the_daemon_refuses_a_deeply_nested_configmap_file_at_once() {
    let node = Node::new();
    let dir = tempfile::tempdir().expect("tmp");
    let cm = dir.path().join("deep.yaml");
    std::fs::write(&cm, nested_configmap(520_000)).expect("write");
    let ready = dir.path().join("ready");
    let m = run_measured(
        &kata_addons_bin(),
        &[
            "daemon",
            "--configmap",
            cm.to_str().expect("utf-8"),
            "--root",
            node.root().to_str().expect("utf-8"),
            "--ready-file",
            ready.to_str().expect("utf-8"),
        ],
        KILL_AFTER,
    );
    bounded(&m, "daemon on a nested ConfigMap file");
    assert_eq!(m.code, Some(2), "{}", m.summary());
    assert!(m.stderr.contains("nested more than 64 deep under `addonImage`"), "{}", m.summary());
    assert!(!ready.exists());
}
