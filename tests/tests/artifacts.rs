//! OCI artifacts as sources (docs/design.md#oci-artifacts), pushed by a real ORAS client (the ORAS
//! Python SDK, `tests/oras/oras_client.py`) to a real docker-registry on 127.0.0.1 and
//! fetched or installed by the real binary on real directories.

use std::process::Output;

use kata_addons_tests::disk::{self, Fs, Label};
use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::node::{Node, Tmpfs, content_snapshot, extension_entries, noise};
use kata_addons_tests::oras::{self, Workdir};
use kata_addons_tests::registry::{Registry, RegistryConfig};
use kata_addons_tests::{run_kata_env as kata, sha256_hex, show};

/// What `oras push --artifact-type` of guest-components' extension disk names.
const COCO_EXTENSION: &str = "application/vnd.confidential-containers.coco-extension.disk";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Fetched {
    out: Output,
    dest: tempfile::TempDir,
}

impl Fetched {
    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dest.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}\n{}", show(&self.out)))
    }
    /// Everything in the destination (no temporaries left behind).
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.dest.path())
            .expect("dest")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

/// `kata-addons fetch` of `paths` from `image` (a reference or `oci:`), plain HTTP to `reg`.
fn fetch(reg: Option<&Registry>, image: &str, paths: &[&str], extra: &[&str]) -> Fetched {
    let dest = tempfile::tempdir().expect("dest");
    let d = dest.path().to_str().expect("utf8").to_string();
    let host = reg.map(Registry::host);
    let mut args: Vec<&str> = vec!["fetch", "--image", image, "--dest", &d];
    if let Some(h) = &host {
        args.extend(["--insecure-registry", h]);
    }
    for p in paths {
        args.extend(["--path", p]);
    }
    args.extend_from_slice(extra);
    Fetched { out: kata(&args, &[]), dest }
}

/// The manifest `digest` as the registry stores it.
fn stored_manifest(reg: &Registry, digest: &str) -> serde_json::Value {
    let hex = digest.trim_start_matches("sha256:");
    let p = reg.dir.path().join("storage/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data");
    serde_json::from_slice(&std::fs::read(&p).expect("stored manifest")).expect("manifest json")
}

/// [`content_snapshot`] of the node without the node lock (`/run/kata-addons.lock`), which
/// the runner keeps.
fn snapshot(node: &Node) -> std::collections::BTreeMap<String, String> {
    let mut m = content_snapshot(node.root());
    m.retain(|k, _| !k.starts_with("run"));
    m
}

fn root_arg(node: &Node) -> String {
    node.root().display().to_string()
}

/// `install` on `node` from the plain-HTTP registry `reg` with the addon `env`.
fn install(node: &Node, reg: &Registry, env: &[(&str, &str)], extra: &[&str]) -> Output {
    let root = root_arg(node);
    let host = reg.host();
    let mut args = vec!["install", "--root", root.as_str(), "--insecure-registry", host.as_str()];
    args.extend_from_slice(extra);
    kata(&args, env)
}

fn read_node_file(node: &Node, node_path: &str) -> Vec<u8> {
    std::fs::read(node.path(node_path)).unwrap_or_else(|e| panic!("{node_path}: {e}"))
}

#[test]
fn a_single_file_as_oras_pushes_it_is_fetched_verbatim() {
    let reg = Registry::start();
    let kernel = noise(300_000, 1);
    let w = Workdir::new();
    w.file("vmlinuz", &kernel);
    let digest = w.push(&reg.host(), "kata/kernel:v1", None, &["vmlinuz"]);
    // The SDK's shape: no artifactType, the "unknown" config, a tar-typed raw layer.
    let m = stored_manifest(&reg, &digest);
    assert_eq!(m["config"]["mediaType"], "application/vnd.unknown.config.v1+json", "{m}");
    assert_eq!(m["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar", "{m}");
    let f = fetch(Some(&reg), &format!("{}/kata/kernel:v1", reg.host()), &["/vmlinuz"], &[]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), kernel);
    assert_eq!(f.names(), vec!["vmlinuz"]);
    let out = stdout(&f.out);
    assert!(out.contains(&format!("manifest {digest}")), "{out}");
    assert!(out.contains(&format!("{}  300000  ", sha256_hex(&kernel))), "{out}");
    assert!(out.contains("layers read 1 of 1"), "{out}");
}

/// A raw layer typed `tar` whose bytes really are a tar is still the file itself, not unpacked.
#[test]
fn a_tar_typed_raw_layer_is_the_file_even_when_it_is_a_tar() {
    let reg = Registry::start();
    let tar = LayerBuilder::new().dir("boot").file("boot/vmlinuz", b"inside the tar").tar_bytes();
    let w = Workdir::new();
    w.file("bundle.tar", &tar);
    w.push(&reg.host(), "kata/bundle:v1", Some("application/x.test"), &["bundle.tar"]);
    let image = format!("{}/kata/bundle:v1", reg.host());
    let f = fetch(Some(&reg), &image, &["/bundle.tar"], &[]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    assert_eq!(f.read("bundle.tar"), tar);
    for inside in ["/boot/vmlinuz", "/bundle.tar/boot/vmlinuz"] {
        let f = fetch(Some(&reg), &image, &[inside], &[]);
        assert_eq!(f.out.status.code(), Some(1), "{inside}: {}", show(&f.out));
        assert!(stderr(&f.out).contains("not a file of the OCI artifact"), "{}", show(&f.out));
        assert!(f.names().is_empty(), "{:?}", f.names());
    }
}

#[test]
fn several_files_read_only_the_wanted_blobs_and_untitled_layers_are_not_addressable() {
    let reg = Registry::start();
    let (kernel, initrd, other) = (noise(200_000, 2), noise(100_000, 3), noise(150_000, 4));
    let w = Workdir::new();
    w.file("vmlinuz", &kernel).file("initrd.img", &initrd).file("other.bin", &other).file("nameless", b"no title");
    // The annotation file gives `nameless` an empty title: a layer without a name.
    let ann = serde_json::json!({"nameless": {"org.opencontainers.image.title": ""}});
    let digest = w.push_annotated(
        &reg.host(),
        "kata/several:v1",
        Some("application/x.kata.guest"),
        Some(&ann),
        &["vmlinuz", "initrd.img", "other.bin", "nameless"],
    );
    let m = stored_manifest(&reg, &digest);
    assert_eq!(m["artifactType"], "application/x.kata.guest", "{m}");
    assert_eq!(m["config"]["mediaType"], "application/vnd.oci.empty.v1+json", "{m}");
    let image = format!("{}/kata/several:v1", reg.host());
    let f = fetch(Some(&reg), &image, &["/vmlinuz", "/initrd.img"], &[]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), kernel);
    assert_eq!(f.read("initrd.img"), initrd);
    assert!(stdout(&f.out).contains("layers read 2 of 4"), "{}", show(&f.out));
    let other_digest = format!("sha256:{}", sha256_hex(&other));
    assert!(reg.requests_matching(&other_digest).is_empty(), "an unwanted blob was downloaded: {}", reg.log());
    let f = fetch(Some(&reg), &image, &["/nameless"], &[]);
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    let e = stderr(&f.out);
    assert!(e.contains("/nameless: no layer of the artifact is titled so"), "{e}");
    assert!(e.contains("/vmlinuz, /initrd.img, /other.bin") && e.contains("1 untitled layer(s)"), "{e}");
}

#[test]
fn a_multi_platform_index_of_artifacts_selects_the_platform() {
    let reg = Registry::start();
    let host = reg.host();
    let (amd, arm) = (noise(100_000, 5), noise(100_001, 6));
    let w = Workdir::new();
    w.file("vmlinuz", &amd);
    let d_amd = w.push(&host, "kata/multi:amd64", Some("application/x.kata.kernel"), &["vmlinuz"]);
    w.file("vmlinuz", &arm);
    let d_arm = w.push(&host, "kata/multi:arm64", Some("application/x.kata.kernel"), &["vmlinuz"]);
    oras::push_index(&host, "kata/multi:v1", &[("linux/amd64", &d_amd), ("linux/arm64", &d_arm)]);
    let image = format!("{host}/kata/multi:v1");
    for (platform, want, digest) in [("linux/amd64", &amd, &d_amd), ("linux/arm64", &arm, &d_arm)] {
        let f = fetch(Some(&reg), &image, &["/vmlinuz"], &["--platform", platform]);
        assert!(f.out.status.success(), "{platform}: {}", show(&f.out));
        assert_eq!(&f.read("vmlinuz"), want, "{platform}");
        assert!(stdout(&f.out).contains(&format!("manifest {digest}")), "{}", show(&f.out));
    }
    let f = fetch(Some(&reg), &image, &["/vmlinuz"], &["--platform", "linux/s390x"]);
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    assert!(
        stderr(&f.out).contains("no manifest for platform linux/s390x; it has: linux/amd64, linux/arm64"),
        "{}",
        show(&f.out)
    );

    // The same index copied by the client into an OCI layout: `oci:` holds an artifact.
    let dir = tempfile::tempdir().expect("layout");
    let layout = dir.path().join("multi");
    oras::to_layout(&host, "kata/multi:v1", &layout, "v1");
    drop(reg);
    let f = fetch(None, &format!("oci:{}:v1", layout.display()), &["/vmlinuz"], &["--platform", "linux/arm64"]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    assert_eq!(f.read("vmlinuz"), arm);
}

#[test]
fn an_unpacked_directory_is_reached_under_its_title() {
    let reg = Registry::start();
    let w = Workdir::new();
    w.file("ext/a.txt", b"file a").file("ext/sub/b.bin", &noise(50_000, 7)).symlink("ext/link", "sub/b.bin");
    w.file("vmlinuz", b"kernel");
    let digest = w.push(&reg.host(), "kata/dir:v1", Some("application/x.test"), &["vmlinuz", "ext"]);
    let m = stored_manifest(&reg, &digest);
    assert_eq!(m["layers"][1]["annotations"]["io.deis.oras.content.unpack"], "true", "{m}");
    assert_eq!(m["layers"][1]["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip", "{m}");
    let image = format!("{}/kata/dir:v1", reg.host());
    let f = fetch(Some(&reg), &image, &["/ext/sub/b.bin", "/ext/a.txt", "/vmlinuz"], &[]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    assert_eq!(f.read("b.bin"), noise(50_000, 7));
    assert_eq!(f.read("a.txt"), b"file a");
    assert_eq!(f.read("vmlinuz"), b"kernel");
    // A symlink inside the directory is followed inside it.
    let f = fetch(Some(&reg), &image, &["/ext/link"], &[]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    assert_eq!(f.read("link"), noise(50_000, 7));
    for (path, says) in [
        ("/ext", "layer 2 unpacks a directory there, not a file"),
        ("/ext/missing", "not a regular file in the image: /ext/missing"),
    ] {
        let f = fetch(Some(&reg), &image, &[path], &[]);
        assert_eq!(f.out.status.code(), Some(1), "{path}: {}", show(&f.out));
        assert!(stderr(&f.out).contains(says), "{path}: want {says:?}\n{}", show(&f.out));
        assert!(f.names().is_empty(), "{:?}", f.names());
    }
}

/// An unpack layer with an entry outside `<title>/` (pushed by the client with an
/// annotation file, as `oras push --annotation-file` can) refuses the artifact; a symlink
/// leading out of the directory finds nothing.
#[test]
fn an_unpack_layer_reaching_outside_its_title_is_refused() {
    let reg = Registry::start();
    let evil = LayerBuilder::new()
        .dir("ext")
        .file("ext/a.txt", b"fine")
        .symlink("ext/up", "../../etc/shadow")
        .file("etc/shadow", b"planted")
        .build(Compress::Gzip);
    let inside = LayerBuilder::new()
        .dir("ext")
        .file("ext/a.txt", b"fine")
        .symlink("ext/up", "../../etc/shadow")
        .build(Compress::Gzip);
    let w = Workdir::new();
    w.file("evil.tgz", &evil.data).file("inside.tgz", &inside.data);
    let unpack = |title: &str| serde_json::json!({"org.opencontainers.image.title": title, "io.deis.oras.content.unpack": "true"});
    let ann = serde_json::json!({"evil.tgz": unpack("ext")});
    w.push_annotated(&reg.host(), "kata/evil:v1", None, Some(&ann), &["evil.tgz"]);
    let ann = serde_json::json!({"inside.tgz": unpack("ext")});
    w.push_annotated(&reg.host(), "kata/inside:v1", None, Some(&ann), &["inside.tgz"]);
    let f = fetch(Some(&reg), &format!("{}/kata/evil:v1", reg.host()), &["/ext/a.txt"], &[]);
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    assert!(stderr(&f.out).contains("entry /etc/shadow lies outside ext/"), "{}", show(&f.out));
    assert!(f.names().is_empty(), "{:?}", f.names());
    let image = format!("{}/kata/inside:v1", reg.host());
    let f = fetch(Some(&reg), &image, &["/ext/a.txt"], &[]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    let f = fetch(Some(&reg), &image, &["/ext/up"], &[]);
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    assert!(stderr(&f.out).contains("not a regular file in the image: /ext/up"), "{}", show(&f.out));
}

#[test]
fn hostile_or_duplicate_titles_refuse_the_whole_artifact() {
    let reg = Registry::start();
    let node = Node::new();
    let before = snapshot(&node);
    let w = Workdir::new();
    w.file("good", b"fine").file("bad", b"hostile");
    for (n, title) in
        ["../../etc/passwd", "/etc/passwd", "a//b", "./bad", "bad/", "a/../b", "tab\there"].iter().enumerate()
    {
        let ann = serde_json::json!({"bad": {"org.opencontainers.image.title": title}});
        let repo = format!("kata/hostile{n}:v1");
        w.push_annotated(&reg.host(), &repo, None, Some(&ann), &["good", "bad"]);
        let image = format!("{}/{repo}", reg.host());
        let f = fetch(Some(&reg), &image, &["/good"], &[]);
        assert_eq!(f.out.status.code(), Some(1), "{title:?}: {}", show(&f.out));
        let e = stderr(&f.out);
        assert!(e.contains(&format!("artifact layer 2 (sha256:{}): title {title:?}", sha256_hex(b"hostile"))), "{e}");
        assert!(f.names().is_empty(), "{:?}", f.names());
        if n == 0 {
            let o = install(&node, &reg, &[("ADDON_IMAGE", &image), ("ADDON_KERNEL_PATH", "/good")], &[]);
            assert_eq!(o.status.code(), Some(1), "{}", show(&o));
            assert!(stderr(&o).contains("artifact layer 2"), "{}", show(&o));
            assert_eq!(snapshot(&node), before, "{title:?}: a refused install wrote on the node");
        }
    }
    let ann = serde_json::json!({"bad": {"org.opencontainers.image.title": "good"}});
    w.push_annotated(&reg.host(), "kata/twice:v1", None, Some(&ann), &["good", "bad"]);
    let f = fetch(Some(&reg), &format!("{}/kata/twice:v1", reg.host()), &["/good"], &[]);
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    assert!(stderr(&f.out).contains("title \"good\" repeats the title \"good\" of layer 1"), "{}", show(&f.out));
    assert!(f.names().is_empty(), "{:?}", f.names());
}

/// The installed state and drop-in, with the version directory's name (derived from the
/// manifest digest) replaced.
fn install_record(node: &Node, provider: &str) -> (serde_json::Value, String) {
    let state: serde_json::Value =
        serde_json::from_slice(&read_node_file(node, "/etc/kata-containers/addons/state.json")).expect("state json");
    let dir = state["files"][0]["path"].as_str().expect("file path").rsplit_once('/').expect("dir").0.to_string();
    let files: Vec<serde_json::Value> = state["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            let mut f = f.clone();
            f["path"] = f["path"].as_str().expect("path").replace(&dir, "<dir>").into();
            f
        })
        .collect();
    let drop_in = node.config_dir(provider).join("config.d/50-kata-addons.toml");
    let text = std::fs::read_to_string(drop_in).expect("drop-in").replace(&dir, "<dir>");
    (serde_json::Value::Array(files), text)
}

#[test]
fn the_same_files_as_a_container_image_install_identically() {
    let reg = Registry::start();
    let (kernel, initrd) = (noise(400_000, 8), noise(200_000, 9));
    let w = Workdir::new();
    w.file("vmlinuz", &kernel).file("initrd.img", &initrd);
    w.push(&reg.host(), "kata/tdx-artifact:v1", Some("application/x.kata.guest"), &["vmlinuz", "initrd.img"]);
    let top = LayerBuilder::new().file("vmlinuz", &kernel).file("initrd.img", &initrd).build(Compress::Gzip);
    reg.push("kata/tdx-image", "v1", &Image::new(vec![top]));
    let mut records = Vec::new();
    for repo in ["kata/tdx-artifact:v1", "kata/tdx-image:v1"] {
        let node = Node::new();
        let pristine = snapshot(&node);
        let image = format!("{}/{repo}", reg.host());
        let env = [
            ("ADDON_IMAGE", image.as_str()),
            ("ADDON_PROVIDER", "tdx"),
            ("ADDON_KERNEL_PATH", "/vmlinuz"),
            ("ADDON_INITRD_PATH", "/initrd.img"),
            ("ADDON_KERNEL_SHA256", &sha256_hex(&kernel)),
        ];
        let o = install(&node, &reg, &env, &[]);
        assert!(o.status.success(), "{repo}: {}", show(&o));
        assert_eq!(read_node_file(&node, &node.qemu_key("tdx", "kernel").expect("kernel")), kernel);
        assert_eq!(read_node_file(&node, &node.qemu_key("tdx", "initrd").expect("initrd")), initrd);
        let st = kata(&["status", "--root", &root_arg(&node)], &[]);
        assert_eq!(st.status.code(), Some(0), "{}", show(&st));
        let o = install(&node, &reg, &env, &[]);
        assert!(stdout(&o).contains("up to date"), "{}", show(&o));
        records.push(install_record(&node, "tdx"));
        let o = kata(&["uninstall", "--root", &root_arg(&node)], &[]);
        assert!(o.status.success(), "{}", show(&o));
        assert_eq!(snapshot(&node), pristine, "{repo}: uninstall did not restore the node");
    }
    assert_eq!(records[0], records[1], "the artifact and the image installed differently");
}

#[test]
fn refusals_of_an_artifact_leave_the_node_unchanged() {
    let reg = Registry::start();
    let kernel = noise(300_000, 10);
    let w = Workdir::new();
    w.file("vmlinuz", &kernel);
    w.push(&reg.host(), "kata/k:v1", Some("application/x.kata.kernel"), &["vmlinuz"]);
    let image = format!("{}/kata/k:v1", reg.host());
    let node = Node::new();
    let before = snapshot(&node);
    let env = [("ADDON_IMAGE", image.as_str()), ("ADDON_KERNEL_PATH", "/vmlinuz")];
    let wrong = "0".repeat(64);
    let pinned = [env[0], env[1], ("ADDON_KERNEL_SHA256", wrong.as_str())];
    let dir = tempfile::tempdir().expect("policy dir");
    let reject = dir.path().join("policy.json");
    std::fs::write(&reject, r#"{"default":[{"type":"reject"}]}"#).expect("policy");
    let reject = reject.to_str().expect("utf8");
    for (what, env, extra, says) in [
        ("a sha256 pin", &pinned[..], &[][..], "checksum mismatch for kernel /vmlinuz"),
        (
            "the size cap",
            &env[..],
            &["--max-file-bytes", "1000"][..],
            "/vmlinuz is 300000 bytes, more than the per-file limit of 1000 bytes",
        ),
        ("the signature policy", &env[..], &["--signature-policy", reject][..], "reject"),
    ] {
        let o = install(&node, &reg, env, extra);
        assert_eq!(o.status.code(), Some(1), "{what}: {}", show(&o));
        assert!(stderr(&o).contains(says), "{what}: want {says:?}\n{}", show(&o));
        assert_eq!(snapshot(&node), before, "{what}: the node changed");
    }
    // Tampered in the registry's storage: the digest check refuses every byte.
    reg.put_blob_raw("kata/k", &format!("sha256:{}", sha256_hex(&kernel)), &noise(300_000, 11));
    let o = install(&node, &reg, &env, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stderr(&o).contains("blob digest mismatch"), "{}", show(&o));
    assert_eq!(snapshot(&node), before, "tampered: the node changed");
}

#[test]
fn a_raw_file_larger_than_the_free_space_is_refused_before_writing() {
    let reg = Registry::start();
    let w = Workdir::new();
    w.file("vmlinuz", &noise(3 << 20, 12));
    w.push(&reg.host(), "kata/big:v1", Some("application/x.kata.kernel"), &["vmlinuz"]);
    let node = Node::new();
    let _fs = Tmpfs::mount(&node.path("/etc/kata-containers/addons"), "size=1m,mode=0755");
    let image = format!("{}/kata/big:v1", reg.host());
    let o = install(&node, &reg, &[("ADDON_IMAGE", &image), ("ADDON_KERNEL_PATH", "/vmlinuz")], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stderr(&o).contains("not enough space on /etc/kata-containers/addons: need"), "{}", show(&o));
    let left: Vec<_> =
        std::fs::read_dir(node.path("/etc/kata-containers/addons")).expect("addons").filter_map(|e| e.ok()).collect();
    assert!(left.is_empty(), "partial files left behind: {left:?}");
}

/// An artifact pushed to a registry requiring a login, reached as the mirror of a source
/// that is down (registries.conf on the node), with the node's auth file.
#[test]
fn mirrors_and_auth_apply_to_artifacts() {
    let (user, password) = ("oras", "s3cret");
    let reg =
        Registry::start_with(RegistryConfig { htpasswd: Some((user.into(), password.into())), ..Default::default() });
    let kernel = noise(120_000, 13);
    let w = Workdir::with_auth(user, password);
    w.file("vmlinuz", &kernel);
    w.push(&reg.host(), "kata/mirrored:v1", Some("application/x.kata.kernel"), &["vmlinuz"]);
    let node = Node::new();
    let down = format!("127.0.0.1:{}", kata_addons_tests::registry::free_port());
    node.write(
        "/etc/containers/registries.conf",
        &format!(
            "[[registry]]\nlocation = \"{down}\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{}\"\ninsecure = true\n",
            reg.host()
        ),
    );
    let auth = serde_json::json!({"auths": {reg.host(): {"auth": base64_basic(user, password)}}});
    node.write("/var/lib/kubelet/config.json", &auth.to_string());
    let image = format!("{down}/kata/mirrored:v1");
    let root = root_arg(&node);
    let o = kata(&["install", "--root", &root], &[("ADDON_IMAGE", &image), ("ADDON_KERNEL_PATH", "/vmlinuz")]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(read_node_file(&node, &node.qemu_key("se", "kernel").expect("kernel")), kernel);
}

fn base64_basic(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// guest-components' `coco-extension-disk` as it publishes it: fetched as published.
#[test]
fn the_coco_extension_disk_shape_is_fetched_as_published() {
    let reg = Registry::start();
    let (disk, root_hash) =
        (noise(1 << 20, 14), b"root_hash=00,salt=00,data_blocks=1,data_block_size=4096,hash_block_size=4096\n");
    let w = Workdir::new();
    w.file("kata-containers-coco-extension.img", &disk).file("root_hash_coco-extension.txt", root_hash);
    let digest = w.push(
        &reg.host(),
        "confidential-containers/coco-extension-disk:v1",
        Some(COCO_EXTENSION),
        &["kata-containers-coco-extension.img", "root_hash_coco-extension.txt"],
    );
    assert_eq!(stored_manifest(&reg, &digest)["artifactType"], COCO_EXTENSION);
    let image = format!("{}/confidential-containers/coco-extension-disk:v1", reg.host());
    let f = fetch(Some(&reg), &image, &["/kata-containers-coco-extension.img", "/root_hash_coco-extension.txt"], &[]);
    assert!(f.out.status.success(), "{}", show(&f.out));
    assert_eq!(f.read("kata-containers-coco-extension.img"), disk);
    assert_eq!(f.read("root_hash_coco-extension.txt"), root_hash);
}

/// A kernel, a measured guest image with its verity file, and an extension, all from one
/// artifact, installed on a Kata 4 node root (the extension keys of
/// docs/measured-guests.md); a damaged extension in the same artifact is refused before the
/// commit, leaving the node unchanged.
#[test]
fn a_kernel_a_verity_image_and_an_extension_install_from_one_artifact() {
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
    let reg = Registry::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (guest, gv) = disk::measured(tmp.path(), "guest", Fs::Erofs, Label::Gpt, "5eed", 4096, 4096);
    let (ext, ev) = disk::measured(tmp.path(), "coco", Fs::Erofs, Label::Mbr, "c0c0", 4096, 4096);
    let kernel = noise(300_000, 21);
    let mut damaged = std::fs::read(&ext).expect("ext");
    damaged[(1 << 20) + 4096 + 3] ^= 1;
    let w = Workdir::new();
    w.file("vmlinuz", &kernel)
        .file("kata-containers-confidential.img", &std::fs::read(&guest).expect("guest"))
        .file("root_hash_confidential.txt", format!("{}\n", gv.kata_params()).as_bytes())
        .file("kata-containers-coco-extension.img", &std::fs::read(&ext).expect("ext"))
        .file("damaged-extension.img", &damaged)
        .file("root_hash_coco-extension.txt", format!("{}\n", ev.kata_params()).as_bytes());
    let files = [
        "vmlinuz",
        "kata-containers-confidential.img",
        "root_hash_confidential.txt",
        "kata-containers-coco-extension.img",
        "damaged-extension.img",
        "root_hash_coco-extension.txt",
    ];
    w.push(&reg.host(), "kata/snp-guest:v4", None, &files);
    let image = format!("{}/kata/snp-guest:v4", reg.host());
    let env = |extension: &str| -> Vec<(&'static str, String)> {
        vec![
            ("ADDON_IMAGE", image.clone()),
            ("ADDON_PROVIDER", "snp".to_string()),
            ("ADDON_KERNEL_PATH", "/vmlinuz".to_string()),
            ("ADDON_IMAGE_PATH", "/kata-containers-confidential.img".to_string()),
            ("ADDON_IMAGE_VERITY_PATH", "/root_hash_confidential.txt".to_string()),
            ("ADDON_EXTENSION_PATH", extension.to_string()),
            ("ADDON_EXTENSION_NAME", "coco".to_string()),
            ("ADDON_EXTENSION_VERITY_PATH", "/root_hash_coco-extension.txt".to_string()),
        ]
    };
    let node = Node::new();
    let before = content_snapshot(node.root());

    let bad_env = env("/damaged-extension.img");
    let bad: Vec<(&str, &str)> = bad_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let o = install(&node, &reg, &bad, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stderr(&o).contains("damaged-extension.img"), "names the damaged file: {}", show(&o));
    let mut after = content_snapshot(node.root());
    after.retain(|k, _| k != "run" && !k.starts_with("run/"));
    assert_eq!(after, before, "a refused extension leaves the node unchanged (but for the node lock)");

    let good_env = env("/kata-containers-coco-extension.img");
    let good: Vec<(&str, &str)> = good_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let o = install(&node, &reg, &good, &[]);
    assert!(o.status.success(), "{}", show(&o));
    let eff = node.effective("snp");
    let q = &eff["hypervisor"]["qemu"];
    let kernel_path = q["kernel"].as_str().expect("kernel");
    let dir = kernel_path.rsplit_once('/').expect("dir").0.to_string();
    assert!(dir.starts_with("/etc/kata-containers/addons/"), "{dir}");
    assert_eq!(read_node_file(&node, kernel_path), kernel);
    assert_eq!(read_node_file(&node, q["image"].as_str().expect("image")), std::fs::read(&guest).expect("guest"));
    assert_eq!(q["kernel_verity_params"].as_str(), Some(gv.kata_params().as_str()));
    assert_eq!(q["rootfs_type"].as_str(), Some("erofs"));
    let entries = extension_entries(&eff);
    assert_eq!(entries, vec![("coco".to_string(), format!("{dir}/extension"), ev.kata_params())]);
    assert_eq!(read_node_file(&node, &entries[0].1), std::fs::read(&ext).expect("ext"));
    let st: serde_json::Value =
        serde_json::from_slice(&read_node_file(&node, "/etc/kata-containers/addons/state.json")).expect("state");
    let roots: Vec<&str> =
        st["files"].as_array().expect("files").iter().filter_map(|f| f["verity"]["rootHash"].as_str()).collect();
    assert_eq!(roots, vec![gv.root_hash.as_str(), ev.root_hash.as_str()], "both verified, recorded");
}

/// guest-components' `coco-extension-disk`, as published (its disk and its
/// `root_hash_<name>.txt`), installed as a guest extension on its own.
#[test]
fn the_coco_extension_disk_installs_as_an_extension() {
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
    let reg = Registry::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (ext, ev) = disk::measured(tmp.path(), "coco", Fs::Erofs, Label::Gpt, "c0c0", 4096, 4096);
    let w = Workdir::new();
    w.file("kata-containers-coco-extension.img", &std::fs::read(&ext).expect("ext"))
        .file("root_hash_coco-extension.txt", format!("{}\n", ev.kata_params()).as_bytes());
    let files = ["kata-containers-coco-extension.img", "root_hash_coco-extension.txt"];
    w.push(&reg.host(), "confidential-containers/coco-extension-disk:v1", Some(COCO_EXTENSION), &files);
    let image = format!("{}/confidential-containers/coco-extension-disk:v1", reg.host());
    let node = Node::new();
    let env = [
        ("ADDON_IMAGE", image.as_str()),
        ("ADDON_PROVIDER", "tdx"),
        ("ADDON_EXTENSION_PATH", "/kata-containers-coco-extension.img"),
        ("ADDON_EXTENSION_NAME", "coco"),
        ("ADDON_EXTENSION_VERITY_PATH", "/root_hash_coco-extension.txt"),
    ];
    let base = node.effective("tdx");
    let o = install(&node, &reg, &env, &[]);
    assert!(o.status.success(), "{}", show(&o));
    let eff = node.effective("tdx");
    let entries = extension_entries(&eff);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!((entries[0].0.as_str(), entries[0].2.as_str()), ("coco", ev.kata_params().as_str()));
    assert_eq!(read_node_file(&node, &entries[0].1), std::fs::read(&ext).expect("ext"));
    for key in ["kernel", "image", "initrd"] {
        assert_eq!(eff["hypervisor"]["qemu"].get(key), base["hypervisor"]["qemu"].get(key), "{key} untouched");
    }
}

/// The worked example of docs/configuration.md: its `oras push` of a kernel, then its ConfigMap, installed.
#[test]
fn the_documented_worked_example_installs() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md"))
        .expect("docs/configuration.md");
    let section = &doc[doc.find("## OCI artifacts").expect("docs/configuration.md section on OCI artifacts")..];
    let block = |fence: &str| {
        let start = section.find(fence).expect("code block") + fence.len();
        section[start..start + section[start..].find("```").expect("end of block")].to_string()
    };
    let (push, configmap) = (block("```sh\n"), block("```yaml\n"));
    let reference = "registry.example.com/kata/se-kernel:v1.0";
    assert!(push.contains(reference) && configmap.contains(reference), "{push}\n{configmap}");
    assert!(push.contains("--artifact-type application/vnd.kata-containers.kernel vmlinuz"), "{push}");
    let reg = Registry::start();
    let kernel = noise(200_000, 15);
    let w = Workdir::new();
    w.file("vmlinuz", &kernel);
    w.push(&reg.host(), "kata/se-kernel:v1.0", Some("application/vnd.kata-containers.kernel"), &["vmlinuz"]);
    let cm = w.dir.path().join("configmap.yaml");
    std::fs::write(&cm, configmap.replace("registry.example.com", &reg.host())).expect("configmap");
    let node = Node::new();
    let o = install(&node, &reg, &[], &["--configmap", cm.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(read_node_file(&node, &node.qemu_key("se", "kernel").expect("kernel")), kernel);
}
