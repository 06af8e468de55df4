//! Hostile layers (memory and CPU bombs, sparse files, link tricks) and hostile node state
//! (docs/design.md#limits), against the real binary. Each test names what it pins down.
//! Costs are measured with `kata_addons_tests::measure` (peak RSS from the child's
//! `VmHWM` / `ru_maxrss`, CPU time from `wait4`), never by wall time.

use std::path::Path;
use std::time::Duration;

use kata_addons_tests::hostile::{KERNEL, RawTar, base_layer, gzip, zstd, zstd_repeat};
use kata_addons_tests::image::{Blob, Compress, Image, LayerBuilder, media};
use kata_addons_tests::kata_addons_bin;
use kata_addons_tests::measure::{Measured, run_measured};

/// Peak RSS any hostile layer of at most 1 MiB may cost.
const RSS_BUDGET_MIB: f64 = 64.0;
/// CPU time any hostile layer of at most 1 MiB may cost.
const CPU_BUDGET: Duration = Duration::from_secs(5);
/// Wall time after which a run is killed (it then fails its assertions).
const KILL_AFTER: Duration = Duration::from_secs(90);

/// Writes an image (layers bottom first) as an OCI layout; returns its `oci:` reference.
fn layout(dir: &Path, layers: Vec<Blob>) -> String {
    let img = Image::new(layers);
    let d = dir.join("layout");
    img.write_layout(&d, "v1");
    format!("oci:{}:v1", d.display())
}

/// `kata-addons fetch` of `paths` from `image`, measured.
fn fetch(dir: &Path, image: &str, paths: &[&str], extra: &[&str]) -> Measured {
    let dest = dir.join("dest");
    let dest = dest.to_str().expect("utf-8");
    let mut args = vec!["fetch", "--image", image, "--dest", dest];
    for p in paths {
        args.extend(["--path", p]);
    }
    args.extend(extra);
    run_measured(&kata_addons_bin(), &args, KILL_AFTER)
}

fn assert_within_budget(m: &Measured, what: &str) {
    eprintln!("cost of {what}: peak RSS {:.1} MiB, CPU {:.2} s", m.peak_rss_mib(), m.cpu.as_secs_f64());
    assert!(m.signal.is_none(), "{what}: killed\n{}", m.summary());
    assert!(m.peak_rss_mib() <= RSS_BUDGET_MIB, "{what}: peak RSS over {RSS_BUDGET_MIB} MiB\n{}", m.summary());
    assert!(m.cpu <= CPU_BUDGET, "{what}: CPU over {CPU_BUDGET:?}\n{}", m.summary());
}

/// CPU allowed to the largest accepted extraction: the 5 s budget for an optimised
/// binary (`cargo test --release`, BENCHMARKS.md); an unoptimised one (plain `cargo test`)
/// runs zstd, sha256 and the copy loop several times slower, so it gets 4x that.
fn extraction_cpu_budget() -> Duration {
    if cfg!(debug_assertions) { CPU_BUDGET * 4 } else { CPU_BUDGET }
}

fn assert_refused(m: &Measured, what: &str, needle: &str) {
    assert_eq!(m.code, Some(1), "{what}: expected exit 1\n{}", m.summary());
    assert!(m.stderr.contains(needle), "{what}: stderr lacks {needle:?}\n{}", m.summary());
}

// ---- memory bombs in tar ----------------------------------------------------------------

/// A GNU long name record of 128 MiB is refused before it is read.
#[test]
fn huge_gnu_long_name_is_refused_before_reading() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut t = RawTar::default();
    t.header(b'L', "././@LongLink", "", 128 << 20);
    let mut tar = t.finish();
    tar.truncate(512);
    // Header frame, then 128 MiB of 'a' as the record, then the end.
    let mut blob = zstd(&tar);
    blob.extend(zstd_repeat(b'a', 128 << 20));
    blob.extend(zstd(&[0u8; 1024]));
    assert!(blob.len() < 1 << 20);
    let image = layout(tmp.path(), vec![base_layer(), Blob::new(media::TAR_ZSTD, blob)]);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "long name", "GNU long name record is 134217728 bytes");
    assert_within_budget(&m, "long name");
}

/// A PAX extended header of 128 MiB is refused before it is read.
#[test]
fn huge_pax_record_is_refused_before_reading() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut t = RawTar::default();
    t.header(b'x', "PaxHeaders/x", "", 128 << 20);
    let mut tar = t.finish();
    tar.truncate(512);
    let mut blob = zstd(&tar);
    blob.extend(zstd_repeat(b'a', 128 << 20));
    blob.extend(zstd(&[0u8; 1024]));
    let image = layout(tmp.path(), vec![base_layer(), Blob::new(media::TAR_ZSTD, blob)]);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "pax record", "PAX extended header record is 134217728 bytes");
    assert_within_budget(&m, "pax record");
}

/// Entry paths longer than 4096 bytes are refused (GNU long name and PAX path).
#[test]
fn paths_over_4096_bytes_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let long = "d/".repeat(2500) + "f";
    let mut t = RawTar::default();
    t.long_name(&long).file("ignored", b"x");
    let img_a = layout(&tmp.path().join("a"), vec![base_layer(), Blob::new(media::TAR_GZIP, gzip(&t.finish()))]);
    let m = fetch(&tmp.path().join("a"), &img_a, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "long name path", "more than the 4096 byte limit");
    let mut t = RawTar::default();
    t.pax(&[("path", &long)]).file("ignored", b"x");
    let img_b = layout(&tmp.path().join("b"), vec![base_layer(), Blob::new(media::TAR_GZIP, gzip(&t.finish()))]);
    let m = fetch(&tmp.path().join("b"), &img_b, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "pax path", "more than the 4096 byte limit");
}

/// Thousands of 4 KiB-deep paths with distinct first components (every prefix
/// distinct) stay within the memory budget and hit the index cap.
#[test]
fn deep_distinct_paths_hit_the_index_cap_within_budget() {
    let tmp = tempfile::tempdir().expect("tmp");
    let deep = "a/".repeat(2000);
    let mut t = RawTar::default();
    for i in 0..12_000 {
        t.long_name(&format!("{i:05}/{deep}f")).file("x", b"");
    }
    let blob = Blob::new(media::TAR_ZSTD, zstd(&t.finish()));
    assert!(blob.data.len() < 1 << 20, "{} bytes", blob.data.len());
    let image = layout(tmp.path(), vec![base_layer(), blob]);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "deep paths", "--max-index-bytes");
    assert_within_budget(&m, "deep paths");
}

/// The merged index is capped by entries; the cap is a flag.
#[test]
fn index_entry_cap_and_flag() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut t = LayerBuilder::new();
    for i in 0..3000 {
        t.file(&format!("f{i}"), b"");
    }
    let image = layout(tmp.path(), vec![base_layer(), t.build(Compress::Gzip)]);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &["--max-index-entries", "2000"]);
    assert_refused(&m, "entries", "more than 2000 tar entries");
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_eq!(m.code, Some(0), "{}", m.summary());
}

// ---- CPU bombs --------------------------------------------------------------------------

/// A small zstd layer expanding to 20 GiB of zeros is cut off at the
/// decompression cap instead of being read to the end.
#[test]
fn zstd_zero_bomb_is_cut_at_the_cap() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut t = RawTar::default();
    t.header(b'0', "zeros", "", 20 << 30);
    let mut head = t.finish();
    head.truncate(512);
    let mut blob = zstd(&head);
    let chunk = zstd_repeat(0, 256 << 20);
    for _ in 0..80 {
        blob.extend_from_slice(&chunk);
    }
    blob.extend(zstd(&[0u8; 1024]));
    assert!(blob.len() < 1 << 20, "{} bytes", blob.len());
    let image = layout(tmp.path(), vec![base_layer(), Blob::new(media::TAR_ZSTD, blob)]);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "zstd bomb", "decompresses to more than");
    assert_within_budget(&m, "zstd bomb");
}

/// The decompression cap is a ratio with a floor, and both flags override it.
#[test]
fn ratio_cap_and_flags() {
    let tmp = tempfile::tempdir().expect("tmp");
    let zeros = vec![0u8; 100 << 20];
    let mut t = LayerBuilder::new();
    t.file("big", &zeros).dir("boot").file("boot/vmlinuz", KERNEL);
    let image = layout(tmp.path(), vec![t.build(Compress::Zstd)]);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "ratio", "--max-layer-ratio");
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &["--max-layer-ratio", "100000"]);
    assert_eq!(m.code, Some(0), "{}", m.summary());
    let m =
        fetch(tmp.path(), &image, &["/boot/vmlinuz"], &["--max-layer-ratio", "100000", "--max-layer-bytes", "1000000"]);
    assert_refused(&m, "ceiling", "decompresses to more than 1000000 bytes");
}

/// More than 256 layers are refused before any is read; the cap is a flag.
#[test]
fn layer_count_cap() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut layers = vec![base_layer()];
    for i in 0..300 {
        layers.push(LayerBuilder::new().file(&format!("l{i}"), b"x").build(Compress::Gzip));
    }
    let image = layout(tmp.path(), layers);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "layers", "has 301 layers, more than the limit of 256 (--max-layers)");
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &["--max-layers", "400"]);
    assert_eq!(m.code, Some(0), "{}", m.summary());
}

/// Symlinks cost work linear in entries: 40 layers of 2,000 symlinks each over
/// a 45-deep wanted path (the first cut re-resolved every wanted path on every symlink:
/// layers × symlinks × depth²).
#[test]
fn symlink_storm_is_linear() {
    let tmp = tempfile::tempdir().expect("tmp");
    let storm = kata_addons_tests::hostile::symlink_storm();
    let image = layout(tmp.path(), storm.layers);
    let wanted = storm.paths[0].clone();
    let m = fetch(tmp.path(), &image, &[&wanted], &[]);
    eprintln!("symlink storm: {}", m.summary());
    assert_eq!(m.code, Some(0), "{}", m.summary());
    assert_within_budget(&m, "symlink storm");
}

// ---- sparse files -----------------------------------------------------------------------

fn sparse_case(dir: &Path, tar: Vec<u8>) -> Measured {
    let image = layout(dir, vec![Blob::new(media::TAR_GZIP, gzip(&tar))]);
    fetch(dir, &image, &["/boot/vmlinuz"], &[])
}

/// Every sparse encoding is refused with "sparse files are not supported".
#[test]
fn every_sparse_form_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let packed = vec![7u8; 5120];
    // GNU 'S' type (old GNU sparse).
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"").entry(b'S', "boot/vmlinuz", "", &packed);
    let m = sparse_case(&tmp.path().join("gnu"), t.finish());
    assert_refused(&m, "GNU S", "sparse files are not supported: /boot/vmlinuz");
    // PAX 0.0: GNU.sparse.offset / numbytes pairs on a regular entry.
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"")
        .pax(&[
            ("GNU.sparse.size", "8388608"),
            ("GNU.sparse.numblocks", "1"),
            ("GNU.sparse.offset", "0"),
            ("GNU.sparse.numbytes", "5120"),
        ])
        .file("boot/vmlinuz", &packed);
    let m = sparse_case(&tmp.path().join("pax00"), t.finish());
    assert_refused(&m, "PAX 0.0", "sparse files are not supported: /boot/vmlinuz");
    // PAX 0.1: GNU.sparse.map.
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"")
        .pax(&[("GNU.sparse.size", "8388608"), ("GNU.sparse.numblocks", "1"), ("GNU.sparse.map", "0,5120")])
        .file("boot/vmlinuz", &packed);
    let m = sparse_case(&tmp.path().join("pax01"), t.finish());
    assert_refused(&m, "PAX 0.1", "sparse files are not supported: /boot/vmlinuz");
    // PAX 1.0: major/minor/realsize/name, the header names GNUSparseFile.0/…
    let mut t = RawTar::default();
    let mut data = b"1\n0\n5120\n".to_vec();
    data.resize(512, 0);
    data.extend_from_slice(&packed);
    t.entry(b'5', "boot", "", b"")
        .pax(&[
            ("GNU.sparse.major", "1"),
            ("GNU.sparse.minor", "0"),
            ("GNU.sparse.realsize", "8388608"),
            ("GNU.sparse.name", "boot/vmlinuz"),
        ])
        .file("boot/GNUSparseFile.0/vmlinuz", &data);
    let m = sparse_case(&tmp.path().join("pax10"), t.finish());
    assert_refused(&m, "PAX 1.0", "sparse files are not supported: /boot/vmlinuz");
}

// ---- hard link to a later entry ---------------------------------------------------------

/// A hard link refers to an earlier entry (or a lower layer), never a later one.
#[test]
fn hardlink_to_a_later_entry_is_not_followed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"").entry(b'1', "boot/vmlinuz", "boot/real", b"").file("boot/real", b"LATER");
    let top = Blob::new(media::TAR_GZIP, gzip(&t.finish()));
    let image = layout(&tmp.path().join("a"), vec![top.clone()]);
    let m = fetch(&tmp.path().join("a"), &image, &["/boot/vmlinuz"], &[]);
    assert_refused(&m, "later hardlink", "which does not exist before it");
    // The same link over a lower layer's file takes the lower file.
    let lower = LayerBuilder::new().dir("boot").file("boot/real", b"LOWER").build(Compress::Gzip);
    let image = layout(&tmp.path().join("b"), vec![lower, top]);
    let m = fetch(&tmp.path().join("b"), &image, &["/boot/vmlinuz"], &[]);
    assert_eq!(m.code, Some(0), "{}", m.summary());
    let got = std::fs::read(tmp.path().join("b/dest/vmlinuz")).expect("fetched");
    assert_eq!(got, b"LOWER");
}

// ---- budget: a layer of at most 1 MiB costs at most 64 MiB RSS and 5 s CPU --------------

/// The costliest *accepted* 1 MiB layer: a wanted file as large as the decompression cap
/// allows (1000 KiB of noise + 249 MiB of zeros, zstd), extracted, hashed and fsynced.
#[test]
fn done_when_largest_extraction_from_a_1mib_layer() {
    let tmp = tempfile::tempdir().expect("tmp");
    let noise = kata_addons_tests::node::noise(1000 << 10, 7);
    let zeros: u64 = 249 << 20;
    let size = noise.len() as u64 + zeros;
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"");
    t.header(b'0', "boot/vmlinuz", "", size);
    let head = t.finish();
    let head = &head[..head.len() - 1024];
    let mut blob = zstd(head);
    blob.extend(zstd(&noise));
    blob.extend(zstd_repeat(0, zeros));
    let mut tail = vec![0u8; (512 - (size % 512) as usize) % 512];
    tail.extend_from_slice(&[0u8; 1024]);
    blob.extend(zstd(&tail));
    assert!(blob.len() <= 1 << 20, "{} bytes", blob.len());
    let image = layout(tmp.path(), vec![Blob::new(media::TAR_ZSTD, blob)]);
    let m = fetch(tmp.path(), &image, &["/boot/vmlinuz"], &[]);
    assert_eq!(m.code, Some(0), "{}", m.summary());
    eprintln!("largest extraction from a 1 MiB layer: {}", m.summary());
    assert!(m.peak_rss_mib() <= RSS_BUDGET_MIB, "peak RSS over {RSS_BUDGET_MIB} MiB\n{}", m.summary());
    assert!(m.cpu <= extraction_cpu_budget(), "CPU over {:?}\n{}", extraction_cpu_budget(), m.summary());
    let len = std::fs::metadata(tmp.path().join("dest/vmlinuz")).expect("fetched").len();
    assert_eq!(len, size);
}

// ---- the state's paths are checked before anything acts on them -------------------------

mod state {
    use std::path::Path;
    use std::process::Output;

    use kata_addons_tests::node::{Node, content_snapshot, layout_with, noise};
    use kata_addons_tests::{kata_addons_bin, show};
    use serde_json::{Value, json};

    pub const STATE: &str = "/etc/kata-containers/addons/state.json";
    pub const TDX_CONFIG: &str = "/etc/kata-containers/kata-tdx/configuration.toml";

    pub fn kata(node: &Node, args: &[&str], env: &[(&str, &str)]) -> Output {
        let home = tempfile::tempdir().expect("temp HOME");
        let mut c = std::process::Command::new(kata_addons_bin());
        c.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("HOME", home.path());
        for (k, v) in env {
            c.env(k, v);
        }
        let root = node.root().display().to_string();
        c.args(args).args(["--root", &root]).output().expect("run kata-addons")
    }

    /// A node with an SE kernel installed from an OCI layout; returns the install env.
    pub fn installed(node: &Node, images: &Path) -> Vec<(&'static str, String)> {
        let k = noise(100_000, 3);
        layout_with(&images.join("v1"), "v1", &[("boot/vmlinuz", &k)]);
        let env = vec![
            ("ADDON_IMAGE", format!("oci:{}:v1", images.join("v1").display())),
            ("ADDON_KERNEL_PATH", "/boot/vmlinuz".to_string()),
        ];
        let o = kata(node, &["install"], &refs(&env));
        assert!(o.status.success(), "{}", show(&o));
        env
    }

    pub fn refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        v.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    pub fn edit_state(node: &Node, f: impl FnOnce(&mut Value)) {
        let p = node.path(STATE);
        let mut v: Value = serde_json::from_slice(&std::fs::read(&p).expect("state")).expect("state json");
        f(&mut v);
        std::fs::write(&p, serde_json::to_vec_pretty(&v).expect("json")).expect("write state");
    }

    /// Sets the (first) current drop-in path, whatever the schema's shape.
    pub fn set_drop_in_path(v: &mut Value, path: &str) {
        if let Some(d) = v.get_mut("dropIns").and_then(|d| d.get_mut(0)) {
            d["path"] = json!(path);
        } else {
            v["dropIn"]["path"] = json!(path);
        }
    }

    fn refused(o: &Output, field: &str) {
        assert_eq!(o.status.code(), Some(1), "{}", show(o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("`{field}")), "stderr does not name {field}: {}", show(o));
    }

    /// A state naming a runtime configuration as its drop-in is refused by
    /// `uninstall` (exit 1, naming the field); the configuration is not deleted.
    #[test]
    fn drop_in_naming_a_runtime_config_is_refused() {
        let (node, images) = (Node::new(), tempfile::tempdir().expect("tmp"));
        installed(&node, images.path());
        edit_state(&node, |v| set_drop_in_path(v, TDX_CONFIG));
        let before = content_snapshot(node.root());
        let o = kata(&node, &["uninstall"], &[]);
        refused(&o, "dropIn");
        assert_eq!(content_snapshot(node.root()), before, "uninstall changed the node");
        assert!(node.path(TDX_CONFIG).exists());
    }

    /// `previousDropIns` naming the TDX configuration does not make an
    /// "up to date" install delete it.
    #[test]
    fn previous_drop_ins_naming_a_runtime_config_is_refused() {
        let (node, images) = (Node::new(), tempfile::tempdir().expect("tmp"));
        let env = installed(&node, images.path());
        edit_state(&node, |v| v["previousDropIns"] = json!([TDX_CONFIG]));
        let before = content_snapshot(node.root());
        let o = kata(&node, &["install"], &refs(&env));
        refused(&o, "previousDropIns[0]");
        assert_eq!(content_snapshot(node.root()), before, "install changed the node");
    }

    /// `versionDir` of `.`, `x/..`, `""` or a path is refused; `addons/` and the
    /// installed kernel stay.
    #[test]
    fn version_dirs_outside_the_contract_are_refused() {
        let (node, images) = (Node::new(), tempfile::tempdir().expect("tmp"));
        installed(&node, images.path());
        let good: Value = serde_json::from_slice(&std::fs::read(node.path(STATE)).expect("state")).expect("json");
        for bad in [".", "x/..", "", "../../kata-tdx", "/etc"] {
            for field in ["versionDir", "previousDirs"] {
                edit_state(&node, |v| {
                    *v = good.clone();
                    v[field] = if field == "versionDir" { json!(bad) } else { json!([bad]) };
                });
                let before = content_snapshot(node.root());
                let o = kata(&node, &["uninstall"], &[]);
                refused(&o, field);
                assert_eq!(content_snapshot(node.root()), before, "{field} = {bad:?}: uninstall changed the node");
            }
        }
        // Files must live in the version directory.
        edit_state(&node, |v| {
            *v = good.clone();
            v["files"][0]["path"] = json!("/etc/shadow");
        });
        refused(&kata(&node, &["status"], &[]), "files[0].path");
    }

    /// A state file above 1 MiB is refused without being parsed.
    #[test]
    fn oversized_state_is_refused() {
        let (node, images) = (Node::new(), tempfile::tempdir().expect("tmp"));
        installed(&node, images.path());
        edit_state(&node, |v| v["padding"] = json!("x".repeat(1 << 20)));
        let o = kata(&node, &["uninstall"], &[]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("larger than 1048576 bytes"), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("kata-addons uninstall"), "{}", show(&o));
    }
}

// ---- ConfigMap input and the exit-code contract -----------------------------------------

mod config {
    use std::path::Path;
    use std::process::Output;

    use kata_addons_tests::{kata_addons_bin, show};

    fn preview(args: &[&str], cache: &Path) -> Output {
        let home = tempfile::tempdir().expect("temp HOME");
        let cache = cache.display().to_string();
        std::process::Command::new(kata_addons_bin())
            .env_clear()
            .env("HOME", home.path())
            .args(["preview", "--cache-dir", &cache])
            .args(args)
            .output()
            .expect("run kata-addons")
    }

    /// Every kind of invalid configuration file exits 2, naming the problem;
    /// limits are checked before the policy runs.
    #[test]
    fn invalid_configuration_always_exits_2() {
        let tmp = tempfile::tempdir().expect("tmp");
        let good = "addonImage: quay.io/org/k:v1\nkernelPath: /boot/vmlinuz\n";
        let many: String = (0..50_000).map(|i| format!("note{i:05}: x\n")).collect();
        let cases: Vec<(&str, String, &str)> = vec![
            ("unquoted number", format!("{good}version: 1.0\n"), "`version`"),
            ("kind Secret", "apiVersion: v1\nkind: Secret\ndata: {}\n".to_string(), "Secret"),
            ("duplicate keys", format!("{good}kernelPath: /boot/other\n"), "duplicate"),
            ("two documents", format!("{good}---\n{good}"), "more than one document"),
            ("malformed", "addonImage: [\n".to_string(), "invalid configuration"),
            ("over 128 keys", format!("{good}{}", &many[..200 * 13]), "limit of 128"),
            ("50,000 keys", format!("{good}{many}"), "limit of 128"),
            ("over 1 MiB", format!("{good}x: \"{}\"\n", "y".repeat(1 << 20)), "limit of 1048576 bytes"),
        ];
        for (what, text, needle) in cases {
            let f = tmp.path().join("cm.yaml");
            std::fs::write(&f, text).expect("write");
            let o = preview(&["--configmap", f.to_str().expect("utf-8")], tmp.path());
            assert_eq!(o.status.code(), Some(2), "{what}: {}", show(&o));
            assert!(String::from_utf8_lossy(&o.stderr).contains(needle), "{what}: lacks {needle:?}: {}", show(&o));
        }
        let f = tmp.path().join("cm.yaml");
        std::fs::write(&f, good).expect("write");
        let o = preview(&["--configmap", f.to_str().expect("utf-8")], tmp.path());
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    }

    /// Command-line usage errors exit 64 (EX_USAGE), so 2 always means invalid
    /// configuration; `--help` exits 0.
    #[test]
    fn usage_errors_exit_64() {
        let tmp = tempfile::tempdir().expect("tmp");
        for args in [&["--no-such-flag"][..], &["--output", "xml"], &["--configmap", "a", "--configmap-dir", "b"]] {
            let o = preview(args, tmp.path());
            assert_eq!(o.status.code(), Some(64), "{args:?}: {}", show(&o));
        }
        let o = std::process::Command::new(kata_addons_bin()).arg("frobnicate").output().expect("run");
        assert_eq!(o.status.code(), Some(64), "{}", show(&o));
        // A flag value outside its range is a usage error too, named, before anything runs.
        let dest = tmp.path().join("dest");
        let dest = dest.to_str().expect("utf-8");
        for (args, flag) in [
            (
                &["fetch", "--image", "oci:/nonexistent", "--path", "/k", "--dest", dest, "--timeout", "0"][..],
                "--timeout",
            ),
            (
                &["fetch", "--image", "oci:/nonexistent", "--path", "/k", "--dest", dest, "--max-layers", "0"],
                "--max-layers",
            ),
            (&["--policy-timeout", "0", "preview"], "--policy-timeout"),
            (&["daemon", "--start-jitter=-1"], "--start-jitter"),
        ] {
            let o = std::process::Command::new(kata_addons_bin()).args(args).output().expect("run");
            assert_eq!(o.status.code(), Some(64), "{args:?}: {}", show(&o));
            assert!(String::from_utf8_lossy(&o.stderr).contains(flag), "{args:?}: {}", show(&o));
            assert!(!Path::new(dest).exists(), "{args:?}: wrote {dest}");
        }
        let o = std::process::Command::new(kata_addons_bin()).arg("--help").output().expect("run");
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    }

    fn write_generation(dir: &Path, g: u32) {
        let d = dir.join(format!("..gen_{g}"));
        std::fs::create_dir(&d).expect("mkdir generation");
        std::fs::write(d.join("addonImage"), format!("quay.io/org/gen{g}:v1")).expect("write");
        std::fs::write(d.join("kernelPath"), format!("/boot/gen{g}/vmlinuz")).expect("write");
        let tmp = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(format!("..gen_{g}"), &tmp).expect("symlink");
        std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
        if g > 0 {
            let _ = std::fs::remove_dir_all(dir.join(format!("..gen_{}", g - 1)));
        }
    }

    /// While kubelet swaps `..data`, every read is one generation: never a new
    /// image with the old kernel path, never a failure.
    #[test]
    fn configmap_dir_reads_one_generation() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("cm");
        std::fs::create_dir(&dir).expect("mkdir");
        write_generation(&dir, 0);
        for k in ["addonImage", "kernelPath"] {
            std::os::unix::fs::symlink(format!("..data/{k}"), dir.join(k)).expect("key link");
        }
        // Compile the policy into the cache once.
        let dir_arg = dir.to_str().expect("utf-8").to_string();
        let o = preview(&["--configmap-dir", &dir_arg, "-o", "json"], tmp.path());
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut g = 1;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    write_generation(&dir, g);
                    g += 1;
                }
            })
        };
        let mut torn = Vec::new();
        for _ in 0..60 {
            let o = preview(&["--configmap-dir", &dir_arg, "-o", "json"], tmp.path());
            if o.status.code() != Some(0) {
                torn.push(format!("failed: {}", show(&o)));
                continue;
            }
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
            let get = |name: &str| {
                v["env"].as_array().and_then(|a| a.iter().find(|e| e["name"] == name)).map(|e| e["value"].to_string())
            };
            let (image, kernel) =
                (get("ADDON_IMAGE").unwrap_or_default(), get("ADDON_KERNEL_PATH").unwrap_or_default());
            let gen_of =
                |s: &str| s.split("gen").nth(1).map(|t| t.chars().take_while(char::is_ascii_digit).collect::<String>());
            if gen_of(&image) != gen_of(&kernel) {
                torn.push(format!("{image} with {kernel}"));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().expect("swapper");
        assert!(torn.is_empty(), "{} torn or failed reads of 60:\n{}", torn.len(), torn.join("\n"));
    }
}

/// A node whose state is lost (or removed after "the state file is corrupt") is
/// put back by `uninstall`: every kata-addons drop-in in a known runtime `config.d`, for
/// every provider and layout, and every version directory; foreign files stay.
mod recovery {
    use kata_addons_tests::node::{BASE_CONFIG, Node, content_snapshot, layout_with, noise};
    use kata_addons_tests::show;

    use super::state::{STATE, kata, refs};

    /// [`content_snapshot`] without the node lock the runner keeps in `/run`.
    fn snap(node: &Node) -> std::collections::BTreeMap<String, String> {
        let mut m = content_snapshot(node.root());
        m.retain(|k, _| !k.starts_with("run"));
        m
    }

    fn stdout(o: &std::process::Output) -> String {
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A TDX kernel + initrd addon in an OCI layout under `dir`; returns its install env.
    /// (An initrd: kata-deploy's `10-installation-prefix.toml` sets `image` and `initrd`
    /// together, which a kernel-only addon is refused over: Kata would not load it.)
    fn tdx_env(dir: &std::path::Path) -> Vec<(&'static str, String)> {
        layout_with(
            &dir.join("img"),
            "v1",
            &[("boot/vmlinuz", &noise(50_000, 7)), ("boot/initrd.img", &noise(20_000, 8))],
        );
        vec![
            ("ADDON_IMAGE", format!("oci:{}:v1", dir.join("img").display())),
            ("ADDON_PROVIDER", "tdx".to_string()),
            ("ADDON_KERNEL_PATH", "/boot/vmlinuz".to_string()),
            ("ADDON_INITRD_PATH", "/boot/initrd.img".to_string()),
        ]
    }

    #[test]
    fn uninstall_without_state_restores_every_layout() {
        let (node, images) = (Node::empty(), tempfile::tempdir().expect("tmp"));
        let os_tdx = node.openshift("tdx");
        let go = node.kata_deploy("qemu-tdx");
        let rs = node.kata_deploy("qemu-tdx-runtime-rs");
        let snp = node.kata_deploy("qemu-snp");
        node.openshift("se");
        // A file at our name without our header, and a foreign fragment: never removed.
        let foreign = "/etc/kata-containers/kata-se/config.d/50-kata-addons.toml";
        node.write(foreign, "# written by the admin\n[hypervisor.qemu]\nkernel = \"/boot/mine\"\n");
        node.write("/etc/kata-containers/kata-tdx/config.d/40-admin.toml", "[hypervisor.qemu]\ndefault_vcpus = 2\n");
        let before = snap(&node);

        let o = kata(&node, &["install"], &refs(&tdx_env(images.path())));
        assert!(o.status.success(), "{}", show(&o));
        let ours = |rc: &str| format!("{}/config.d/50-kata-addons.toml", rc.rsplit_once('/').map_or("", |(d, _)| d));
        for rc in [&os_tdx, &go, &rs] {
            assert!(node.path(&ours(rc)).is_file(), "{rc}: no drop-in");
        }
        // A drop-in of an earlier install for another provider, whose state is gone too.
        std::fs::copy(node.path(&ours(&go)), node.path(&ours(&snp))).expect("copy drop-in");

        // A corrupt state is refused; its advice is to remove it and uninstall.
        std::fs::write(node.path(STATE), "{").expect("corrupt");
        let o = kata(&node, &["uninstall"], &[]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("remove it and run `kata-addons uninstall`"), "{}", show(&o));
        assert!(!err.contains("by hand"), "{}", show(&o));

        std::fs::remove_file(node.path(STATE)).expect("remove state");
        let o = kata(&node, &["uninstall"], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let out = stdout(&o);
        assert!(out.contains("no state recorded an install"), "{}", show(&o));
        for rc in [&os_tdx, &go, &rs, &snp] {
            assert!(out.contains(&format!("removed drop-in {}", ours(rc))), "{rc}: {}", show(&o));
            assert!(!node.path(&ours(rc)).exists(), "{rc}: drop-in left");
        }
        assert!(out.contains("removed version directory /etc/kata-containers/addons/v1-"), "{}", show(&o));
        assert!(
            out.contains(&format!("left alone (not kata-addons' to remove; see the warnings): {foreign}")),
            "{}",
            show(&o)
        );
        assert!(!node.path("/etc/kata-containers/addons").exists(), "addons/ left");
        assert_eq!(snap(&node), before, "uninstall did not restore the node");
        for rc in [&os_tdx, &go, &rs, &snp] {
            assert_eq!(std::fs::read_to_string(node.path(rc)).expect("config"), BASE_CONFIG);
        }

        // Again: nothing to do, still exit 0, and the foreign file is still reported, not removed.
        let o = kata(&node, &["uninstall"], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        assert!(stdout(&o).contains("nothing installed"), "{}", show(&o));
        assert_eq!(snap(&node), before);
    }

    #[test]
    fn uninstall_without_state_honours_kata_prefix_and_runtime_config() {
        let (node, images) = (Node::empty(), tempfile::tempdir().expect("tmp"));
        let rc = "/usr/local/kata/share/defaults/kata-containers/runtimes/qemu-tdx/configuration-qemu-tdx.toml";
        node.write(rc, BASE_CONFIG);
        let custom = "/srv/kata/configuration-custom.toml";
        node.write(custom, BASE_CONFIG);
        let before = snap(&node);
        let o = kata(&node, &["install", "--kata-prefix", "/usr/local/kata"], &refs(&tdx_env(images.path())));
        assert!(o.status.success(), "{}", show(&o));
        let drop_in = "/usr/local/kata/share/defaults/kata-containers/runtimes/qemu-tdx/config.d/50-kata-addons.toml";
        // A drop-in of ours beside a configuration no layout knows (placed by hand).
        let custom_drop_in = "/srv/kata/config.d/50-kata-addons.toml";
        node.write(custom_drop_in, &std::fs::read_to_string(node.path(drop_in)).expect("drop-in"));
        std::fs::remove_file(node.path(STATE)).expect("remove state");

        let o = kata(&node, &["uninstall", "--kata-prefix", "/usr/local/kata", "--runtime-config", custom], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        for p in [drop_in, custom_drop_in] {
            assert!(!node.path(p).exists(), "{p} left: {}", show(&o));
        }
        assert_eq!(snap(&node), before, "uninstall did not restore the node");

        // Flags are checked as install checks them: exit 2, naming the flag.
        for (flag, bad) in [("--kata-prefix", "opt/kata"), ("--runtime-config", "/etc/passwd")] {
            let o = kata(&node, &["uninstall", flag, bad], &[]);
            assert_eq!(o.status.code(), Some(2), "{}", show(&o));
            assert!(String::from_utf8_lossy(&o.stderr).contains(flag), "{}", show(&o));
        }
    }
}

/// What a killed run leaves (staging directories, temporary drop-ins and state
/// files, a version directory no state refers to) is removed by the next run of any kind,
/// under the node lock; a running process' staging is left alone.
mod leftovers {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use kata_addons_tests::image::{Compress, Image, LayerBuilder};
    use kata_addons_tests::node::{Node, content_snapshot, noise};
    use kata_addons_tests::proxy::{Proxy, Rules};
    use kata_addons_tests::registry::Registry;
    use kata_addons_tests::{kata_addons_bin, show};

    use super::state::{STATE, installed, kata, refs};

    const ADDONS: &str = "/etc/kata-containers/addons";
    /// Where the se runtime configuration of [`Node::new`] resolves to.
    const SE_DIR: &str = "/opt/kata/share/defaults/kata-containers";
    const TDX_DIR: &str = "/etc/kata-containers/kata-tdx";

    fn snap(node: &Node) -> std::collections::BTreeMap<String, String> {
        let mut m = content_snapshot(node.root());
        m.retain(|k, _| !k.starts_with("run"));
        m
    }

    /// The pid of a process that has exited (and been reaped).
    fn dead_pid() -> u32 {
        let mut c = Command::new("true").spawn().expect("spawn true");
        let pid = c.id();
        c.wait().expect("wait");
        pid
    }

    /// Leftovers of a killed run with owner `pid`; returns their node paths.
    fn leave(node: &Node, pid: u32) -> Vec<String> {
        let staging = format!("{ADDONS}/.staging-{pid}");
        node.write(&format!("{staging}/.kata-addons-tmp.{pid}.0"), &"k".repeat(100_000));
        node.write(&format!("{ADDONS}/.state.json.tmp-{pid}"), "{\"schema\": 2");
        let tmp_drop_in = format!("{SE_DIR}/.50-kata-addons.toml.kata-addons-tmp-{pid}");
        node.write(&tmp_drop_in, "[hypervisor.qemu]\nkernel = \"/x\"\n");
        // The fixed name releases before this one used.
        let legacy = format!("{TDX_DIR}/.50-kata-addons.toml.kata-addons-tmp");
        node.write(&legacy, "[hypervisor.qemu]\nkernel = \"/x\"\n");
        vec![staging, format!("{ADDONS}/.state.json.tmp-{pid}"), tmp_drop_in, legacy]
    }

    #[test]
    fn every_run_sweeps_what_killed_runs_left() {
        let (node, images) = (Node::new(), tempfile::tempdir().expect("tmp"));
        let before = snap(&node);
        let env = installed(&node, images.path());
        let st: serde_json::Value =
            serde_json::from_slice(&std::fs::read(node.path(STATE)).expect("state")).expect("json");
        let version_dir = st["versionDir"].as_str().expect("versionDir").to_string();

        let dead = leave(&node, dead_pid());
        // A complete version directory no state refers to (killed after the rename).
        let orphan = format!("{ADDONS}/v0-0123456789ab");
        node.write(&format!("{orphan}/kernel"), "old kernel");
        // A running process' staging is not touched.
        let mut live = Command::new("sleep").arg("60").spawn().expect("spawn sleep");
        let live_staging = format!("{ADDONS}/.staging-{}", live.id());
        node.write(&format!("{live_staging}/x"), "busy");

        // An "up to date" install sweeps.
        let o = kata(&node, &["install"], &refs(&env));
        assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("up to date"), "{}", show(&o));
        for p in dead.iter().chain([&orphan]) {
            assert!(!node.path(p).exists(), "{p} survived an up-to-date install: {}", show(&o));
        }
        assert!(node.path(&live_staging).exists(), "a running process' staging was removed");
        assert!(node.path(&format!("{ADDONS}/{version_dir}/kernel")).is_file());
        let o = kata(&node, &["status"], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));

        // Uninstall sweeps too, and leaves addons/ absent once the owner is gone.
        let dead = leave(&node, dead_pid());
        let _ = live.kill();
        let _ = live.wait();
        let o = kata(&node, &["uninstall"], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        for p in dead.iter().chain([&live_staging]) {
            assert!(!node.path(p).exists(), "{p} survived uninstall: {}", show(&o));
        }
        assert!(!node.path(ADDONS).exists(), "addons/ left: {}", show(&o));
        assert_eq!(snap(&node), before, "uninstall did not restore the node");
    }

    /// A real SIGKILL while the pull is stalled mid-blob: the partial staging directory is
    /// there, and the next run (here `uninstall`, with no state yet) removes it.
    #[test]
    fn sigkill_during_a_slow_pull_is_cleaned_by_the_next_run() {
        let reg = Registry::start();
        let base = LayerBuilder::new().dir("etc").file("etc/os-release", b"ID=test\n").build(Compress::None);
        let top = LayerBuilder::new().dir("boot").file("boot/vmlinuz", &noise(4 << 20, 5)).build(Compress::None);
        reg.push("k", "1", &Image::new(vec![base, top]));
        let proxy = Proxy::start(reg.addr, Rules { stall_blob_after: Some(1 << 20), ..Rules::default() });
        let node = Node::new();
        let before = snap(&node);
        let host = proxy.host();
        let home = tempfile::tempdir().expect("home");
        let log = home.path().join("install.log");
        let mut child = Command::new(kata_addons_bin())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("ADDON_IMAGE", format!("{host}/k:1"))
            .env("ADDON_KERNEL_PATH", "/boot/vmlinuz")
            .args(["install", "--insecure-registry", &host, "--timeout", "10", "--root"])
            .arg(node.root())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn install");
        let staging = node.path(&format!("{ADDONS}/.staging-{}", child.id()));
        let start = Instant::now();
        let staged_bytes = || -> u64 {
            std::fs::read_dir(&staging)
                .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
                .unwrap_or(0)
        };
        while staged_bytes() == 0 {
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                let seen = proxy.requests();
                panic!("the pull never wrote into {}; requests {seen:#?}; its log:\n{log}", staging.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        assert!(staged_bytes() > 0, "the killed run left nothing to clean: the test proves nothing");

        let o = kata(&node, &["uninstall"], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        assert!(!staging.exists(), "staging survived: {}", show(&o));
        assert!(!node.path(ADDONS).exists(), "addons/ left: {}", show(&o));
        assert_eq!(snap(&node), before, "uninstall did not restore the node");
    }
}

/// The policy's output on hostile input: at most 64 problems listed (guest side), and
/// `preview` echoes `ADDON_*` values trimmed, as install uses them.
mod policy_output {
    use std::process::Output;

    use kata_addons_tests::{kata_addons_bin, show};

    fn kata(args: &[&str], env: &[(&str, &str)], cache: &std::path::Path) -> Output {
        let home = tempfile::tempdir().expect("temp HOME");
        let mut c = std::process::Command::new(kata_addons_bin());
        c.env_clear().env("HOME", home.path()).args(["--cache-dir"]).arg(cache);
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(args).output().expect("run kata-addons")
    }

    /// The guest caps its violation list at 64, the last saying how many more there are;
    /// the runner reports it as invalid configuration (exit 2), never as refused output.
    #[test]
    fn guest_caps_its_violation_list() {
        let tmp = tempfile::tempdir().expect("tmp");
        let f = tmp.path().join("cm.yaml");
        let keys: String = (0..100).map(|i| format!("unknownKey{i:03}: x\n")).collect();
        std::fs::write(&f, &keys).expect("write");
        let o = kata(&["preview", "--configmap", f.to_str().expect("utf-8")], &[], tmp.path());
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("invalid configuration (64 problems)"), "{}", show(&o));
        assert!(err.contains("\u{2026} and 39 more (at most 64 problems are listed"), "{}", show(&o));
        assert!(!err.contains("refuses"), "{}", show(&o));
        assert_eq!(err.lines().filter(|l| l.starts_with("  ")).count(), 64, "{}", show(&o));
        // 300 keys: the runner's own limit, before the policy runs.
        let keys: String = (0..300).map(|i| format!("unknownKey{i:03}: x\n")).collect();
        std::fs::write(&f, &keys).expect("write");
        let o = kata(&["preview", "--configmap", f.to_str().expect("utf-8")], &[], tmp.path());
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("limit of 128"), "{}", show(&o));
    }

    /// `preview -o env|json|yaml` of `ADDON_*` input shows the trimmed values install uses.
    #[test]
    fn preview_echoes_what_install_uses() {
        let tmp = tempfile::tempdir().expect("tmp");
        let env = [
            ("ADDON_IMAGE", "  quay.io/org/kernel:v1 \n"),
            ("ADDON_KERNEL_PATH", "\t/boot/vmlinuz "),
            ("ADDON_VERSION", "   "),
        ];
        let o = kata(&["preview", "-o", "env"], &env, tmp.path());
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.lines().any(|l| l == "ADDON_IMAGE=quay.io/org/kernel:v1"), "{}", show(&o));
        assert!(out.lines().any(|l| l == "ADDON_KERNEL_PATH=/boot/vmlinuz"), "{}", show(&o));
        let o = kata(&["preview", "-o", "json"], &env, tmp.path());
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        for e in v["env"].as_array().expect("env") {
            let value = e["value"].as_str().expect("value");
            assert_eq!(value, value.trim(), "{e}");
        }
        assert_eq!(v["artifacts"][0]["source"], "/boot/vmlinuz");
        let o = kata(&["preview", "-o", "yaml"], &env, tmp.path());
        assert!(String::from_utf8_lossy(&o.stdout).contains("value: quay.io/org/kernel:v1\n"), "{}", show(&o));
    }
}

/// Free space is checked against each file's size (from its tar header)
/// before its data is written; a refusal names the place and changes nothing.
mod free_space {
    use kata_addons_tests::node::{Node, content_snapshot, layout_with, noise};
    use kata_addons_tests::show;

    use super::state::{kata, refs};

    /// A tmpfs mounted for the test, unmounted when dropped.
    struct Tmpfs(std::path::PathBuf);

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }

    #[test]
    #[cfg_attr(not_root, ignore = "needs root to mount a tmpfs")]
    fn free_space_is_checked_before_the_data_is_written() {
        let (node, images) = (Node::new(), tempfile::tempdir().expect("tmp"));
        let addons = node.path("/etc/kata-containers/addons");
        std::fs::create_dir_all(&addons).expect("mkdir");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
            .arg(&addons)
            .output()
            .expect("run mount");
        assert!(mounted.status.success(), "mounting a tmpfs: {}", String::from_utf8_lossy(&mounted.stderr));
        let _tmpfs = Tmpfs(addons.clone());
        let env = |tag: &str| {
            vec![
                ("ADDON_IMAGE", format!("oci:{}:{tag}", images.path().join(tag).display())),
                ("ADDON_KERNEL_PATH", "/boot/vmlinuz".to_string()),
            ]
        };
        // 1 MiB + the 16 MiB margin fits in 24 MiB.
        layout_with(&images.path().join("v1"), "v1", &[("boot/vmlinuz", &noise(1 << 20, 1))]);
        let o = kata(&node, &["install"], &refs(&env("v1")));
        assert!(o.status.success(), "{}", show(&o));
        // 10 MiB + 16 MiB does not: refused before the file is written, nothing changes.
        layout_with(&images.path().join("v2"), "v2", &[("boot/vmlinuz", &noise(10 << 20, 2))]);
        let before = content_snapshot(node.root());
        let o = kata(&node, &["install"], &refs(&env("v2")));
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("not enough space on /etc/kata-containers/addons: need 27262976 bytes"), "{}", show(&o));
        assert!(err.contains("have "), "{}", show(&o));
        assert_eq!(content_snapshot(node.root()), before, "a refused install changed the node");
        let o = kata(&node, &["status"], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    }
}
