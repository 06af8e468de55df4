//! Policy and registries.conf fidelity (docs/registries-and-trust.md), with skopeo as the oracle
//! where it can judge: each file is given to `skopeo copy` and to `kata-addons fetch`, on a
//! real registry on 127.0.0.1, and both must load it or refuse it as containers/image does.
//!
//! - remapIdentity prefixes (`validateIdentityRemappingPrefix`);
//! - scopes per transport (`ValidatePolicyConfigurationScope`) and every field's JSON type;
//! - `sigstoreSigned` `pki` (`newPRSigstoreSignedPKI`: caRootsPath or caRootsData required);
//! - registries.conf `[aliases]` (`validateShortName`, `parseShortNameValue`) and the v1
//!   `[registries.search]` list (converted to `unqualified-search-registries`, then validated);
//! - credential helpers are never executed: a warning when the registry is anonymous-readable,
//!   the error of an HTTP 401 names them.

use std::path::Path;
use std::process::{Command, Output};

use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::registry::{Registry, RegistryConfig};
use kata_addons_tests::{kata_addons_bin, show};
use serde_json::{Value, json};

const KERNEL: &str = "/artifacts/kernel/vmlinuz";

fn image() -> Image {
    Image::new(vec![LayerBuilder::new().file(KERNEL.trim_start_matches('/'), b"k").build(Compress::Gzip)])
}

fn write(p: &Path, data: impl AsRef<[u8]>) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

/// `kata-addons fetch` of `image` with `args`, in an empty HOME and an empty node root.
fn fetch(image: &str, args: &[&str]) -> Output {
    fetch_with_path(&std::env::var("PATH").unwrap_or_default(), image, args)
}

/// [`fetch`] with `PATH` set to `path`.
fn fetch_with_path(path: &str, image: &str, args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("home");
    let root = tempfile::tempdir().expect("root");
    let dest = tempfile::tempdir().expect("dest");
    Command::new(kata_addons_bin())
        .env_clear()
        .env("PATH", path)
        .env("HOME", home.path())
        .args(["fetch", "--image", image, "--path", KERNEL, "--timeout", "5", "--retries", "0", "--root"])
        .arg(root.path())
        .arg("--dest")
        .arg(dest.path())
        .args(args)
        .output()
        .expect("run kata-addons")
}

/// `skopeo copy docker://image oci:…` with `args` before `copy` and `copy_args` after.
fn skopeo(image: &str, args: &[&str], copy_args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("home");
    let out = tempfile::tempdir().expect("out");
    Command::new("skopeo")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .args(args)
        .args(["--command-timeout", "30s", "copy", "--retry-times", "0", "--src-tls-verify=false"])
        .args(copy_args)
        .arg(format!("docker://{image}"))
        .arg(format!("oci:{}:t", out.path().join("l").display()))
        .output()
        .expect("run skopeo")
}

/// A policy accepting everything by default, plus `transports`.
fn policy_with(transports: Value) -> String {
    json!({"default": [{"type": "insecureAcceptAnything"}], "transports": transports}).to_string()
}

fn remap(prefix: &str, signed: &str) -> String {
    policy_with(json!({"docker": {"other.example/x": [{
        "type": "signedBy", "keyType": "GPGKeys", "keyPath": "/nonexistent.gpg",
        "signedIdentity": {"type": "remapIdentity", "prefix": prefix, "signedPrefix": signed}
    }]}}))
}

fn sigstore(fields: Value) -> String {
    let mut r = json!({"type": "sigstoreSigned"});
    if let (Some(o), Some(f)) = (r.as_object_mut(), fields.as_object()) {
        o.extend(f.clone());
    }
    policy_with(json!({"docker": {"other.example/x": [r]}}))
}

#[test]
fn policy_loads_as_containers_image_loads_it() {
    let reg = Registry::start();
    let h = reg.host();
    reg.push("lib/kernel", "1", &image());
    let img = format!("{h}/lib/kernel:1");
    let dir = tempfile::tempdir().expect("temp");
    let signed_by = |extra: Value| {
        let mut r = json!({"type": "signedBy", "keyType": "GPGKeys"});
        if let (Some(o), Some(f)) = (r.as_object_mut(), extra.as_object()) {
            o.extend(f.clone());
        }
        policy_with(json!({"docker": {"other.example/x": [r]}}))
    };
    // (case, policy, loads, skopeo 1.9.3 can judge, kata-addons refusal says)
    let cases: Vec<(&str, String, bool, bool, &str)> = vec![
        (
            "remap docker.io/library -> docker.io/testing",
            remap("docker.io/library", "docker.io/testing"),
            true,
            true,
            "",
        ),
        ("remap ns/shortname", remap("ns/shortname", "quay.io/ns/shortname"), true, true, ""),
        ("remap index.docker.io/library", remap("index.docker.io/library", "quay.io/library"), true, true, ""),
        ("remap quay.io/library", remap("quay.io/library", "docker.io/library"), true, true, ""),
        ("remap host:port alone", remap("example.com:5000", "example.org"), true, true, ""),
        ("remap upper-case path", remap("docker.io/Library", "docker.io/testing"), false, true, "is not valid"),
        ("remap trailing slash", remap("quay.io/", "docker.io/testing"), false, true, "is not valid"),
        ("dir scope absolute", policy_with(json!({"dir": {"/var/lib/images": [{"type": "reject"}]}})), true, true, ""),
        (
            "dir scope relative",
            policy_with(json!({"dir": {"var/lib/images": [{"type": "reject"}]}})),
            false,
            true,
            "must be an absolute path",
        ),
        (
            "dir scope not clean",
            policy_with(json!({"dir": {"/var//images": [{"type": "reject"}]}})),
            false,
            true,
            "canonical",
        ),
        (
            "docker-archive scope",
            policy_with(json!({"docker-archive": {"/a.tar": [{"type": "reject"}]}})),
            false,
            true,
            "docker-archive",
        ),
        (
            "sigstoreSigned pki {}",
            sigstore(json!({"pki": {}})),
            false,
            true,
            "at least one of caRootsPath and caRootsData must be specified",
        ),
        (
            // skopeo 1.9.3 predates pki (it refuses the unknown key); containers/image at HEAD loads it.
            "sigstoreSigned pki complete",
            sigstore(json!({"pki": {"caRootsPath": "/etc/pki/roots.pem", "subjectEmail": "a@example.com"}})),
            true,
            false,
            "",
        ),
        (
            "rekorPublicKeyPath a number",
            sigstore(json!({"keyPath": "/k.pub", "rekorPublicKeyPath": 1})),
            false,
            true,
            "rekorPublicKeyPath: expected a string, found a number",
        ),
        (
            "keyPath a number",
            signed_by(json!({"keyPath": 7})),
            false,
            true,
            "keyPath: expected a string, found a number",
        ),
        ("keyPaths a string", signed_by(json!({"keyPaths": "/k.gpg"})), false, true, "keyPaths: expected an array"),
        ("keyPaths with a number", signed_by(json!({"keyPaths": ["/k.gpg", 3]})), false, true, "expected a string"),
        ("keyData a boolean", signed_by(json!({"keyData": true})), false, true, "keyData: expected a string"),
        (
            "keyType a number",
            signed_by(json!({"keyType": 1, "keyPath": "/k.gpg"})),
            false,
            true,
            "keyType: expected a string",
        ),
        (
            "keyPath null",
            signed_by(json!({"keyPath": null})),
            false,
            true,
            "exactly one of keyPath, keyPaths and keyData",
        ),
        (
            "dockerReference a number",
            signed_by(json!({"keyPath": "/k.gpg", "signedIdentity": {"type": "exactReference", "dockerReference": 5}})),
            false,
            true,
            "expected a string, found a number",
        ),
    ];
    let mut failures = Vec::new();
    for (i, (name, policy, loads, judge, says)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("policy-{i}.json"));
        write(&p, policy);
        let ps = p.to_str().expect("utf8");
        let k = fetch(&img, &["--signature-policy", ps, "--insecure-registry", &h]);
        let stderr = String::from_utf8_lossy(&k.stderr);
        if k.status.success() != *loads || (!loads && !stderr.contains(says)) {
            failures
                .push(format!("{name}: kata-addons (expected loads={loads}, saying {says:?})\n{policy}\n{}", show(&k)));
        }
        if *judge {
            let s = skopeo(&img, &["--policy", ps], &[]);
            if s.status.success() != *loads {
                failures.push(format!("{name}: skopeo (expected loads={loads})\n{policy}\n{}", show(&s)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn registries_conf_aliases_and_v1_search_are_validated_at_load() {
    let reg = Registry::start();
    let h = reg.host();
    reg.push("lib/kernel", "1", &image());
    let img = format!("{h}/lib/kernel:1");
    let dir = tempfile::tempdir().expect("temp");
    let policy = dir.path().join("policy.json");
    write(&policy, r#"{"default":[{"type":"insecureAcceptAnything"}]}"#);
    let d = format!("sha256:{}", "a".repeat(64));
    // (case, registries.conf, loads, refusal says)
    let cases: Vec<(&str, String, bool, &str)> = vec![
        ("valid alias", "[aliases]\n\"kernel\" = \"quay.io/lib/kernel\"\n".into(), true, ""),
        ("alias reset (empty value)", "[aliases]\n\"kernel\" = \"\"\n".into(), true, ""),
        (
            "alias value with a tag",
            "[aliases]\n\"kernel\" = \"quay.io/lib/kernel:1\"\n".into(),
            false,
            "must not contain a tag",
        ),
        ("alias value with a digest", format!("[aliases]\n\"kernel\" = \"quay.io/lib/kernel@{d}\"\n"), false, "digest"),
        (
            "alias value without registry",
            "[aliases]\n\"kernel\" = \"lib/kernel\"\n".into(),
            false,
            "must contain registry",
        ),
        ("alias value invalid", "[aliases]\n\"kernel\" = \"quay.io/Lib\"\n".into(), false, "invalid alias"),
        (
            "alias name with a registry",
            "[aliases]\n\"quay.io/kernel\" = \"quay.io/lib/kernel\"\n".into(),
            false,
            "must not contain a registry",
        ),
        (
            "alias name with a tag",
            "[aliases]\n\"kernel:1\" = \"quay.io/lib/kernel\"\n".into(),
            false,
            "must not contain a tag",
        ),
        ("v1 search valid", "[registries.search]\nregistries = [\"quay.io\", \"localhost:5000\"]\n".into(), true, ""),
        (
            "v1 search with a URI scheme",
            "[registries.search]\nregistries = [\"https://quay.io\"]\n".into(),
            false,
            "[registries.search] registries: invalid location \"https://quay.io\": URI schemes are not supported",
        ),
        (
            "v1 search not a host",
            "[registries.search]\nregistries = [\"quay.io/ns\"]\n".into(),
            false,
            "must be host[:port]",
        ),
    ];
    let mut failures = Vec::new();
    for (i, (name, conf, loads, says)) in cases.iter().enumerate() {
        let c = dir.path().join(format!("registries-{i}.conf"));
        write(&c, conf);
        let cs = c.to_str().expect("utf8");
        let k = fetch(&img, &["--registries-conf", cs, "--insecure-registry", &h]);
        let stderr = String::from_utf8_lossy(&k.stderr);
        let named = stderr.contains(says) && stderr.contains(cs);
        if k.status.success() != *loads || !(*loads || named) {
            failures
                .push(format!("{name}: kata-addons (expected loads={loads}, naming {cs} and {says:?})\n{}", show(&k)));
        }
        let s = skopeo(&img, &["--policy", policy.to_str().expect("utf8"), "--registries-conf", cs], &[]);
        if s.status.success() != *loads {
            failures.push(format!("{name}: skopeo (expected loads={loads})\n{}", show(&s)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn credential_helpers_are_reported_never_executed() {
    let open = Registry::start();
    let locked = Registry::start_with(RegistryConfig {
        htpasswd: Some(("puller".into(), "s3cret".into())),
        ..RegistryConfig::default()
    });
    for r in [&open, &locked] {
        r.push("lib/kernel", "1", &image());
    }
    let dir = tempfile::tempdir().expect("temp");
    // A helper that would leave a mark if anything ran it.
    let bin = dir.path().join("bin");
    let mark = dir.path().join("helper-ran");
    write(&bin.join("docker-credential-mark"), format!("#!/bin/sh\ntouch {}\necho '{{}}'\n", mark.display()));
    std::fs::set_permissions(bin.join("docker-credential-mark"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let auth = dir.path().join("auth.json");
    let (o, l) = (open.host(), locked.host());
    write(&auth, json!({"auths": {}, "credHelpers": {&o: "mark", &l: "mark"}}).to_string());
    let conf = dir.path().join("registries.conf");
    write(&conf, "credential-helpers = [\"mark\"]\n");
    let a = auth.to_str().expect("utf8");
    let c = conf.to_str().expect("utf8");
    let run = |host: &str, extra: &[&str]| {
        let mut args = vec!["--insecure-registry", host];
        args.extend_from_slice(extra);
        fetch_with_path(&path, &format!("{host}/lib/kernel:1"), &args)
    };
    let warnings = |out: &Output| -> Vec<String> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains("credential helpers are never executed"))
            .map(str::to_string)
            .collect()
    };

    // Anonymous-readable: the pull proceeds, one warning naming the file and the helper.
    let k = run(&o, &["--auth-file", a]);
    assert!(k.status.success(), "{}", show(&k));
    let w = warnings(&k);
    assert_eq!(w.len(), 1, "one warning expected\n{}", show(&k));
    assert!(w[0].contains(a) && w[0].contains("credHelpers") && w[0].contains("\"mark\""), "{}", show(&k));
    assert!(w[0].contains("anonymous access"), "{}", show(&k));
    // registries.conf credential-helpers: named with its file.
    let k = run(&o, &["--registries-conf", c]);
    assert!(k.status.success(), "{}", show(&k));
    let w = warnings(&k);
    assert!(w.len() == 1 && w[0].contains(c) && w[0].contains("credential-helpers"), "{}", show(&k));

    // HTTP 401: the error names the file and the helper.
    let k = run(&l, &["--auth-file", a]);
    assert_eq!(k.status.code(), Some(1), "{}", show(&k));
    let stderr = String::from_utf8_lossy(&k.stderr);
    assert!(stderr.contains("HTTP 401") && stderr.contains(a) && stderr.contains("\"mark\""), "{}", show(&k));
    assert!(!mark.exists(), "a credential helper was executed");
}
