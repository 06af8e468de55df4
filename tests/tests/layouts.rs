//! Every Kata layout the runner meets, on real directories with the real binary:
//! OpenShift, kata-deploy's Go and runtime-rs shims (relative symlinks, per-shim
//! `config.d` with kata-deploy's own fragments), a shared pre-2026 `config.d`, several
//! matches at once. For each: install, status, reinstall, upgrade, uninstall, with the
//! effective values Kata would compute asserted after every step.

use std::process::{Command, Output};

use kata_addons_tests::node::{BASE_CONFIG, KATA_DEPLOY_DEFAULTS, Node, content_snapshot, layout_with, noise};
use kata_addons_tests::{kata_addons_bin, run_kata_env as kata, sha256_hex, show};

/// [`content_snapshot`] / [`Node::snapshot`] without the node lock (`/run/kata-addons.lock`),
/// which the runner keeps.
fn without_lock(mut m: std::collections::BTreeMap<String, String>) -> std::collections::BTreeMap<String, String> {
    m.retain(|k, _| !k.starts_with("run"));
    m
}

/// Two versions of a TDX kernel + initrd in OCI layouts.
struct Images {
    _dir: tempfile::TempDir,
    v1: String,
    v2: String,
    k1: Vec<u8>,
    i2: Vec<u8>,
}

fn images() -> Images {
    let dir = tempfile::tempdir().expect("images dir");
    let (k1, i1) = (noise(200_000, 11), noise(100_000, 12));
    let (k2, i2) = (noise(210_000, 21), noise(110_000, 22));
    layout_with(&dir.path().join("v1"), "v1", &[("boot/vmlinuz", &k1), ("boot/initrd.img", &i1)]);
    layout_with(&dir.path().join("v2"), "v2", &[("boot/vmlinuz", &k2), ("boot/initrd.img", &i2)]);
    Images {
        v1: format!("oci:{}:v1", dir.path().join("v1").display()),
        v2: format!("oci:{}:v2", dir.path().join("v2").display()),
        _dir: dir,
        k1,
        i2,
    }
}

/// The TDX addon env for an image.
fn env(image: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ADDON_IMAGE", image.to_string()),
        ("ADDON_PROVIDER", "tdx".to_string()),
        ("ADDON_KERNEL_PATH", "/boot/vmlinuz".to_string()),
        ("ADDON_INITRD_PATH", "/boot/initrd.img".to_string()),
    ]
}

fn refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

struct Run<'a> {
    node: &'a Node,
    extra: Vec<String>,
}

impl Run<'_> {
    fn args<'b>(&'b self, cmd: &'b str) -> Vec<&'b str> {
        let mut a = vec![cmd, "--root"];
        a.push(self.node.root().to_str().expect("utf-8 root"));
        a.extend(self.extra.iter().map(String::as_str));
        a
    }

    fn install(&self, image: &str) -> Output {
        kata(&self.args("install"), &refs(&env(image)))
    }

    fn status(&self) -> (Option<i32>, serde_json::Value) {
        let o = kata(&["status", "--root", self.node.root().to_str().expect("utf-8"), "--output", "json"], &[]);
        let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("status json: {e}\n{}", show(&o)));
        (o.status.code(), v)
    }

    fn uninstall(&self) -> Output {
        kata(&["uninstall", "--root", self.node.root().to_str().expect("utf-8")], &[])
    }
}

/// The addon's boot paths are effective for `rc` (kernel and initrd from version `v`,
/// image cleared), and kata-deploy's other keys, if present, still are.
fn assert_effective(node: &Node, rc: &str, v: &str, kata_deploy: bool) {
    let kernel = node.qemu_of(rc, "kernel").unwrap_or_else(|| panic!("{rc}: no effective kernel"));
    assert!(kernel.starts_with(&format!("/etc/kata-containers/addons/{v}-")), "{rc}: kernel {kernel}");
    assert!(kernel.ends_with("/kernel"), "{rc}: kernel {kernel}");
    let initrd = node.qemu_of(rc, "initrd").unwrap_or_default();
    assert!(initrd.starts_with(&format!("/etc/kata-containers/addons/{v}-")), "{rc}: initrd {initrd}");
    assert_eq!(node.qemu_of(rc, "image").as_deref(), Some(""), "{rc}: image must be cleared");
    if kata_deploy {
        assert_eq!(
            node.qemu_of(rc, "kernel_params").as_deref(),
            Some("agent.https_proxy=http://proxy:3128"),
            "{rc}: kata-deploy's 30-kernel-params.toml must stay in effect"
        );
        assert_eq!(node.qemu_of(rc, "default_memory").as_deref(), Some("4096"), "{rc}: 50-user-overrides");
        assert_eq!(node.qemu_of(rc, "path").as_deref(), Some("/opt/kata/bin/qemu-system-x86_64"), "{rc}: 10- path");
    }
    // The base file is never edited.
    assert_eq!(std::fs::read_to_string(node.path(rc)).expect("base"), BASE_CONFIG);
}

/// install -> status -> reinstall -> upgrade -> uninstall on `node` for the resolved
/// runtime configurations `rcs` (all must get the drop-in), `kata_deploy` when
/// kata-deploy's fragments are present.
fn lifecycle(node: &Node, rcs: &[String], kata_deploy: bool, extra: &[&str]) {
    let imgs = images();
    let run = Run { node, extra: extra.iter().map(|s| s.to_string()).collect() };
    let before = without_lock(content_snapshot(node.root()));

    // install
    let o = run.install(&imgs.v1);
    assert!(o.status.success(), "{}", show(&o));
    for rc in rcs {
        assert_effective(node, rc, "v1", kata_deploy);
        assert!(node.config_d_of(rc).contains(&"50-kata-addons.toml".to_string()), "{rc}");
    }
    let kernel = node.qemu_of(&rcs[0], "kernel").expect("kernel");
    assert_eq!(std::fs::read(node.path(&kernel)).expect("kernel file"), imgs.k1);

    // status: healthy, every drop-in recorded, effective values reported
    let (code, st) = run.status();
    assert_eq!(code, Some(0), "{st:#}");
    assert_eq!(st["state"]["schema"], 2);
    let drop_ins = st["state"]["dropIns"].as_array().expect("dropIns");
    let recorded: Vec<&str> = drop_ins.iter().map(|d| d["runtimeConfig"].as_str().unwrap_or("")).collect();
    assert_eq!(recorded, rcs.iter().map(String::as_str).collect::<Vec<_>>(), "{st:#}");
    for (d, rc) in drop_ins.iter().zip(rcs) {
        let dir = rc.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        assert_eq!(d["path"], format!("{dir}/config.d/50-kata-addons.toml"));
        let text = std::fs::read(node.path(d["path"].as_str().unwrap_or(""))).expect("drop-in");
        assert_eq!(d["sha256"], sha256_hex(&text));
    }
    let eff = st["effective"].as_array().expect("effective");
    assert_eq!(eff.len(), rcs.len(), "{st:#}");
    for (e, rc) in eff.iter().zip(rcs) {
        assert_eq!(e["runtimeConfig"], rc.as_str());
        assert_eq!(e["table"], "hypervisor.qemu");
        assert_eq!(e["kernel"]["value"].as_str(), node.qemu_of(rc, "kernel").as_deref(), "{e:#}");
        assert!(e["kernel"]["from"].as_str().unwrap_or("").ends_with("/config.d/50-kata-addons.toml"), "{e:#}");
        assert_eq!(e["image"]["value"], "", "{e:#}");
    }

    // reinstall: nothing written
    let snap = node.snapshot();
    let o = run.install(&imgs.v1);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("up to date"), "{}", show(&o));
    assert_eq!(node.snapshot(), snap, "reinstall wrote to the node");

    // upgrade
    let o = run.install(&imgs.v2);
    assert!(o.status.success(), "{}", show(&o));
    for rc in rcs {
        assert_effective(node, rc, "v2", kata_deploy);
    }
    let initrd = node.qemu_of(&rcs[0], "initrd").expect("initrd");
    assert_eq!(std::fs::read(node.path(&initrd)).expect("initrd file"), imgs.i2);
    assert!(!node.path(&kernel).exists(), "v1 kernel left behind");
    let (code, st) = run.status();
    assert_eq!(code, Some(0), "{st:#}");

    // uninstall: back to exactly what was there (empty config.d directories aside)
    let o = run.uninstall();
    assert!(o.status.success(), "{}", show(&o));
    for rc in rcs {
        assert!(!node.config_d_of(rc).contains(&"50-kata-addons.toml".to_string()), "{rc}");
        if kata_deploy {
            let k = node.qemu_of(rc, "kernel").unwrap_or_default();
            assert_eq!(k, "/opt/kata/share/kata-containers/vmlinux.container", "{rc}: kata-deploy's kernel again");
        }
    }
    assert_eq!(without_lock(content_snapshot(node.root())), before, "uninstall did not restore the node");
    let (code, _) = run.status();
    assert_eq!(code, Some(3));
}

#[test]
fn openshift_layout() {
    let node = Node::empty();
    let rc = node.openshift("tdx");
    lifecycle(&node, &[rc], false, &[]);
}

#[test]
fn kata_deploy_go_and_runtime_rs_shims() {
    let node = Node::empty();
    let go = node.kata_deploy("qemu-tdx");
    let rs = node.kata_deploy("qemu-tdx-runtime-rs");
    // Other TEEs' shims are left alone.
    let other = node.kata_deploy("qemu-snp");
    assert!(go.contains("/runtimes/qemu-tdx/") && rs.contains("/runtime-rs/runtimes/qemu-tdx-runtime-rs/"));
    lifecycle(&node, &[go, rs], true, &[]);
    assert!(!node.config_d_of(&other).contains(&"50-kata-addons.toml".to_string()));
}

#[test]
fn kata_deploy_under_another_prefix() {
    let node = Node::empty();
    // The same layout under /usr/local/kata, found with --kata-prefix.
    let rc = "/usr/local/kata/share/defaults/kata-containers/runtimes/qemu-tdx/configuration-qemu-tdx.toml";
    node.write(rc, BASE_CONFIG);
    std::os::unix::fs::symlink(
        "runtimes/qemu-tdx/configuration-qemu-tdx.toml",
        node.path("/usr/local/kata/share/defaults/kata-containers/configuration-qemu-tdx.toml"),
    )
    .expect("symlink");
    lifecycle(&node, &[rc.to_string()], false, &["--kata-prefix", "/usr/local/kata"]);
}

#[test]
fn several_matches_each_get_the_drop_in() {
    let node = Node::empty();
    let os = node.openshift("tdx");
    let go = node.kata_deploy("qemu-tdx");
    let rs = node.kata_deploy("qemu-tdx-runtime-rs");
    let imgs = images();
    let o = kata(&["install", "--root", node.root().to_str().expect("utf-8")], &refs(&env(&imgs.v1)));
    assert!(o.status.success(), "{}", show(&o));
    for rc in [&os, &go, &rs] {
        assert_effective(&node, rc, "v1", rc != &os);
    }
    let o = kata(&["uninstall", "--root", node.root().to_str().expect("utf-8")], &[]);
    assert!(o.status.success(), "{}", show(&o));
    for rc in [&os, &go, &rs] {
        assert!(!node.config_d_of(rc).contains(&"50-kata-addons.toml".to_string()), "{rc}");
    }
}

#[test]
fn openshift_symlink_into_kata_deploy_is_one_configuration() {
    let node = Node::empty();
    let go = node.kata_deploy("qemu-tdx");
    std::fs::create_dir_all(node.path("/etc/kata-containers/kata-tdx")).expect("mkdir");
    std::os::unix::fs::symlink(
        format!("{KATA_DEPLOY_DEFAULTS}/configuration-qemu-tdx.toml"),
        node.path("/etc/kata-containers/kata-tdx/configuration.toml"),
    )
    .expect("symlink");
    lifecycle(&node, &[go], true, &[]);
}

#[test]
fn runtime_config_flag_restricts_the_set() {
    let node = Node::empty();
    let go = node.kata_deploy("qemu-tdx");
    let rs = node.kata_deploy("qemu-tdx-runtime-rs");
    // The symlink path kata-deploy users know selects the runtime-rs shim only.
    let link = format!("{KATA_DEPLOY_DEFAULTS}/runtime-rs/configuration-qemu-tdx-runtime-rs.toml");
    lifecycle(&node, std::slice::from_ref(&rs), true, &["--runtime-config", &link]);
    assert!(!node.config_d_of(&go).contains(&"50-kata-addons.toml".to_string()));

    // A path that is not one of the provider's configurations: refused, nothing written.
    let before = without_lock(node.snapshot());
    let imgs = images();
    let o = kata(
        &[
            "install",
            "--root",
            node.root().to_str().expect("utf-8"),
            "--runtime-config",
            "/etc/kata-containers/kata-snp/configuration.toml",
        ],
        &refs(&env(&imgs.v1)),
    );
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--runtime-config /etc/kata-containers/kata-snp/configuration.toml"), "{err}");
    assert!(err.contains(&go) && err.contains(&rs), "the error lists what was found: {err}");
    assert_eq!(without_lock(node.snapshot()), before);
}

#[test]
fn shared_config_d_is_refused_naming_the_others() {
    let node = Node::empty();
    let files = node.kata_deploy_shared(&["qemu-tdx", "qemu", "clh"]);
    let before = without_lock(node.snapshot());
    let imgs = images();
    let o = kata(&["install", "--root", node.root().to_str().expect("utf-8")], &refs(&env(&imgs.v1)));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("refusing to write into {KATA_DEPLOY_DEFAULTS}/config.d")), "{err}");
    assert!(err.contains(&files[1]) && err.contains(&files[2]), "names the other configurations: {err}");
    assert!(err.contains("--allow-shared-config-d"), "{err}");
    assert_eq!(without_lock(node.snapshot()), before, "a refused install wrote to the node");

    // Explicitly allowed: one drop-in in the shared config.d, effective for all of them.
    lifecycle(&node, std::slice::from_ref(&files[0]), true, &["--allow-shared-config-d"]);
}

#[test]
fn nothing_found_lists_where_it_looked() {
    let node = Node::empty();
    node.openshift("snp");
    let imgs = images();
    let o = kata(&["install", "--root", node.root().to_str().expect("utf-8")], &refs(&env(&imgs.v1)));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("provider `tdx`") && err.contains("looked at: /etc/kata-containers/kata-tdx/configuration.toml"),
        "{err}"
    );
    assert!(err.contains("/runtime-rs/runtimes/qemu-tdx-runtime-rs/configuration-qemu-tdx-runtime-rs.toml"), "{err}");
    assert!(!node.path("/etc/kata-containers/addons").exists(), "nothing may be written");
}

#[test]
fn a_later_fragment_overriding_a_boot_path_is_drift() {
    let node = Node::empty();
    let go = node.kata_deploy("qemu-tdx");
    let imgs = images();
    let root = node.root().to_str().expect("utf-8").to_string();
    let o = kata(&["install", "--root", &root], &refs(&env(&imgs.v1)));
    assert!(o.status.success(), "{}", show(&o));
    let config_d = format!("{}/config.d", go.rsplit_once('/').map(|(d, _)| d).unwrap_or(""));
    // kata-deploy's user overrides sort after 50-kata-addons.toml ('u' > 'k'): they win.
    node.write(
        &format!("{config_d}/50-user-overrides.toml"),
        "[hypervisor.qemu]\ndefault_memory = 4096\nkernel = \"/custom/vmlinuz\"\n",
    );
    let o = kata(&["status", "--root", &root, "--output", "json"], &[]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let problems = st["problems"].to_string();
    assert!(
        problems.contains("hypervisor.qemu.kernel") && problems.contains(&format!("{config_d}/50-user-overrides.toml")),
        "{st:#}"
    );
    assert_eq!(st["effective"][0]["kernel"]["value"], "/custom/vmlinuz");
    assert_eq!(node.qemu_of(&go, "kernel").as_deref(), Some("/custom/vmlinuz"));
    // The text output says the same.
    let o = kata(&["status", "--root", &root], &[]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"/custom/vmlinuz\"  (from"), "{}", show(&o));

    // A fragment Kata cannot load is drift too.
    node.write(&format!("{config_d}/zz.bak"), "kernel = [");
    node.write(&format!("{config_d}/50-user-overrides.toml"), "[hypervisor.qemu]\ndefault_memory = 4096\n");
    let o = kata(&["status", "--root", &root, "--output", "json"], &[]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("zz.bak: not valid TOML"), "{}", show(&o));
    std::fs::remove_file(node.path(&format!("{config_d}/zz.bak"))).expect("rm");
    // So is a dangling symlink (reported, not a status failure).
    std::os::unix::fs::symlink("gone.toml", node.path(&format!("{config_d}/60-gone.toml"))).expect("symlink");
    let o = kata(&["status", "--root", &root, "--output", "json"], &[]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("60-gone.toml: unreadable"), "{}", show(&o));
    std::fs::remove_file(node.path(&format!("{config_d}/60-gone.toml"))).expect("rm");
    // A runtime configuration that became a symlink loop is drift (4), not a failure (1).
    let rc = node.path(&go);
    std::fs::rename(&rc, rc.with_extension("saved")).expect("move aside");
    std::os::unix::fs::symlink(rc.file_name().expect("name"), &rc).expect("symlink loop");
    let o = kata(&["status", "--root", &root, "--output", "json"], &[]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("a symlink loop"), "{}", show(&o));
    std::fs::remove_file(&rc).expect("rm loop");
    std::fs::rename(rc.with_extension("saved"), &rc).expect("restore");
    let o = kata(&["status", "--root", &root], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

#[test]
fn schema_1_state_from_the_field_is_read_and_uninstalled() {
    let node = Node::empty();
    let rc = node.openshift("tdx");
    let imgs = images();
    let root = node.root().to_str().expect("utf-8").to_string();
    let before = without_lock(content_snapshot(node.root()));
    let o = kata(&["install", "--root", &root], &refs(&env(&imgs.v1)));
    assert!(o.status.success(), "{}", show(&o));
    // Rewrite the state as kata-addons before schema 2 wrote it.
    let state_path = node.path("/etc/kata-containers/addons/state.json");
    let mut st: serde_json::Value = serde_json::from_slice(&std::fs::read(&state_path).expect("state")).expect("json");
    let d = st["dropIns"][0].clone();
    st["schema"] = 1.into();
    st["dropIn"] = serde_json::json!({"path": d["path"], "sha256": d["sha256"]});
    st.as_object_mut().expect("object").remove("dropIns");
    std::fs::write(&state_path, serde_json::to_vec_pretty(&st).expect("json")).expect("write v1 state");

    let o = kata(&["status", "--root", &root, "--output", "json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(s["state"]["dropIns"][0]["runtimeConfig"], rc.as_str());
    // Reinstall of the same addon: up to date, the state is not rewritten.
    let o = kata(&["install", "--root", &root], &refs(&env(&imgs.v1)));
    assert!(o.status.success(), "{}", show(&o));
    let o = kata(&["uninstall", "--root", &root], &[]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(without_lock(content_snapshot(node.root())), before);
}

#[test]
fn preview_shows_one_drop_in_per_configuration_found() {
    let node = Node::empty();
    let go = node.kata_deploy("qemu-tdx");
    let rs = node.kata_deploy("qemu-tdx-runtime-rs");
    let o = kata(
        &["preview", "--root", node.root().to_str().expect("utf-8"), "--output", "json"],
        &refs(&env("quay.io/example/addon:v1")),
    );
    assert!(o.status.success(), "{}", show(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let d = doc["dropIns"].as_array().expect("dropIns");
    assert_eq!(d.len(), 2, "{doc:#}");
    assert_eq!(d[0]["runtimeConfig"], go.as_str());
    assert_eq!(d[1]["runtimeConfig"], rs.as_str());
    assert!(
        d[1]["path"].as_str().unwrap_or("").ends_with("/runtimes/qemu-tdx-runtime-rs/config.d/50-kata-addons.toml")
    );
    assert!(doc["note"].is_null(), "{doc:#}");
    assert_eq!(doc["plan"]["runtimeConfigs"].as_array().map(Vec::len), Some(5));
}

/// The daemon under test: `daemon --resync` on a node, its log in a file.
struct Daemon {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Daemon {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn repairs(&self) -> usize {
        self.log().lines().filter(|l| l.contains("drift repaired") || l.contains("pulling")).count()
    }

    /// Resyncs finished so far (each logs one `resync:` line, "node matches the state" at
    /// debug level).
    fn resyncs(&self) -> usize {
        self.log().lines().filter(|l| l.contains("resync:")).count()
    }

    /// Waits until two more resyncs finished: the second of them started after this call,
    /// so it saw every change made before it.
    fn two_more_resyncs(&self, within: Duration) {
        let seen = self.resyncs();
        wait_for("two more resyncs", 2 * within, self, || self.resyncs() >= seen + 2);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `f` holds; returns how long it took, or panics with the daemon log.
fn wait_for(what: &str, timeout: Duration, d: &Daemon, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}; daemon log:\n{}", d.log());
}

use std::time::{Duration, Instant};

#[test]
fn daemon_repairs_drift_and_follows_kata_deploy_upgrade_and_reinstall() {
    const RESYNC: f64 = 2.0;
    // Two resync periods at the top of the jitter (+10 %), plus scheduling slack for a
    // loaded test machine.
    let within = Duration::from_secs_f64(2.0 * RESYNC * 1.1 + 1.0);
    let node = Node::empty();
    let go = node.kata_deploy("qemu-tdx");
    let rs = node.kata_deploy("qemu-tdx-runtime-rs");
    let imgs = images();
    let dir = tempfile::tempdir().expect("tmp");
    let ready = dir.path().join("ready");
    let log = dir.path().join("daemon.log");
    let mut c = Command::new(kata_addons_bin());
    c.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("HOME", dir.path());
    for (k, v) in env(&imgs.v1) {
        c.env(k, v);
    }
    // Debug lines: each resync's "node matches the state", which the test waits for.
    let child = c
        .env("RUST_LOG", "info,kata_addons=debug")
        // Repairs follow one another on purpose here; the repair rate limit (which would
        // hold the second back by --failure-backoff) is tested in daemon_lifecycle.rs.
        .args(["daemon", "--resync", &RESYNC.to_string(), "--failure-backoff", "0.1", "--failure-backoff-max", "0.2"])
        .arg("--root")
        .arg(node.root())
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn daemon");
    let d = Daemon { child, log };
    wait_for("readiness", Duration::from_secs(120), &d, || ready.exists());
    assert_effective(&node, &go, "v1", true);
    assert_effective(&node, &rs, "v1", true);
    let drop_in = |rc: &str| node.path(rc).parent().expect("parent").join("config.d/50-kata-addons.toml");
    let good = std::fs::read(drop_in(&go)).expect("drop-in");
    let mut took = Vec::new();

    // 1. A deleted drop-in is restored, and the log says what drifted.
    std::fs::remove_file(drop_in(&go)).expect("rm drop-in");
    took.push(wait_for("the deleted drop-in", within, &d, || std::fs::read(drop_in(&go)).ok() == Some(good.clone())));
    wait_for("the repair log line", within, &d, || d.log().contains("was missing"));
    assert!(
        d.log().contains(&format!(
            "drop-in {} was missing",
            go.replace("configuration-qemu-tdx.toml", "config.d/50-kata-addons.toml")
        )),
        "{}",
        d.log()
    );

    // 2. An edited drop-in is restored.
    std::fs::write(drop_in(&rs), "[hypervisor.qemu]\nkernel = \"/evil\"\n").expect("edit");
    took.push(wait_for("the edited drop-in", within, &d, || std::fs::read(drop_in(&rs)).ok() == Some(good.clone())));
    wait_for("the repair log line", within, &d, || d.log().contains("was edited"));

    // 3. kata-deploy upgrade: fragments and base files rewritten. Our drop-in is untouched
    // and still wins; nothing needs repair.
    let repairs = d.repairs();
    node.kata_deploy("qemu-tdx");
    node.kata_deploy("qemu-tdx-runtime-rs");
    d.two_more_resyncs(within);
    assert_effective(&node, &go, "v1", true);
    assert_effective(&node, &rs, "v1", true);
    assert_eq!(d.repairs(), repairs, "nothing drifted: {}", d.log());

    // 4. kata-deploy uninstall removes runtimes/<shim> (our drop-in with it): we do not
    // recreate it...
    node.kata_deploy_remove("qemu-tdx");
    d.two_more_resyncs(within);
    let shim_dir = node.path(&go).parent().expect("parent").to_path_buf();
    assert!(!shim_dir.exists(), "the daemon recreated {}", shim_dir.display());
    assert_effective(&node, &rs, "v1", true);
    // ...and restore the drop-in when kata-deploy installs the shim again.
    node.kata_deploy("qemu-tdx");
    took.push(wait_for("the drop-in in the reinstalled shim", within, &d, || {
        std::fs::read(drop_in(&go)).ok() == Some(good.clone())
    }));
    assert_effective(&node, &go, "v1", true);

    // 5. A deleted artifact is pulled again from the recorded image.
    let kernel = node.qemu_of(&go, "kernel").expect("kernel");
    std::fs::remove_file(node.path(&kernel)).expect("rm kernel");
    took.push(wait_for("the re-pulled kernel", within, &d, || {
        node.qemu_of(&go, "kernel").and_then(|k| std::fs::read(node.path(&k)).ok()) == Some(imgs.k1.clone())
    }));
    wait_for("the artifact repair log line", within, &d, || d.log().contains("was missing; pulling"));
    assert_effective(&node, &go, "v1", true);
    assert_effective(&node, &rs, "v1", true);
    eprintln!("repair latencies with --resync {RESYNC}: {took:?}");

    // SIGTERM: exit 0.
    let mut d = d;
    let pid = d.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let status = d.child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{}", d.log());
}
