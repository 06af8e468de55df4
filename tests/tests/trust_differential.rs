//! Image trust (docs/registries-and-trust.md) against skopeo, with real parts: a real
//! docker-registry on
//! 127.0.0.1, GPG simple signatures made by skopeo itself (`--sign-by`, throwaway GnuPG
//! keys: RSA and ed25519) into a file lookaside, served over HTTP too; sigstore
//! attachments made by the test in containers/image's format and checked with `openssl`.
//! Every case runs `skopeo copy docker://… oci:…` and `kata-addons fetch` with the same
//! policy.json and registries.d and asserts the same accept/refuse outcome (and the
//! expected one); sigstore cases that Debian's skopeo cannot decide are asserted against
//! the expected outcome only.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine;
use kata_addons_tests::fileserver::FileServer;
use kata_addons_tests::image::{Compress, Image, LayerBuilder, media};
use kata_addons_tests::node::{Node, content_snapshot};
use kata_addons_tests::registry::Registry;
use kata_addons_tests::{kata_addons_bin, sha256_hex, show};
use serde_json::json;

const KERNEL: &str = "/artifacts/kernel/vmlinuz";

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn must(cmd: &mut Command) -> Output {
    let o = run(cmd);
    assert!(o.status.success(), "{cmd:?}\n{}", show(&o));
    o
}

/// The shared world: registry, keys, signatures, lookasides.
struct Fx {
    dir: tempfile::TempDir,
    _reg: Registry,
    host: String,
    gnupg: PathBuf,
    fpr_a: String,
    key_a: PathBuf,
    key_b: PathBuf,
    cosign_pub: PathBuf,
    cosign_other_pub: PathBuf,
    /// registries.d with a file:// lookaside and sigstore attachments enabled.
    regd_file: PathBuf,
    /// registries.d with an http:// lookaside.
    regd_http: PathBuf,
    /// registries.d with a lookaside but attachments disabled.
    regd_noattach: PathBuf,
    app_digest: String,
    _fs: FileServer,
    n: std::cell::Cell<u32>,
}

fn gen_key(gnupg: &Path, uid: &str, algo: &str) -> String {
    must(Command::new("gpg").env("GNUPGHOME", gnupg).args([
        "--batch",
        "--passphrase",
        "",
        "--quick-gen-key",
        uid,
        algo,
        "sign",
        "never",
    ]));
    let o = must(Command::new("gpg").env("GNUPGHOME", gnupg).args(["--with-colons", "--list-keys", uid]));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("fpr:").map(|r| r.trim_matches(':').to_string()))
        .expect("fingerprint")
}

fn write(p: &Path, data: impl AsRef<[u8]>) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(p, data).expect("write");
}

fn image(content: &[u8]) -> Image {
    let layer = LayerBuilder::new().file(KERNEL.trim_start_matches('/'), content).build(Compress::Gzip);
    Image::new(vec![layer])
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
    }
}

impl Fx {
    fn new() -> Fx {
        let dir = tempfile::tempdir().expect("temp");
        let t = dir.path();
        let gnupg = t.join("gnupg");
        std::fs::create_dir_all(&gnupg).expect("gnupg");
        std::fs::set_permissions(&gnupg, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
        let fpr_a = gen_key(&gnupg, "Trusted <a@test>", "rsa2048");
        let fpr_b = gen_key(&gnupg, "Other <b@test>", "ed25519");
        let key_a = t.join("a.gpg");
        let key_b = t.join("b.gpg");
        for (fpr, p) in [(&fpr_a, &key_a), (&fpr_b, &key_b)] {
            let o = must(Command::new("gpg").env("GNUPGHOME", &gnupg).args(["--export", fpr]));
            write(p, &o.stdout);
        }
        let reg = Registry::start();
        let host = reg.host();
        let app = image(b"kernel one");
        let app_digest = reg.push("org/app", "v1", &app);
        reg.push("org/app", "v2", &app);
        reg.push("org/unsigned", "v1", &app);
        reg.push("org/wrongkey", "v1", &app);
        reg.push("org/mismatch", "v1", &app);
        reg.push("org/cosignonly", "v1", &app);
        let other = image(b"kernel two");
        let other_digest = reg.push("org/otherdigest", "v1", &other);

        // Signatures made by skopeo into a file lookaside (lookaside-staging for writing).
        let sigs = t.join("sigs");
        let regd_sign = t.join("regd-sign");
        write(
            &regd_sign.join("sign.yaml"),
            format!("default-docker:\n  lookaside-staging: file://{}\n", sigs.display()),
        );
        let accept = t.join("accept.json");
        write(&accept, r#"{"default":[{"type":"insecureAcceptAnything"}]}"#);
        let sign = |fpr: &str, from: &str, to: &str| {
            must(Command::new("skopeo").env("GNUPGHOME", &gnupg).args([
                "copy",
                "--quiet",
                "--policy",
                accept.to_str().expect("utf8"),
                "--registries.d",
                regd_sign.to_str().expect("utf8"),
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
                "--sign-by",
                fpr,
                &format!("docker://{host}/{from}"),
                &format!("docker://{host}/{to}"),
            ]));
        };
        sign(&fpr_a, "org/app:v1", "org/app:v1");
        sign(&fpr_b, "org/wrongkey:v1", "org/wrongkey:v1");
        sign(&fpr_a, "org/app:v1", "org/renamed:v1");
        let hex = app_digest.trim_start_matches("sha256:");
        let sig_dir = |repo: &str, hex: &str| sigs.join(format!("{repo}@sha256={hex}"));
        assert!(sig_dir("org/app", hex).join("signature-1").is_file(), "skopeo wrote no signature");
        // A signature claiming org/renamed:v1, served for org/mismatch (same digest).
        copy_dir(&sig_dir("org/renamed", hex), &sig_dir("org/mismatch", hex));
        // A valid signature of another digest, served for org/otherdigest.
        copy_dir(&sig_dir("org/app", hex), &sig_dir("org/otherdigest", other_digest.trim_start_matches("sha256:")));

        // Sigstore attachments in containers/image's format, signed by openssl.
        let cosign_key = t.join("cosign.key");
        let cosign_pub = t.join("cosign.pub");
        let cosign_other_key = t.join("cosign-other.key");
        let cosign_other_pub = t.join("cosign-other.pub");
        for (k, p) in [(&cosign_key, &cosign_pub), (&cosign_other_key, &cosign_other_pub)] {
            must(Command::new("openssl").args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"]).arg(k));
            must(Command::new("openssl").args(["ec", "-pubout", "-in"]).arg(k).arg("-out").arg(p));
        }
        for repo in ["org/app", "org/cosignonly"] {
            attach_sigstore(&reg, t, repo, &format!("{host}/{repo}:v1"), &app_digest, &cosign_key, &cosign_pub);
        }

        let fs = FileServer::start(&sigs);
        let regd_file = t.join("regd-file");
        write(
            &regd_file.join("default.yaml"),
            format!("default-docker:\n  lookaside: file://{}\n  use-sigstore-attachments: true\n", sigs.display()),
        );
        let regd_http = t.join("regd-http");
        // The legacy name `sigstore` for the lookaside, on a per-host namespace.
        write(&regd_http.join("host.yaml"), format!("docker:\n  {host}:\n    sigstore: {}\n", fs.url()));
        let regd_noattach = t.join("regd-noattach");
        write(
            &regd_noattach.join("default.yaml"),
            format!("default-docker:\n  lookaside: file://{}\n", sigs.display()),
        );
        Fx {
            dir,
            _reg: reg,
            host,
            gnupg,
            fpr_a,
            key_a,
            key_b,
            cosign_pub,
            cosign_other_pub,
            regd_file,
            regd_http,
            regd_noattach,
            app_digest,
            _fs: fs,
            n: std::cell::Cell::new(0),
        }
    }

    fn policy(&self, text: &str) -> PathBuf {
        self.n.set(self.n.get() + 1);
        let p = self.dir.path().join(format!("policy-{}.json", self.n.get()));
        write(&p, text);
        p
    }

    fn skopeo(&self, policy: &Path, regd: &Path, image: &str) -> Output {
        let out = self.dir.path().join(format!("out-{}", self.n.get()));
        let _ = std::fs::remove_dir_all(&out);
        run(Command::new("skopeo").env("GNUPGHOME", &self.gnupg).args([
            "copy",
            "--quiet",
            "--remove-signatures",
            "--policy",
            policy.to_str().expect("utf8"),
            "--registries.d",
            regd.to_str().expect("utf8"),
            "--src-tls-verify=false",
            &format!("docker://{image}"),
            &format!("oci:{}:x", out.display()),
        ]))
    }

    fn fetch(&self, policy: &Path, regd: &Path, image: &str) -> Output {
        let dest = tempfile::tempdir().expect("dest");
        let home = tempfile::tempdir().expect("home");
        let o = run(Command::new(kata_addons_bin()).env("HOME", home.path()).args([
            "fetch",
            "--image",
            image,
            "--path",
            KERNEL,
            "--dest",
            dest.path().to_str().expect("utf8"),
            "--insecure-registry",
            &self.host,
            "--signature-policy",
            policy.to_str().expect("utf8"),
            "--registries-d",
            regd.to_str().expect("utf8"),
        ]));
        if !o.status.success() {
            let left: Vec<_> = std::fs::read_dir(dest.path()).expect("dest").collect();
            assert!(left.is_empty(), "a refused fetch wrote files\n{}", show(&o));
        }
        o
    }
}

impl Drop for Fx {
    /// Stops the gpg-agent that gpg started for the throwaway GNUPGHOME.
    fn drop(&mut self) {
        let _ = Command::new("gpgconf").env("GNUPGHOME", &self.gnupg).args(["--kill", "all"]).output();
    }
}

/// Pushes a `sha256-<hex>.sig` manifest whose layer is a cosign simple-signing payload
/// for `identity`/`digest`, signed with `key` (ECDSA P-256), checked with openssl first.
fn attach_sigstore(reg: &Registry, t: &Path, repo: &str, identity: &str, digest: &str, key: &Path, public: &Path) {
    let payload = serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": identity},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature"
        },
        "optional": null
    }))
    .expect("json");
    let pfile = t.join(format!("payload-{}", sha256_hex(identity.as_bytes())));
    let sfile = pfile.with_extension("sig");
    write(&pfile, &payload);
    must(Command::new("openssl").args(["dgst", "-sha256", "-sign"]).arg(key).arg("-out").arg(&sfile).arg(&pfile));
    let v = must(
        Command::new("openssl")
            .args(["dgst", "-sha256", "-verify"])
            .arg(public)
            .arg("-signature")
            .arg(&sfile)
            .arg(&pfile),
    );
    assert!(String::from_utf8_lossy(&v.stdout).contains("Verified OK"));
    let sig = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&sfile).expect("sig"));
    let pdigest = format!("sha256:{}", sha256_hex(&payload));
    reg.put_blob_raw(repo, &pdigest, &payload);
    let config = br#"{"architecture":"","config":{},"os":"","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let cdigest = format!("sha256:{}", sha256_hex(config));
    reg.put_blob_raw(repo, &cdigest, config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": media::MANIFEST,
        "config": {"mediaType": media::CONFIG, "digest": cdigest, "size": config.len()},
        "layers": [{
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": pdigest,
            "size": payload.len(),
            "annotations": {"dev.cosignproject.cosign/signature": sig}
        }]
    }))
    .expect("json");
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    reg.put_manifest(repo, Some(&tag), &manifest);
}

/// Which registries.d a case uses.
#[derive(Clone, Copy)]
enum Regd {
    File,
    Http,
    NoAttach,
}

struct Case {
    name: &'static str,
    policy: String,
    image: String,
    regd: Regd,
    accept: bool,
    /// Whether Debian's skopeo 1.9.3 can decide the case (it cannot verify sigstore).
    skopeo: bool,
    /// Text the kata-addons refusal must contain.
    says: &'static str,
}

fn signed_by(key: &Path, identity: Option<serde_json::Value>) -> serde_json::Value {
    let mut r = json!({"type": "signedBy", "keyType": "GPGKeys", "keyPath": key});
    if let Some(i) = identity {
        r["signedIdentity"] = i;
    }
    r
}

fn scoped(host: &str, scope: &str, reqs: serde_json::Value) -> String {
    json!({"default": [{"type": "reject"}], "transports": {"docker": {format!("{host}/{scope}"): reqs}}}).to_string()
}

#[test]
fn differential_table() {
    let fx = Fx::new();
    let h = fx.host.clone();
    let a = &fx.key_a;
    let accept = json!([{"type": "insecureAcceptAnything"}]);
    let reject = json!([{"type": "reject"}]);
    let app = format!("{h}/org/app:v1");
    let mism = format!("{h}/org/mismatch:v1");
    let sig_mism = |i: serde_json::Value| scoped(&h, "org", json!([signed_by(a, Some(i))]));
    let sigstore = |key: &Path, extra: serde_json::Value| {
        let mut r = json!({"type": "sigstoreSigned", "keyPath": key});
        if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        scoped(&h, "org", json!([r]))
    };
    let key_data = base64::engine::general_purpose::STANDARD.encode(std::fs::read(a).expect("key"));
    let c = |name, policy: String, image: &str, accept, says| Case {
        name,
        policy,
        image: image.to_string(),
        regd: Regd::File,
        accept,
        skopeo: true,
        says,
    };
    let mut cases = vec![
        c("insecureAcceptAnything", json!({"default": accept}).to_string(), &app, true, ""),
        c("reject", json!({"default": reject}).to_string(), &app, false, "default: reject"),
        c("signedBy accepted", scoped(&h, "org", json!([signed_by(a, None)])), &app, true, ""),
        c(
            "signedBy keyData",
            scoped(&h, "org", json!([{"type": "signedBy", "keyType": "GPGKeys", "keyData": key_data}])),
            &app,
            true,
            "",
        ),
        c(
            "signedBy keyPaths",
            scoped(&h, "org", json!([{"type": "signedBy", "keyType": "GPGKeys", "keyPaths": [&fx.key_b, a]}])),
            &app,
            true,
            "",
        ),
        Case {
            regd: Regd::Http,
            ..c("signedBy over an http lookaside (legacy `sigstore` key)", scoped(&h, "org", json!([signed_by(a, None)])), &app, true, "")
        },
        c(
            "unsigned",
            scoped(&h, "org", json!([signed_by(a, None)])),
            &format!("{h}/org/unsigned:v1"),
            false,
            "no signature found for sha256:",
        ),
        c(
            "wrong key",
            scoped(&h, "org", json!([signed_by(a, None)])),
            &format!("{h}/org/wrongkey:v1"),
            false,
            "is not accepted",
        ),
        c(
            "ed25519 key accepted",
            scoped(&h, "org", json!([signed_by(&fx.key_b, None)])),
            &format!("{h}/org/wrongkey:v1"),
            true,
            "",
        ),
        c(
            "signature for another digest",
            scoped(&h, "org", json!([signed_by(a, None)])),
            &format!("{h}/org/otherdigest:v1"),
            false,
            "does not match",
        ),
        c("identity: matchRepoDigestOrExact (default)", sig_mism(json!({"type": "matchRepoDigestOrExact"})), &mism, false, "identity"),
        c("identity: matchExact", sig_mism(json!({"type": "matchExact"})), &mism, false, "identity"),
        c("identity: matchRepository", sig_mism(json!({"type": "matchRepository"})), &mism, false, "identity"),
        c(
            "identity: exactReference accepted",
            sig_mism(json!({"type": "exactReference", "dockerReference": format!("{h}/org/renamed:v1")})),
            &mism,
            true,
            "",
        ),
        c(
            "identity: exactReference refused",
            sig_mism(json!({"type": "exactReference", "dockerReference": format!("{h}/org/renamed:v2")})),
            &mism,
            false,
            "identity",
        ),
        c(
            "identity: exactRepository accepted",
            sig_mism(json!({"type": "exactRepository", "dockerRepository": format!("{h}/org/renamed")})),
            &mism,
            true,
            "",
        ),
        c(
            "identity: exactRepository refused",
            sig_mism(json!({"type": "exactRepository", "dockerRepository": format!("{h}/org/other")})),
            &mism,
            false,
            "identity",
        ),
        c(
            "identity: remapIdentity accepted",
            sig_mism(json!({"type": "remapIdentity", "prefix": format!("{h}/org/mismatch"), "signedPrefix": format!("{h}/org/renamed")})),
            &mism,
            true,
            "",
        ),
        c(
            "identity: remapIdentity refused",
            sig_mism(json!({"type": "remapIdentity", "prefix": format!("{h}/org/mismatch"), "signedPrefix": format!("{h}/org/elsewhere")})),
            &mism,
            false,
            "identity",
        ),
        c("other tag, matchRepoDigestOrExact", sig_mism(json!({"type": "matchRepoDigestOrExact"})), &format!("{h}/org/app:v2"), false, "identity"),
        c("other tag, matchRepository", sig_mism(json!({"type": "matchRepository"})), &format!("{h}/org/app:v2"), true, ""),
        c(
            "by digest, matchRepoDigestOrExact",
            sig_mism(json!({"type": "matchRepoDigestOrExact"})),
            &format!("{h}/org/app@{}", fx.app_digest),
            true,
            "",
        ),
        c("by digest, matchExact", sig_mism(json!({"type": "matchExact"})), &format!("{h}/org/app@{}", fx.app_digest), false, "identity"),
        c("unknown requirement type", json!({"default": [{"type": "signedByMagic"}]}).to_string(), &app, false, "unknown policy requirement type"),
        c("malformed: no default", json!({"transports": {}}).to_string(), &app, false, "default policy is missing"),
        c("malformed: not JSON", "{\"default\": [".to_string(), &app, false, "invalid policy"),
        c("malformed: empty requirements", json!({"default": []}).to_string(), &app, false, "must not be empty"),
        c("malformed: unknown key", json!({"default": accept, "extra": 1}).to_string(), &app, false, "unknown key"),
        c(
            "malformed: two key sources",
            scoped(&h, "org", json!([{"type": "signedBy", "keyType": "GPGKeys", "keyPath": a, "keyData": "AA=="}])),
            &app,
            false,
            "exactly one of keyPath",
        ),
        c("all requirements must hold", scoped(&h, "org", json!([signed_by(a, None), {"type": "reject"}])), &app, false, "reject"),
        c("signedBy + insecureAcceptAnything", scoped(&h, "org", json!([signed_by(a, None), {"type": "insecureAcceptAnything"}])), &app, true, ""),
        c(
            "signedBy keyType signedByGPGKeys (unimplemented)",
            scoped(&h, "org", json!([{"type": "signedBy", "keyType": "signedByGPGKeys", "keyPath": a}])),
            &app,
            false,
            "not implemented",
        ),
        c(
            "signedBy key file missing",
            scoped(&h, "org", json!([signed_by(&fx.dir.path().join("nope.gpg"), None)])),
            &app,
            false,
            "does not exist",
        ),
        // Scope precedence: full identity, repository, namespaces, host, *.domain, "" , default.
        c(
            "scope: repository beats namespace",
            json!({"default": reject, "transports": {"docker": {format!("{h}/org"): reject, format!("{h}/org/app"): accept}}}).to_string(),
            &app,
            true,
            "",
        ),
        c(
            "scope: repo:tag beats repository",
            json!({"default": accept, "transports": {"docker": {format!("{h}/org/app:v1"): reject, format!("{h}/org/app"): accept}}}).to_string(),
            &app,
            false,
            "reject",
        ),
        c(
            "scope: repo@digest identity",
            json!({"default": accept, "transports": {"docker": {format!("{h}/org/app@{}", fx.app_digest): reject}}}).to_string(),
            &format!("{h}/org/app@{}", fx.app_digest),
            false,
            "reject",
        ),
        c(
            "scope: namespace beats host",
            json!({"default": accept, "transports": {"docker": {format!("{h}/org"): reject, h.clone(): accept}}}).to_string(),
            &app,
            false,
            "reject",
        ),
        c(
            "scope: host beats wildcard",
            json!({"default": reject, "transports": {"docker": {h.clone(): accept, "*.0.0.1": reject}}}).to_string(),
            &app,
            true,
            "",
        ),
        c(
            "scope: wildcard *.0.0.1",
            json!({"default": accept, "transports": {"docker": {"*.0.0.1": reject, "*.1": accept}}}).to_string(),
            &app,
            false,
            "reject",
        ),
        c(
            "scope: transport default beats global default",
            json!({"default": accept, "transports": {"docker": {"": reject}}}).to_string(),
            &app,
            false,
            "reject",
        ),
        c(
            "scope: another repository does not apply",
            json!({"default": accept, "transports": {"docker": {format!("{h}/org/other"): reject, format!("{h}/org/ap"): reject}}}).to_string(),
            &app,
            true,
            "",
        ),
        c(
            "scope: other transports do not apply",
            json!({"default": accept, "transports": {"oci": {"/nonexistent/dir": reject}, "atomic": {"x.io/ns": reject}}}).to_string(),
            &app,
            true,
            "",
        ),
    ];
    // Sigstore: Debian's skopeo is built without sigstore verification; asserted on the format.
    let sigstore_cases = vec![
        c("sigstoreSigned accepted", sigstore(&fx.cosign_pub, json!({})), &app, true, ""),
        c(
            "sigstoreSigned unsigned",
            sigstore(&fx.cosign_pub, json!({})),
            &format!("{h}/org/unsigned:v1"),
            false,
            "sigstoreSigned: no signature found for sha256:",
        ),
        c("sigstoreSigned wrong key", sigstore(&fx.cosign_other_pub, json!({})), &app, false, "verification failed"),
        Case {
            regd: Regd::NoAttach,
            ..c(
                "sigstoreSigned with attachments disabled",
                sigstore(&fx.cosign_pub, json!({})),
                &app,
                false,
                "no signature found",
            )
        },
        c(
            "sigstoreSigned identity: matchRepository",
            sigstore(&fx.cosign_pub, json!({"signedIdentity": {"type": "matchRepository"}})),
            &format!("{h}/org/app:v2"),
            true,
            "",
        ),
        c(
            "sigstoreSigned identity mismatch",
            sigstore(
                &fx.cosign_pub,
                json!({"signedIdentity": {"type": "exactRepository", "dockerRepository": format!("{h}/org/other")}}),
            ),
            &app,
            false,
            "identity",
        ),
        c(
            "sigstoreSigned fulcio refused (fail closed)",
            scoped(
                &h,
                "org",
                json!([{"type": "sigstoreSigned", "fulcio": {"caPath": "/x", "oidcIssuer": "https://i", "subjectEmail": "a@b"}, "rekorPublicKeyPath": "/y"}]),
            ),
            &app,
            false,
            "not supported by kata-addons",
        ),
        c(
            "a sigstore attachment never satisfies signedBy",
            scoped(&h, "org", json!([signed_by(a, None)])),
            &format!("{h}/org/cosignonly:v1"),
            false,
            "no signature found",
        ),
    ];
    for mut s in sigstore_cases {
        s.skopeo = s.name.starts_with("a sigstore attachment");
        cases.push(s);
    }
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for case in &cases {
        let policy = fx.policy(&case.policy);
        let regd = match case.regd {
            Regd::File => &fx.regd_file,
            Regd::Http => &fx.regd_http,
            Regd::NoAttach => &fx.regd_noattach,
        };
        let k = fx.fetch(&policy, regd, &case.image);
        let s = fx.skopeo(&policy, regd, &case.image);
        let (ko, so) = (k.status.success(), s.status.success());
        let mut line = format!("{:<60} kata-addons {:<7} skopeo {}", case.name, ok(ko), ok(so));
        if !case.skopeo {
            let why = String::from_utf8_lossy(&s.stderr).lines().last().unwrap_or_default().to_string();
            line.push_str(&format!(" (not compared: {why})"));
        }
        report.push(line);
        if ko != case.accept {
            failures.push(format!(
                "{}: kata-addons {} (expected {})\n{}",
                case.name,
                ok(ko),
                ok(case.accept),
                show(&k)
            ));
        }
        if case.skopeo && so != ko {
            failures.push(format!("{}: skopeo {} but kata-addons {}\n{}", case.name, ok(so), ok(ko), show(&s)));
        }
        if !ko && k.status.code() != Some(1) {
            failures.push(format!("{}: refusal exit code {:?}, expected 1", case.name, k.status.code()));
        }
        let err = String::from_utf8_lossy(&k.stderr);
        let named = err.contains(case.says) && err.contains(policy.to_str().unwrap_or("?"));
        if !ko && !named {
            failures.push(format!(
                "{}: the refusal does not name the file and say {:?}\n{}",
                case.name,
                case.says,
                show(&k)
            ));
        }
        if ko && !String::from_utf8_lossy(&k.stdout).contains("trust accepted by") {
            failures.push(format!("{}: no trust line in the output\n{}", case.name, show(&k)));
        }
    }
    eprintln!(
        "{} cases ({} compared with skopeo):\n{}",
        cases.len(),
        cases.iter().filter(|c| c.skopeo).count(),
        report.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(cases.len() >= 30);
    // The accepted signedBy decision names the key and identity.
    let o = fx.fetch(&fx.policy(&scoped(&h, "org", json!([signed_by(a, None)]))), &fx.regd_file, &app);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&fx.fpr_a) && out.contains(&format!("identity {app}")), "{}", show(&o));
}

fn ok(b: bool) -> &'static str {
    if b { "accept" } else { "refuse" }
}

fn kata_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let home = tempfile::tempdir().expect("home");
    let mut c = Command::new(kata_addons_bin());
    c.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("HOME", home.path());
    for (k, v) in env {
        c.env(k, v);
    }
    run(c.args(args))
}

/// `install --root R` reads R/etc/containers/policy.json and registries.d (key paths and
/// the file:// lookaside are node paths beneath R); a refusal writes nothing on the node.
#[test]
fn install_reads_the_node_policy_and_refusals_write_nothing() {
    let fx = Fx::new();
    let h = fx.host.clone();
    let node = Node::new();
    let root = node.root().to_str().expect("utf8").to_string();
    // Key and lookaside copied onto the node, named by node paths.
    std::fs::create_dir_all(node.path("/etc/pki/containers")).expect("mkdir");
    std::fs::copy(&fx.key_a, node.path("/etc/pki/containers/trusted.gpg")).expect("key");
    let sigs = fx.dir.path().join("sigs");
    let node_sigs = node.path("/var/lib/kata-sigs");
    std::fs::create_dir_all(node.path("/var/lib")).expect("mkdir");
    must(Command::new("cp").arg("-a").arg(&sigs).arg(&node_sigs));
    write(
        &node.path("/etc/containers/registries.d/default.yaml"),
        "default-docker:\n  lookaside: file:///var/lib/kata-sigs\n",
    );
    let policy_path = node.path("/etc/containers/policy.json");
    let policy = json!({"default": [{"type": "reject"}], "transports": {"docker": {format!("{h}/org"): [
        {"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/etc/pki/containers/trusted.gpg"}
    ]}}});
    write(&policy_path, policy.to_string());
    let install = |image: &str, extra: &[&str]| {
        let mut args = vec!["install", "--root", &root, "--insecure-registry", &h];
        args.extend_from_slice(extra);
        kata_env(&args, &[("ADDON_IMAGE", image), ("ADDON_KERNEL_PATH", KERNEL)])
    };

    let before = content_snapshot(node.root());
    for (image, says) in [
        (
            format!("{h}/org/unsigned:v1"),
            format!("/etc/containers/policy.json: scope \"{h}/org\": signedBy: no signature found for sha256:"),
        ),
        (format!("{h}/org/wrongkey:v1"), "is not accepted".to_string()),
        (format!("{h}/else/app:v1"), "/etc/containers/policy.json: default: reject".to_string()),
    ] {
        let o = install(&image, &[]);
        assert_eq!(o.status.code(), Some(1), "{image}: {}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(&says), "{image}: want {says:?}\n{}", show(&o));
        assert_eq!(content_snapshot(node.root()), before, "{image}: a refused install wrote on the node");
    }
    // A policy containers/image would refuse to load fails every pull.
    write(
        &policy_path,
        r#"{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{"x":[{"type":"bogus"}]}}}"#,
    );
    let before = content_snapshot(node.root());
    let o = install(&format!("{h}/org/app:v1"), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown policy requirement type \"bogus\""), "{}", show(&o));
    assert_eq!(content_snapshot(node.root()), before);
    // A policy named by a flag but missing is an error.
    let o = install(&format!("{h}/org/app:v1"), &["--signature-policy", "/nonexistent/policy.json"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--signature-policy /nonexistent/policy.json"), "{}", show(&o));

    // Signed by the trusted key: installed, the decision recorded in the state and status.
    write(&policy_path, policy.to_string());
    let o = install(&format!("{h}/org/app:v1"), &[]);
    assert!(o.status.success(), "{}", show(&o));
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.path("/etc/kata-containers/addons/state.json")).expect("state"))
            .expect("state json");
    let trust = &state["trust"];
    assert_eq!(trust["decision"], "accepted", "{state}");
    assert_eq!(trust["policyFile"], "/etc/containers/policy.json");
    assert_eq!(trust["scope"], format!("scope \"{h}/org\""));
    assert_eq!(trust["requirement"], "signedBy");
    assert_eq!(trust["identity"], format!("{h}/org/app:v1"));
    assert_eq!(trust["key"], fx.fpr_a.as_str());
    let st = kata_env(&["status", "--root", &root, "--output", "json"], &[]);
    assert!(st.status.success(), "{}", show(&st));
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status json");
    assert_eq!(v["state"]["trust"]["key"], fx.fpr_a.as_str());
    let st = kata_env(&["status", "--root", &root], &[]);
    assert!(
        String::from_utf8_lossy(&st.stdout).contains("trust   accepted by /etc/containers/policy.json"),
        "{}",
        show(&st)
    );

    // Documented difference: no policy file at the default location accepts with one
    // warning (skopeo refuses: it has no default).
    std::fs::remove_file(&policy_path).expect("rm policy");
    let node2 = Node::new();
    let root2 = node2.root().to_str().expect("utf8").to_string();
    let o = kata_env(
        &["install", "--root", &root2, "--insecure-registry", &h],
        &[("ADDON_IMAGE", &format!("{h}/org/unsigned:v1")), ("ADDON_KERNEL_PATH", KERNEL)],
    );
    assert!(o.status.success(), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("signatures are NOT checked").count(), 1, "{}", show(&o));
    let s = fx.skopeo(&node2.path("/etc/containers/policy.json"), &fx.regd_file, &format!("{h}/org/unsigned:v1"));
    assert!(!s.status.success(), "skopeo accepted without a policy file: {}", show(&s));
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node2.path("/etc/kata-containers/addons/state.json")).expect("state"))
            .expect("state json");
    assert_eq!(state["trust"]["decision"], "unchecked");
}

/// Signatures are read from the endpoint the image came from (a registries.conf mirror):
/// the lookaside path of the mirror's repository and the mirror's sigstore attachments,
/// while the identity checked is the reference as named. Same decision as skopeo for GPG.
#[test]
fn mirror_signatures_come_from_the_endpoint_pulled_from() {
    let fx = Fx::new();
    let h = fx.host.clone();
    let mirror = Registry::start();
    let m = mirror.host();
    let app = image(b"kernel one");
    let digest = mirror.push("mirrored/app", "v1", &app);
    assert_eq!(digest, fx.app_digest);
    let t = fx.dir.path();
    let conf = t.join("registries.conf");
    write(
        &conf,
        format!(
            "[[registry]]\nprefix = \"{h}/org\"\nlocation = \"{h}/org\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{m}/mirrored\"\ninsecure = true\n"
        ),
    );
    let hex = digest.trim_start_matches("sha256:");
    let sigs = t.join("sigs");
    let gpg_policy = fx.policy(&scoped(&h, "org", json!([signed_by(&fx.key_a, None)])));
    let image_ref = format!("{h}/org/app:v1");
    let both = |policy: &Path| -> (Output, Output) {
        let dest = tempfile::tempdir().expect("dest");
        let home = tempfile::tempdir().expect("home");
        let k = run(Command::new(kata_addons_bin()).env("HOME", home.path()).args([
            "fetch",
            "--image",
            &image_ref,
            "--path",
            KERNEL,
            "--dest",
            dest.path().to_str().expect("utf8"),
            "--insecure-registry",
            &h,
            "--registries-conf",
            conf.to_str().expect("utf8"),
            "--signature-policy",
            policy.to_str().expect("utf8"),
            "--registries-d",
            fx.regd_file.to_str().expect("utf8"),
        ]));
        let out = t.join("mirror-out");
        let _ = std::fs::remove_dir_all(&out);
        let s = run(Command::new("skopeo").args([
            "--registries-conf",
            conf.to_str().expect("utf8"),
            "copy",
            "--quiet",
            "--remove-signatures",
            "--policy",
            policy.to_str().expect("utf8"),
            "--registries.d",
            fx.regd_file.to_str().expect("utf8"),
            "--src-tls-verify=false",
            &format!("docker://{image_ref}"),
            &format!("oci:{}:x", out.display()),
        ]));
        (k, s)
    };
    // The source's lookaside has org/app's signature, but the image comes from the mirror,
    // whose lookaside path (mirrored/app) has none: refused by both.
    let (k, s) = both(&gpg_policy);
    assert!(!k.status.success(), "{}", show(&k));
    assert!(!s.status.success(), "{}", show(&s));
    assert!(String::from_utf8_lossy(&k.stderr).contains("no signature found"), "{}", show(&k));
    // The same signature (identity: the source reference) under the mirror's path: accepted by both.
    copy_dir(&sigs.join(format!("org/app@sha256={hex}")), &sigs.join(format!("mirrored/app@sha256={hex}")));
    let (k, s) = both(&gpg_policy);
    assert!(k.status.success(), "{}", show(&k));
    assert!(s.status.success(), "{}", show(&s));
    assert!(String::from_utf8_lossy(&k.stdout).contains(&format!("identity {image_ref}")), "{}", show(&k));

    // Sigstore: the source has an attachment (Fx made one for org/app), the mirror none: refused.
    let ss_policy = fx.policy(&scoped(&h, "org", json!([{"type": "sigstoreSigned", "keyPath": &fx.cosign_pub}])));
    let (k, _) = both(&ss_policy);
    assert!(!k.status.success(), "{}", show(&k));
    assert!(String::from_utf8_lossy(&k.stderr).contains("sigstoreSigned: no signature found"), "{}", show(&k));
    // An attachment on the mirror, signing the source reference: accepted.
    attach_sigstore(&mirror, t, "mirrored/app", &image_ref, &digest, &t.join("cosign.key"), &fx.cosign_pub);
    let (k, _) = both(&ss_policy);
    assert!(k.status.success(), "{}", show(&k));
    assert!(
        !mirror.requests_matching(&format!("sha256-{hex}.sig")).is_empty(),
        "the mirror was not asked for the attachment"
    );
}

/// The `oci` transport: scopes are layout directories (the directory, then its parents).
#[test]
fn oci_layout_scopes() {
    let dir = tempfile::tempdir().expect("temp");
    let layout = dir.path().join("images/kernel");
    image(b"kernel one").write_layout(&layout, "v1");
    let layout_s = layout.to_str().expect("utf8");
    let parent = dir.path().join("images");
    let regd = dir.path().join("regd");
    std::fs::create_dir_all(&regd).expect("mkdir");
    let cases = [
        (
            json!({"default": [{"type": "insecureAcceptAnything"}], "transports": {"oci": {layout_s: [{"type": "reject"}]}}}),
            false,
        ),
        (
            json!({"default": [{"type": "reject"}], "transports": {"oci": {parent.to_str().expect("utf8"): [{"type": "insecureAcceptAnything"}]}}}),
            true,
        ),
        (
            json!({"default": [{"type": "insecureAcceptAnything"}], "transports": {"oci": {"": [{"type": "reject"}]}}}),
            false,
        ),
        (
            json!({"default": [{"type": "reject"}], "transports": {"docker": {"": [{"type": "insecureAcceptAnything"}]}}}),
            false,
        ),
        // Signatures cannot exist for a layout: signedBy refuses.
        (json!({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyData": "AA=="}]}), false),
    ];
    for (i, (policy, accept)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("policy-{i}.json"));
        write(&p, policy.to_string());
        let dest = tempfile::tempdir().expect("dest");
        let k = run(Command::new(kata_addons_bin()).args([
            "fetch",
            "--image",
            &format!("oci:{layout_s}:v1"),
            "--path",
            KERNEL,
            "--dest",
            dest.path().to_str().expect("utf8"),
            "--signature-policy",
            p.to_str().expect("utf8"),
            "--registries-d",
            regd.to_str().expect("utf8"),
        ]));
        let out = dir.path().join(format!("out-{i}"));
        let s = run(Command::new("skopeo").args([
            "copy",
            "--quiet",
            "--policy",
            p.to_str().expect("utf8"),
            &format!("oci:{layout_s}:v1"),
            &format!("oci:{}:x", out.display()),
        ]));
        assert_eq!(k.status.success(), *accept, "case {i} {policy}: {}", show(&k));
        assert_eq!(s.status.success(), *accept, "case {i} {policy}: skopeo {}", show(&s));
    }
}
