//! Reference values for attestation (docs/attestation.md), IBM Secure Execution: SE headers
//! built here to s390-tools' documented layout (`pv_hdr_def.h`: the 416-byte head, 80-byte
//! key slots, the encrypted area, the trailing 16-byte tag), embedded in a kernel file at
//! the offsets `pvextract-hdr` searches, installed with the real runner, and compared with
//! two oracles: s390-tools' own `pvextract-hdr` script (tests/attest/pvextract-hdr, run as
//! is) for the extracted header, and the tests' own computation of `se.version`, `se.tag`,
//! `se.image_phkh` and `se.attestation_phkh` as Trustee's `se_parse_hdr.py` defines them
//! (tests/attest/se_oracle.py, PyPI `cryptography` in the venv tests/run creates). Host key
//! documents are EC P-521 certificates made with openssl; they are self-signed here (IBM
//! signs real ones: the signature plays no part in the key hash).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine;
use kata_addons_tests::node::{Node, content_snapshot, layout_with, noise};
use kata_addons_tests::{kata_addons_bin, sha256_hex, show};

/// The node's files, without the node lock kata-addons keeps under /run.
fn snapshot(root: &Path) -> std::collections::BTreeMap<String, String> {
    let mut s = content_snapshot(root);
    s.retain(|k, _| k != "run" && !k.starts_with("run/"));
    s
}

/// The venv's Python with `cryptography`: `$KATA_ADDONS_ATTEST_PYTHON`, else
/// `${XDG_CACHE_HOME:-~/.cache}/kata-addons/attest-venv/bin/python` (where tests/run puts it).
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KATA_ADDONS_ATTEST_PYTHON") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("kata-addons/attest-venv/bin/python")
}

fn asset(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("attest").join(name)
}

fn oracle(args: &[&str]) -> String {
    let py = python();
    let out = Command::new(&py)
        .arg(asset("se_oracle.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {} (the attestation venv; tests/run creates it): {e}", py.display()));
    assert!(out.status.success(), "se_oracle.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An EC P-521 host key document (self-signed X.509 certificate) made with openssl.
fn host_key_document(dir: &Path, name: &str) -> PathBuf {
    let key = dir.join(format!("{name}.key"));
    let cert = dir.join(format!("{name}.crt"));
    let run = |args: &[&str]| {
        let o = Command::new("openssl").args(args).output().expect("run openssl (tests/run installs it)");
        assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    run(&["ecparam", "-name", "secp521r1", "-genkey", "-noout", "-out", key.to_str().expect("utf-8")]);
    run(&[
        "req",
        "-new",
        "-x509",
        "-key",
        key.to_str().expect("utf-8"),
        "-subj",
        &format!("/CN=test host key {name}"),
        "-days",
        "2",
        "-out",
        cert.to_str().expect("utf-8"),
    ]);
    cert
}

/// The 32-byte host key hash of a document, computed by the oracle.
fn phkh(doc: &Path) -> [u8; 32] {
    let h = hex::decode(oracle(&["phkh", doc.to_str().expect("utf-8")])).expect("hex");
    h.try_into().expect("32 bytes")
}

/// How a test header is laid out.
struct Hdr {
    /// `digest_key` of each key slot.
    slots: Vec<[u8; 32]>,
    /// The size written in `phs` (None: the true size).
    phs: Option<u32>,
    /// The version written.
    version: u32,
    /// Seed of the noise fields.
    seed: u64,
}

impl Hdr {
    fn new(slots: Vec<[u8; 32]>, seed: u64) -> Hdr {
        Hdr { slots, phs: None, version: 0x100, seed }
    }

    /// The header bytes: `pv_hdr_head` (magic, version, phs, iv[12], res1, nks, sea, nep,
    /// pcf, cust_pub_key[160], pld/ald/tld[64]), the key slots (digest_key[32],
    /// wrapped_key[32], tag[16]), `pv_hdr_encrypted` (128 bytes, no optional items) and
    /// the tag[16]; big-endian.
    fn bytes(&self) -> Vec<u8> {
        let sea: u64 = 128;
        let size = 416 + 80 * self.slots.len() as u64 + sea + 16;
        let n = |len: usize, s: u64| noise(len, self.seed * 1000 + s);
        let mut h = Vec::new();
        h.extend_from_slice(b"IBMSecEx");
        h.extend_from_slice(&self.version.to_be_bytes());
        h.extend_from_slice(&self.phs.unwrap_or(size as u32).to_be_bytes());
        h.extend_from_slice(&n(12, 1)); // iv
        h.extend_from_slice(&[0; 4]); // res1
        h.extend_from_slice(&(self.slots.len() as u64).to_be_bytes()); // nks
        h.extend_from_slice(&sea.to_be_bytes());
        h.extend_from_slice(&7u64.to_be_bytes()); // nep
        h.extend_from_slice(&0u64.to_be_bytes()); // pcf
        h.extend_from_slice(&n(160, 2)); // cust_pub_key
        h.extend_from_slice(&n(3 * 64, 3)); // pld, ald, tld
        assert_eq!(h.len(), 416);
        for (i, d) in self.slots.iter().enumerate() {
            h.extend_from_slice(d);
            h.extend_from_slice(&n(48, 10 + i as u64)); // wrapped_key, tag
        }
        h.extend_from_slice(&n(sea as usize, 4)); // encrypted area
        h.extend_from_slice(&n(16, 5)); // the header tag
        assert_eq!(h.len() as u64, size);
        h
    }
}

/// A kernel file of `len` noise bytes with `hdr` written at `offset`.
fn se_image(hdr: &[u8], offset: usize, len: usize, seed: u64) -> Vec<u8> {
    let mut img = noise(len.max(offset + hdr.len()), seed);
    img[offset..offset + hdr.len()].copy_from_slice(hdr);
    img.truncate(len);
    img
}

/// s390-tools' `pvextract-hdr` on a file: the header it writes, or its error.
fn pvextract(dir: &Path, image: &[u8]) -> Result<Vec<u8>, String> {
    let input = dir.join("pvextract-input.img");
    let output = dir.join("pvextract-sehdr.bin");
    std::fs::write(&input, image).expect("write");
    let _ = std::fs::remove_file(&output);
    let o = Command::new("bash")
        .arg(asset("pvextract-hdr"))
        .arg("-o")
        .arg(&output)
        .arg(&input)
        .output()
        .expect("run pvextract-hdr (bash, od, awk, grep, dd)");
    if o.status.success() {
        Ok(std::fs::read(&output).expect("pvextract output"))
    } else {
        Err(String::from_utf8_lossy(&o.stderr).to_string())
    }
}

/// A node with the IBM SE runtime configuration (`confidential_guest` as given).
fn se_node(confidential: Option<bool>) -> Node {
    let node = Node::new();
    let mut text = kata_addons_tests::node::BASE_CONFIG.replace(
        "[hypervisor.qemu]\n",
        "[hypervisor.qemu]\nmachine_type = \"s390-ccw-virtio\"\nkernel_params = \"agent.log=debug\"\n",
    );
    if let Some(c) = confidential {
        text = text.replace("[hypervisor.qemu]\n", &format!("[hypervisor.qemu]\nconfidential_guest = {c}\n"));
    }
    node.write("/opt/kata/share/defaults/kata-containers/configuration-se.toml", &text);
    node
}

fn kata(node: &Node, cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(kata_addons_bin());
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", cache)
        .arg("--cache-dir")
        .arg(cache.join("policy"));
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(args).arg("--root").arg(node.root()).output().expect("run kata-addons")
}

fn install(node: &Node, cache: &Path, kernel: &[u8], tag: &str) -> Output {
    let layout = cache.join(format!("layout-{tag}"));
    layout_with(&layout, tag, &[("vmlinuz", kernel)]);
    let image = format!("oci:{}:{tag}", layout.display());
    kata(node, cache, &["install"], &[("ADDON_IMAGE", &image), ("ADDON_KERNEL_PATH", "/vmlinuz")])
}

fn state(node: &Node) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(node.path("/etc/kata-containers/addons/state.json")).expect("state"))
        .expect("state json")
}

fn version_dir(node: &Node) -> String {
    format!("/etc/kata-containers/addons/{}", state(node)["versionDir"].as_str().expect("versionDir"))
}

/// The `{name: [values]}` payload of each RVPS `sample` message printed, one per line.
fn rvps_payloads(stdout: &[u8]) -> Vec<serde_json::Map<String, serde_json::Value>> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| {
            let m: serde_json::Value = serde_json::from_str(l).expect("an RVPS message per line");
            assert_eq!(m["version"], "0.1.0", "{m}");
            assert_eq!(m["type"], "sample", "{m}");
            assert_eq!(m.as_object().map(|o| o.len()), Some(3), "version, type, payload only: {m}");
            let payload = base64::engine::general_purpose::STANDARD
                .decode(m["payload"].as_str().expect("payload"))
                .expect("standard base64");
            let p: serde_json::Value = serde_json::from_slice(&payload).expect("payload JSON");
            let p = p.as_object().expect("a map").clone();
            for (k, v) in &p {
                let ok = v.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(|x| x.is_string()));
                assert!(ok, "{k}: a non-empty list of strings, got {v}");
            }
            p
        })
        .collect()
}

#[test]
fn se_install_publishes_the_header_and_the_values_trustee_checks() {
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path();
    let (hkd1, hkd2, other) =
        (host_key_document(cache, "host1"), host_key_document(cache, "host2"), host_key_document(cache, "other"));
    for (offset, slots_first) in [(0x14000usize, true), (0x16a30, false)] {
        let mut slots = vec![phkh(&hkd1), [0x5a; 32], phkh(&hkd2)];
        if !slots_first {
            slots.reverse();
        }
        let hdr = Hdr::new(slots, offset as u64).bytes();
        let kernel = se_image(&hdr, offset, 0x30000, offset as u64);
        let extracted = pvextract(cache, &kernel).expect("pvextract-hdr finds the header");
        assert_eq!(extracted, hdr, "pvextract-hdr extracts the header as built");

        let node = se_node(Some(true));
        let o = install(&node, cache, &kernel, &format!("v{offset:x}"));
        assert!(o.status.success(), "{}", show(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("reference-values.json") && out.contains("reference values"), "{out}");

        // The header beside the image, byte for byte what pvextract-hdr writes.
        let vdir = version_dir(&node);
        let se_header = std::fs::read(node.path(&format!("{vdir}/se-header.bin"))).expect("se-header.bin");
        assert_eq!(se_header, extracted);
        let st = state(&node);
        let published: Vec<(String, String)> = st["published"]
            .as_array()
            .expect("published")
            .iter()
            .map(|p| (p["path"].as_str().expect("path").to_string(), p["sha256"].as_str().expect("sha").to_string()))
            .collect();
        for name in ["se-header.bin", "reference-values.json"] {
            let path = format!("{vdir}/{name}");
            let data = std::fs::read(node.path(&path)).expect("published file");
            assert!(published.contains(&(path.clone(), sha256_hex(&data))), "{name} in the state: {published:?}");
        }

        // The values, against the oracle, for one and for two host key documents.
        let hdr_file = cache.join("oracle-hdr.bin");
        std::fs::write(&hdr_file, &extracted).expect("write");
        for docs in [vec![&hkd1], vec![&hkd1, &hkd2]] {
            let mut args = vec!["reference-values", "--output", "rvps"];
            let mut oracle_args = vec!["values".to_string(), hdr_file.display().to_string()];
            for d in &docs {
                args.extend(["--host-key-document", d.to_str().expect("utf-8")]);
                oracle_args.push(d.display().to_string());
            }
            let o = kata(&node, cache, &args, &[]);
            assert!(o.status.success(), "{}", show(&o));
            let payloads = rvps_payloads(&o.stdout);
            assert_eq!(payloads.len(), 1, "one target");
            let expected: serde_json::Value =
                serde_json::from_str(&oracle(&oracle_args.iter().map(String::as_str).collect::<Vec<_>>()))
                    .expect("oracle json");
            let got: serde_json::Map<String, serde_json::Value> =
                payloads[0].iter().filter(|(k, _)| k.starts_with("se.")).map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_eq!(serde_json::Value::Object(got), expected, "offset {offset:#x}, {} documents", docs.len());
            assert_eq!(payloads[0]["kata_addons.kernel.sha256"], serde_json::json!([sha256_hex(&kernel)]));
        }

        // A host key document the image is not sealed for: se.image_phkh is not computed.
        let o = kata(
            &node,
            cache,
            &["reference-values", "--output", "json", "--host-key-document", other.to_str().expect("utf-8")],
            &[],
        );
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("se.image_phkh") && err.contains("other.crt"), "{err}");
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
        assert!(json["targets"][0]["inputs"]["config"]["hypervisor.qemu.confidential_guest"]["from"].is_string());

        // status verifies the published files; an edit is drift.
        let o = kata(&node, cache, &["status"], &[]);
        assert!(o.status.success(), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("reference-values.json"), "{}", show(&o));
        let rv = node.path(&format!("{vdir}/reference-values.json"));
        let original = std::fs::read(&rv).expect("read");
        std::fs::write(&rv, b"{}\n").expect("tamper");
        let o = kata(&node, cache, &["status"], &[]);
        assert_eq!(o.status.code(), Some(4), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("reference-values.json: sha256"), "{}", show(&o));
        std::fs::write(&rv, original).expect("restore");

        // Uninstall removes them with the version directory.
        let o = kata(&node, cache, &["uninstall"], &[]);
        assert!(o.status.success(), "{}", show(&o));
        assert!(!node.path(&vdir).exists(), "{vdir} left after uninstall");
    }
}

#[test]
fn an_se_kernel_without_a_valid_header_is_refused_for_a_confidential_guest() {
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path();
    let slot = [0x11u8; 32];
    let good = Hdr::new(vec![slot], 1).bytes();
    let mut wrong_version = Hdr::new(vec![slot], 2);
    wrong_version.version = 0x200;
    let mut forged_huge = Hdr::new(vec![slot], 3);
    forged_huge.phs = Some(0xffff_0000);
    let mut forged_slots = Hdr::new(vec![slot, slot], 4);
    forged_slots.phs = Some(416 + 80 * 3 + 128 + 16);
    // (name, kernel file, what the refusal names, whether pvextract-hdr finds a header)
    let cases: Vec<(&str, Vec<u8>, &str, bool)> = vec![
        ("no header at all", noise(0x30000, 9), "no IBM Secure Execution header", false),
        ("before the window", se_image(&good, 0x13000, 0x30000, 10), "no IBM Secure Execution header", false),
        ("after the window", se_image(&good, 0x18000, 0x30000, 11), "no IBM Secure Execution header", false),
        ("not on a 16-byte row", se_image(&good, 0x14008, 0x30000, 12), "not at the start of a 16-byte row", true),
        ("truncated", se_image(&good, 0x14000, 0x14000 + good.len() - 20, 13), "truncated", true),
        ("truncated head", se_image(&good, 0x14000, 0x14000 + 100, 14), "truncated", true),
        ("forged length", se_image(&forged_huge.bytes(), 0x14000, 0x30000, 15), "claims a size of", true),
        ("forged slot count", se_image(&forged_slots.bytes(), 0x14000, 0x30000, 16), "inconsistent", true),
        ("unknown version", se_image(&wrong_version.bytes(), 0x14000, 0x30000, 17), "version 0x200", true),
        (
            "two headers",
            se_image(&good, 0x15000, 0x30000, 18)
                .iter()
                .enumerate()
                .map(|(i, b)| if (0x14000..0x14008).contains(&i) { b"IBMSecEx"[i - 0x14000] } else { *b })
                .collect(),
            "2 IBM Secure Execution header magics",
            true,
        ),
    ];
    let node = se_node(Some(true));
    for (name, kernel, says, _pvextract_finds) in &cases {
        let before = snapshot(node.root());
        let o = install(&node, cache, kernel, "refused");
        assert_eq!(o.status.code(), Some(1), "{name}: {}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("confidential_guest = true") && err.contains(says), "{name}: {err}");
        assert!(err.contains("/etc/kata-containers/addons/"), "{name}: the refusal names the file: {err}");
        assert_eq!(snapshot(node.root()), before, "{name}: the node changed");
        let found = pvextract(cache, kernel);
        if *name == "no header at all" || name.ends_with("the window") {
            assert!(found.is_err(), "{name}: pvextract-hdr agrees there is none");
        }
    }

    // Without confidential_guest, a plain kernel installs as before; its SE values are
    // not computed, and reference-values says so (exit 1) while still printing the rest.
    for confidential in [None, Some(false)] {
        let node = se_node(confidential);
        let kernel = noise(0x30000, 20);
        let o = install(&node, cache, &kernel, "plain");
        assert!(o.status.success(), "{confidential:?}: {}", show(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("not computed: se.version"), "{}", show(&o));
        assert!(!node.path(&format!("{}/se-header.bin", version_dir(&node))).exists());
        let o = kata(&node, cache, &["reference-values", "--output", "rvps"], &[]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("se.tag not computed"), "{}", show(&o));
        let payloads = rvps_payloads(&o.stdout);
        assert_eq!(payloads[0]["kata_addons.kernel.sha256"], serde_json::json!([sha256_hex(&kernel)]));
        assert!(!payloads[0].contains_key("se.tag"));
    }
}

#[test]
fn reference_values_refuses_bad_flags_and_says_when_nothing_is_installed() {
    let dir = tempfile::tempdir().expect("tmp");
    let node = se_node(None);
    let o = kata(&node, dir.path(), &["reference-values"], &[]);
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    for bad in ["0", "4-2", "x", "1-999"] {
        let o = kata(&node, dir.path(), &["reference-values", "--vcpus", bad], &[]);
        assert_eq!(o.status.code(), Some(64), "--vcpus {bad}: {}", show(&o));
    }
    let not_a_key = dir.path().join("not-a-key.crt");
    std::fs::write(&not_a_key, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").expect("write");
    let o =
        kata(&node, dir.path(), &["reference-values", "--host-key-document", not_a_key.to_str().expect("utf-8")], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not-a-key.crt"), "{}", show(&o));
}

#[test]
fn preview_names_the_reference_values_a_change_invalidates() {
    let dir = tempfile::tempdir().expect("tmp");
    let node = se_node(None);
    let root = verity_root();
    for (env, want) in [
        (
            vec![("ADDON_IMAGE", "quay.io/x/y:v1"), ("ADDON_KERNEL_PATH", "/vmlinuz")],
            "this change invalidates se.version, se.tag, se.image_phkh, kata_addons.kernel.sha256 on kata-se",
        ),
        (
            vec![
                ("ADDON_IMAGE", "quay.io/x/y:v1"),
                ("ADDON_PROVIDER", "snp"),
                ("ADDON_IMAGE_PATH", "/i.img"),
                ("ADDON_IMAGE_VERITY_PARAMS", &root),
            ],
            "this change invalidates snp_launch_measurement, kata_addons.image.root_hash on kata-snp",
        ),
    ] {
        let o = kata(&node, dir.path(), &["preview"], &env);
        assert!(o.status.success(), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains(want), "{want}\n{}", show(&o));
        let o = kata(&node, dir.path(), &["preview", "--output", "json"], &env);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        assert!(v["invalidates"].as_array().is_some_and(|a| !a.is_empty()), "{v}");
    }
}

fn verity_root() -> String {
    format!(
        "root_hash={},salt=5eed,data_blocks=74,data_block_size=4096,hash_block_size=4096",
        "278d7cfa2bf79e43ca873d5f203bf2622358a5c0cbbadc3b0d3757675fa1a6ef"
    )
}

#[test]
fn the_daemon_publishes_with_every_install_and_says_so() {
    use kata_addons_tests::daemon::{ConfigMapDir, Daemon, wait_for};
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path();
    let node = se_node(Some(true));
    let images: Vec<(String, Vec<u8>)> = (0..2u64)
        .map(|i| {
            let hdr = Hdr::new(vec![[i as u8 + 1; 32]], 40 + i).bytes();
            let kernel = se_image(&hdr, 0x14000, 0x20000, 50 + i);
            let layout = cache.join(format!("daemon-{i}"));
            layout_with(&layout, &format!("d{i}"), &[("vmlinuz", &kernel)]);
            (format!("oci:{}:d{i}", layout.display()), hdr)
        })
        .collect();
    let tag = |hdr: &[u8]| hex::encode(&hdr[hdr.len() - 16..]);
    let mut cm = ConfigMapDir::new(&[("addonImage", &images[0].0), ("kernelPath", "/vmlinuz")]);
    let ready = cache.join("ready");
    let mut d = Daemon::start(node.root(), cm.path(), &ready, cache.join("daemon.log"));
    let published = |node: &Node| {
        std::fs::read_to_string(node.path(&format!("{}/reference-values.json", version_dir(node)))).unwrap_or_default()
    };
    for (i, (image, hdr)) in images.iter().enumerate() {
        if i > 0 {
            cm.update(&[("addonImage", image), ("kernelPath", "/vmlinuz")]);
        }
        let dir_now = || format!("{}/reference-values.json", version_dir(&node));
        wait_for(
            "the reference values in the readiness file",
            Duration::from_secs(60),
            || {
                node.path("/etc/kata-containers/addons/state.json").exists()
                    && published(&node).contains(&tag(hdr))
                    && std::fs::read_to_string(&ready)
                        .is_ok_and(|r| r.contains(&format!("reference values: {}", dir_now())))
            },
            || d.log(),
        );
        assert!(d.log().contains("reference values written"), "{}", d.log());
    }
    d.signal("TERM");
    assert_eq!(d.wait_exit(Duration::from_secs(60)), Some(0), "{}", d.log());
}

/// Makes the node look installed by a kata-addons that did not publish reference values:
/// the published files removed and the state without `published`.
fn unpublish(node: &Node) {
    let vdir = version_dir(node);
    for name in ["reference-values.json", "se-header.bin"] {
        std::fs::remove_file(node.path(&format!("{vdir}/{name}"))).expect("remove a published file");
    }
    let mut st = state(node);
    st.as_object_mut().expect("state object").remove("published");
    let path = node.path("/etc/kata-containers/addons/state.json");
    std::fs::write(path, serde_json::to_vec_pretty(&st).expect("json")).expect("write state");
}

#[test]
fn an_up_to_date_install_publishes_the_values_of_a_version_installed_before_publishing() {
    use kata_addons_tests::daemon::{ConfigMapDir, Daemon, wait_for};
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path();
    let hdr = Hdr::new(vec![[0x42; 32]], 77).bytes();
    let kernel = se_image(&hdr, 0x14000, 0x20000, 77);
    let node = se_node(Some(true));
    let o = install(&node, cache, &kernel, "old");
    assert!(o.status.success(), "{}", show(&o));
    let vdir = version_dir(&node);
    let rv = node.path(&format!("{vdir}/reference-values.json"));
    let first = std::fs::read(&rv).expect("published at install");

    // The CLI: the same install again publishes them, and says so; then it is up to date.
    unpublish(&node);
    let before = snapshot(node.root());
    let o = install(&node, cache, &kernel, "old");
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("repaired:") && out.contains("reference values published for the installed version"),
        "{out}"
    );
    assert!(out.contains(&format!("{vdir}/reference-values.json")), "{out}");
    assert_eq!(version_dir(&node), vdir, "the same version, not reinstalled");
    assert_eq!(std::fs::read(&rv).expect("published again"), first, "the values of the installed version");
    let header = std::fs::read(node.path(&format!("{vdir}/se-header.bin"))).expect("se-header.bin");
    assert_eq!(header, hdr);
    let st = state(&node);
    let recorded: Vec<&str> =
        st["published"].as_array().expect("published").iter().filter_map(|p| p["sha256"].as_str()).collect();
    assert!(recorded.contains(&sha256_hex(&first).as_str()), "{st}");
    let after = snapshot(node.root());
    let changed: Vec<&String> = after.keys().filter(|k| before.get(*k) != after.get(*k)).collect();
    let expected = ["etc/kata-containers/addons/state.json".to_string()];
    assert!(
        changed
            .iter()
            .all(|k| expected.contains(k) || k.ends_with("/reference-values.json") || k.ends_with("/se-header.bin")),
        "only the published files and the state change: {changed:?}"
    );
    let o = install(&node, cache, &kernel, "old");
    assert!(o.status.success(), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("up to date:"), "{}", show(&o));
    let o = kata(&node, cache, &["status"], &[]);
    assert!(o.status.success(), "{}", show(&o));

    // The daemon: its first install publishes them, logs them and puts them in its readiness file.
    unpublish(&node);
    let image = format!("oci:{}:old", cache.join("layout-old").display());
    let cm = ConfigMapDir::new(&[("addonImage", &image), ("kernelPath", "/vmlinuz")]);
    let ready = cache.join("ready");
    let mut d = Daemon::start(node.root(), cm.path(), &ready, cache.join("daemon.log"));
    let line = format!("reference values: {vdir}/reference-values.json");
    wait_for(
        "the reference values in the readiness file",
        Duration::from_secs(60),
        || std::fs::read_to_string(&ready).is_ok_and(|r| r.contains(&line)),
        || d.log(),
    );
    assert_eq!(std::fs::read(&rv).expect("published by the daemon"), first);
    assert_eq!(version_dir(&node), vdir);
    let log = d.log();
    assert!(log.contains("reference values published for the installed version"), "{log}");
    assert!(log.contains(&format!("{vdir}/reference-values.json")), "{log}");
    d.signal("TERM");
    assert_eq!(d.wait_exit(Duration::from_secs(60)), Some(0), "{}", d.log());
}

/// The computed `se.*` values of the published `reference-values.json`, as `{name: [values]}`.
fn published_se_values(node: &Node) -> serde_json::Value {
    let path = node.path(&format!("{}/reference-values.json", version_dir(node)));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).expect("published")).expect("json");
    let mut out = serde_json::Map::new();
    for x in v["targets"][0]["values"].as_array().expect("values") {
        let name = x["name"].as_str().expect("name");
        if name.starts_with("se.") && x["status"] == "computed" {
            out.insert(name.to_string(), x["values"].clone());
        }
    }
    serde_json::Value::Object(out)
}

#[test]
fn host_key_documents_named_by_the_configmap_are_read_from_the_node() {
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path();
    let (hkd1, hkd2) = (host_key_document(cache, "host1"), host_key_document(cache, "host2"));
    let node = se_node(Some(true));
    let pem = |p: &Path| std::fs::read_to_string(p).expect("read the document");
    node.write("/etc/hkd/host1.crt", &pem(&hkd1));
    node.write("/etc/hkd/host2.crt", &pem(&hkd2));
    node.write(
        "/etc/hkd/garbage.crt",
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    );
    let hdr = Hdr::new(vec![phkh(&hkd1), [0x5a; 32], phkh(&hkd2)], 91).bytes();
    let kernel = se_image(&hdr, 0x14000, 0x20000, 91);
    let hdr_file = cache.join("oracle-hdr.bin");
    std::fs::write(&hdr_file, &hdr).expect("write");
    let layout = cache.join("layout-hkd");
    layout_with(&layout, "hkd", &[("vmlinuz", &kernel)]);
    let image = format!("oci:{}:hkd", layout.display());
    let install = |docs: &str| {
        kata(
            &node,
            cache,
            &["install"],
            &[("ADDON_IMAGE", &image), ("ADDON_KERNEL_PATH", "/vmlinuz"), ("ADDON_SE_HOST_KEY_DOCUMENTS", docs)],
        )
    };
    let expected = |docs: &[&Path]| -> serde_json::Value {
        let mut args = vec!["values".to_string(), hdr_file.display().to_string()];
        args.extend(docs.iter().map(|d| d.display().to_string()));
        serde_json::from_str(&oracle(&args.iter().map(String::as_str).collect::<Vec<_>>())).expect("oracle json")
    };
    let refusals = [
        ("/etc/hkd/host1.crt,/etc/hkd/missing.crt", "/etc/hkd/missing.crt"),
        ("/etc/hkd/garbage.crt", "/etc/hkd/garbage.crt"),
    ];
    let refused = |when: &str| {
        for (docs, file) in refusals {
            let before = snapshot(node.root());
            let o = install(docs);
            assert_eq!(o.status.code(), Some(1), "{when}, {docs}: {}", show(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("seHostKeyDocuments") && err.contains(file), "{when}, {docs}: {err}");
            assert_eq!(snapshot(node.root()), before, "{when}, {docs}: the node is unchanged");
        }
    };

    // A missing or unparsable document refuses the install of a fresh node.
    refused("fresh node");

    // Both documents: the values Trustee checks, at install and from `reference-values`.
    let o = install("/etc/hkd/host1.crt,/etc/hkd/host2.crt");
    assert!(o.status.success(), "{}", show(&o));
    let both = expected(&[&hkd1, &hkd2]);
    assert!(both.get("se.image_phkh").is_some() && both.get("se.attestation_phkh").is_some(), "{both}");
    assert_eq!(published_se_values(&node), both);
    let o = kata(&node, cache, &["reference-values", "--output", "rvps"], &[]);
    assert!(o.status.success(), "the recorded documents are used: {}", show(&o));
    let p = &rvps_payloads(&o.stdout)[0];
    let got: serde_json::Map<String, serde_json::Value> =
        p.iter().filter(|(k, _)| k.starts_with("se.")).map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(serde_json::Value::Object(got), both);

    // Another list republishes them; the same list again is up to date.
    let o = install("/etc/hkd/host2.crt");
    assert!(o.status.success(), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("host key documents"), "{}", show(&o));
    assert_eq!(published_se_values(&node), expected(&[&hkd2]));
    let o = install("/etc/hkd/host2.crt");
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("up to date:"), "{}", show(&o));

    // A document whose content changed on the node (another machine's key) republishes.
    node.write("/etc/hkd/host2.crt", &pem(&hkd1));
    let o = install("/etc/hkd/host2.crt");
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(published_se_values(&node), expected(&[&hkd1]));

    // Refused on an installed node too, the node unchanged; status still healthy.
    refused("installed node");
    let o = kata(&node, cache, &["status"], &[]);
    assert!(o.status.success(), "{}", show(&o));
}
