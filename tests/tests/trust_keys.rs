//! OpenPGP key validity as containers/image's gpgme mechanism judges it:
//! revoked and expired keys and subkeys, subkeys without the signing flag and signatures
//! made after expiry are refused; a valid signing subkey of a listed primary key signs for it.
//!
//! Every key is made by `gpg` in the test (GnuPG's `--faked-system-time` for keys and
//! signatures in the past), every signature is a simple signing payload signed by `gpg
//! --sign` into a file lookaside. Each case is judged by three parties, which must agree
//! with the expected outcome: `gpg --verify` with only that key imported (the engine gpgme
//! drives: accepted only on one signature, GOODSIG), `skopeo copy` (Debian's 1.9.3; it predates
//! containers/image's subkey matching of 2025, so it judges the cases signed by a primary
//! key only), and `kata-addons fetch`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::registry::Registry;
use kata_addons_tests::{kata_addons_bin, show};
use serde_json::json;

const KERNEL: &str = "/artifacts/kernel/vmlinuz";
/// The time every key "in the past" is made at (GnuPG's faked clock, frozen).
const PAST: &str = "20200101T000000!";

fn write(p: &Path, data: impl AsRef<[u8]>) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(p, data).expect("write");
}

/// A throwaway GnuPG home.
struct Gpg {
    home: PathBuf,
}

impl Gpg {
    fn new(home: PathBuf) -> Gpg {
        std::fs::create_dir_all(&home).expect("gnupg home");
        std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
        Gpg { home }
    }

    /// Runs gpg (optionally at a faked time, with `input` on the command fd).
    fn run(&self, at: Option<&str>, args: &[&str], input: Option<&str>) -> Output {
        let mut c = Command::new("gpg");
        c.env("GNUPGHOME", &self.home).args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""]);
        if let Some(t) = at {
            c.args(["--faked-system-time", t]);
        }
        if input.is_some() {
            c.args(["--command-fd", "0", "--status-fd", "2"]);
        }
        c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("run gpg (apt install gnupg)");
        if let (Some(i), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write;
            stdin.write_all(i.as_bytes()).expect("gpg stdin");
        }
        let o = child.wait_with_output().expect("gpg");
        assert!(o.status.success(), "gpg {args:?}\n{}", show(&o));
        o
    }

    /// Fingerprints of `key`: the primary first, then the subkeys in order.
    fn fingerprints(&self, key: &str) -> Vec<String> {
        let o = self.run(None, &["--with-colons", "--list-keys", key], None);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("fpr:").map(|r| r.trim_matches(':').to_string()))
            .collect()
    }

    /// A new ed25519 key with `usage` (`sign`, `cert`) and `expire` (`never`, `1d`).
    fn key(&self, uid: &str, usage: &str, expire: &str, at: Option<&str>) -> String {
        self.run(at, &["--quick-gen-key", uid, "ed25519", usage, expire], None);
        self.fingerprints(uid)[0].clone()
    }

    /// Adds an ed25519 subkey; returns its fingerprint.
    fn subkey(&self, fpr: &str, usage: &str, expire: &str, at: Option<&str>) -> String {
        self.run(at, &["--quick-add-key", fpr, "ed25519", usage, expire], None);
        self.fingerprints(fpr).last().cloned().expect("subkey")
    }

    /// Signs `payload` with exactly the (sub)key `by`.
    fn sign(&self, by: &str, payload: &Path, out: &Path, at: Option<&str>, sig_expire: Option<&str>) {
        let by = format!("{by}!");
        let (o, p) = (out.to_str().expect("utf8"), payload.to_str().expect("utf8"));
        match sig_expire {
            None => self.run(at, &["-u", &by, "--output", o, "--sign", p], None),
            Some(e) => self.run(at, &["--default-sig-expire", e, "-u", &by, "--output", o, "--sign", p], None),
        };
    }

    /// Revokes the primary key with the revocation certificate gpg made with it.
    fn revoke(&self, fpr: &str) {
        let cert = std::fs::read_to_string(self.home.join(format!("openpgp-revocs.d/{fpr}.rev"))).expect("rev cert");
        let cert = cert.replace(":-----BEGIN PGP PUBLIC KEY BLOCK-----", "-----BEGIN PGP PUBLIC KEY BLOCK-----");
        let f = self.home.join(format!("{fpr}.rev.asc"));
        write(&f, cert);
        self.run(None, &["--import", f.to_str().expect("utf8")], None);
    }

    /// Runs `--edit-key` commands (answers to its prompts, one a line), then saves.
    fn edit(&self, fpr: &str, commands: &[&str]) {
        let input = format!("{}\nsave\n", commands.join("\n"));
        self.run(None, &["--edit-key", fpr], Some(&input));
    }

    fn export(&self, fpr: &str, out: &Path) {
        let o = self.run(None, &["--export", fpr], None);
        write(out, &o.stdout);
    }
}

/// `gpg --verify` with only `keys` imported: whether the status says GOODSIG.
fn gpg_accepts(dir: &Path, keys: &[PathBuf], sig: &Path) -> (bool, String) {
    let v = Gpg::new(dir.to_path_buf());
    for k in keys {
        v.run(None, &["--import", k.to_str().expect("utf8")], None);
    }
    let o = Command::new("gpg")
        .env("GNUPGHOME", &v.home)
        .args(["--batch", "--status-fd", "1", "--verify"])
        .arg(sig)
        .output()
        .expect("gpg --verify");
    let status = String::from_utf8_lossy(&o.stdout).into_owned();
    let _ = Command::new("gpgconf").env("GNUPGHOME", &v.home).args(["--kill", "all"]).output();
    // gpgme's Verify in containers/image: exactly one signature, and it is good.
    let count = |tag: &str| status.lines().filter(|l| l.starts_with(tag)).count();
    (count("[GNUPG:] NEWSIG") == 1 && count("[GNUPG:] GOODSIG ") == 1, status)
}

struct Case {
    name: &'static str,
    accept: bool,
    /// Signed by a primary key: skopeo 1.9.3 can judge it.
    skopeo: bool,
    /// kata-addons' refusal must say this.
    says: &'static str,
}

#[test]
fn key_validity_matrix() {
    let dir = tempfile::tempdir().expect("temp");
    let t = dir.path();
    let gpg = Gpg::new(t.join("gnupg"));
    let reg = Registry::start();
    let host = reg.host();
    let layer = LayerBuilder::new().file(KERNEL.trim_start_matches('/'), b"kernel").build(Compress::Gzip);
    let img = Image::new(vec![layer]);
    let sigs = t.join("sigs");
    let mut cases = Vec::new();
    let mut policy = serde_json::Map::new();
    let mut verdicts = Vec::new();
    // Each case: a repository of its own, its keys, one signature in the lookaside.
    let mut add = |case: Case, keys: Vec<PathBuf>, make: &dyn Fn(&Path)| {
        let repo = format!("org/{}", case.name);
        let digest = reg.push(&repo, "v1", &img);
        let payload = t.join(format!("{}.json", case.name));
        let body = json!({
            "critical": {
                "identity": {"docker-reference": format!("{host}/{repo}:v1")},
                "image": {"docker-manifest-digest": digest},
                "type": "atomic container signature"
            },
            "optional": {"creator": "kata-addons trust_keys test"}
        });
        write(&payload, body.to_string());
        let sig = sigs.join(format!("{repo}@sha256={}/signature-1", digest.trim_start_matches("sha256:")));
        std::fs::create_dir_all(sig.parent().expect("parent")).expect("mkdir");
        make(&payload);
        std::fs::rename(payload.with_extension("sig"), &sig).expect("signature into the lookaside");
        verdicts.push(gpg_accepts(&t.join(format!("verify-{}", case.name)), &keys, &sig));
        let req = match keys.as_slice() {
            [k] => json!({"type": "signedBy", "keyType": "GPGKeys", "keyPath": k}),
            ks => json!({"type": "signedBy", "keyType": "GPGKeys", "keyPaths": ks}),
        };
        policy.insert(format!("{host}/{repo}"), json!([req]));
        cases.push(case);
    };
    let key_file = |n: &str| t.join(format!("{n}.gpg"));
    let sig_of = |p: &Path| p.with_extension("sig");

    // A valid primary signing key.
    let k = gpg.key("Primary <primary@test>", "sign", "never", None);
    gpg.export(&k, &key_file("primary"));
    add(Case { name: "primary", accept: true, skopeo: true, says: "" }, vec![key_file("primary")], &|p| {
        gpg.sign(&k, p, &sig_of(p), None, None)
    });

    // A valid signing subkey of a certify-only primary key.
    let k = gpg.key("Subkey <subkey@test>", "cert", "never", None);
    let s = gpg.subkey(&k, "sign", "never", None);
    gpg.export(&k, &key_file("subkey"));
    add(Case { name: "subkey", accept: true, skopeo: false, says: "" }, vec![key_file("subkey")], &|p| {
        gpg.sign(&s, p, &sig_of(p), None, None)
    });

    // A signing subkey revoked after it signed.
    let k = gpg.key("Revoked subkey <revsub@test>", "cert", "never", None);
    let s = gpg.subkey(&k, "sign", "never", None);
    let payload_sign = |p: &Path| gpg.sign(&s, p, &sig_of(p), None, None);
    let name = "subkey-revoked";
    let revoke_sub = || gpg.edit(&k, &["key 1", "revkey", "y", "0", "", "y"]);
    add(Case { name, accept: false, skopeo: false, says: "the subkey is revoked" }, vec![key_file(name)], &|p| {
        payload_sign(p);
        revoke_sub();
        gpg.export(&k, &key_file(name));
    });

    // A revoked primary key (its own signature, and its valid subkey's).
    let k = gpg.key("Revoked <revoked@test>", "sign", "never", None);
    let s = gpg.subkey(&k, "sign", "never", None);
    let name = "primary-revoked";
    add(Case { name, accept: false, skopeo: true, says: "the primary key is revoked" }, vec![key_file(name)], &|p| {
        gpg.sign(&k, p, &sig_of(p), None, None);
        gpg.sign(&s, p, &t.join("revoked-by-subkey.sig"), None, None);
        gpg.revoke(&k);
        gpg.export(&k, &key_file(name));
    });
    add(
        Case { name: "primary-revoked-subkey-signs", accept: false, skopeo: false, says: "the primary key is revoked" },
        vec![key_file(name)],
        &|p| std::fs::copy(t.join("revoked-by-subkey.sig"), sig_of(p)).map(drop).expect("copy"),
    );

    // The revocation in a second copy of the key counts (keyPaths: both copies).
    let k = gpg.key("Two copies <copies@test>", "sign", "never", None);
    gpg.export(&k, &key_file("copies-before"));
    add(
        Case { name: "revoked-in-second-copy", accept: false, skopeo: true, says: "the primary key is revoked" },
        vec![key_file("copies-before"), key_file("copies-after")],
        &|p| {
            gpg.sign(&k, p, &sig_of(p), None, None);
            gpg.revoke(&k);
            gpg.export(&k, &key_file("copies-after"));
        },
    );

    // An expired primary key (made and used in 2020, valid for one day).
    let k = gpg.key("Expired <expired@test>", "sign", "1d", Some(PAST));
    gpg.export(&k, &key_file("primary-expired"));
    add(
        Case { name: "primary-expired", accept: false, skopeo: true, says: "the primary key expired" },
        vec![key_file("primary-expired")],
        &|p| gpg.sign(&k, p, &sig_of(p), Some("20200101T120000!"), None),
    );

    // An expired signing subkey.
    let k = gpg.key("Expired subkey <expsub@test>", "cert", "never", Some(PAST));
    let s = gpg.subkey(&k, "sign", "1d", Some(PAST));
    gpg.export(&k, &key_file("subkey-expired"));
    add(
        Case { name: "subkey-expired", accept: false, skopeo: false, says: "the subkey expired" },
        vec![key_file("subkey-expired")],
        &|p| gpg.sign(&s, p, &sig_of(p), Some("20200101T120000!"), None),
    );

    // A signature made after the key's expiry (signed on 5 January, the key expires on the 3rd).
    let k = gpg.key("Late <late@test>", "sign", "never", Some(PAST));
    let name = "signed-after-expiry";
    add(Case { name, accept: false, skopeo: true, says: "the primary key expired" }, vec![key_file(name)], &|p| {
        gpg.sign(&k, p, &sig_of(p), Some("20200105T000000!"), None);
        gpg.run(Some("20200102T000000!"), &["--quick-set-expire", &k, "1d"], None);
        gpg.export(&k, &key_file(name));
    });

    // A subkey whose binding no longer carries the signing flag (changed to authentication).
    let k = gpg.key("Auth subkey <auth@test>", "cert", "never", None);
    let s = gpg.subkey(&k, "sign", "never", None);
    let name = "subkey-not-signing";
    add(Case { name, accept: false, skopeo: false, says: "not bound for signing" }, vec![key_file(name)], &|p| {
        gpg.sign(&s, p, &sig_of(p), None, None);
        gpg.edit(&k, &["key 1", "change-usage", "S", "A", "Q"]);
        gpg.export(&k, &key_file(name));
    });

    // A primary key whose self-signature no longer allows signing.
    let k = gpg.key("Certify only <certonly@test>", "sign", "never", None);
    let name = "primary-not-signing";
    add(Case { name, accept: false, skopeo: true, says: "not flagged for signing" }, vec![key_file(name)], &|p| {
        gpg.sign(&k, p, &sig_of(p), None, None);
        gpg.edit(&k, &["change-usage", "S", "Q"]);
        gpg.export(&k, &key_file(name));
    });

    // A signature that expired (valid for one day in 2020).
    let k = gpg.key("Short signature <shortsig@test>", "sign", "never", Some(PAST));
    gpg.export(&k, &key_file("signature-expired"));
    add(
        Case { name: "signature-expired", accept: false, skopeo: true, says: "the signature expired" },
        vec![key_file("signature-expired")],
        &|p| gpg.sign(&k, p, &sig_of(p), Some("20200101T120000!"), Some("1d")),
    );

    // Two signatures in one message (the listed key's and another's): gpgme's count is not 1.
    let k = gpg.key("Listed <listed@test>", "sign", "never", None);
    let other = gpg.key("Other <other@test>", "sign", "never", None);
    gpg.export(&k, &key_file("two-signatures"));
    add(
        Case { name: "two-signatures", accept: false, skopeo: true, says: "carries 2 signatures" },
        vec![key_file("two-signatures")],
        &|p| {
            let (o, p2) = (sig_of(p), p.to_str().expect("utf8").to_string());
            let (a, b) = (format!("{k}!"), format!("{other}!"));
            gpg.run(None, &["-u", &a, "-u", &b, "--output", o.to_str().expect("utf8"), "--sign", &p2], None);
        },
    );

    let policy_file = t.join("policy.json");
    write(&policy_file, json!({"default": [{"type": "reject"}], "transports": {"docker": policy}}).to_string());
    let regd = t.join("registries.d");
    write(&regd.join("lookaside.yaml"), format!("default-docker:\n  lookaside: file://{}\n", sigs.display()));

    let mut failures = Vec::new();
    for (c, (gpg_ok, status)) in cases.iter().zip(&verdicts) {
        let image = format!("{host}/org/{}:v1", c.name);
        if *gpg_ok != c.accept {
            failures.push(format!("{}: gpg --verify {} (expected {})\n{status}", c.name, gpg_ok, c.accept));
        }
        let dest = tempfile::tempdir().expect("dest");
        let home = tempfile::tempdir().expect("home");
        let k = Command::new(kata_addons_bin())
            .env("HOME", home.path())
            .args(["fetch", "--image", &image, "--path", KERNEL, "--insecure-registry", &host])
            .arg("--dest")
            .arg(dest.path())
            .arg("--signature-policy")
            .arg(&policy_file)
            .arg("--registries-d")
            .arg(&regd)
            .output()
            .expect("kata-addons");
        let stderr = String::from_utf8_lossy(&k.stderr);
        if k.status.success() != c.accept || (!c.accept && !stderr.contains(c.says)) {
            failures.push(format!(
                "{}: kata-addons (expected accept={}, saying {:?})\n{}",
                c.name,
                c.accept,
                c.says,
                show(&k)
            ));
        }
        if c.skopeo {
            let out = t.join(format!("skopeo-{}", c.name));
            let s = Command::new("skopeo")
                .env("HOME", home.path())
                .arg("--policy")
                .arg(&policy_file)
                .arg("--registries.d")
                .arg(&regd)
                .args(["copy", "--quiet", "--remove-signatures", "--src-tls-verify=false"])
                .arg(format!("docker://{image}"))
                .arg(format!("oci:{}:x", out.display()))
                .output()
                .expect("skopeo");
            if s.status.success() != c.accept {
                failures.push(format!("{}: skopeo (expected accept={})\n{}", c.name, c.accept, show(&s)));
            }
        }
    }
    let _ = Command::new("gpgconf").env("GNUPGHOME", &gpg.home).args(["--kill", "all"]).output();
    assert!(failures.is_empty(), "{} of {} cases disagree:\n{}", failures.len(), cases.len(), failures.join("\n\n"));
}
