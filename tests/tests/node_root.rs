//! Node files are read only from inside `--root` (docs/registries-and-trust.md#root-resolution):
//! every node file is resolved as the node resolves it, symlinks followed with absolute
//! targets meaning the node's `/` and `..` stopping at the root.
//!
//! For each file kind the file is a symlink of four sorts: an absolute target inside the
//! root, a relative target inside the root (both read: the pull sees the file), a relative
//! target climbing past the root, and an absolute target naming a path of the machine
//! running the test outside the root (the pod's own filesystem in the DaemonSet). For the
//! last two the file that the naive `root.join(...)` reading would reach exists outside the
//! root and is never read. Real registries (plain HTTP, TLS with a test CA, basic auth)
//! on 127.0.0.1; `kata-addons fetch --root` for registry files, `install --root` for the
//! trust files (policy.json, registries.d, key paths, the `file://` lookaside).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine;
use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::node::Node;
use kata_addons_tests::registry::{Registry, RegistryConfig};
use kata_addons_tests::show;
use kata_addons_tests::tls::TestCa;
use serde_json::json;

const KERNEL: &str = "/artifacts/kernel/vmlinuz";

fn write(p: &Path, data: impl AsRef<[u8]>) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

/// The four link sorts.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Link {
    /// `/srv/...`: inside the root.
    Absolute,
    /// `../../srv/...` (as many `..` as the link is deep): inside the root.
    Relative,
    /// One `..` more than the link is deep, then `outside/...`: naively the outside copy
    /// beside the root; on the node `..` stops at `/`, so `R/outside/...` (absent).
    Climbing,
    /// The absolute path of the outside copy on the test machine (`R/<that path>`, absent).
    HostAbsolute,
}

impl Link {
    const ALL: [Link; 4] = [Link::Absolute, Link::Relative, Link::Climbing, Link::HostAbsolute];

    fn inside(self) -> bool {
        matches!(self, Link::Absolute | Link::Relative)
    }
}

/// A node root inside `outer` (so climbing links land in `outer`), with `content` at the
/// node path `at` reached through a link of sort `link`; the same content sits outside the
/// root where a reader that escaped the root would find it.
struct Placed {
    root: PathBuf,
}

fn place(outer: &Path, n: usize, at: &str, content: &dyn Fn(&Path), link: Link, copy_from: Option<&Path>) -> Placed {
    let root = outer.join(format!("root-{n}"));
    if let Some(from) = copy_from {
        let o = Command::new("cp").arg("-a").arg(from).arg(&root).output().expect("cp");
        assert!(o.status.success(), "{}", show(&o));
    }
    std::fs::create_dir_all(&root).expect("root");
    let name = at.trim_start_matches('/').replace('/', "_");
    let inside = format!("/srv/{name}");
    let outside = outer.join("outside").join(format!("{n}-{name}"));
    content(&root.join(inside.trim_start_matches('/')));
    content(&outside);
    let depth = at.trim_start_matches('/').matches('/').count();
    let target = match link {
        Link::Absolute => inside.clone(),
        Link::Relative => format!("{}srv/{name}", "../".repeat(depth)),
        Link::Climbing => format!("{}outside/{n}-{name}", "../".repeat(depth + 1)),
        Link::HostAbsolute => outside.display().to_string(),
    };
    let l = root.join(at.trim_start_matches('/'));
    std::fs::create_dir_all(l.parent().expect("parent")).expect("mkdir");
    std::os::unix::fs::symlink(&target, &l).expect("symlink");
    Placed { root }
}

/// Writes a file's (or a directory's) content at a path.
type Content = Box<dyn Fn(&Path)>;

fn file(data: Vec<u8>) -> impl Fn(&Path) {
    move |p: &Path| write(p, &data)
}

/// Runs `kata-addons` with a clean environment plus `env`.
fn kata(args: &[&str], env: &[(&str, &str)]) -> Output {
    kata_addons_tests::run_kata_env(args, env)
}

#[test]
fn registry_files_resolve_inside_the_root() {
    let img = Image::new(vec![LayerBuilder::new().file(KERNEL.trim_start_matches('/'), b"k").build(Compress::Gzip)]);
    let plain = Registry::start();
    let ca = TestCa::new();
    let tls = Registry::start_with(RegistryConfig { tls: Some(ca.clone()), ..RegistryConfig::default() });
    let auth = Registry::start_with(RegistryConfig {
        htpasswd: Some(("puller".into(), "s3cret".into())),
        ..RegistryConfig::default()
    });
    for r in [&plain, &tls, &auth] {
        r.push("lib/kernel", "1", &img);
    }
    let (p, t, a) = (plain.host(), tls.host(), auth.host());
    let ca_pem = std::fs::read(&ca.ca_cert).expect("ca");
    let insecure = format!("[[registry]]\nlocation = \"{p}\"\ninsecure = true\n").into_bytes();
    let secret = json!({"auths": {&a: {"auth": base64::engine::general_purpose::STANDARD.encode("puller:s3cret")}}})
        .to_string()
        .into_bytes();
    let ca_dir = {
        let pem = ca_pem.clone();
        move |d: &Path| write(&d.join("ca.crt"), &pem)
    };
    // (what, node path made a link, its content, image, extra flags)
    let kinds: Vec<(&str, String, Content, String, Vec<String>)> = vec![
        (
            "registries.conf",
            "/etc/containers/registries.conf".into(),
            Box::new(file(insecure.clone())),
            p.clone(),
            vec![],
        ),
        (
            "registries.conf.d entry",
            "/etc/containers/registries.conf.d/50-plain.conf".into(),
            Box::new(file(insecure)),
            p.clone(),
            vec![],
        ),
        (
            "certs.d CA file",
            format!("/etc/containers/certs.d/{t}/ca.crt"),
            Box::new(file(ca_pem.clone())),
            t.clone(),
            vec![],
        ),
        ("certs.d host directory", format!("/etc/docker/certs.d/{t}"), Box::new(ca_dir), t.clone(), vec![]),
        ("node CA bundle", "/etc/ssl/certs/ca-certificates.crt".into(), Box::new(file(ca_pem)), t.clone(), vec![]),
        (
            "kubelet pull secret",
            "/var/lib/kubelet/config.json".into(),
            Box::new(file(secret)),
            a.clone(),
            vec!["--insecure-registry".into(), a.clone()],
        ),
    ];
    let outer = tempfile::tempdir().expect("outer");
    let mut n = 0;
    let mut failures = Vec::new();
    for (what, at, content, host, extra) in &kinds {
        for link in Link::ALL {
            n += 1;
            let placed = place(outer.path(), n, at, content.as_ref(), link, None);
            let dest = outer.path().join(format!("dest-{n}"));
            let image = format!("{host}/lib/kernel:1");
            let root = placed.root.to_str().expect("utf8");
            let mut args = vec!["fetch", "--image", &image, "--path", KERNEL, "--timeout", "5", "--retries", "0"];
            args.extend(["--root", root, "--dest", dest.to_str().expect("utf8")]);
            args.extend(extra.iter().map(String::as_str));
            let o = kata(&args, &[]);
            if o.status.success() != link.inside() {
                failures.push(format!(
                    "{what} through a {link:?} link: expected success={}\n{}",
                    link.inside(),
                    show(&o)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Signs a simple signing payload for `identity`/`digest` with a new gpg key; returns the
/// exported public key and the signature.
fn gpg_signature(dir: &Path, identity: &str, digest: &str) -> (Vec<u8>, Vec<u8>) {
    let home = dir.join("gnupg");
    std::fs::create_dir_all(&home).expect("gnupg");
    std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    let gpg = |args: &[&str]| {
        let o = Command::new("gpg")
            .env("GNUPGHOME", &home)
            .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
            .args(args)
            .output()
            .expect("gpg");
        assert!(o.status.success(), "gpg {args:?}\n{}", show(&o));
        o.stdout
    };
    gpg(&["--quick-gen-key", "Node <node@test>", "ed25519", "sign", "never"]);
    let payload = dir.join("payload.json");
    let body = json!({
        "critical": {
            "identity": {"docker-reference": identity},
            "image": {"docker-manifest-digest": digest},
            "type": "atomic container signature"
        },
        "optional": {}
    });
    write(&payload, body.to_string());
    let sig = dir.join("payload.sig");
    gpg(&["-u", "node@test", "--output", sig.to_str().expect("utf8"), "--sign", payload.to_str().expect("utf8")]);
    let key = gpg(&["--export", "node@test"]);
    let _ = Command::new("gpgconf").env("GNUPGHOME", &home).args(["--kill", "all"]).output();
    (key, std::fs::read(&sig).expect("sig"))
}

#[test]
fn trust_files_resolve_inside_the_root() {
    let img = Image::new(vec![LayerBuilder::new().file(KERNEL.trim_start_matches('/'), b"k").build(Compress::Gzip)]);
    let reg = Registry::start();
    let h = reg.host();
    let digest = reg.push("org/app", "v1", &img);
    let outer = tempfile::tempdir().expect("outer");
    let (key, sig) = gpg_signature(outer.path(), &format!("{h}/org/app:v1"), &digest);
    let sig_rel = format!("org/app@sha256={}/signature-1", digest.trim_start_matches("sha256:"));
    let signed_by = |reqs: serde_json::Value| {
        json!({"default": [{"type": "reject"}], "transports": {"docker": {format!("{h}/org"): reqs}}}).to_string()
    };
    let policy = signed_by(json!([{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/etc/pki/node.gpg"}]));
    let regd = "default-docker:\n  lookaside: file:///var/lib/node-sigs\n".to_string();
    // A node where every trust file is a plain file: accepted.
    let base = Node::new();
    write(&base.path("/etc/containers/policy.json"), &policy);
    write(&base.path("/etc/containers/registries.d/default.yaml"), &regd);
    write(&base.path("/etc/pki/node.gpg"), &key);
    write(&base.path(&format!("/var/lib/node-sigs/{sig_rel}")), &sig);
    let reject = json!({"default": [{"type": "reject"}]}).to_string();
    let sigs_dir = {
        let (sig, rel) = (sig.clone(), sig_rel.clone());
        move |d: &Path| write(&d.join(&rel), &sig)
    };
    // (what, node path made a link, its content, accepted when read?, refusal text when read / not read)
    let kinds: Vec<(&str, &str, Content, bool, &str, &str)> = vec![
        (
            "policy.json",
            "/etc/containers/policy.json",
            Box::new(file(reject.into_bytes())),
            false,
            "/etc/containers/policy.json: default: reject",
            "",
        ),
        (
            "registries.d file",
            "/etc/containers/registries.d/default.yaml",
            Box::new(file(regd.into_bytes())),
            true,
            "",
            "no signature found",
        ),
        ("key path", "/etc/pki/node.gpg", Box::new(file(key)), true, "", "key file /etc/pki/node.gpg does not exist"),
        ("file:// lookaside directory", "/var/lib/node-sigs", Box::new(sigs_dir), true, "", "no signature found"),
    ];
    let mut failures = Vec::new();
    let mut n = 0;
    for (what, at, content, accepted_when_read, says_read, says_unread) in &kinds {
        for link in Link::ALL {
            n += 1;
            let copy = outer.path().join(format!("base-{n}"));
            let o = Command::new("cp").arg("-a").arg(base.root()).arg(&copy).output().expect("cp");
            assert!(o.status.success(), "{}", show(&o));
            let _ = std::fs::remove_file(copy.join(at.trim_start_matches('/')));
            let _ = std::fs::remove_dir_all(copy.join(at.trim_start_matches('/')));
            let placed = place(outer.path(), n, at, content.as_ref(), link, Some(&copy));
            let root = placed.root.to_str().expect("utf8");
            let image = format!("{h}/org/app:v1");
            let o = kata(
                &["install", "--root", root, "--insecure-registry", &h],
                &[("ADDON_IMAGE", &image), ("ADDON_KERNEL_PATH", KERNEL)],
            );
            // Read through the link: the file decides; not read: as if it were absent
            // (no policy accepts with a warning; no key, lookaside or registries.d refuses).
            let expect_ok = if link.inside() { *accepted_when_read } else { *what == "policy.json" };
            let says = if link.inside() { says_read } else { says_unread };
            let stderr = String::from_utf8_lossy(&o.stderr);
            if o.status.success() != expect_ok || !stderr.contains(says) {
                failures.push(format!(
                    "{what} through a {link:?} link: expected success={expect_ok} saying {says:?}\n{}",
                    show(&o)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
