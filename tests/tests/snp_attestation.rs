//! `snp_launch_measurement` end to end (docs/attestation.md): a kata-deploy runtime-rs SNP
//! node from Kata's real template (`tests/src/kata_deploy.rs`) with kata-deploy's devkit
//! fragment, firmware shaped like Kata's AMDSEV OVMF (`tests/src/ovmf.rs`; Debian's `ovmf`
//! for the refusal), a measured guest image and a measured extension built with
//! mkfs.erofs, veritysetup and sfdisk; the real binary installs and publishes, and the
//! published list is compared with `sev-snp-measure` run on the same firmware, kernel and
//! the command line written out here from the runtime-rs table of docs/attestation.md. The
//! daemon republishes after a ConfigMap change; uninstall removes the values.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use kata_addons_tests::daemon::{ConfigMapDir, Daemon, wait_for};
use kata_addons_tests::disk::{self, Fs, Label, Verity};
use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::kata_deploy::{COCO_PARAMS, CONFIG, FIRMWARE, KERNEL, devkit_fragment, kata_config};
use kata_addons_tests::node::{Node, content_snapshot};
use kata_addons_tests::ovmf::{self, Ovmf};
use kata_addons_tests::show;

const ADDONS: &str = "/etc/kata-containers/addons";

/// Runs `kata-addons` with a clean environment on the node `root`.
fn kata(args: &[&str], root: &Path) -> Output {
    let root = root.display().to_string();
    let args: Vec<&str> = args.iter().copied().chain(["--root", &root]).collect();
    kata_addons_tests::run_kata_env(&args, &[])
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn state(node: &Node) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(node.path(&format!("{ADDONS}/state.json"))).expect("state"))
        .expect("state json")
}

fn version_dir(node: &Node) -> String {
    format!("{ADDONS}/{}", state(node)["versionDir"].as_str().expect("versionDir"))
}

/// The `snp_launch_measurement` list of the published `reference-values.json`.
fn published(node: &Node) -> Vec<String> {
    let text = std::fs::read(node.path(&format!("{}/reference-values.json", version_dir(node)))).expect("published");
    let v: serde_json::Value = serde_json::from_slice(&text).expect("reference-values.json");
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 1, "one target: {v}");
    let value = targets[0]["values"]
        .as_array()
        .expect("values")
        .iter()
        .find(|x| x["name"] == "snp_launch_measurement")
        .unwrap_or_else(|| panic!("no snp_launch_measurement: {v}"));
    assert_eq!(value["status"], "computed", "{value}");
    value["values"].as_array().expect("list").iter().map(|s| s.as_str().expect("hex").to_string()).collect()
}

/// The node's CPUs as Kata's Go runtime and kata-addons count them (`processor` lines).
fn host_cpus() -> u32 {
    let text = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
    text.lines().filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor")).count() as u32
}

/// The command line runtime-rs composes for this node, row by row of the runtime-rs table in
/// docs/attestation.md: the fixed parameters, the dm-verity root of the installed image
/// (erofs), the agent's in key order (`cdh_api_timeout_ms = 50000`, the devkit fragment's
/// debug console, `launch_process_timeout = 6`), `kernel_params`, `selinux=1` (the template's
/// `disable_guest_selinux = false`), one parameter per extension, `console=hvc0`.
fn runtime_rs_cmdline(image: &Verity, coco: &Verity) -> String {
    let sectors = image.data_blocks * u64::from(image.data_block_size) / 512;
    format!(
        "reboot=k panic=1 systemd.unit=kata-containers.target systemd.mask=systemd-networkd.service \
         systemd.mask=systemd-networkd.socket dm-mod.create=\"dm-verity,,,ro,0 {sectors} verity 1 /dev/vda1 \
         /dev/vda2 {} {} {} 0 sha256 {} {}\" root=/dev/dm-0 rootflags=ro rootfstype=erofs agent.cdh_api_timeout=50 \
         agent.debug_console agent.debug_console_vport=1026 agent.launch_process_timeout=6 cgroup_no_v1=all \
         quiet selinux=1 kata.extension.coco.verity_params={} kata.extension.devkit.verity_params console=hvc0",
        image.data_block_size,
        image.hash_block_size,
        image.data_blocks,
        image.root_hash,
        image.salt,
        coco.kata_params()
    )
}

/// `sev-snp-measure` for every count.
fn oracle(firmware: &Path, kernel: &Path, cmdline: &str, counts: &[u32]) -> Vec<String> {
    counts
        .iter()
        .map(|n| {
            ovmf::measure(firmware, kernel, None, cmdline, *n, "EPYC-v4")
                .unwrap_or_else(|e| panic!("sev-snp-measure with {n} vCPUs: {e}"))
        })
        .collect()
}

#[test]
fn snp_install_publishes_what_sev_snp_measure_computes_and_the_daemon_republishes() {
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
    assert!(ovmf::oracle().exists(), "sev-snp-measure is not at {} (tests/run installs it)", ovmf::oracle().display());
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    let node = Node::empty();
    let config = kata_config();
    assert!(config.contains("kernel_params = \"x\"\n"), "the filled template's kernel_params");
    node.write(CONFIG, &config.replace("kernel_params = \"x\"\n", "kernel_params = \"cgroup_no_v1=all quiet\"\n"));
    let config_d = format!("{}/config.d", CONFIG.rsplit_once('/').expect("dir").0);
    node.write(&format!("{config_d}/25-devkit.toml"), &devkit_fragment(""));
    node.write(&format!("{config_d}/30-vcpus.toml"), "[hypervisor.qemu]\ndefault_maxvcpus = 4\n");
    let counts: Vec<u32> = (1..=4.min(host_cpus())).collect();
    let firmware = Ovmf::amdsev(23).build();
    for (path, data) in [(FIRMWARE, firmware), (KERNEL, random(3 << 20, 5))] {
        std::fs::create_dir_all(node.path(path).parent().expect("dir")).expect("mkdir");
        std::fs::write(node.path(path), data).expect("write a node file");
    }
    let root = node.root().to_path_buf();

    // The addon: a measured guest image and a measured extension; in v2, a kernel too.
    let (guest, gv) = disk::measured(d, "guest", Fs::Erofs, Label::Gpt, "5eed", 4096, 4096);
    let (ext, ev) = disk::measured(d, "coco", Fs::Erofs, Label::Mbr, "c0c0", 4096, 4096);
    let addon_kernel = random((4 << 20) + 321, 6);
    let layer = LayerBuilder::new()
        .file("images/kata-containers-confidential.img", &std::fs::read(&guest).expect("guest"))
        .file("images/kata-containers-coco.img", &std::fs::read(&ext).expect("ext"))
        .file("images/root_hash_coco.txt", format!("{}\n", ev.kata_params()).as_bytes())
        .file("vmlinuz", &addon_kernel)
        .build(Compress::Gzip);
    Image::new(vec![layer]).write_layout(&d.join("layout"), "v1");
    let reference = format!("oci:{}:v1", d.join("layout").display());
    let gp = gv.kata_params();
    let v1 = [
        ("addonImage", reference.as_str()),
        ("provider", "snp"),
        ("imagePath", "/images/kata-containers-confidential.img"),
        ("imageVerityParams", gp.as_str()),
        ("extensionPath", "/images/kata-containers-coco.img"),
        ("extensionName", "coco"),
        ("extensionVerityPath", "/images/root_hash_coco.txt"),
    ];
    let cm_file = d.join("cm.json");
    let map: serde_json::Map<String, serde_json::Value> =
        v1.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string()))).collect();
    std::fs::write(&cm_file, serde_json::to_vec(&map).expect("json")).expect("configmap");

    // Install: the node's kernel, the installed image's dm-verity root and the extension.
    let o = kata(&["install", "--configmap", cm_file.to_str().expect("utf-8")], &root);
    assert!(o.status.success(), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("reference-values.json"), "{}", show(&o));
    let cmdline = runtime_rs_cmdline(&gv, &ev);
    let fw_path = node.path(FIRMWARE);
    let want = oracle(&fw_path, &node.path(KERNEL), &cmdline, &counts);
    assert_eq!(published(&node), want, "the published list is sev-snp-measure's, for vCPU counts {counts:?}");
    let o = kata(&["reference-values", "--output", "json"], &root);
    assert!(o.status.success(), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&cmdline.replace('"', "\\\"")), "the composed command line");
    assert_ne!(COCO_PARAMS, ev.kata_params(), "the extension's parameters are the installed one's");

    // The daemon: up to date with v1, then a ConfigMap change that installs a kernel too;
    // it republishes, for the new kernel.
    let mut cm = ConfigMapDir::new(&v1);
    let ready = d.join("ready");
    let mut daemon = Daemon::start(node.root(), cm.path(), &ready, d.join("daemon.log"));
    let v1_dir = version_dir(&node);
    let line = |dir: &str| format!("reference values: {dir}/reference-values.json");
    wait_for(
        "the daemon ready with v1's reference values",
        Duration::from_secs(120),
        || std::fs::read_to_string(&ready).is_ok_and(|r| r.contains(&line(&v1_dir))),
        || daemon.log(),
    );
    let mut v2 = v1.to_vec();
    v2.push(("kernelPath", "/vmlinuz"));
    cm.update(&v2);
    wait_for(
        "the daemon ready with v2's reference values",
        Duration::from_secs(120),
        || {
            let now = version_dir(&node);
            now != v1_dir && std::fs::read_to_string(&ready).is_ok_and(|r| r.contains(&line(&now)))
        },
        || daemon.log(),
    );
    assert!(daemon.log().contains("reference values written"), "{}", daemon.log());
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(Duration::from_secs(60)), Some(0), "{}", daemon.log());
    let v2_dir = version_dir(&node);
    let st = state(&node);
    let kernel_rec = st["files"]
        .as_array()
        .expect("files")
        .iter()
        .find(|f| f["kind"] == "kernel")
        .unwrap_or_else(|| panic!("no kernel installed: {st}"));
    let installed_kernel = node.path(kernel_rec["path"].as_str().expect("path"));
    assert_eq!(std::fs::read(&installed_kernel).expect("installed kernel"), addon_kernel);
    let want2 = oracle(&fw_path, &installed_kernel, &cmdline, &counts);
    assert_ne!(want2, want, "another kernel, other digests");
    assert_eq!(published(&node), want2, "republished for the installed kernel");
    let o = kata(&["reference-values", "--output", "rvps"], &root);
    assert!(o.status.success(), "{}", show(&o));
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one RVPS message");
    use base64::Engine;
    let payload =
        base64::engine::general_purpose::STANDARD.decode(m["payload"].as_str().expect("payload")).expect("b64");
    let p: serde_json::Value = serde_json::from_slice(&payload).expect("payload json");
    assert_eq!(p["snp_launch_measurement"], serde_json::json!(want2), "{p}");

    // Debian's OVMF has no kernel-hashes section: not computed, with the reason (exit 1).
    std::fs::copy("/usr/share/ovmf/OVMF.fd", &fw_path).expect("Debian's OVMF (tests/run installs ovmf)");
    let o = kata(&["reference-values"], &root);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("snp_launch_measurement") && err.contains("kernel-hashes"), "{err}");

    // Uninstall removes them with the version directories.
    let o = kata(&["uninstall"], &root);
    assert!(o.status.success(), "{}", show(&o));
    let left: Vec<String> =
        content_snapshot(node.root()).into_keys().filter(|k| k.ends_with("reference-values.json")).collect();
    assert!(left.is_empty(), "left after uninstall: {left:?}");
    for dir in [&v1_dir, &v2_dir] {
        assert!(!node.path(dir).exists(), "{dir} left after uninstall");
    }
    let o = kata(&["reference-values"], &root);
    assert_eq!(o.status.code(), Some(3), "nothing installed: {}", show(&o));
}
