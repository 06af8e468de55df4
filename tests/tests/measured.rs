//! Measured guests end to end (docs/measured-guests.md): a kata-deploy node root built from
//! Kata's real `configuration-qemu-snp-runtime-rs.toml.in` (its @VARS@ filled) with
//! kata-deploy's `25-devkit.toml` fragment beside it; a measured guest image and a measured
//! extension built with mkfs.erofs, veritysetup and sfdisk, shipped in an OCI layout; the
//! real binary installs, and the configuration Kata loads (tables merged, arrays replaced,
//! `tests/src/node.rs`) has the keys required; status sees stale and shadowed entries;
//! refusals leave the node unchanged; uninstall gives back the base.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kata_addons_tests::disk::{self, Fs, Label};
use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::kata_deploy::{BASE_PARAMS, COCO_PARAMS, CONFIG, DEVKIT, devkit_fragment, kata_config};
use kata_addons_tests::node::{Node, content_snapshot, extension_entries};
use kata_addons_tests::{kata_addons_bin, show};

const SHIM: &str = "qemu-snp-runtime-rs";
const STATE: &str = "/etc/kata-containers/addons/state.json";

/// Runs `kata-addons` with a clean environment.
fn kata(args: &[&str]) -> Output {
    kata_addons_tests::run_kata_env(args, &[])
}

fn write_configmap(dir: &Path, name: &str, pairs: &[(&str, &str)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> =
        pairs.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string()))).collect();
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(&map).expect("json")).expect("write configmap");
    p.display().to_string()
}

/// The node's files, without the node lock kata-addons keeps under /run.
fn snapshot(root: &Path) -> std::collections::BTreeMap<String, String> {
    let mut s = content_snapshot(root);
    s.retain(|k, _| k != "run" && !k.starts_with("run/"));
    s
}

/// The tools check, a scratch directory, and a kata-deploy qemu-snp-runtime-rs node root
/// (Kata's template filled) with kata-deploy's `25-devkit.toml` beside it; returns the
/// fragment's node path too.
fn kata_deploy_snp_node() -> (tempfile::TempDir, Node, String) {
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let node = Node::empty();
    node.write(CONFIG, &kata_config());
    let devkit_path = format!("{}/config.d/25-devkit.toml", CONFIG.rsplit_once('/').expect("dir").0);
    node.write(&devkit_path, &devkit_fragment(""));
    (tmp, node, devkit_path)
}

#[test]
fn kata_deploy_snp_root_measured_image_and_extension() {
    let (tmp, node, devkit_path) = kata_deploy_snp_node();
    let d = tmp.path();
    let base_effective = node.effective_of(CONFIG);
    assert_eq!(node.qemu_of(CONFIG, "kernel_verity_params").as_deref(), Some(BASE_PARAMS), "the template filled");
    let before = snapshot(node.root());

    // A measured guest image (erofs, GPT) and a measured extension (erofs, MBR) whose
    // parameters ship in the image as guest-components publishes them (root_hash_<v>.txt).
    let (guest, gv) = disk::measured(d, "guest", Fs::Erofs, Label::Gpt, "5eed", 4096, 4096);
    let (ext, ev) = disk::measured(d, "coco", Fs::Erofs, Label::Mbr, "c0c0", 4096, 4096);
    let mut damaged = std::fs::read(&guest).expect("guest");
    damaged[(1 << 20) + 4096 + 7] ^= 1;
    let layer = LayerBuilder::new()
        .file("images/kata-containers-confidential.img", &std::fs::read(&guest).expect("guest"))
        .file("images/damaged.img", &damaged)
        .file("images/kata-containers-coco.img", &std::fs::read(&ext).expect("ext"))
        .file("images/root_hash_coco.txt", format!("{}\n", ev.kata_params()).as_bytes())
        .file("images/root_hash_bad.txt", b"root_hash=00,salt=zz\n")
        .build(Compress::Gzip);
    let img = Image::new(vec![layer]);
    img.write_layout(&d.join("layout"), "v1");
    let reference = format!("oci:{}:v1", d.join("layout").display());
    let root = node.root().to_str().expect("utf-8").to_string();
    let gp = gv.kata_params();
    let cm = write_configmap(
        d,
        "cm.json",
        &[
            ("addonImage", &reference),
            ("provider", "snp"),
            ("imagePath", "/images/kata-containers-confidential.img"),
            ("imageVerityParams", &gp),
            ("extensionPath", "/images/kata-containers-coco.img"),
            ("extensionName", "coco"),
            ("extensionVerityPath", "/images/root_hash_coco.txt"),
        ],
    );

    // preview shows the new drop-in keys for this node.
    let o = kata(&["preview", "--configmap", &cm, "--root", &root, "--output", "json"]);
    assert!(o.status.success(), "{}", show(&o));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let contents = p["dropIns"][0]["contents"].as_str().expect("contents");
    assert!(contents.contains(&format!("kernel_verity_params = \"{gp}\"")), "{contents}");
    assert!(contents.contains("[[hypervisor.qemu.guest_extension_images]]"), "{contents}");

    // Refusals change nothing: a damaged image, a verity file that does not parse, an
    // unmeasured image on this measured runtime config.
    for (pairs, code, says) in [
        (
            vec![("imagePath", "/images/damaged.img"), ("imageVerityParams", gp.as_str())],
            1,
            "refusing /images/damaged.img",
        ),
        (
            vec![
                ("imagePath", "/images/kata-containers-confidential.img"),
                ("imageVerityPath", "/images/root_hash_bad.txt"),
            ],
            1,
            "root_hash_bad.txt",
        ),
        (vec![("imagePath", "/images/kata-containers-confidential.img")], 1, CONFIG),
    ] {
        let mut all = vec![("addonImage", reference.as_str()), ("provider", "snp")];
        all.extend(pairs);
        let bad = write_configmap(d, "bad.json", &all);
        let o = kata(&["install", "--configmap", &bad, "--root", &root]);
        assert_eq!(o.status.code(), Some(code), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{says}: {}", show(&o));
        assert_eq!(snapshot(node.root()), before, "a refusal leaves the node unchanged");
    }

    // Install: Kata's merged configuration has the keys required.
    let o = kata(&["install", "--configmap", &cm, "--root", &root]);
    assert!(o.status.success(), "{}", show(&o));
    let eff = node.effective_of(CONFIG);
    let q = &eff["hypervisor"]["qemu"];
    let dir = q["image"].as_str().expect("image").rsplit_once('/').expect("dir").0.to_string();
    assert!(dir.starts_with("/etc/kata-containers/addons/"), "{dir}");
    assert_eq!(q["initrd"].as_str(), Some(""));
    assert_eq!(q["kernel_verity_params"].as_str(), Some(gp.as_str()));
    assert_eq!(q["rootfs_type"].as_str(), Some("erofs"));
    assert_eq!(
        extension_entries(&eff),
        vec![
            ("coco".to_string(), format!("{dir}/extension"), ev.kata_params()),
            ("devkit".to_string(), DEVKIT.to_string(), String::new()),
        ],
        "ours replaces coco in place; devkit kept"
    );
    assert_eq!(eff["agent"]["kata"]["debug_console_enabled"].as_bool(), Some(true), "25-devkit.toml still in effect");
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.path(STATE)).expect("state")).expect("state json");
    let files = st["files"].as_array().expect("files");
    assert_eq!(files[0]["filesystem"], "erofs");
    assert_eq!(files[0]["verity"]["rootHash"], gv.root_hash.as_str());
    assert_eq!(files[1]["verity"]["rootHash"], ev.root_hash.as_str());
    let o = kata(&["status", "--root", &root]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let o = kata(&["install", "--configmap", &cm, "--root", &root]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("up to date"), "{}", show(&o));

    // No sha256 was pinned, so a measured file's record is its dm-verity tree and the
    // sha256 of its bytes outside the data blocks (its SHA-256 is not computed: one pass
    // less over every byte). Every byte is still covered: an edit inside the data blocks
    // or outside them is drift, and install puts the file back.
    assert!(files[0].get("sha256").is_none(), "{st}");
    assert!(files[0]["verity"]["outsideSha256"].as_str().is_some_and(|h| h.len() == 64), "{st}");
    let installed_image = || {
        let st: serde_json::Value =
            serde_json::from_slice(&std::fs::read(node.path(STATE)).expect("state")).expect("state json");
        node.path(st["files"][0]["path"].as_str().expect("path"))
    };
    let data_start = disk::sfdisk_partitions(&installed_image()).expect("partitions")[0].1;
    for (offset, says) in
        [(data_start + 10 * 4096 + 5, "dm-verity: the dm-verity tree"), (100, "outside the dm-verity data blocks")]
    {
        disk::flip(&installed_image(), offset);
        let o = kata(&["status", "--root", &root]);
        assert_eq!(o.status.code(), Some(4), "byte {offset}: {}", show(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains(says), "byte {offset}, {says}: {}", show(&o));
        let o = kata(&["install", "--configmap", &cm, "--root", &root]);
        assert!(o.status.success(), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("was edited"), "byte {offset}: {}", show(&o));
        let o = kata(&["status", "--root", &root]);
        assert_eq!(o.status.code(), Some(0), "byte {offset}, after the repair: {}", show(&o));
    }

    // A kata-deploy upgrade changes devkit's parameters underneath: status names the
    // stale entry (exit 4); install re-renders and the new entry is in effect.
    node.write(&devkit_path, &devkit_fragment(COCO_PARAMS));
    let o = kata(&["status", "--root", &root]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"devkit\" is stale"), "{}", show(&o));
    let o = kata(&["install", "--configmap", &cm, "--root", &root]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(extension_entries(&node.effective_of(CONFIG))[1].2, COCO_PARAMS);
    assert_eq!(kata(&["status", "--root", &root]).status.code(), Some(0));

    // A later fragment that replaces the array and the verity key shadows ours.
    let over = format!("{}/config.d/50-overrides.toml", CONFIG.rsplit_once('/').expect("dir").0);
    node.write(&over, "[hypervisor.qemu]\nkernel_verity_params = \"\"\nguest_extension_images = []\n");
    let o = kata(&["status", "--root", &root]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for k in ["hypervisor.qemu.kernel_verity_params", "hypervisor.qemu.guest_extension_images"] {
        assert!(out.contains(k) && out.contains("50-overrides.toml"), "{k}: {out}");
    }
    std::fs::remove_file(node.path(&over)).expect("rm overrides");

    // Uninstall: exactly the base (and kata-deploy's fragment) again.
    let o = kata(&["uninstall", "--root", &root]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(node.effective_of(CONFIG), {
        let mut b = base_effective.clone();
        kata_addons_tests::node::merge(&mut b, toml::from_str(&devkit_fragment(COCO_PARAMS)).expect("toml"));
        b
    });
    assert_eq!(
        extension_entries(&node.effective_of(CONFIG))[0].1,
        "/opt/kata/share/kata-containers/kata-containers-coco.img"
    );
    let _ = SHIM;
}

/// The daemon re-renders within one resync when the entries it re-emits change underneath:
/// a kata-deploy upgrade that edits devkit's verity parameters in `25-devkit.toml`.
#[test]
fn the_daemon_re_renders_when_a_re_emitted_entry_changes_underneath() {
    let (tmp, node, devkit_path) = kata_deploy_snp_node();
    let d = tmp.path();
    let (ext, ev) = disk::measured(d, "coco", Fs::Erofs, Label::Gpt, "c0c0", 4096, 4096);
    let layer = LayerBuilder::new()
        .file("images/kata-containers-coco.img", &std::fs::read(&ext).expect("ext"))
        .build(Compress::Gzip);
    Image::new(vec![layer]).write_layout(&d.join("layout"), "v1");
    let reference = format!("oci:{}:v1", d.join("layout").display());
    let params = ev.kata_params();
    let cm = write_configmap(
        d,
        "cm.json",
        &[
            ("addonImage", &reference),
            ("provider", "snp"),
            ("extensionPath", "/images/kata-containers-coco.img"),
            ("extensionName", "coco"),
            ("extensionVerityParams", &params),
        ],
    );
    let (ready, log) = (d.join("ready"), d.join("daemon.log"));
    let mut child = Command::new(kata_addons_bin())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["daemon", "--poll-interval", "0.2", "--start-jitter", "0", "--configmap", &cm, "--root"])
        .arg(node.root())
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn daemon");
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !f() {
            if start.elapsed() > Duration::from_secs(90) {
                panic!("timed out waiting for {what}:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait("readiness", &|| ready.exists());
    let devkit = |eff: &toml::Table| extension_entries(eff).into_iter().find(|e| e.0 == "devkit").map(|e| e.2);
    assert_eq!(devkit(&node.effective_of(CONFIG)), Some(String::new()));
    node.write(&devkit_path, &devkit_fragment(COCO_PARAMS));
    wait("the re-render", &|| devkit(&node.effective_of(CONFIG)).as_deref() == Some(COCO_PARAMS));
    let entries = extension_entries(&node.effective_of(CONFIG));
    assert_eq!(entries[0].0, "coco");
    assert_eq!(entries[0].2, params, "ours still replaces coco");
    assert_eq!(kata(&["status", "--root", node.root().to_str().expect("utf-8")]).status.code(), Some(0));
    let _ = child.kill();
    let _ = child.wait();
}
