//! containerd nodes: `kata-addons fetch` against containerd's own `ctr content fetch
//! --hosts-dir` (Debian's containerd 1.6, a daemon started beneath a temp dir), with the
//! same `hosts.toml` trees and real loopback `docker-registry` instances: the same
//! registries contacted in the same order, for the same manifests (by tag and digest), the
//! blobs we read coming from the host `ctr` took them from, the same outcome, and the
//! right bytes (docs/registries-and-trust.md#registry-configuration-on-containerd-nodes).
//!
//! `ctr` HEADs a tag and reads every blob of the image; we GET the tag (to hash it) and
//! read only the layers holding the wanted files, and ping `/v2/` first (for the auth
//! challenge). So per registry: the manifest paths must be equal (method aside, pings
//! aside) and our blob paths a subset of `ctr`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::proxy::{Proxy, Rules};
use kata_addons_tests::registry::{Registry, RegistryConfig, free_port};
use kata_addons_tests::tls::TestCa;
use kata_addons_tests::{run_kata, show};

/// A containerd daemon of its own (root, state and socket beneath a temp dir).
struct Containerd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start() -> Containerd {
        let dir = tempfile::tempdir().expect("containerd dir");
        let d = dir.path();
        let config = format!(
            "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\", \
             \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \
             \"io.containerd.snapshotter.v1.devmapper\", \"io.containerd.snapshotter.v1.aufs\"]\n\
             [grpc]\n  address = \"{0}/c.sock\"\n[ttrpc]\n  address = \"{0}/c.sock.ttrpc\"\n",
            d.display()
        );
        std::fs::write(d.join("config.toml"), config).expect("containerd config");
        let log = std::fs::File::create(d.join("containerd.log")).expect("log");
        let child = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn containerd (apt install containerd)");
        let c = Containerd { child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if c.ctr(&["version"]).status.success() {
                return c;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = std::fs::read_to_string(c.dir.path().join("containerd.log")).unwrap_or_default();
        panic!("containerd did not start: {log}");
    }

    fn ctr(&self, args: &[&str]) -> Output {
        let sock = self.dir.path().join("c.sock");
        Command::new("ctr")
            .arg("--address")
            .arg(&sock)
            .args(["--namespace", "kata-addons-test"])
            .args(args)
            .output()
            .expect("run ctr")
    }

    fn fetch(&self, image: &str, hosts_dir: &Path) -> Output {
        let h = hosts_dir.to_str().expect("utf8");
        self.ctr(&["content", "fetch", "--hosts-dir", h, image])
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One registry of a case: a real one, or a port nobody listens on.
enum Reg {
    Up(Registry),
    Dead(u16),
}

impl Reg {
    fn host(&self) -> String {
        match self {
            Reg::Up(r) => r.host(),
            Reg::Dead(p) => format!("127.0.0.1:{p}"),
        }
    }
    fn log(&self) -> String {
        match self {
            Reg::Up(r) => r.log(),
            Reg::Dead(_) => String::new(),
        }
    }
    fn reg(&self) -> &Registry {
        match self {
            Reg::Up(r) => r,
            Reg::Dead(_) => panic!("a dead registry has no storage"),
        }
    }
}

/// `(method, path without query)` of the access log lines after byte `from`.
fn requests(log: &str, from: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in log.get(from..).unwrap_or_default().lines() {
        for m in ["\"GET ", "\"HEAD "] {
            if let Some(i) = line.find(m) {
                let rest = &line[i + m.len()..];
                let path = rest.split(' ').next().unwrap_or_default();
                let path = path.split('?').next().unwrap_or_default();
                out.push((m.trim_matches(['"', ' ']).to_string(), path.to_string()));
            }
        }
    }
    out
}

/// What one run contacted: per registry, the manifest and blob paths asked for (a host is
/// asked only when those before it failed, so equal sets mean the same order).
#[derive(Debug, Default)]
struct Seen {
    manifests: BTreeMap<String, BTreeSet<String>>,
    blobs: BTreeMap<String, BTreeSet<String>>,
}

/// A node root with a containerd configuration and a hosts directory.
struct Node {
    root: tempfile::TempDir,
    /// The hosts directory beneath the root (what `ctr --hosts-dir` is given).
    certs: String,
}

impl Node {
    fn new() -> Node {
        let root = tempfile::tempdir().expect("root");
        let etc = root.path().join("etc/containerd");
        std::fs::create_dir_all(etc.join("certs.d")).expect("certs.d");
        std::fs::write(
            etc.join("config.toml"),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata-qemu-tdx]\n  runtime_type = \"io.containerd.kata-qemu-tdx.v2\"\n",
        )
        .expect("config.toml");
        Node { root, certs: "etc/containerd/certs.d".into() }
    }
    /// A node root with these files (node path, text) and the hosts directory `certs`.
    fn with(files: &[(&str, &str)], certs: &str) -> Node {
        let root = tempfile::tempdir().expect("root");
        for (p, text) in files {
            let p = root.path().join(p.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
            std::fs::write(p, text).expect("write");
        }
        std::fs::create_dir_all(root.path().join(certs)).expect("certs");
        Node { root, certs: certs.to_string() }
    }
    fn certs_d(&self) -> PathBuf {
        self.root.path().join(&self.certs)
    }
    fn write(&self, rel: &str, data: &[u8]) {
        let p = self.certs_d().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
        std::fs::write(p, data).expect("write");
    }
}

/// A unique image for a case: the kernel in the top layer, a base layer below.
fn case_image(name: &str) -> (Image, Vec<u8>) {
    let kernel = format!("KERNEL of {name}").into_bytes();
    let base = LayerBuilder::new().dir("etc").file("etc/case", name.as_bytes()).build(Compress::Gzip);
    let top = LayerBuilder::new().dir("boot").file("boot/vmlinuz", &kernel).build(Compress::Gzip);
    (Image::new(vec![base, top]), kernel)
}

/// The outcome of one side.
struct Run {
    ok: bool,
    seen: Seen,
    text: String,
}

fn observe(regs: &[(&str, &Reg)], before: &[usize]) -> Seen {
    let mut seen = Seen::default();
    for ((name, r), from) in regs.iter().zip(before) {
        for (_, path) in requests(&r.log(), *from) {
            if path.contains("/manifests/") {
                let p = path.rsplit("/manifests/").next().unwrap_or_default().to_string();
                seen.manifests.entry(name.to_string()).or_default().insert(p);
            } else if path.contains("/blobs/") {
                let p = path.rsplit("/blobs/").next().unwrap_or_default().to_string();
                seen.blobs.entry(name.to_string()).or_default().insert(p);
            }
        }
    }
    seen
}

/// Runs `ctr` then `kata-addons fetch` on the same tree and compares.
fn differential(
    case: &str,
    node: &Node,
    regs: &[(&str, &Reg)],
    image: &str,
    kernel: &[u8],
    expect_ok: bool,
) -> (Run, Run) {
    let ctd = Containerd::start();
    let before: Vec<usize> = regs.iter().map(|(_, r)| r.log().len()).collect();
    let out = ctd.fetch(image, &node.certs_d());
    std::thread::sleep(Duration::from_millis(300));
    let theirs = Run { ok: out.status.success(), seen: observe(regs, &before), text: show(&out) };
    let before: Vec<usize> = regs.iter().map(|(_, r)| r.log().len()).collect();
    let dest = tempfile::tempdir().expect("dest");
    let root = node.root.path().to_str().expect("utf8");
    let d = dest.path().to_str().expect("utf8");
    let out = run_kata(&[
        "fetch",
        "--root",
        root,
        "--image",
        image,
        "--path",
        "/boot/vmlinuz",
        "--dest",
        d,
        "--timeout",
        "10",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let ours = Run { ok: out.status.success(), seen: observe(regs, &before), text: show(&out) };
    eprintln!("{case}: ctr ok={} {:?}\n{case}: ours ok={} {:?}", theirs.ok, theirs.seen, ours.ok, ours.seen);
    assert_eq!(theirs.ok, expect_ok, "{case}: ctr outcome\n{}", theirs.text);
    assert_eq!(ours.ok, expect_ok, "{case}: kata-addons outcome\n{}", ours.text);
    if ours.ok {
        let got = std::fs::read(dest.path().join("vmlinuz")).expect("fetched kernel");
        assert_eq!(got, kernel, "{case}: bytes");
    }
    assert_eq!(
        ours.seen.manifests, theirs.seen.manifests,
        "{case}: manifests per registry\nctr: {}\nours: {}",
        theirs.text, ours.text
    );
    for (reg, blobs) in &ours.seen.blobs {
        let theirs_b = theirs.seen.blobs.get(reg).cloned().unwrap_or_default();
        assert!(
            blobs.is_subset(&theirs_b),
            "{case}: blobs from {reg}: ours {blobs:?}, ctr {theirs_b:?}\nours: {}",
            ours.text
        );
    }
    (theirs, ours)
}

fn up() -> Reg {
    Reg::Up(Registry::start())
}

fn dead() -> Reg {
    Reg::Dead(free_port())
}

fn tls(ca: &TestCa, client_auth: bool) -> Reg {
    Reg::Up(Registry::start_with(RegistryConfig { tls: Some(ca.clone()), client_auth, ..Default::default() }))
}

/// Pushes the case image to each registry named.
fn push(regs: &[&Reg], repo: &str, img: &Image) {
    for r in regs {
        r.reg().push(repo, "v1", img);
    }
}

#[test]
fn mirrors_order_and_fallback() {
    // 1. No directory for a loopback registry: containerd's default host, plain HTTP.
    let u = up();
    let (img, k) = case_image("default-loopback");
    push(&[&u], "c/default", &img);
    let node = Node::new();
    differential("default-loopback", &node, &[("U", &u)], &format!("{}/c/default:v1", u.host()), &k, true);

    // 2. A mirror before the server: everything from the mirror.
    let (m, u) = (up(), up());
    let (img, k) = case_image("mirror-first");
    push(&[&m, &u], "c/mirror", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}\"]\n", u.host(), m.host()).as_bytes(),
    );
    let (theirs, _) =
        differential("mirror-first", &node, &[("M", &m), ("U", &u)], "upstream.test/c/mirror:v1", &k, true);
    assert!(!theirs.seen.manifests.contains_key("U"), "the server is not asked when the mirror has it");

    // 3. The mirror lacks the image: tag, manifest and blobs from the server.
    let (m, u) = (up(), up());
    let (img, k) = case_image("mirror-404");
    push(&[&u], "c/m404", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}\"]\n", u.host(), m.host()).as_bytes(),
    );
    differential("mirror-404", &node, &[("M", &m), ("U", &u)], "upstream.test/c/m404:v1", &k, true);

    // 4. A dead first mirror, a live second one.
    let (d, m, u) = (dead(), up(), up());
    let (img, k) = case_image("dead-first");
    push(&[&m, &u], "c/dead", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}\"]\n[host.\"http://{}\"]\n", u.host(), d.host(), m.host())
            .as_bytes(),
    );
    differential("dead-first", &node, &[("D", &d), ("M", &m), ("U", &u)], "upstream.test/c/dead:v1", &k, true);

    // 5. A pull-only mirror: the tag resolved on the server, the manifest by digest and
    //    the blobs from the mirror.
    let (m, u) = (up(), up());
    let (img, k) = case_image("pull-only");
    push(&[&m, &u], "c/pull", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}\"]\n  capabilities = [\"pull\"]\n", u.host(), m.host())
            .as_bytes(),
    );
    let (theirs, ours) = differential("pull-only", &node, &[("M", &m), ("U", &u)], "upstream.test/c/pull:v1", &k, true);
    for run in [&theirs, &ours] {
        assert_eq!(run.seen.manifests.get("U").map(|s| s.contains("v1")), Some(true), "tag from upstream");
        assert!(!run.seen.manifests.get("M").is_some_and(|s| s.contains("v1")), "no tag from the pull-only mirror");
        assert!(run.seen.blobs.contains_key("M"));
    }

    // 6. The mirror has the manifest but answers 404 for the kernel layer.
    let (m, u) = (up(), up());
    let (img, k) = case_image("blob-404");
    push(&[&m, &u], "c/blob", &img);
    let top = &img.layers[1].digest;
    let hex = top.strip_prefix("sha256:").expect("sha256");
    std::fs::remove_dir_all(
        m.reg().dir.path().join("storage/docker/registry/v2/repositories/c/blob/_layers/sha256").join(hex),
    )
    .expect("unlink the layer from the mirror");
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}\"]\n", u.host(), m.host()).as_bytes(),
    );
    let (_, ours) = differential("blob-404", &node, &[("M", &m), ("U", &u)], "upstream.test/c/blob:v1", &k, true);
    assert!(ours.seen.blobs.get("U").is_some_and(|b| b.contains(top)), "the layer from upstream");

    // 7. `_default` names the mirror for every registry without a directory.
    let m = up();
    let (img, k) = case_image("default-dir");
    push(&[&m], "c/dflt", &img);
    let node = Node::new();
    node.write("_default/hosts.toml", format!("[host.\"http://{}\"]\n", m.host()).as_bytes());
    differential("default-dir", &node, &[("M", &m)], "upstream.test:5000/c/dflt:v1", &k, true);

    // 8. `host_port_` is found before `host:port`.
    let (a, b) = (up(), up());
    let (img, k) = case_image("port-dir");
    push(&[&a, &b], "c/port", &img);
    let node = Node::new();
    node.write("upstream.test_5000_/hosts.toml", format!("server = \"http://{}\"\n[host]\n", a.host()).as_bytes());
    node.write("upstream.test:5000/hosts.toml", format!("server = \"http://{}\"\n[host]\n", b.host()).as_bytes());
    let (_, ours) = differential("port-dir", &node, &[("A", &a), ("B", &b)], "upstream.test:5000/c/port:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("B"));

    // 9. Every host dead: both fail.
    let (d1, d2) = (dead(), dead());
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}\"]\n", d1.host(), d2.host()).as_bytes(),
    );
    differential("all-dead", &node, &[("D1", &d1), ("D2", &d2)], "upstream.test/c/none:v1", b"", false);

    // 10. A path of the mirror's own (`/v3` is appended `/v2`: 404 there) falls back.
    let (m, u) = (up(), up());
    let (img, k) = case_image("mirror-path");
    push(&[&m, &u], "c/path", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}/prefix\"]\n", u.host(), m.host()).as_bytes(),
    );
    differential("mirror-path", &node, &[("M", &m), ("U", &u)], "upstream.test/c/path:v1", &k, true);

    // 11. `override_path` with the standard root: the mirror serves.
    let (m, u) = (up(), up());
    let (img, k) = case_image("override-path");
    push(&[&m, &u], "c/ovr", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"http://{}/v2\"]\n  override_path = true\n", u.host(), m.host())
            .as_bytes(),
    );
    differential("override-path", &node, &[("M", &m), ("U", &u)], "upstream.test/c/ovr:v1", &k, true);
}

#[test]
fn tls_setups() {
    let ca = TestCa::new();
    let other = TestCa::new();

    // 1. A TLS mirror with its CA (relative path, beside hosts.toml).
    let (m, u) = (tls(&ca, false), up());
    let (img, k) = case_image("tls-ca");
    push(&[&m, &u], "c/tls", &img);
    let node = Node::new();
    node.write("upstream.test/ca.pem", &std::fs::read(&ca.ca_cert).expect("ca"));
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"https://{}\"]\n  ca = \"ca.pem\"\n", u.host(), m.host()).as_bytes(),
    );
    differential("tls-ca", &node, &[("M", &m), ("U", &u)], "upstream.test/c/tls:v1", &k, true);

    // 2. Without the CA: the mirror's certificate is refused, the server serves.
    let (m, u) = (tls(&ca, false), up());
    let (img, k) = case_image("tls-no-ca");
    push(&[&m, &u], "c/tlsn", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"https://{}\"]\n", u.host(), m.host()).as_bytes(),
    );
    differential("tls-no-ca", &node, &[("M", &m), ("U", &u)], "upstream.test/c/tlsn:v1", &k, true);

    // 3. skip_verify.
    let (m, u) = (tls(&ca, false), up());
    let (img, k) = case_image("tls-skip");
    push(&[&m, &u], "c/tlss", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"https://{}\"]\n  skip_verify = true\n", u.host(), m.host()).as_bytes(),
    );
    let (_, ours) = differential("tls-skip", &node, &[("M", &m), ("U", &u)], "upstream.test/c/tlss:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 4. A CA list: a wrong CA first, the right one second.
    let (m, u) = (tls(&ca, false), up());
    let (img, k) = case_image("tls-ca-list");
    push(&[&m, &u], "c/tlsl", &img);
    let node = Node::new();
    node.write("upstream.test/other.pem", &std::fs::read(&other.ca_cert).expect("ca"));
    node.write("upstream.test/ca.pem", &std::fs::read(&ca.ca_cert).expect("ca"));
    node.write(
        "upstream.test/hosts.toml",
        format!(
            "server = \"http://{}\"\n[host.\"https://{}\"]\n  ca = [\"other.pem\", \"ca.pem\"]\n",
            u.host(),
            m.host()
        )
        .as_bytes(),
    );
    let (_, ours) = differential("tls-ca-list", &node, &[("M", &m), ("U", &u)], "upstream.test/c/tlsl:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 5. Mutual TLS with a client pair.
    let (m, u) = (tls(&ca, true), up());
    let (img, k) = case_image("mtls");
    push(&[&m, &u], "c/mtls", &img);
    let node = Node::new();
    node.write("upstream.test/ca.pem", &std::fs::read(&ca.ca_cert).expect("ca"));
    ca.client_pair(&node.certs_d().join("upstream.test"));
    node.write(
        "upstream.test/hosts.toml",
        format!(
            "server = \"http://{}\"\n[host.\"https://{}\"]\n  ca = \"ca.pem\"\n  client = [[\"client.cert\", \"client.key\"]]\n",
            u.host(),
            m.host()
        )
        .as_bytes(),
    );
    let (_, ours) = differential("mtls", &node, &[("M", &m), ("U", &u)], "upstream.test/c/mtls:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 6. Mutual TLS without a client certificate: refused, the server serves.
    let (m, u) = (tls(&ca, true), up());
    let (img, k) = case_image("mtls-none");
    push(&[&m, &u], "c/mtlsn", &img);
    let node = Node::new();
    node.write("upstream.test/ca.pem", &std::fs::read(&ca.ca_cert).expect("ca"));
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"http://{}\"\n[host.\"https://{}\"]\n  ca = \"ca.pem\"\n", u.host(), m.host()).as_bytes(),
    );
    differential("mtls-none", &node, &[("M", &m), ("U", &u)], "upstream.test/c/mtlsn:v1", &k, true);
}

#[test]
fn broken_hosts_toml_is_refused_where_containerd_carries_on() {
    let u = up();
    let (img, k) = case_image("broken");
    push(&[&u], "c/broken", &img);
    let node = Node::new();
    let dir = u.host();
    node.write(
        &format!("{dir}/hosts.toml"),
        b"server = \"http://nowhere.test\"\n[host.\"http://x\"\ncapabilities = 1\n",
    );
    let ctd = Containerd::start();
    let image = format!("{}/c/broken:v1", u.host());
    let out = ctd.fetch(&image, &node.certs_d());
    assert!(out.status.success(), "containerd carries on with the default host: {}", show(&out));
    let _ = k;
    let dest = tempfile::tempdir().expect("dest");
    let out = run_kata(&[
        "fetch",
        "--root",
        node.root.path().to_str().expect("utf8"),
        "--image",
        &image,
        "--path",
        "/boot/vmlinuz",
        "--dest",
        dest.path().to_str().expect("utf8"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", show(&out));
    assert!(err.contains(&format!("/etc/containerd/certs.d/{dir}/hosts.toml:2")), "{err}");
    assert_eq!(std::fs::read_dir(dest.path()).expect("dest").count(), 0);
}

/// `hosts.toml` for `upstream.test`: `server` then the given extra text.
fn server_and(u: &Reg, extra: &str) -> Vec<u8> {
    format!("server = \"http://{}\"\n{extra}", u.host()).into_bytes()
}

#[test]
fn capabilities_schemes_and_failures() {
    // 1. A resolve-only mirror: never resolves a tag (that needs pull too), but containerd's
    //    fetcher walks every host, so it serves the manifest by digest and the blobs.
    let (m, u) = (up(), up());
    let (img, k) = case_image("resolve-only");
    push(&[&m, &u], "c/ronly", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        &server_and(&u, &format!("[host.\"http://{}\"]\n  capabilities = [\"resolve\"]\n", m.host())),
    );
    let (theirs, _) =
        differential("resolve-only", &node, &[("M", &m), ("U", &u)], "upstream.test/c/ronly:v1", &k, true);
    assert!(theirs.seen.manifests.get("U").is_some_and(|s| s.contains("v1")));

    // 2. A host without a scheme is HTTPS: against a plain-HTTP mirror it fails, the
    //    server serves.
    let (m, u) = (up(), up());
    let (img, k) = case_image("no-scheme");
    push(&[&m, &u], "c/nosch", &img);
    let node = Node::new();
    node.write("upstream.test/hosts.toml", &server_and(&u, &format!("[host.\"{}\"]\n", m.host())));
    differential("no-scheme", &node, &[("M", &m), ("U", &u)], "upstream.test/c/nosch:v1", &k, true);

    // 3. `_default` with a server: the server replaces every registry.
    let m = up();
    let (img, k) = case_image("default-server");
    push(&[&m], "c/dsrv", &img);
    let node = Node::new();
    node.write("_default/hosts.toml", format!("server = \"http://{}\"\n[host]\n", m.host()).as_bytes());
    differential("default-server", &node, &[("M", &m)], "elsewhere.test/c/dsrv:v1", &k, true);

    // 4. A mirror answering 503 for everything: the server serves.
    let (m, u) = (up(), up());
    let (img, k) = case_image("mirror-503");
    push(&[&m, &u], "c/m503", &img);
    let rules = Rules { fail_first: 1_000_000, fail_status: Some(503), ..Default::default() };
    let proxy = Proxy::start(m.reg().addr, rules);
    let node = Node::new();
    node.write("upstream.test/hosts.toml", &server_and(&u, &format!("[host.\"http://{}\"]\n", proxy.host())));
    differential("mirror-503", &node, &[("M", &m), ("U", &u)], "upstream.test/c/m503:v1", &k, true);
    assert!(!proxy.requests().is_empty(), "the mirror was asked");

    // 5. A CA file that does not exist: containerd refuses the whole host list.
    let (m, u) = (up(), up());
    let (img, k) = case_image("missing-ca");
    push(&[&m, &u], "c/nocaf", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        &server_and(&u, &format!("[host.\"https://{}\"]\n  ca = \"missing.pem\"\n", m.host())),
    );
    differential("missing-ca", &node, &[("M", &m), ("U", &u)], "upstream.test/c/nocaf:v1", &k, false);

    // 6. Empty capabilities mean all of them.
    let (m, u) = (up(), up());
    let (img, k) = case_image("caps-empty");
    push(&[&m, &u], "c/capse", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        &server_and(&u, &format!("[host.\"http://{}\"]\n  capabilities = []\n", m.host())),
    );
    let (_, ours) = differential("caps-empty", &node, &[("M", &m), ("U", &u)], "upstream.test/c/capse:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 7. A reference pinned by digest with a pull-only mirror: all from the mirror.
    let (m, u) = (up(), up());
    let (img, k) = case_image("digest-pull-only");
    push(&[&m, &u], "c/dpo", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        &server_and(&u, &format!("[host.\"http://{}\"]\n  capabilities = [\"pull\"]\n", m.host())),
    );
    let image = format!("upstream.test/c/dpo@{}", img.digest());
    let (_, ours) = differential("digest-pull-only", &node, &[("M", &m), ("U", &u)], &image, &k, true);
    assert!(!ours.seen.manifests.contains_key("U") && !ours.seen.blobs.contains_key("U"));

    // 8. Two mirrors, the first without the image, the second dead: the server serves.
    let (m, d, u) = (up(), dead(), up());
    let (img, k) = case_image("empty-then-dead");
    push(&[&u], "c/ed", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        &server_and(&u, &format!("[host.\"http://{}\"]\n[host.\"http://{}\"]\n", m.host(), d.host())),
    );
    differential("empty-then-dead", &node, &[("M", &m), ("D", &d), ("U", &u)], "upstream.test/c/ed:v1", &k, true);

    // 9. Only pull-only mirrors and no server that resolves: `server` still resolves.
    //    Without any host that may resolve (the server given pull only too), both fail.
    let (m, u) = (up(), up());
    let (img, k) = case_image("no-resolver");
    push(&[&m, &u], "c/nores", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!(
            "server = \"http://{}\"\ncapabilities = [\"pull\"]\n[host.\"http://{}\"]\n  capabilities = [\"pull\"]\n",
            u.host(),
            m.host()
        )
        .as_bytes(),
    );
    differential("no-resolver", &node, &[("M", &m), ("U", &u)], "upstream.test/c/nores:v1", &k, false);
}

#[test]
fn tls_more() {
    let ca = TestCa::new();

    // 1. `client` as one file holding the certificate and its key.
    let (m, u) = (tls(&ca, true), up());
    let (img, k) = case_image("mtls-one-file");
    push(&[&m, &u], "c/mtls1", &img);
    let node = Node::new();
    node.write("upstream.test/ca.pem", &std::fs::read(&ca.ca_cert).expect("ca"));
    let tmp = tempfile::tempdir().expect("tmp");
    ca.client_pair(tmp.path());
    let mut both = std::fs::read(tmp.path().join("client.cert")).expect("cert");
    both.extend(std::fs::read(tmp.path().join("client.key")).expect("key"));
    node.write("upstream.test/client.pem", &both);
    node.write(
        "upstream.test/hosts.toml",
        &server_and(&u, &format!("[host.\"https://{}\"]\n  ca = \"ca.pem\"\n  client = \"client.pem\"\n", m.host())),
    );
    let (_, ours) = differential("mtls-one-file", &node, &[("M", &m), ("U", &u)], "upstream.test/c/mtls1:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 2. The CA at the top level of a file without `server` applies to the registry itself:
    //    a TLS registry named by a `server` of `_default`… here: the TLS server with its CA.
    let t = tls(&ca, false);
    let (img, k) = case_image("server-tls-ca");
    push(&[&t], "c/stls", &img);
    let node = Node::new();
    node.write("upstream.test/ca.pem", &std::fs::read(&ca.ca_cert).expect("ca"));
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"https://{}\"\nca = \"ca.pem\"\n[host]\n", t.host()).as_bytes(),
    );
    differential("server-tls-ca", &node, &[("T", &t)], "upstream.test/c/stls:v1", &k, true);

    // 3. The same server without its CA: refused, nothing else to try.
    let t = tls(&ca, false);
    let node = Node::new();
    node.write("upstream.test/hosts.toml", format!("server = \"https://{}\"\n[host]\n", t.host()).as_bytes());
    differential("server-tls-no-ca", &node, &[("T", &t)], "upstream.test/c/x:v1", b"", false);

    // 4. A TLS server with skip_verify at the top level.
    let t = tls(&ca, false);
    let (img, k) = case_image("server-skip");
    push(&[&t], "c/sskip", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        format!("server = \"https://{}\"\nskip_verify = true\n[host]\n", t.host()).as_bytes(),
    );
    differential("server-skip", &node, &[("T", &t)], "upstream.test/c/sskip:v1", &k, true);
}

#[test]
fn inline_registry_form_is_refused_naming_the_file() {
    let node = Node::new();
    std::fs::write(
        node.root.path().join("etc/containerd/config.toml"),
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"docker.io\"]\n  endpoint = [\"https://m.example\"]\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n",
    )
    .expect("config");
    let dest = tempfile::tempdir().expect("dest");
    let out = run_kata(&[
        "fetch",
        "--root",
        node.root.path().to_str().expect("utf8"),
        "--image",
        "docker.io/library/busybox:latest",
        "--path",
        "/bin/busybox",
        "--dest",
        dest.path().to_str().expect("utf8"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", show(&out));
    assert!(err.contains("/etc/containerd/config.toml") && err.contains("registry.mirrors"), "{err}");
    assert!(err.contains("hosts.toml"), "{err}");
}

/// The hosts.toml of the node configuration cases: a mirror before the server.
fn mirror_toml(m: &Reg, u: &Reg) -> String {
    format!("server = \"http://{}\"\n[host.\"http://{}\"]\n", u.host(), m.host())
}

/// A kata handler of a v2 CRI section.
const KATA_V2: &str =
    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n";

#[test]
fn node_configurations() {
    // 1. k3s: its own config.toml location and hosts directory.
    let (m, u) = (up(), up());
    let (img, k) = case_image("k3s");
    push(&[&m, &u], "c/k3s", &img);
    let k3s = "var/lib/rancher/k3s/agent/etc/containerd";
    let config = format!(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/{k3s}/certs.d\"\n{KATA_V2}"
    );
    let node = Node::with(&[(&format!("{k3s}/config.toml"), &config)], &format!("{k3s}/certs.d"));
    node.write("upstream.test/hosts.toml", mirror_toml(&m, &u).as_bytes());
    let (_, ours) = differential("k3s", &node, &[("M", &m), ("U", &u)], "upstream.test/c/k3s:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 2. containerd 2.x (config version 3): the images plugin's config_path.
    let (m, u) = (up(), up());
    let (img, k) = case_image("v3");
    push(&[&m, &u], "c/v3", &img);
    let config = "version = 3\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"/etc/ctd-hosts\"\n\
                  [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n";
    let node = Node::with(&[("etc/containerd/config.toml", config)], "etc/ctd-hosts");
    node.write("upstream.test/hosts.toml", mirror_toml(&m, &u).as_bytes());
    let (_, ours) = differential("v3", &node, &[("M", &m), ("U", &u)], "upstream.test/c/v3:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 3. containerd 2.x without config_path: its default /etc/containerd/certs.d.
    let (m, u) = (up(), up());
    let (img, k) = case_image("v3-default");
    push(&[&m, &u], "c/v3d", &img);
    let config = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n";
    let node = Node::with(&[("etc/containerd/config.toml", config)], "etc/containerd/certs.d");
    node.write("upstream.test/hosts.toml", mirror_toml(&m, &u).as_bytes());
    let (_, ours) = differential("v3-default", &node, &[("M", &m), ("U", &u)], "upstream.test/c/v3d:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 4. config_path and the Kata handler set in an imported drop-in.
    let (m, u) = (up(), up());
    let (img, k) = case_image("imports");
    push(&[&m, &u], "c/imp", &img);
    let main = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";
    let drop = format!(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/hosts\"\n{KATA_V2}"
    );
    let node = Node::with(
        &[("etc/containerd/config.toml", main), ("etc/containerd/conf.d/kata.toml", &drop)],
        "etc/containerd/hosts",
    );
    node.write("upstream.test/hosts.toml", mirror_toml(&m, &u).as_bytes());
    let (_, ours) = differential("imports", &node, &[("M", &m), ("U", &u)], "upstream.test/c/imp:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("U"));

    // 5. A directory for the host wins over `_default`.
    let (a, b) = (up(), up());
    let (img, k) = case_image("host-over-default");
    push(&[&a, &b], "c/hod", &img);
    let node = Node::new();
    node.write("_default/hosts.toml", format!("server = \"http://{}\"\n[host]\n", b.host()).as_bytes());
    node.write("upstream.test/hosts.toml", format!("server = \"http://{}\"\n[host]\n", a.host()).as_bytes());
    let (_, ours) =
        differential("host-over-default", &node, &[("A", &a), ("B", &b)], "upstream.test/c/hod:v1", &k, true);
    assert!(!ours.seen.manifests.contains_key("B"));

    // 6. A dead server and no mirror: both fail.
    let d = dead();
    let node = Node::new();
    node.write("upstream.test/hosts.toml", format!("server = \"http://{}\"\n[host]\n", d.host()).as_bytes());
    differential("dead-server", &node, &[("D", &d)], "upstream.test/c/x:v1", b"", false);

    // 7. A dead pull-only mirror: everything from the server.
    let (d, u) = (dead(), up());
    let (img, k) = case_image("dead-pull-only");
    push(&[&u], "c/dpo2", &img);
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        &server_and(&u, &format!("[host.\"http://{}\"]\n  capabilities = [\"pull\"]\n", d.host())),
    );
    differential("dead-pull-only", &node, &[("D", &d), ("U", &u)], "upstream.test/c/dpo2:v1", &k, true);
}

#[test]
fn mirrors_get_the_registry_name_as_ns() {
    let (m, u) = (up(), up());
    let (img, k) = case_image("ns");
    push(&[&m, &u], "c/ns", &img);
    let node = Node::new();
    node.write("upstream.test/hosts.toml", mirror_toml(&m, &u).as_bytes());
    differential("ns", &node, &[("M", &m), ("U", &u)], "upstream.test/c/ns:v1", &k, true);
    let lines: Vec<String> = m.log().lines().filter(|l| l.contains("/c/ns/")).map(str::to_string).collect();
    assert!(!lines.is_empty() && lines.iter().all(|l| l.contains("ns=upstream.test")), "{lines:#?}");
}

#[test]
fn crio_files_win_when_both_runtimes_define_kata() {
    let (m, u) = (up(), up());
    let (img, k) = case_image("both-runtimes");
    push(&[&m, &u], "c/both", &img);
    let node = Node::new();
    node.write(&format!("{}/hosts.toml", u.host()), format!("[host.\"http://{}\"]\n", m.host()).as_bytes());
    let root = node.root.path();
    std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).expect("crio dir");
    std::fs::write(
        root.join("etc/crio/crio.conf.d/50-kata.conf"),
        "[crio.runtime.runtimes.kata]\nruntime_path = \"/usr/bin/containerd-shim-kata-v2\"\nruntime_type = \"vm\"\n\
         runtime_config_path = \"/opt/kata/share/defaults/kata-containers/configuration.toml\"\n",
    )
    .expect("crio conf");
    std::fs::create_dir_all(root.join("etc/containers")).expect("containers dir");
    std::fs::write(
        root.join("etc/containers/registries.conf"),
        format!("[[registry]]\nlocation = \"{}\"\ninsecure = true\n", u.host()),
    )
    .expect("registries.conf");
    let dest = tempfile::tempdir().expect("dest");
    let image = format!("{}/c/both:v1", u.host());
    let out = run_kata(&[
        "fetch",
        "--root",
        root.to_str().expect("utf8"),
        "--image",
        &image,
        "--path",
        "/boot/vmlinuz",
        "--dest",
        dest.path().to_str().expect("utf8"),
    ]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(std::fs::read(dest.path().join("vmlinuz")).expect("kernel"), k);
    assert!(requests(&m.log(), 0).is_empty(), "hosts.toml's mirror is not used: {}", m.log());
}

/// `kata-addons fetch` of `image` on a node root with the given hosts.toml tree, run in a
/// thread; the output and the kernel fetched.
fn fetch_on(node: &Node, image: &str) -> (Output, Option<Vec<u8>>) {
    let dest = tempfile::tempdir().expect("dest");
    let out = run_kata(&[
        "fetch",
        "--root",
        node.root.path().to_str().expect("utf8"),
        "--image",
        image,
        "--path",
        "/boot/vmlinuz",
        "--dest",
        dest.path().to_str().expect("utf8"),
        "--timeout",
        "10",
    ]);
    let got = std::fs::read(dest.path().join("vmlinuz")).ok();
    (out, got)
}

#[test]
fn pull_through_cache_serves_the_fleet_and_a_dead_one_falls_back() {
    // A docker-registry in proxy mode in front of the upstream, named in every node's
    // hosts.toml as the Spegel/pull-through cache example of
    // docs/registries-and-trust.md#registry-configuration-on-containerd-nodes does.
    let u = up();
    let (img, k) = case_image("cache");
    push(&[&u], "c/cache", &img);
    let cache = Registry::start_with(RegistryConfig {
        proxy_remote: Some(format!("http://{}", u.host())),
        ..Default::default()
    });
    let toml = format!(
        "server = \"http://{}\"\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        u.host(),
        cache.host()
    );
    let nodes: Vec<Node> = (0..8)
        .map(|_| {
            let n = Node::new();
            n.write("upstream.test/hosts.toml", toml.as_bytes());
            n
        })
        .collect();
    let image = "upstream.test/c/cache:v1";
    // The first node fills the cache; the other seven pull at once.
    let (out, got) = fetch_on(&nodes[0], image);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(got.as_deref(), Some(&k[..]));
    std::thread::scope(|s| {
        let runs: Vec<_> = nodes[1..].iter().map(|n| s.spawn(|| fetch_on(n, image))).collect();
        for r in runs {
            let (out, got) = r.join().expect("thread");
            assert!(out.status.success(), "{}", show(&out));
            assert_eq!(got.as_deref(), Some(&k[..]));
        }
    });
    let top = &img.layers[1].digest;
    let upstream_gets =
        requests(&u.log(), 0).into_iter().filter(|(m, p)| m == "GET" && p.ends_with(&format!("/blobs/{top}"))).count();
    // distribution's proxy mode commits a blob after serving it: a request arriving before
    // the commit is passed through, so "once" is not guaranteed; far fewer than the nodes is.
    eprintln!("upstream GETs of the kernel layer for 8 nodes: {upstream_gets}");
    assert!((1..8).contains(&upstream_gets), "the cache absorbed the fleet ({upstream_gets} upstream GETs)");
    let cache_gets = requests(&cache.log(), 0)
        .into_iter()
        .filter(|(m, p)| m == "GET" && p.ends_with(&format!("/blobs/{top}")))
        .count();
    assert_eq!(cache_gets, 8, "every node read the layer from the cache\n{}", cache.log());

    // The cache dies: a node falls back to the upstream at once.
    drop(cache);
    let before = u.log().len();
    let n = Node::new();
    n.write("upstream.test/hosts.toml", toml.as_bytes());
    let t = Instant::now();
    let (out, got) = fetch_on(&n, image);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(got.as_deref(), Some(&k[..]));
    assert!(t.elapsed() < Duration::from_secs(30), "fell back within the deadline: {:?}", t.elapsed());
    assert!(requests(&u.log(), before).iter().any(|(_, p)| p.ends_with(&format!("/blobs/{top}"))));
}

#[test]
fn preview_shows_the_hosts_in_order_with_file_and_line() {
    // File order, not name order: `zz` first, then `aa`, then the server.
    let node = Node::new();
    node.write(
        "upstream.test/hosts.toml",
        b"server = \"http://127.0.0.1:9\"\n\n[host.\"http://zz.test:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n\
          [host.\"http://aa.test:5000\"]\n  capabilities = [\"pull\"]\n",
    );
    let root = node.root.path().to_str().expect("utf8");
    let env = [("ADDON_IMAGE", "upstream.test/c/x:v1"), ("ADDON_KERNEL_PATH", "/boot/vmlinuz")];
    let out = kata_addons_tests::run_kata_env(&["preview", "--root", root], &env);
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let file = "etc/containerd/certs.d/upstream.test/hosts.toml";
    let want = [
        "registry configuration: containerd hosts.toml".to_string(),
        "host 1: http://zz.test:5000/v2 [pull, resolve] from ".to_string(),
        format!("{file}:3 [host.\"http://zz.test:5000\"]"),
        "host 2: http://aa.test:5000/v2 [pull: digests and blobs only] from ".to_string(),
        format!("{file}:5 [host.\"http://aa.test:5000\"]"),
        "host 3: http://127.0.0.1:9/v2 [pull, resolve] from ".to_string(),
        format!("{file}:1 server"),
    ];
    let mut at = 0;
    for w in &want {
        let i = text[at..].find(w.as_str()).unwrap_or_else(|| panic!("{w:?} after byte {at}\n{}", show(&out)));
        at += i + w.len();
    }
    // The same lines in the JSON output, and the same as `status` would print.
    let out = kata_addons_tests::run_kata_env(&["preview", "--root", root, "--output", "json"], &env);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let lines: Vec<&str> = v["registry"].as_array().expect("registry").iter().filter_map(|l| l.as_str()).collect();
    assert_eq!(lines.len(), 4, "{v}");
    assert!(lines[1].starts_with("host 1: http://zz.test:5000/v2") && lines[3].ends_with(":1 server"), "{lines:?}");
}
