//! `kata-addons fetch` against a real docker-registry (and OCI layouts).

use std::path::Path;

use kata_addons_tests::image::{Compress, Image, LayerBuilder, index, media};
use kata_addons_tests::proxy::{Proxy, Rules};
use kata_addons_tests::registry::{Registry, RegistryConfig};
use kata_addons_tests::tls::TestCa;
use kata_addons_tests::{run_kata, sha256_hex, show};

struct Fetched {
    out: std::process::Output,
    dest: tempfile::TempDir,
}

impl Fetched {
    fn ok(&self) -> bool {
        self.out.status.success()
    }
    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dest.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}\n{}", show(&self.out)))
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).to_string()
    }
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).to_string()
    }
    /// Only the fetched files, no temporaries, nothing else.
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.dest.path())
            .expect("dest")
            .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
            .collect();
        v.sort();
        v
    }
}

fn fetch(image: &str, paths: &[&str], extra: &[&str]) -> Fetched {
    let dest = tempfile::tempdir().expect("dest");
    let d = dest.path().to_str().expect("utf8").to_string();
    let mut args: Vec<&str> = vec!["fetch", "--image", image, "--dest", &d];
    for p in paths {
        args.push("--path");
        args.push(p);
    }
    args.extend_from_slice(extra);
    let out = run_kata(&args);
    Fetched { out, dest }
}

fn insecure(reg: &str) -> Vec<String> {
    vec!["--insecure-registry".to_string(), reg.to_string()]
}

fn fetch_plain(reg: &Registry, image: &str, paths: &[&str]) -> Fetched {
    let host = reg.host();
    let ins = insecure(&host);
    let r = format!("{host}/{image}");
    let extra: Vec<&str> = ins.iter().map(String::as_str).collect();
    fetch(&r, paths, &extra)
}

fn kernel_image(kernel: &[u8], c: Compress) -> Image {
    let base = LayerBuilder::new().dir("etc").file("etc/os-release", b"ID=test\n").build(c);
    let top = LayerBuilder::new().dir("boot").file("boot/vmlinuz", kernel).build(c);
    Image::new(vec![base, top])
}

#[test]
fn registry_gzip_top_layer_only() {
    let reg = Registry::start();
    let bottom = LayerBuilder::new().dir("usr").big_file("usr/big", 2 << 20, 7).build(Compress::Gzip);
    let mid = LayerBuilder::new().dir("etc").file("etc/hostname", b"x").build(Compress::Gzip);
    let top = LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"KERNEL").build(Compress::Gzip);
    let img = Image::new(vec![bottom.clone(), mid.clone(), top.clone()]);
    let digest = reg.push("kata/kernel", "v1", &img);
    let f = fetch_plain(&reg, "kata/kernel:v1", &["/boot/vmlinuz"]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), b"KERNEL");
    assert_eq!(f.names(), vec!["vmlinuz"]);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(f.dest.path().join("vmlinuz")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o7777, 0o644);
    assert!(f.stdout().contains(&sha256_hex(b"KERNEL")), "{}", show(&f.out));
    assert!(f.stdout().contains(&digest), "{}", show(&f.out));
    assert_eq!(reg.requests_matching(&top.digest).len(), 1, "{}", reg.log());
    assert!(reg.requests_matching(&bottom.digest).is_empty(), "bottom layer downloaded");
    assert!(reg.requests_matching(&mid.digest).is_empty(), "middle layer downloaded");
    // Pinned digest works; a wrong pinned digest fails.
    let f = fetch_plain(&reg, &format!("kata/kernel@{digest}"), &["/boot/vmlinuz"]);
    assert!(f.ok(), "{}", show(&f.out));
    let wrong = format!("sha256:{}", "0".repeat(64));
    let f = fetch_plain(&reg, &format!("kata/kernel@{wrong}"), &["/boot/vmlinuz"]);
    assert!(!f.ok());
    assert_eq!(f.out.status.code(), Some(1));
}

#[test]
fn pinned_digest_mismatch_is_refused() {
    let reg = Registry::start();
    let img = kernel_image(b"K", Compress::Gzip);
    reg.push_untagged("r", &img);
    // The registry serves other content under the pinned digest.
    let other = kernel_image(b"EVIL", Compress::Gzip);
    reg.push_untagged("r", &other);
    reg.put_manifest_raw("r", None, &img.digest(), &other.manifest());
    let f = fetch_plain(&reg, &format!("r@{}", img.digest()), &["/boot/vmlinuz"]);
    assert!(!f.ok(), "{}", show(&f.out));
    assert!(f.stderr().contains("digest mismatch"), "{}", show(&f.out));
    assert!(f.names().is_empty());
}

#[test]
fn layout_source_and_compressions() {
    for c in [Compress::None, Compress::Gzip, Compress::MultiGzip, Compress::Zstd] {
        let dir = tempfile::tempdir().unwrap();
        let mut l = LayerBuilder::new();
        l.dir("boot").big_file("boot/vmlinuz", 300_000, 3);
        let tar = l.tar_bytes();
        let blob = kata_addons_tests::image::compress(&tar, c);
        let img = Image::new(vec![blob]);
        img.write_layout(dir.path(), "v1");
        let f = fetch(&format!("oci:{}:v1", dir.path().display()), &["/boot/vmlinuz"], &[]);
        assert!(f.ok(), "{c:?}: {}", show(&f.out));
        assert_eq!(f.read("vmlinuz").len(), 300_000, "{c:?}");
    }
    // Docker media type for gzip too, via the registry.
    let reg = Registry::start();
    let mut blob = LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"D").build(Compress::Gzip);
    blob.media_type = media::DOCKER_GZIP.into();
    reg.push("d", "1", &Image::new(vec![blob]));
    let f = fetch_plain(&reg, "d:1", &["/boot/vmlinuz"]);
    assert!(f.ok(), "{}", show(&f.out));
    // Unknown media types are refused.
    let mut blob = LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"D").build(Compress::Gzip);
    blob.media_type = "application/x-weird".into();
    reg.push("u", "1", &Image::new(vec![blob]));
    let f = fetch_plain(&reg, "u:1", &["/boot/vmlinuz"]);
    assert!(!f.ok());
    assert!(f.stderr().contains("unsupported layer media type"), "{}", show(&f.out));
}

fn layout_fetch(layers: Vec<kata_addons_tests::image::Blob>, paths: &[&str]) -> Fetched {
    let dir = tempfile::tempdir().unwrap();
    Image::new(layers).write_layout(dir.path(), "t");
    let f = fetch(&format!("oci:{}:t", dir.path().display()), paths, &[]);
    drop(dir);
    f
}

#[test]
fn whiteouts_and_opaque_dirs() {
    let g = Compress::Gzip;
    let low = || {
        LayerBuilder::new()
            .dir("etc")
            .file("etc/a", b"A")
            .file("etc/b", b"B")
            .file("etc/c", b"C-low")
            .dir("opq")
            .file("opq/x", b"X")
            .build(g)
    };
    // Whiteout after the entry it hides, and a whiteout plus a new file in the same layer.
    let top = || {
        LayerBuilder::new()
            .dir("etc")
            .file("etc/c", b"C-top")
            .whiteout("etc/c")
            .whiteout("etc/a")
            .dir("opq")
            .file("opq/y", b"Y")
            .opaque("opq")
            .build(g)
    };
    let f = layout_fetch(vec![low(), top()], &["/etc/b", "/etc/c", "/opq/y"]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("b"), b"B");
    assert_eq!(f.read("c"), b"C-top", "a whiteout applies only to lower layers");
    assert_eq!(f.read("y"), b"Y");
    for p in ["/etc/a", "/opq/x"] {
        let f = layout_fetch(vec![low(), top()], &[p]);
        assert!(!f.ok(), "{p} should be gone: {}", show(&f.out));
        assert!(f.stderr().contains("does not exist"), "{}", show(&f.out));
        assert!(f.names().is_empty());
    }
    // Whiteout of a directory hides its subtree.
    let top2 = LayerBuilder::new().whiteout("etc").build(g);
    let f = layout_fetch(vec![low(), top2], &["/etc/b"]);
    assert!(!f.ok());
}

#[test]
fn symlinks_stay_inside_the_image() {
    let g = Compress::Gzip;
    let low = LayerBuilder::new()
        .dir("real")
        .file("real/vmlinuz-6", b"REAL")
        .dir("etc")
        .file("etc/passwd", b"image-passwd")
        .build(g);
    let top = LayerBuilder::new()
        .dir("boot")
        .symlink("boot/vmlinuz", "../real/vmlinuz-6")
        .symlink("boot/abs", "/real/vmlinuz-6")
        .symlink("boot/clamp", "../../../../../../real/vmlinuz-6")
        .symlink("boot/host", "/etc/passwd")
        .symlink("boot/shadow", "/etc/shadow")
        .symlink("boot/loop1", "loop2")
        .symlink("boot/loop2", "loop1")
        .symlink("dirlink", "real")
        .build(g);
    let f = layout_fetch(
        vec![low.clone(), top.clone()],
        &["/boot/vmlinuz", "/boot/abs", "/boot/clamp", "/boot/host", "/dirlink/vmlinuz-6"],
    );
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), b"REAL");
    assert_eq!(f.read("abs"), b"REAL");
    assert_eq!(f.read("clamp"), b"REAL");
    assert_eq!(f.read("host"), b"image-passwd", "absolute targets mean the image's /");
    assert_eq!(f.read("vmlinuz-6"), b"REAL");
    for name in f.names() {
        let m = std::fs::symlink_metadata(f.dest.path().join(&name)).unwrap();
        assert!(m.file_type().is_file(), "{name} must be a regular file");
    }
    let f = layout_fetch(vec![low.clone(), top.clone()], &["/boot/shadow"]);
    assert!(!f.ok(), "{}", show(&f.out));
    assert!(f.names().is_empty());
    let f = layout_fetch(vec![low, top], &["/boot/loop1"]);
    assert!(!f.ok());
    assert!(f.stderr().contains("too many levels"), "{}", show(&f.out));
}

#[test]
fn hardlinks_devices_setuid_traversal_duplicates() {
    let g = Compress::Gzip;
    let layer = LayerBuilder::new()
        .dir("boot")
        .file("boot/vmlinuz-6", b"K6")
        .hardlink("boot/vmlinuz", "boot/vmlinuz-6")
        .hardlink("boot/hostlink", "/etc/shadow")
        .hardlink("boot/uplink", "../../boot/vmlinuz-6")
        .char_device("boot/dev")
        .file_mode("boot/suid", b"S", 0o4755)
        .file("../x", b"TRAVERSAL")
        .file("/abs", b"ABSOLUTE")
        .file("boot/dup", b"first")
        .file("boot/dup", b"second")
        .build(g);
    let f =
        layout_fetch(vec![layer.clone()], &["/boot/vmlinuz", "/boot/uplink", "/boot/suid", "/x", "/abs", "/boot/dup"]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), b"K6");
    assert_eq!(f.read("uplink"), b"K6");
    assert_eq!(f.read("x"), b"TRAVERSAL");
    assert_eq!(f.read("abs"), b"ABSOLUTE");
    assert_eq!(f.read("dup"), b"second", "later duplicates win");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(f.dest.path().join("suid")).unwrap().permissions());
    assert_eq!(mode & 0o7777, 0o644, "no setuid");
    assert!(!f.dest.path().parent().unwrap().join("x").exists() || !Path::new("/x").exists());
    let f = layout_fetch(vec![layer.clone()], &["/boot/hostlink"]);
    assert!(!f.ok(), "{}", show(&f.out));
    let f = layout_fetch(vec![layer], &["/boot/dev"]);
    assert!(!f.ok());
    assert!(f.stderr().contains("character device"), "{}", show(&f.out));
    assert!(f.names().is_empty());
}

#[test]
fn implicit_parent_reads_lower_layers() {
    // Top has boot/vmlinuz without a boot/ entry: boot could be a symlink below.
    let g = Compress::Gzip;
    let low = LayerBuilder::new().dir("boot").file("boot/other", b"O").build(g);
    let top = LayerBuilder::new().file("boot/vmlinuz", b"K").build(g);
    let f = layout_fetch(vec![low, top], &["/boot/vmlinuz"]);
    assert!(f.ok(), "{}", show(&f.out));
    assert!(f.stdout().contains("layers read 2 of 2"), "{}", show(&f.out));
}

#[test]
fn tampered_truncated_oversized_foreign() {
    let reg = Registry::start();
    // Tampered: a valid tar.gz under another layer's digest.
    let img = kernel_image(b"GOOD", Compress::Gzip);
    reg.push("t", "1", &img);
    let evil = LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"EVIL").build(Compress::Gzip);
    reg.put_blob_raw("t", &img.layers[1].digest, &evil.data);
    let mut img2 = img.clone();
    img2.descriptors[1]["size"] = serde_json::json!(evil.data.len());
    reg.put_manifest("t", Some("2"), &img2.manifest());
    for tag in ["t:1", "t:2"] {
        let f = fetch_plain(&reg, tag, &["/boot/vmlinuz"]);
        assert!(!f.ok(), "{}", show(&f.out));
        assert!(f.names().is_empty(), "nothing handed out: {:?}", f.names());
    }
    // Truncated / oversized: the descriptor size lies.
    let img = kernel_image(b"GOOD", Compress::Gzip);
    reg.push("s", "1", &img);
    let mut bigger = img.clone();
    bigger.descriptors[1]["size"] = serde_json::json!(img.layers[1].data.len() + 100);
    reg.put_manifest("s", Some("trunc"), &bigger.manifest());
    let f = fetch_plain(&reg, "s:trunc", &["/boot/vmlinuz"]);
    assert!(!f.ok());
    assert!(f.stderr().contains("truncated"), "{}", show(&f.out));
    let mut smaller = img.clone();
    smaller.descriptors[1]["size"] = serde_json::json!(img.layers[1].data.len() - 10);
    reg.put_manifest("s", Some("over"), &smaller.manifest());
    let f = fetch_plain(&reg, "s:over", &["/boot/vmlinuz"]);
    assert!(!f.ok());
    assert!(f.stderr().contains("larger than its descriptor"), "{}", show(&f.out));
    // Foreign layer with urls: refused without contacting the url.
    let sink = Registry::start();
    let mut foreign = img.clone();
    foreign.descriptors[1]["urls"] = serde_json::json!([format!("http://{}/v2/x/blobs/evil", sink.host())]);
    reg.put_manifest("s", Some("foreign"), &foreign.manifest());
    let f = fetch_plain(&reg, "s:foreign", &["/boot/vmlinuz"]);
    assert!(!f.ok());
    assert!(f.stderr().contains("foreign layer"), "{}", show(&f.out));
    assert!(sink.requests_matching("/v2/").is_empty(), "url contacted");
    // Manifest larger than 4 MiB (docker-registry refuses to serve those itself, so a layout).
    let dir = tempfile::tempdir().unwrap();
    let mut huge = img.clone();
    huge.descriptors[0]["annotations"] = serde_json::json!({"pad": "x".repeat(5 << 20)});
    huge.write_layout(dir.path(), "huge");
    let f = fetch(&format!("oci:{}:huge", dir.path().display()), &["/boot/vmlinuz"], &[]);
    assert!(!f.ok());
    assert!(f.stderr().contains("limit"), "{}", show(&f.out));
}

#[test]
fn index_platform_selection() {
    let reg = Registry::start();
    let amd = Image::with_platform(
        vec![LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"AMD64").build(Compress::Gzip)],
        "linux",
        "amd64",
    );
    let arm = Image::with_platform(
        vec![LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"ARM64").build(Compress::Gzip)],
        "linux",
        "arm64",
    );
    let s390 = Image::with_platform(
        vec![LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"S390X").build(Compress::Gzip)],
        "linux",
        "s390x",
    );
    for i in [&amd, &arm, &s390] {
        reg.push_untagged("multi", i);
    }
    reg.put_manifest(
        "multi",
        Some("1"),
        &index(&[
            ("linux", "amd64", None, &amd),
            ("linux", "arm64", Some("v8"), &arm),
            ("linux", "s390x", None, &s390),
        ]),
    );
    let host = reg.host();
    let r = format!("{host}/multi:1");
    for (p, want) in
        [("linux/arm64", "ARM64"), ("linux/s390x", "S390X"), ("linux/amd64", "AMD64"), ("linux/arm64/v8", "ARM64")]
    {
        let f = fetch(&r, &["/boot/vmlinuz"], &["--insecure-registry", &host, "--platform", p]);
        assert!(f.ok(), "{p}: {}", show(&f.out));
        assert_eq!(f.read("vmlinuz"), want.as_bytes());
    }
    let f = fetch(&r, &["/boot/vmlinuz"], &["--insecure-registry", &host, "--platform", "linux/riscv64"]);
    assert!(!f.ok());
    let e = f.stderr();
    assert!(
        e.contains("linux/riscv64") && e.contains("linux/arm64/v8") && e.contains("linux/s390x"),
        "{}",
        show(&f.out)
    );
}

fn auth_file(dir: &Path, host: &str, user: &str, pass: &str, b64: bool) -> String {
    use base64::Engine;
    let entry = if b64 {
        serde_json::json!({"auth": base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))})
    } else {
        serde_json::json!({"username": user, "password": pass})
    };
    let p = dir.join(format!("auth-{b64}-{pass}.json"));
    std::fs::write(&p, serde_json::json!({"auths": {host: entry}}).to_string()).unwrap();
    p.display().to_string()
}

#[test]
fn htpasswd_auth() {
    let reg = Registry::start_with(RegistryConfig {
        htpasswd: Some(("alice".into(), "s3cret".into())),
        ..RegistryConfig::default()
    });
    reg.push("p/k", "1", &kernel_image(b"AUTH", Compress::Gzip));
    let host = reg.host();
    let r = format!("{host}/p/k:1");
    let tmp = tempfile::tempdir().unwrap();
    for b64 in [true, false] {
        let a = auth_file(tmp.path(), &host, "alice", "s3cret", b64);
        let f = fetch(&r, &["/boot/vmlinuz"], &["--insecure-registry", &host, "--auth-file", &a]);
        assert!(f.ok(), "{}", show(&f.out));
        assert_eq!(f.read("vmlinuz"), b"AUTH");
    }
    let a = auth_file(tmp.path(), &host, "alice", "wrong", true);
    let f = fetch(&r, &["/boot/vmlinuz"], &["--insecure-registry", &host, "--auth-file", &a]);
    assert!(!f.ok());
    assert!(f.stderr().contains("authentication failed"), "{}", show(&f.out));
    let f = fetch(&r, &["/boot/vmlinuz"], &["--insecure-registry", &host]);
    assert!(!f.ok());
    assert!(f.stderr().contains("no credentials"), "{}", show(&f.out));
    // REGISTRY_AUTH_FILE is searched by default.
    let a = auth_file(tmp.path(), &host, "alice", "s3cret", true);
    let dest = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(kata_addons_tests::kata_addons_bin())
        .args(["fetch", "--image", &r, "--path", "/boot/vmlinuz", "--dest"])
        .arg(dest.path())
        .args(["--insecure-registry", &host])
        .env("REGISTRY_AUTH_FILE", &a)
        .env("HOME", tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
}

#[test]
fn tls_ca_and_insecure_marking() {
    let ca = TestCa::new();
    let reg = Registry::start_with(RegistryConfig { tls: Some(ca.clone()), ..RegistryConfig::default() });
    reg.push("k", "1", &kernel_image(b"TLS", Compress::Gzip));
    let r = format!("{}/k:1", reg.host());
    let f = fetch(&r, &["/boot/vmlinuz"], &["--timeout", "5"]);
    assert!(!f.ok(), "unknown CA must fail: {}", show(&f.out));
    assert!(
        f.stderr().to_lowercase().contains("certificate") || f.stderr().contains("UnknownIssuer"),
        "{}",
        show(&f.out)
    );
    let certs = ca.cert_dir();
    let cd = certs.path().display().to_string();
    let f = fetch(&r, &["/boot/vmlinuz"], &["--cert-dir", &cd]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), b"TLS");
    // A bad PEM in --cert-dir is reported by name and otherwise ignored (containers-certs.d(5)).
    std::fs::write(certs.path().join("bad.crt"), "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n")
        .unwrap();
    let f = fetch(&r, &["/boot/vmlinuz"], &["--cert-dir", &cd]);
    assert!(f.ok(), "{}", show(&f.out));
    assert!(f.stderr().contains("bad.crt"), "{}", show(&f.out));
    // Plain-HTTP registry without the insecure mark: fails, never falls back to HTTP.
    let plain = Registry::start();
    plain.push("k", "1", &kernel_image(b"P", Compress::Gzip));
    let f = fetch(&format!("{}/k:1", plain.host()), &["/boot/vmlinuz"], &["--timeout", "5"]);
    assert!(!f.ok());
    assert!(plain.requests_matching("/v2/").is_empty(), "plain HTTP used: {}", plain.log());
}

#[test]
fn mirrors_in_order_then_primary() {
    let primary = Registry::start();
    primary.push("lib/k", "1", &kernel_image(b"PRIMARY", Compress::Gzip));
    let empty = Registry::start();
    let dead = kata_addons_tests::registry::free_port();
    let conf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        conf.path(),
        format!(
            "[[registry]]\nprefix = \"example.invalid/lib\"\nlocation = \"{p}/lib\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"127.0.0.1:{dead}/m\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{e}/m2\"\ninsecure = true\n",
            p = primary.host(),
            e = empty.host()
        ),
    )
    .unwrap();
    let c = conf.path().display().to_string();
    let f = fetch("example.invalid/lib/k:1", &["/boot/vmlinuz"], &["--registries-conf", &c, "--timeout", "5"]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), b"PRIMARY");
    assert!(!empty.requests_matching("/v2/m2/k/manifests/1").is_empty(), "second mirror not tried: {}", empty.log());
    // A mirror that has the image is used instead of the primary.
    empty.push("m2/k", "1", &kernel_image(b"MIRROR", Compress::Gzip));
    let f = fetch("example.invalid/lib/k:1", &["/boot/vmlinuz"], &["--registries-conf", &c, "--timeout", "5"]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), b"MIRROR");
    // Blocked.
    std::fs::write(conf.path(), "[[registry]]\nlocation = \"example.invalid\"\nblocked = true\n").unwrap();
    let f = fetch("example.invalid/lib/k:1", &["/boot/vmlinuz"], &["--registries-conf", &c]);
    assert!(!f.ok());
    assert!(f.stderr().contains("blocked"), "{}", show(&f.out));
}

fn proxied(rules: Rules, kernel: &[u8]) -> (Registry, Proxy, Image) {
    let reg = Registry::start();
    let img = kernel_image(kernel, Compress::Gzip);
    reg.push("k", "1", &img);
    let proxy = Proxy::start(reg.addr, rules);
    (reg, proxy, img)
}

#[test]
fn retries_503_then_success() {
    let (_reg, proxy, _) = proxied(Rules { fail_first: 3, ..Rules::default() }, b"RETRY");
    let h = proxy.host();
    let f = fetch(&format!("{h}/k:1"), &["/boot/vmlinuz"], &["--insecure-registry", &h]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), b"RETRY");
    assert!(proxy.requests().len() >= 4);
}

#[test]
fn connection_cut_mid_blob_resumes() {
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let (_reg, proxy, img) = proxied(Rules { cut_blob_after: Some(100_000), cut_times: 1, ..Rules::default() }, &big);
    let h = proxy.host();
    let f = fetch(&format!("{h}/k:1"), &["/boot/vmlinuz"], &["--insecure-registry", &h]);
    assert!(f.ok(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), big);
    assert_eq!(proxy.requests_matching(&img.layers[1].digest).len(), 2, "{:?}", proxy.requests());
}

#[test]
fn stalled_registry_times_out() {
    let (_reg, proxy, _) = proxied(Rules { stall: true, ..Rules::default() }, b"S");
    let h = proxy.host();
    let t = std::time::Instant::now();
    let f = fetch(
        &format!("{h}/k:1"),
        &["/boot/vmlinuz"],
        &["--insecure-registry", &h, "--timeout", "1", "--retries", "2"],
    );
    assert!(!f.ok());
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "took {:?}", t.elapsed());
    assert!(f.stderr().contains(&h), "error must name the registry: {}", show(&f.out));
    // Stall in the middle of a blob.
    let reg = Registry::start();
    let top = LayerBuilder::new().dir("boot").big_file("boot/vmlinuz", 2 << 20, 9).build(Compress::Gzip);
    reg.push("k", "1", &Image::new(vec![top]));
    let proxy = Proxy::start(reg.addr, Rules { stall_blob_after: Some(50_000), ..Rules::default() });
    let h = proxy.host();
    let f = fetch(
        &format!("{h}/k:1"),
        &["/boot/vmlinuz"],
        &["--insecure-registry", &h, "--timeout", "1", "--retries", "2"],
    );
    assert!(!f.ok());
    assert!(f.stderr().contains("timed out") || f.stderr().contains("stalled"), "{}", show(&f.out));
    assert!(f.names().is_empty());
}
