//! The node's registry configuration, decided as containers/image decides: every case runs
//! `skopeo copy docker://… oci:…` (Debian's skopeo 1.9.3) and `kata-addons fetch` on the
//! same files and asserts the same accept/refuse outcome (docs/registries-and-trust.md).
//!
//! Real `docker-registry` instances on 127.0.0.1, shared by all cases: a plain-HTTP source,
//! a plain-HTTP mirror, a TLS registry (test CA), a mutual-TLS registry and a basic-auth one.
//! Where a mirror must have served the image, the image exists only on the mirror.
//!
//! File placement: kata-addons reads a node root R (`--root R`): `R/etc/containers/…`,
//! `R/var/lib/kubelet/config.json`. skopeo reads `--registries-conf R/etc/containers/registries.conf`,
//! drop-ins and per-host certificates from `$HOME/.config/containers/{registries.conf.d,certs.d}`
//! (its user directories: the system ones under /etc are not touched by tests), and the
//! same `$HOME` auth files. Cases where skopeo cannot decide (it predates a feature, or has
//! no equivalent flag) say why and check kata-addons alone.

use std::path::Path;
use std::process::{Command, Output};

use base64::Engine;
use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::registry::{Registry, RegistryConfig};
use kata_addons_tests::tls::TestCa;
use kata_addons_tests::{kata_addons_bin, show};

const KERNEL: &[u8] = b"nodecfg differential kernel";

/// How skopeo takes part in a case.
enum Skopeo {
    /// Same files, same expected outcome.
    Same,
    /// skopeo cannot decide this case; the reason is documented here.
    Skip(&'static str),
}

struct Case {
    name: &'static str,
    /// Image reference (placeholders: {S} source, {M} mirror, {T} TLS, {MT} mutual TLS,
    /// {A} auth registry, {D} manifest digest).
    image: String,
    /// R/etc/containers/registries.conf (skopeo: --registries-conf).
    conf: Option<String>,
    /// Drop-ins: R/etc/containers/registries.conf.d/NAME and $HOME/.config/containers/registries.conf.d/NAME.
    drop_ins: Vec<(&'static str, String)>,
    /// Files under R only (kata-addons).
    root_files: Vec<(String, Vec<u8>)>,
    /// Files under $HOME (both tools).
    home_files: Vec<(String, Vec<u8>)>,
    /// Environment for both ({H} = $HOME, {R} = root).
    env: Vec<(&'static str, String)>,
    /// Extra kata-addons arguments ({H}, {R}).
    kata_args: Vec<String>,
    /// Extra skopeo copy arguments ({H}, {R}).
    skopeo_args: Vec<String>,
    accept: bool,
    skopeo: Skopeo,
    /// kata-addons' stderr must contain this (message quality: file and entry named).
    stderr_has: Vec<String>,
}

fn case(name: &'static str, image: &str, accept: bool) -> Case {
    Case {
        name,
        image: image.to_string(),
        conf: None,
        drop_ins: Vec::new(),
        root_files: Vec::new(),
        home_files: Vec::new(),
        env: Vec::new(),
        kata_args: Vec::new(),
        skopeo_args: Vec::new(),
        accept,
        skopeo: Skopeo::Same,
        stderr_has: Vec::new(),
    }
}

impl Case {
    fn conf(mut self, c: &str) -> Self {
        self.conf = Some(c.to_string());
        self
    }
    fn drop_in(mut self, n: &'static str, c: &str) -> Self {
        self.drop_ins.push((n, c.to_string()));
        self
    }
    fn root_file(mut self, p: &str, c: &[u8]) -> Self {
        self.root_files.push((p.to_string(), c.to_vec()));
        self
    }
    fn home_file(mut self, p: &str, c: &[u8]) -> Self {
        self.home_files.push((p.to_string(), c.to_vec()));
        self
    }
    fn env(mut self, k: &'static str, v: &str) -> Self {
        self.env.push((k, v.to_string()));
        self
    }
    fn kata(mut self, a: &[&str]) -> Self {
        self.kata_args.extend(a.iter().map(|s| s.to_string()));
        self
    }
    fn skopeo(mut self, a: &[&str]) -> Self {
        self.skopeo_args.extend(a.iter().map(|s| s.to_string()));
        self
    }
    fn skip(mut self, why: &'static str) -> Self {
        self.skopeo = Skopeo::Skip(why);
        self
    }
    fn says(mut self, s: &str) -> Self {
        self.stderr_has.push(s.to_string());
        self
    }
}

struct World {
    src: Registry,
    mirror: Registry,
    tls: Registry,
    mtls: Registry,
    auth: Registry,
    ca: TestCa,
    digest: String,
    policy: tempfile::TempDir,
}

impl World {
    fn subst(&self, s: &str) -> String {
        s.replace("{S}", &self.src.host())
            .replace("{MT}", &self.mtls.host())
            .replace("{M}", &self.mirror.host())
            .replace("{T}", &self.tls.host())
            .replace("{A}", &self.auth.host())
            .replace("{D}", &self.digest)
    }
}

fn world() -> World {
    let img = Image::new(vec![LayerBuilder::new().dir("boot").file("boot/vmlinuz", KERNEL).build(Compress::Gzip)]);
    let src = Registry::start();
    let mirror = Registry::start();
    let ca = TestCa::new();
    let tls = Registry::start_with(RegistryConfig { tls: Some(ca.clone()), ..RegistryConfig::default() });
    let mtls =
        Registry::start_with(RegistryConfig { tls: Some(ca.clone()), client_auth: true, ..RegistryConfig::default() });
    let auth = Registry::start_with(RegistryConfig {
        htpasswd: Some(("puller".into(), "s3cret".into())),
        ..RegistryConfig::default()
    });
    let digest = src.push("lib/kernel", "1", &img);
    // Only on the mirror: a successful pull of these proves the mirror served it.
    mirror.push("mirror/lib/kernel", "1", &img);
    mirror.push("mirror/only/kernel", "1", &img);
    mirror.push("lib/kernel", "1", &img);
    tls.push("lib/kernel", "1", &img);
    mtls.push("lib/kernel", "1", &img);
    auth.push("lib/kernel", "1", &img);
    let policy = tempfile::tempdir().expect("policy dir");
    std::fs::write(policy.path().join("policy.json"), r#"{"default":[{"type":"insecureAcceptAnything"}]}"#)
        .expect("policy.json");
    World { src, mirror, tls, mtls, auth, ca, digest, policy }
}

fn write(path: &Path, data: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, data).expect("write");
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn auth_json(host: &str, user: &str, pass: &str) -> Vec<u8> {
    serde_json::json!({"auths": {host: {"auth": b64(&format!("{user}:{pass}"))}}}).to_string().into_bytes()
}

struct Outcome {
    kata: Output,
    skopeo: Option<Output>,
}

fn run_case(w: &World, c: &Case) -> Outcome {
    let root = tempfile::tempdir().expect("root");
    let home = tempfile::tempdir().expect("home");
    let r = root.path().to_str().expect("utf8").to_string();
    let h = home.path().to_str().expect("utf8").to_string();
    let sub = |s: &str| w.subst(s).replace("{H}", &h).replace("{R}", &r);
    let conf_path = root.path().join("etc/containers/registries.conf");
    write(&conf_path, sub(c.conf.as_deref().unwrap_or("")).as_bytes());
    for (n, t) in &c.drop_ins {
        write(&root.path().join("etc/containers/registries.conf.d").join(n), sub(t).as_bytes());
        write(&home.path().join(".config/containers/registries.conf.d").join(n), sub(t).as_bytes());
    }
    let content = |d: &[u8]| match std::str::from_utf8(d) {
        Ok(t) => sub(t).into_bytes(),
        Err(_) => d.to_vec(),
    };
    for (p, d) in &c.root_files {
        write(&root.path().join(sub(p)), &content(d));
    }
    for (p, d) in &c.home_files {
        write(&home.path().join(sub(p)), &content(d));
    }
    let env: Vec<(&str, String)> = c.env.iter().map(|(k, v)| (*k, sub(v))).collect();
    let image = sub(&c.image);

    let dest = tempfile::tempdir().expect("dest");
    let mut k = Command::new(kata_addons_bin());
    k.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("HOME", &h);
    for (key, v) in &env {
        k.env(key, v);
    }
    k.args(["fetch", "--image", &image, "--path", "/boot/vmlinuz", "--timeout", "5", "--root", &r]);
    k.arg("--dest").arg(dest.path());
    k.args(c.kata_args.iter().map(|a| sub(a)));
    let kata = k.output().expect("run kata-addons");
    if kata.status.success() {
        assert_eq!(std::fs::read(dest.path().join("vmlinuz")).expect("fetched kernel"), KERNEL, "{}", c.name);
    }

    let skopeo = match c.skopeo {
        Skopeo::Skip(_) => None,
        Skopeo::Same => {
            let out = tempfile::tempdir().expect("skopeo out");
            let mut s = Command::new("skopeo");
            s.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("HOME", &h);
            for (key, v) in &env {
                s.env(key, v);
            }
            s.arg("--policy").arg(w.policy.path().join("policy.json"));
            s.arg("--registries-conf").arg(&conf_path);
            s.args(["--command-timeout", "30s", "copy", "--retry-times", "0"]);
            s.args(c.skopeo_args.iter().map(|a| sub(a)));
            s.arg(format!("docker://{image}"));
            s.arg(format!("oci:{}:t", out.path().join("l").display()));
            Some(s.output().expect("run skopeo"))
        }
    };
    Outcome { kata, skopeo }
}

/// Plain-HTTP registries are reached as containers/image reaches them: `insecure = true`.
fn insecure_entries(hosts: &[&str]) -> String {
    hosts.iter().map(|h| format!("[[registry]]\nlocation = \"{h}\"\ninsecure = true\n\n")).collect()
}

fn cases() -> Vec<Case> {
    let ins = insecure_entries(&["{S}", "{M}", "{A}"]);
    let mut v = Vec::new();
    // registries.conf v2
    v.push(case("plain_http_needs_insecure", "{S}/lib/kernel:1", false));
    v.push(case("insecure_source", "{S}/lib/kernel:1", true).conf(&ins));
    v.push(
        case("mirror_served_with_rewrite", "{S}/only/kernel:1", true).conf(&format!(
            "{ins}[[registry]]\nprefix = \"{{S}}/only\"\nlocation = \"{{S}}/only\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{{M}}/mirror/only\"\ninsecure = true\n"
        )),
    );
    v.push(
        case("mco_prefix_empty_idms_never_contact_source", "{S}/lib/kernel@{D}", true).conf(&format!(
            "{ins}[[registry]]\nprefix = \"\"\nlocation = \"{{S}}/lib/kernel\"\nblocked = true\n[[registry.mirror]]\nlocation = \"{{M}}/mirror/lib/kernel\"\ninsecure = true\npull-from-mirror = \"digest-only\"\n"
        ))
        .skip("skopeo 1.9.3 (containers/image 5.23) predates pull-from-mirror; see mco_style_mirror_by_digest_only"),
    );
    v.push(
        case("mco_style_mirror_by_digest_only", "{S}/lib/kernel@{D}", true).conf(&format!(
            "{ins}[[registry]]\nprefix = \"\"\nlocation = \"{{S}}/lib/kernel\"\nblocked = true\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"{{M}}/mirror/lib/kernel\"\ninsecure = true\n"
        )),
    );
    v.push(
        case("mirror_by_digest_only_tag_pull_refused_when_blocked", "{S}/lib/kernel:1", false)
            .conf(&format!(
                "[[registry]]\nprefix = \"\"\nlocation = \"{{S}}/lib/kernel\"\nblocked = true\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"{{M}}/mirror/lib/kernel\"\ninsecure = true\n{}",
                insecure_entries(&["{M}"])
            ))
            .says("blocked by")
            .says("registries.conf: [[registry]] prefix"),
    );
    v.push(
        case("pull_from_mirror_tag_only_skips_digest_pulls", "{S}/lib/kernel@{D}", false)
            .conf(
                "[[registry]]\nlocation = \"{S}/lib/kernel\"\nblocked = true\n[[registry.mirror]]\nlocation = \"{M}/mirror/lib/kernel\"\ninsecure = true\npull-from-mirror = \"tag-only\"\n",
            )
            .skip("skopeo 1.9.3 predates pull-from-mirror (it would use the mirror)")
            .says("blocked by"),
    );
    v.push(
        case("blocked_source_with_mirror_uses_mirror", "{S}/lib/kernel:1", true).conf(
            "[[registry]]\nlocation = \"{S}\"\nblocked = true\n[[registry.mirror]]\nlocation = \"{M}/mirror\"\ninsecure = true\n",
        ),
    );
    v.push(
        case("blocked_without_mirror", "{S}/lib/kernel:1", false)
            .conf("[[registry]]\nlocation = \"{S}\"\nblocked = true\ninsecure = true\n")
            .says("blocked by"),
    );
    v.push(
        case("mirror_without_image_falls_back_to_source", "{S}/lib/kernel:1", true).conf(&format!(
            "[[registry]]\nlocation = \"{{S}}\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{{M}}/nothing-here\"\ninsecure = true\n{}",
            insecure_entries(&["{M}"])
        )),
    );
    v.push(
        case("secure_mirror_fails_then_source", "{S}/lib/kernel:1", true).conf(
            "[[registry]]\nlocation = \"{S}\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{M}/mirror\"\n",
        ),
    );
    v.push(case("wildcard_prefix_mirror", "reg.example.test/lib/kernel:1", true).conf(
        "[[registry]]\nprefix = \"*.example.test\"\n[[registry.mirror]]\nlocation = \"{M}/mirror\"\ninsecure = true\n",
    ));
    v.push(case("longest_prefix_wins", "{S}/lib/kernel:1", true).conf(
        "[[registry]]\nlocation = \"{S}\"\nblocked = true\n\n[[registry]]\nlocation = \"{S}/lib\"\ninsecure = true\n",
    ));
    v.push(case("longest_prefix_wins_blocked", "{S}/lib/kernel:1", false).conf(
        "[[registry]]\nlocation = \"{S}\"\ninsecure = true\n\n[[registry]]\nlocation = \"{S}/lib\"\nblocked = true\n",
    ));
    // registries.conf.d
    v.push(
        case("drop_in_replaces_main_entry", "{S}/lib/kernel:1", true)
            .conf("[[registry]]\nlocation = \"{S}\"\nblocked = true\n")
            .drop_in("50-unblock.conf", "[[registry]]\nlocation = \"{S}\"\ninsecure = true\n"),
    );
    v.push(
        case("drop_ins_lexical_order_last_wins", "{S}/lib/kernel:1", false)
            .drop_in("10-a.conf", "[[registry]]\nlocation = \"{S}\"\ninsecure = true\n")
            .drop_in("20-b.conf", "[[registry]]\nlocation = \"{S}\"\nblocked = true\n")
            .says("20-b.conf"),
    );
    v.push(
        case("drop_in_v1_is_an_error", "{S}/lib/kernel:1", false)
            .conf(&ins)
            .drop_in("10-v1.conf", "[registries.insecure]\nregistries = [\"{S}\"]\n")
            .says("10-v1.conf"),
    );
    // v1
    v.push(case("v1_insecure", "{S}/lib/kernel:1", true).conf("[registries.insecure]\nregistries = [\"{S}\"]\n"));
    v.push(
        case("v1_block", "{S}/lib/kernel:1", false)
            .conf("[registries.block]\nregistries = [\"{S}\"]\n[registries.insecure]\nregistries = [\"{S}\"]\n")
            .says("blocked by"),
    );
    v.push(
        case("v1_v2_mixed_is_an_error", "{S}/lib/kernel:1", false)
            .conf("[registries.insecure]\nregistries = [\"{S}\"]\n[[registry]]\nlocation = \"{M}\"\n")
            .says("mixes"),
    );
    v.push(
        case("scheme_in_location_is_an_error", "{S}/lib/kernel:1", false)
            .conf("[[registry]]\nlocation = \"http://{S}\"\n")
            .says("URI schemes"),
    );
    v.push(
        case("conflicting_insecure_is_an_error", "{S}/lib/kernel:1", false)
            .conf("[[registry]]\nprefix = \"{S}/a\"\nlocation = \"{S}\"\n[[registry]]\nprefix = \"{S}/lib\"\nlocation = \"{S}\"\ninsecure = true\n")
            .says("conflicting"),
    );
    v.push(
        case("unknown_key_is_a_warning", "{S}/lib/kernel:1", true)
            .conf(&format!("{ins}[[registry]]\nlocation = \"{{S}}/lib\"\ninsecure = true\nno-such-key = 1\n"))
            .says("no-such-key"),
    );
    // TLS: insecure and certs.d
    v.push(case("tls_untrusted_refused", "{T}/lib/kernel:1", false));
    v.push(
        case("tls_insecure_skips_verification", "{T}/lib/kernel:1", true)
            .conf("[[registry]]\nlocation = \"{T}\"\ninsecure = true\n"),
    );
    let ca = std::fs::read(TestCa::new().ca_cert).expect("other ca");
    v.push(
        case("certs_d_wrong_ca_refused", "{T}/lib/kernel:1", false)
            .root_file("etc/containers/certs.d/{T}/ca.crt", &ca)
            .home_file(".config/containers/certs.d/{T}/ca.crt", &ca),
    );
    v
}

/// certs.d cases need the world's CA (its bytes), so they are built with it.
fn tls_cases(w: &World) -> Vec<Case> {
    let ca = std::fs::read(&w.ca.ca_cert).expect("ca");
    let client = tempfile::tempdir().expect("client");
    w.ca.client_pair(client.path());
    let cert = std::fs::read(client.path().join("client.cert")).expect("client.cert");
    let key = std::fs::read(client.path().join("client.key")).expect("client.key");
    let garbage = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n".to_vec();
    let both = |c: Case, p: &str, d: &[u8]| {
        c.root_file(&format!("etc/containers/certs.d/{p}"), d).home_file(&format!(".config/containers/certs.d/{p}"), d)
    };
    let v = vec![
        both(case("certs_d_host_ca", "{T}/lib/kernel:1", true), "{T}/ca.crt", &ca),
        both(case("certs_d_other_host_ca_not_trusted", "{T}/lib/kernel:1", false), "other.example:5000/ca.crt", &ca),
        both(
            both(case("certs_d_bad_crt_warned_and_ignored", "{T}/lib/kernel:1", true), "{T}/ca.crt", &ca),
            "{T}/0-bad.crt",
            &garbage,
        )
        .says("0-bad.crt"),
        both(
            both(case("certs_d_other_host_broken_no_effect", "{T}/lib/kernel:1", true), "{T}/ca.crt", &ca),
            "other.example/client.cert",
            &cert,
        ),
        both(
            both(case("certs_d_cert_without_key_fails_host", "{T}/lib/kernel:1", false), "{T}/ca.crt", &ca),
            "{T}/client.cert",
            &cert,
        )
        .says("client.key"),
        both(
            both(
                both(case("mtls_client_cert", "{MT}/lib/kernel:1", true), "{MT}/ca.crt", &ca),
                "{MT}/client.cert",
                &cert,
            ),
            "{MT}/client.key",
            &key,
        ),
        both(case("mtls_without_client_cert_refused", "{MT}/lib/kernel:1", false), "{MT}/ca.crt", &ca),
        case("docker_certs_d_used_when_containers_has_no_entry", "{T}/lib/kernel:1", true)
            .root_file("etc/docker/certs.d/{T}/ca.crt", &ca)
            .home_file(".config/containers/certs.d/{T}/ca.crt", &ca),
        case("first_certs_dir_with_host_entry_wins", "{T}/lib/kernel:1", false)
            .root_file("etc/containers/certs.d/{T}/README", b"empty on purpose")
            .root_file("etc/docker/certs.d/{T}/ca.crt", &ca)
            .home_file(".config/containers/certs.d/{T}/README", b"empty on purpose"),
        case("cert_dir_flag_global_crt", "{T}/lib/kernel:1", true)
            .home_file("cd/ca.crt", &ca)
            .kata(&["--cert-dir", "{H}/cd"])
            .skopeo(&["--src-cert-dir", "{H}/cd"]),
        case("cert_dir_flag_per_host_subdir", "{T}/lib/kernel:1", true)
            .home_file("cd/{T}/ca.crt", &ca)
            .kata(&["--cert-dir", "{H}/cd"])
            .skip("skopeo --src-cert-dir reads only files directly in DIR; ours also takes DIR/<host>/ (certs.d form)"),
        case("cert_dir_flag_replaces_node_certs_d", "{T}/lib/kernel:1", false)
            .root_file("etc/containers/certs.d/{T}/ca.crt", &ca)
            .home_file("cd/README", b"no certificates")
            .kata(&["--cert-dir", "{H}/cd"])
            .skopeo(&["--src-cert-dir", "{H}/cd"]),
        case("node_ca_bundle_added_to_roots", "{T}/lib/kernel:1", true)
            .root_file("etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", &ca)
            .skip("skopeo reads the machine's own CA store, which tests do not modify"),
    ];
    drop(client);
    v
}

fn auth_cases() -> Vec<Case> {
    let ins = insecure_entries(&["{A}"]);
    let good = |host: &str| auth_json(host, "puller", "s3cret");
    let mut v = Vec::new();
    v.push(case("auth_required_no_credentials", "{A}/lib/kernel:1", false).conf(&ins).says("no credentials found"));
    v.push(
        case("auth_file_flag", "{A}/lib/kernel:1", true)
            .conf(&ins)
            .home_file("a.json", &good("{A}"))
            .kata(&["--auth-file", "{H}/a.json"])
            .skopeo(&["--src-authfile", "{H}/a.json"]),
    );
    v.push(
        case("auth_wrong_password", "{A}/lib/kernel:1", false)
            .conf(&ins)
            .home_file("a.json", &auth_json("{A}", "puller", "wrong"))
            .kata(&["--auth-file", "{H}/a.json"])
            .skopeo(&["--src-authfile", "{H}/a.json"])
            .says("a.json"),
    );
    v.push(
        case("auth_explicit_file_is_the_only_one", "{A}/lib/kernel:1", false)
            .conf(&ins)
            .home_file("a.json", br#"{"auths":{}}"#)
            .home_file(".docker/config.json", &good("{A}"))
            .kata(&["--auth-file", "{H}/a.json"])
            .skip(
                "skopeo 1.9.3 (containers/image 5.23) still searches ~/.docker/config.json after --authfile; \
                 current containers/image (getAuthFilePaths) reads only the named file, as we do",
            ),
    );
    v.push(
        case("auth_registry_auth_file_env", "{A}/lib/kernel:1", true)
            .conf(&ins)
            .home_file("env.json", &good("{A}"))
            .env("REGISTRY_AUTH_FILE", "{H}/env.json"),
    );
    v.push(
        case("auth_xdg_runtime_dir", "{A}/lib/kernel:1", true)
            .conf(&ins)
            .home_file("run/containers/auth.json", &good("{A}"))
            .env("XDG_RUNTIME_DIR", "{H}/run"),
    );
    v.push(
        case("auth_config_containers_auth_json", "{A}/lib/kernel:1", true)
            .conf(&ins)
            .home_file(".config/containers/auth.json", &good("{A}")),
    );
    v.push(
        case("auth_docker_config_json", "{A}/lib/kernel:1", true)
            .conf(&ins)
            .home_file(".docker/config.json", &good("{A}")),
    );
    v.push(
        case("auth_docker_config_env", "{A}/lib/kernel:1", true)
            .conf(&ins)
            .home_file("dc/config.json", &good("{A}"))
            .env("DOCKER_CONFIG", "{H}/dc"),
    );
    v.push(
        case("auth_most_specific_key_wins", "{A}/lib/kernel:1", true).conf(&ins).home_file(
            ".docker/config.json",
            serde_json::json!({"auths": {
                "{A}": {"auth": b64("puller:wrong")},
                "{A}/lib": {"auth": b64("puller:s3cret")},
            }})
            .to_string()
            .as_bytes(),
        ),
    );
    v.push(
        case("auth_most_specific_key_wins_refused", "{A}/lib/kernel:1", false).conf(&ins).home_file(
            ".docker/config.json",
            serde_json::json!({"auths": {
                "{A}": {"auth": b64("puller:s3cret")},
                "{A}/lib/kernel": {"auth": b64("puller:wrong")},
            }})
            .to_string()
            .as_bytes(),
        ),
    );
    v.push(
        case("auth_cred_helper_named_on_401", "{A}/lib/kernel:1", false)
            .conf(&ins)
            .home_file(
                ".docker/config.json",
                serde_json::json!({"auths": {}, "credHelpers": {"{A}": "kata-test-helper"}}).to_string().as_bytes(),
            )
            .says("kata-test-helper")
            .says("config.json"),
    );
    v.push(
        case("auth_node_pull_secret", "{A}/lib/kernel:1", true)
            .conf(&ins)
            .root_file("var/lib/kubelet/config.json", &good("{A}"))
            .home_file("ps.json", &good("{A}"))
            .skopeo(&["--src-authfile", "{H}/ps.json"]),
    );
    v
}

#[test]
fn same_decision_as_skopeo() {
    let started = std::time::Instant::now();
    let w = world();
    let mut all = cases();
    all.extend(tls_cases(&w));
    all.extend(auth_cases());
    let mut failures = Vec::new();
    let mut compared = 0;
    let mut skipped = Vec::new();
    for c in &all {
        let o = run_case(&w, c);
        let kata_ok = o.kata.status.success();
        if kata_ok != c.accept {
            failures.push(format!(
                "{}: kata-addons {} (expected {})\n{}",
                c.name,
                if kata_ok { "accepted" } else { "refused" },
                if c.accept { "accept" } else { "refuse" },
                show(&o.kata)
            ));
        }
        if !kata_ok {
            assert_eq!(o.kata.status.code(), Some(1), "{}: exit code\n{}", c.name, show(&o.kata));
        }
        let stderr = String::from_utf8_lossy(&o.kata.stderr);
        for s in &c.stderr_has {
            let s = w.subst(s);
            if !stderr.contains(&s) {
                failures.push(format!("{}: stderr lacks {s:?}\n{}", c.name, show(&o.kata)));
            }
        }
        if let Skopeo::Skip(why) = c.skopeo {
            skipped.push(format!("{}: {why}", c.name));
        }
        if let Some(s) = &o.skopeo {
            compared += 1;
            if s.status.success() != c.accept {
                failures.push(format!(
                    "{}: skopeo {} (expected {})\n{}",
                    c.name,
                    if s.status.success() { "accepted" } else { "refused" },
                    if c.accept { "accept" } else { "refuse" },
                    show(s)
                ));
            }
        }
    }
    eprintln!("{} cases, {} compared with skopeo, {:.1} s", all.len(), compared, started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
}

/// `install --root R` where `R/etc/containers` and `R/var/lib/kubelet/config.json` hold the
/// only configuration: an ImageDigestMirrorSet as the machine-config operator writes it
/// (`prefix = ""`, source blocked = `NeverContactSource`, digest-only mirror), the mirror on
/// TLS with its CA in `R/etc/docker/certs.d/<mirror>/`, and basic auth from the node pull secret.
#[test]
fn install_root_idms_mirror_with_node_pull_secret() {
    use kata_addons_tests::node::Node;
    let ca = TestCa::new();
    let mirror = Registry::start_with(RegistryConfig {
        htpasswd: Some(("cluster".into(), "pull-secret-pw".into())),
        tls: Some(ca.clone()),
        ..RegistryConfig::default()
    });
    let img = Image::new(vec![LayerBuilder::new().dir("boot").file("boot/vmlinuz", KERNEL).build(Compress::Gzip)]);
    let digest = mirror.push("mirror/org/kernel", "1", &img);
    let m = mirror.host();
    let node = Node::new();
    let r = node.root();
    write(
        &r.join("etc/containers/registries.conf"),
        format!(
            "unqualified-search-registries = [\"registry.access.redhat.com\", \"docker.io\"]\nshort-name-mode = \"\"\n\n\
             [[registry]]\n  prefix = \"\"\n  location = \"quay.example.test/org/kernel\"\n  blocked = true\n\n\
             [[registry.mirror]]\n    location = \"{m}/mirror/org/kernel\"\n    pull-from-mirror = \"digest-only\"\n"
        )
        .as_bytes(),
    );
    write(&r.join(format!("etc/docker/certs.d/{m}/ca.crt")), &std::fs::read(&ca.ca_cert).expect("ca"));
    write(&r.join("var/lib/kubelet/config.json"), &auth_json(&m, "cluster", "pull-secret-pw"));
    let home = tempfile::tempdir().expect("home");
    let run = |image: &str| {
        Command::new(kata_addons_bin())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("ADDON_IMAGE", image)
            .env("ADDON_KERNEL_PATH", "/boot/vmlinuz")
            .args(["install", "--root"])
            .arg(r)
            .args(["--timeout", "5"])
            .output()
            .expect("run kata-addons")
    };
    // By tag: the digest-only mirror is not used and the source is blocked: refused, nothing
    // written (the node lock file and empty directories are install's own machinery).
    let files = |root: &Path| {
        let mut s = kata_addons_tests::node::content_snapshot(root);
        s.retain(|k, _| k != "run" && k != "run/kata-addons.lock");
        s
    };
    let before = files(r);
    let o = run("quay.example.test/org/kernel:1");
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("blocked by") && err.contains("registries.conf: [[registry]] prefix"), "{}", show(&o));
    assert_eq!(files(r), before, "a refused pull wrote to the node");
    // By digest: pulled from the mirror with the node's pull secret and CA.
    let o = run(&format!("quay.example.test/org/kernel@{digest}"));
    assert!(o.status.success(), "{}", show(&o));
    let kernel = node.qemu_key("se", "kernel").expect("kernel configured");
    assert_eq!(std::fs::read(node.path(&kernel)).expect("installed kernel"), KERNEL);
    assert!(
        !mirror.requests_matching(&format!("/v2/mirror/org/kernel/manifests/{digest}")).is_empty(),
        "{}",
        mirror.log()
    );
}
