//! Hostile images and node state against the real binary: a GPT header whose entry count
//! and size would size the partition-table read (install as a ConfigMap change, `status`
//! and the repair of an installed image edited on the node, the daemon through both), a
//! tampered state naming drop-ins kata-addons never wrote, FIFOs in an OCI layout, refusals
//! on a fresh node, a zero-length kernel, and a state recording a size no file has.
//!
//! Real parts: disks from mkfs.erofs + veritysetup + sfdisk (`tests/src/disk.rs`), their
//! GPT header edited as an attacker would (CRC32 recomputed), OCI layouts, real node roots.
//! Every case asserts the exit code, that nothing panicked (exit 101) or aborted (a
//! signal), a time bound as a failure detector (not a measurement), bounded peak RSS, and
//! what the node holds. Each run prints its cost (`cost of …`) for BENCHMARKS.md.

use std::path::Path;
use std::time::Duration;

use kata_addons_tests::daemon::{ConfigMapDir, Daemon, wait_for};
use kata_addons_tests::disk::{self, Fs, GptField, HOSTILE_GPT_HEADERS, Label};
use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::kata_addons_bin;
use kata_addons_tests::measure::{Measured, run_measured};
use kata_addons_tests::node::{Node, layout_with, noise};

/// A refusal or a check that takes longer than this hangs (a failure detector: the
/// hostile headers took 0.09 s to abort, 27 s to panic, or ran past 120 s before).
const DETECTOR: Duration = Duration::from_secs(10);
/// Wall time after which a run is killed (it then fails its assertions).
const KILL_AFTER: Duration = Duration::from_secs(60);
/// The DaemonSet's memory limit: no refusal may come near it.
const RSS_BOUND_MIB: f64 = 128.0;
/// The state file.
const STATE: &str = "/etc/kata-containers/addons/state.json";

/// A policy compile cache shared by the tests of this file and kept between runs, filled
/// once per test process before anything is measured (compiling the policy is not what a
/// case costs).
fn policy_cache() -> String {
    static WARM: std::sync::Once = std::sync::Once::new();
    let p = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hostile-image-policy-cache");
    std::fs::create_dir_all(&p).expect("policy cache dir");
    let cache = p.to_str().expect("utf-8").to_string();
    WARM.call_once(|| {
        let tmp = tempfile::tempdir().expect("tmp");
        let cm = configmap(tmp.path(), "cm.json", &[("addonImage", "quay.io/x/y:v1"), ("kernelPath", "/k")]);
        let root = tmp.path().to_str().expect("utf-8");
        // The verdict does not matter here: loading the policy fills the cache.
        let _ = run_measured(
            &kata_addons_bin(),
            &["--cache-dir", &cache, "preview", "--configmap", &cm, "--root", root],
            KILL_AFTER,
        );
    });
    cache
}

/// Runs the binary with `args` (and the shared policy cache), measured and killed after
/// [`KILL_AFTER`].
fn run(args: &[&str]) -> Measured {
    let cache = policy_cache();
    let mut all = vec!["--cache-dir", cache.as_str()];
    all.extend_from_slice(args);
    run_measured(&kata_addons_bin(), &all, KILL_AFTER)
}

/// The run ended on its own with `code`: no abort, no panic, within [`DETECTOR`] and
/// [`RSS_BOUND_MIB`]. Prints the cost.
fn assert_ended(m: &Measured, code: i32, what: &str) {
    eprintln!(
        "cost of {what}: exit {:?} signal {:?}, wall {:.2} s, CPU {:.2} s, peak RSS {:.1} MiB",
        m.code,
        m.signal,
        m.wall.as_secs_f64(),
        m.cpu.as_secs_f64(),
        m.peak_rss_mib()
    );
    assert!(m.signal.is_none(), "{what}: ended by a signal\n{}", m.summary());
    assert_ne!(m.code, Some(101), "{what}: panicked\n{}", m.summary());
    assert_eq!(m.code, Some(code), "{what}: exit code\n{}", m.summary());
    assert!(m.wall < DETECTOR, "{what}: took {:?}\n{}", m.wall, m.summary());
    assert!(m.peak_rss_mib() <= RSS_BOUND_MIB, "{what}: peak RSS\n{}", m.summary());
}

/// A ConfigMap (bare JSON map) file in `dir`.
fn configmap(dir: &Path, name: &str, pairs: &[(&str, &str)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> =
        pairs.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string()))).collect();
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(&map).expect("json")).expect("write configmap");
    p.display().to_string()
}

fn root_of(node: &Node) -> String {
    node.root().to_str().expect("utf-8 root").to_string()
}

/// `install --configmap CM --root NODE`, measured.
fn install(node: &Node, cm: &str) -> Measured {
    run(&["install", "--configmap", cm, "--root", &root_of(node)])
}

fn tools_or_panic() {
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
}

/// A measured guest disk (erofs in partition 1 of a GPT, its dm-verity tree in partition 2)
/// and its parameters.
fn guest_disk(dir: &Path) -> (Vec<u8>, String) {
    let (path, v) = disk::measured(dir, "guest", Fs::Erofs, Label::Gpt, "5eed", 4096, 4096);
    (std::fs::read(path).expect("disk"), v.kata_params())
}

/// `disk` with the hostile entry count and size (header CRC recomputed).
fn hostile(disk_bytes: &[u8], entries: u64, size: u64) -> Vec<u8> {
    let mut d = disk_bytes.to_vec();
    disk::set_gpt_header(&mut d, &[(GptField::Entries, entries), (GptField::EntrySize, size)]);
    d
}

/// An OCI layout at `dir/name` holding `/images/guest.img`; returns its `oci:` reference.
fn guest_layout(dir: &Path, name: &str, disk_bytes: &[u8]) -> String {
    let layer = LayerBuilder::new().file("images/guest.img", disk_bytes).build(Compress::Gzip);
    Image::new(vec![layer]).write_layout(&dir.join(name), "v1");
    format!("oci:{}:v1", dir.join(name).display())
}

/// The ConfigMap pairs of a measured guest image for TDX.
fn guest_pairs<'a>(image: &'a str, params: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![("addonImage", image), ("provider", "tdx"), ("imagePath", "/images/guest.img"), ("imageVerityParams", params)]
}

/// What the state says is installed (node path of each file).
fn installed_files(node: &Node) -> Vec<String> {
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.path(STATE)).expect("state")).expect("state json");
    st["files"].as_array().expect("files").iter().map(|f| f["path"].as_str().expect("path").to_string()).collect()
}

// ---- A: a GPT header that sizes the partition-table read ---------------------------------

/// Each hostile header, as the image of a ConfigMap change on a fresh node: refused (exit
/// 1, naming the file and what the header says), at once, and the node is byte-identical.
#[test]
fn a_hostile_gpt_header_in_a_new_image_is_refused() {
    tools_or_panic();
    let tmp = tempfile::tempdir().expect("tmp");
    let (good, params) = guest_disk(tmp.path());
    let node = Node::new();
    let before = node.snapshot();
    for (i, (what, entries, size)) in HOSTILE_GPT_HEADERS.iter().enumerate() {
        let image = guest_layout(tmp.path(), &format!("l{i}"), &hostile(&good, *entries, *size));
        let cm = configmap(tmp.path(), &format!("cm{i}.json"), &guest_pairs(&image, &params));
        let m = install(&node, &cm);
        assert_ended(&m, 1, &format!("install, GPT header with {what}"));
        assert!(
            m.stderr.contains("refusing /images/guest.img") && m.stderr.contains("GPT header"),
            "{what}\n{}",
            m.summary()
        );
        assert_eq!(node.snapshot(), before, "{what}: a refusal changed the node");
    }
    // The same disk with its header intact installs.
    let image = guest_layout(tmp.path(), "good", &good);
    let cm = configmap(tmp.path(), "good.json", &guest_pairs(&image, &params));
    assert_ended(&install(&node, &cm), 0, "install of the intact disk");
}

/// The installed image edited on the node: `status` reports it (exit 4, naming the file),
/// leaves the node alone, and `install` repairs it, each within the bound.
#[test]
fn a_hostile_gpt_header_on_an_installed_image_is_drift() {
    tools_or_panic();
    let tmp = tempfile::tempdir().expect("tmp");
    let (good, params) = guest_disk(tmp.path());
    let node = Node::new();
    let image = guest_layout(tmp.path(), "good", &good);
    let cm = configmap(tmp.path(), "cm.json", &guest_pairs(&image, &params));
    assert_ended(&install(&node, &cm), 0, "install");
    let root = root_of(&node);
    for (what, entries, size) in HOSTILE_GPT_HEADERS {
        let file = installed_files(&node)[0].clone();
        let on_node = node.path(&file);
        let mut d = std::fs::read(&on_node).expect("installed image");
        disk::set_gpt_header(&mut d, &[(GptField::Entries, entries), (GptField::EntrySize, size)]);
        std::fs::write(&on_node, &d).expect("edit installed image");
        let before = node.snapshot();
        let m = run(&["status", "--root", &root]);
        assert_ended(&m, 4, &format!("status, installed image's GPT header with {what}"));
        assert!(m.stdout.contains(&file) && m.stdout.contains("GPT header"), "{what}\n{}\n{}", m.stdout, m.summary());
        assert_eq!(node.snapshot(), before, "{what}: status changed the node");
        let m = install(&node, &cm);
        assert_ended(&m, 0, &format!("repair install, installed image's GPT header with {what}"));
        assert!(m.stderr.contains("was edited"), "{what}\n{}", m.summary());
        assert_ended(&run(&["status", "--root", &root]), 0, "status after the repair");
    }
}

/// The daemon survives both: each hostile image as a ConfigMap change (refused, logged,
/// the node keeps what it had), and the installed image edited on the node (repaired at
/// the next resync).
#[test]
fn the_daemon_survives_hostile_gpt_headers() {
    tools_or_panic();
    let tmp = tempfile::tempdir().expect("tmp");
    let (good, params) = guest_disk(tmp.path());
    let node = Node::new();
    let image = guest_layout(tmp.path(), "good", &good);
    let mut cm = ConfigMapDir::new(&guest_pairs(&image, &params));
    let (ready, log) = (tmp.path().join("ready"), tmp.path().join("daemon.log"));
    let cache = policy_cache();
    let mut d = Daemon::spawn(
        &["--cache-dir", &cache],
        &["--resync", "1", "--failure-backoff", "0.5"],
        node.root(),
        Some(cm.path()),
        &ready,
        log,
    );
    wait_for("readiness", Duration::from_secs(90), || ready.exists(), || d.log());
    let installed = std::fs::read(node.path(STATE)).expect("state");
    let alive = |d: &mut Daemon, when: &str| {
        assert!(d.child.try_wait().expect("try_wait").is_none(), "the daemon died {when}:\n{}", d.log());
    };

    // As ConfigMap changes: each refused and logged; the node keeps the good image.
    for (i, (what, entries, size)) in HOSTILE_GPT_HEADERS.iter().enumerate() {
        let bad = guest_layout(tmp.path(), &format!("bad{i}"), &hostile(&good, *entries, *size));
        let refusals = d.log().matches("GPT header").count();
        cm.update(&guest_pairs(&bad, &params));
        wait_for(
            &format!("the refusal of {what}"),
            Duration::from_secs(30),
            || d.log().matches("GPT header").count() > refusals,
            || d.log(),
        );
        alive(&mut d, &format!("after a ConfigMap change to {what}"));
        assert_eq!(std::fs::read(node.path(STATE)).expect("state"), installed, "{what}: the node changed");
    }

    // Back to the good image, then its installed file edited on the node: repaired.
    cm.update(&guest_pairs(&image, &params));
    for (what, entries, size) in HOSTILE_GPT_HEADERS {
        // A check that finds the installed file intact first: the edit below is then news to
        // the daemon, not part of the install it has just made.
        let checks = d.log().matches("up to date; nothing changed").count();
        wait_for(
            "a check of the installed file",
            Duration::from_secs(30),
            || d.log().matches("up to date; nothing changed").count() > checks,
            || d.log(),
        );
        let file = node.path(&installed_files(&node)[0]);
        let mut bytes = std::fs::read(&file).expect("installed image");
        let pristine = bytes.clone();
        disk::set_gpt_header(&mut bytes, &[(GptField::Entries, entries), (GptField::EntrySize, size)]);
        std::fs::write(&file, &bytes).expect("edit installed image");
        wait_for(
            &format!("the repair of {what}"),
            Duration::from_secs(60),
            || std::fs::read(node.path(&installed_files(&node)[0])).is_ok_and(|b| b == pristine),
            || d.log(),
        );
        alive(&mut d, &format!("after the installed image's GPT header was set to {what}"));
    }
    let m = run(&["status", "--root", &root_of(&node)]);
    assert_ended(&m, 0, "status after the daemon's repairs");
    alive(&mut d, "at the end");
}

// ---- E: the state never vouches for deleting a file ----------------------------------------

/// A file without kata-addons' header at the drop-in name, listed in the state's `dropIns`
/// and `previousDropIns`, survives install's garbage collection and `uninstall`.
#[test]
fn a_tampered_state_never_deletes_a_file_kata_addons_did_not_write() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::new();
    layout_with(&tmp.path().join("layout"), "v1", &[("vmlinuz", &noise(4096, 1))]);
    let image = format!("oci:{}:v1", tmp.path().join("layout").display());
    let cm =
        configmap(tmp.path(), "cm.json", &[("addonImage", &image), ("provider", "se"), ("kernelPath", "/vmlinuz")]);
    assert_ended(&install(&node, &cm), 0, "install");

    let foreign = "[hypervisor.qemu]\nenable_debug = true\n";
    let listed_previous = "/etc/kata-containers/kata-tdx/config.d/50-kata-addons.toml";
    let listed_current = "/etc/kata-containers/kata-snp/config.d/50-kata-addons.toml";
    node.write(listed_previous, foreign);
    node.write(listed_current, foreign);
    let honest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.path(STATE)).expect("state")).expect("state json");
    let tamper = || {
        let mut st = honest.clone();
        st["previousDropIns"] = serde_json::json!([listed_previous]);
        st["dropIns"].as_array_mut().expect("dropIns").push(serde_json::json!({
            "runtimeConfig": "/etc/kata-containers/kata-snp/configuration.toml",
            "path": listed_current,
            "sha256": kata_addons_tests::sha256_hex(foreign.as_bytes()),
        }));
        std::fs::write(node.path(STATE), serde_json::to_vec_pretty(&st).expect("json")).expect("write state");
    };
    let intact = |when: &str| {
        for p in [listed_previous, listed_current] {
            assert_eq!(std::fs::read_to_string(node.path(p)).ok().as_deref(), Some(foreign), "{when}: {p} was touched");
        }
    };

    tamper();
    let m = install(&node, &cm);
    assert_ended(&m, 0, "install with the tampered state");
    intact("install's garbage collection");
    tamper();
    let m = run(&["uninstall", "--root", &root_of(&node)]);
    assert_ended(&m, 0, "uninstall with the tampered state");
    intact("uninstall");
    for p in [listed_previous, listed_current] {
        assert!(
            m.stdout.contains(&format!("left alone (not kata-addons' to remove; see the warnings): {p}")),
            "{}",
            m.stdout
        );
    }
    assert!(!node.path("/opt/kata/share/defaults/kata-containers/config.d/50-kata-addons.toml").exists(), "ours stays");
}

// ---- F: a FIFO in an OCI layout -------------------------------------------------------------

/// A FIFO in place of `index.json`, the manifest blob or the layer blob: refused at once
/// (exit 1, naming the file), and the fresh node is byte-identical.
#[test]
fn a_fifo_in_an_oci_layout_is_refused_at_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::new();
    let before = node.snapshot();
    for target in ["index.json", "manifest", "layer"] {
        let dir = tmp.path().join(format!("layout-{target}"));
        layout_with(&dir, "v1", &[("vmlinuz", &noise(4096, 2))]);
        let blob = |digest: &str| dir.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("index.json")).expect("index")).expect("index json");
        let manifest_digest = index["manifests"][0]["digest"].as_str().expect("digest").to_string();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(blob(&manifest_digest)).expect("manifest")).expect("manifest json");
        let path = match target {
            "index.json" => dir.join("index.json"),
            "manifest" => blob(&manifest_digest),
            _ => blob(manifest["layers"][1]["digest"].as_str().expect("layer digest")),
        };
        std::fs::remove_file(&path).expect("rm");
        mkfifo(&path);
        let image = format!("oci:{}:v1", dir.display());
        let cm =
            configmap(tmp.path(), "cm.json", &[("addonImage", &image), ("provider", "se"), ("kernelPath", "/vmlinuz")]);
        let m = install(&node, &cm);
        assert_ended(&m, 1, &format!("install, a FIFO as the {target}"));
        assert!(m.stderr.contains("is a FIFO, not a regular file"), "{target}\n{}", m.summary());
        assert_eq!(node.snapshot(), before, "{target}: a refusal changed the node");
    }
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().expect("utf-8")).expect("path");
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", p.display());
}

// ---- G: refusals on a fresh node ----------------------------------------------------------

/// Refusals on a fresh node (nothing installed yet), before and after files are staged,
/// leave it byte-identical: no install directory, no `config.d`, no lock file.
#[test]
fn a_refusal_on_a_fresh_node_leaves_it_byte_identical() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::new();
    let before = node.snapshot();
    layout_with(&tmp.path().join("layout"), "v1", &[("vmlinuz", &noise(4096, 3))]);
    let image = format!("oci:{}:v1", tmp.path().join("layout").display());
    let wrong_sha = "0".repeat(64);
    for (what, pairs, says) in [
        ("no such file in the image", vec![("kernelPath", "/nope")], "/nope"),
        (
            "a pinned sha256 that differs (after staging)",
            vec![("kernelPath", "/vmlinuz"), ("kernelSha256", wrong_sha.as_str())],
            "checksum mismatch",
        ),
    ] {
        let mut all = vec![("addonImage", image.as_str()), ("provider", "se")];
        all.extend(pairs);
        let cm = configmap(tmp.path(), "cm.json", &all);
        let m = install(&node, &cm);
        assert_ended(&m, 1, &format!("install refused: {what}"));
        assert!(m.stderr.contains(says), "{what}: {says}\n{}", m.summary());
        assert_eq!(node.snapshot(), before, "{what}: the refusal changed the fresh node");
    }
}

// ---- J: a zero-length artifact; recorded sizes ---------------------------------------------

/// A zero-length kernel, initrd or image is refused, naming the file and its key, and the
/// fresh node is byte-identical.
#[test]
fn a_zero_length_artifact_is_refused_naming_the_file_and_key() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::new();
    let before = node.snapshot();
    layout_with(&tmp.path().join("layout"), "v1", &[("vmlinuz", &noise(4096, 4)), ("empty.img", b"")]);
    let image = format!("oci:{}:v1", tmp.path().join("layout").display());
    for (key, provider, kernel) in
        [("kernelPath", "se", None), ("initrdPath", "tdx", Some("/vmlinuz")), ("imagePath", "tdx", Some("/vmlinuz"))]
    {
        let mut pairs = vec![("addonImage", image.as_str()), ("provider", provider), (key, "/empty.img")];
        pairs.extend(kernel.map(|k| ("kernelPath", k)));
        let cm = configmap(tmp.path(), "cm.json", &pairs);
        let m = install(&node, &cm);
        assert_ended(&m, 1, &format!("install, zero-length {key}"));
        assert!(
            m.stderr.contains("/empty.img") && m.stderr.contains(&format!("{key} must name a non-empty file")),
            "{key}\n{}",
            m.summary()
        );
        assert_eq!(node.snapshot(), before, "{key}: the refusal changed the node");
    }
}

/// A state recording `files[].size = u64::MAX` is drift to `status` (exit 4, naming the
/// file and both sizes), not healthy.
#[test]
fn a_recorded_size_no_file_has_is_drift() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::new();
    layout_with(&tmp.path().join("layout"), "v1", &[("vmlinuz", &noise(4096, 5))]);
    let image = format!("oci:{}:v1", tmp.path().join("layout").display());
    let cm =
        configmap(tmp.path(), "cm.json", &[("addonImage", &image), ("provider", "se"), ("kernelPath", "/vmlinuz")]);
    assert_ended(&install(&node, &cm), 0, "install");
    let root = root_of(&node);
    assert_ended(&run(&["status", "--root", &root]), 0, "status of the intact node");
    let mut st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.path(STATE)).expect("state")).expect("state json");
    st["files"][0]["size"] = serde_json::json!(u64::MAX);
    std::fs::write(node.path(STATE), serde_json::to_vec_pretty(&st).expect("json")).expect("write state");
    let file = installed_files(&node)[0].clone();
    let m = run(&["status", "--root", &root]);
    assert_ended(&m, 4, "status with files[0].size = u64::MAX");
    assert!(m.stdout.contains(&format!("{file}: 4096 bytes, expected {}", u64::MAX)), "{}", m.stdout);
}
