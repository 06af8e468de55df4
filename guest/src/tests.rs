//! Unit tests: every rule of docs/design.md#configmap-keys and docs/design.md#providers,
//! accepted and rejected.

use crate::*;
use alloc::string::String;
use alloc::vec::Vec;
use kata_addons_facts::{HEADER, INSTALL_DIR};

/// Runtime configuration facts with just the path (what the runner read is not needed here).
fn rcs(paths: &[&str]) -> Vec<RuntimeConfigFacts> {
    paths
        .iter()
        .map(|p| RuntimeConfigFacts {
            path: String::from(*p),
            handler: None,
            keys: Vec::new(),
            extensions: Vec::new(),
            extensions_from: None,
        })
        .collect()
}

const IMG: &str = "quay.io/openshift_sandboxed_containers/kata-se-artifacts:v1.0";
const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn kv(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
    pairs.iter().map(|(n, v)| KeyValue::new(*n, *v)).collect()
}

fn env_ok(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    match env(&kv(pairs)) {
        Ok(e) => e.into_iter().map(|k| (k.name, k.value)).collect(),
        Err(v) => panic!("expected ok for {pairs:?}, got {v:#?}"),
    }
}

fn env_err(pairs: &[(&str, &str)]) -> Vec<Violation> {
    match env(&kv(pairs)) {
        Ok(e) => panic!("expected violations for {pairs:?}, got {e:?}"),
        Err(v) => v,
    }
}

fn codes(v: &[Violation]) -> Vec<(&str, ViolationCode)> {
    v.iter().map(|v| (v.key.as_str(), v.code)).collect()
}

fn image_err(image: &str) -> Vec<Violation> {
    env_err(&[("addonImage", image), ("kernelPath", "/k")])
}

fn image_ok(image: &str) -> String {
    let e = env_ok(&[("addonImage", image), ("kernelPath", "/k")]);
    e[0].1.clone()
}

/// `plan` with the default node options (kata-deploy prefix `/opt/kata`).
fn plan(env: &[KeyValue]) -> Result<Plan, Vec<Violation>> {
    crate::plan(env, &NodeOptions::default())
}

/// `render` for the plan's first candidate (the OpenShift file) only: its one drop-in's text.
fn render(p: &Plan, installed: &[InstalledFile]) -> Result<String, Vec<Violation>> {
    let first: Vec<&str> = p.runtime_configs.iter().take(1).map(String::as_str).collect();
    crate::render(p, installed, &rcs(&first)).map(|d| {
        assert_eq!(d.len(), 1, "one drop-in per runtime config");
        d.into_iter().map(|d| d.contents).collect()
    })
}

fn plan_ok(pairs: &[(&str, &str)]) -> Plan {
    match plan(&kv(pairs)) {
        Ok(p) => p,
        Err(v) => panic!("expected a plan for {pairs:?}, got {v:#?}"),
    }
}

#[test]
fn the_se_kernel_example() {
    let e = env_ok(&[("addonImage", IMG), ("kernelPath", "/artifacts/kernel/vmlinuz")]);
    assert_eq!(
        e,
        [
            ("ADDON_IMAGE".into(), IMG.into()),
            ("ADDON_PROVIDER".into(), "se".into()),
            ("ADDON_VERSION".into(), "v1.0".into()),
            ("ADDON_KERNEL_PATH".into(), "/artifacts/kernel/vmlinuz".into()),
        ]
    );
}

#[test]
fn env_fixed_order_with_everything() {
    let e = env_ok(&[
        ("imageSha256", HEX),
        ("kernelSha256", HEX),
        ("imagePath", "/i.img"),
        ("kernelPath", "/k"),
        ("version", "2.0+x"),
        ("provider", "tdx"),
        ("addonImage", "quay.io/a/b:v1"),
    ]);
    let names: Vec<&str> = e.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "ADDON_IMAGE",
            "ADDON_PROVIDER",
            "ADDON_VERSION",
            "ADDON_KERNEL_PATH",
            "ADDON_IMAGE_PATH",
            "ADDON_KERNEL_SHA256",
            "ADDON_IMAGE_SHA256"
        ]
    );
    assert_eq!(e[2].1, "2.0+x");
}

#[test]
fn env_round_trips_through_plan() {
    let e = env(&kv(&[("addonImage", "quay.io/a/b"), ("kernelPath", "/k"), ("initrdPath", "/i"), ("provider", "snp")]))
        .expect("env");
    let p = plan(&e).expect("plan");
    assert_eq!(p.image, "quay.io/a/b:latest");
    assert_eq!(p.version, "latest");
    assert_eq!(p.provider, Provider::Snp);
    assert_eq!(env(&kv(&[("addonImage", &p.image), ("kernelPath", "/k")])).map(|e| e[0].value.clone()), Ok(p.image));
}

#[test]
fn values_are_trimmed_and_empty_is_absent() {
    let e =
        env_ok(&[("addonImage", "  quay.io/a/b:v1 \n"), ("kernelPath", "\t/k "), ("provider", "  "), ("version", "")]);
    assert_eq!(e[0].1, "quay.io/a/b:v1");
    assert_eq!(e[1].1, "se");
    assert_eq!(e[2].1, "v1");
    assert_eq!(e[3].1, "/k");
    let v = env_err(&[("addonImage", "   "), ("kernelPath", "/k")]);
    assert_eq!(codes(&v), [("addonImage", ViolationCode::Missing)]);
}

#[test]
fn duplicate_keys_are_errors() {
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("kernelPath", "/k"), ("kernelPath", "/x")]);
    assert_eq!(codes(&v), [("kernelPath", ViolationCode::Conflict)]);
    let v = env_err(&[("addonImage", IMG), ("addonImage", IMG), ("kernelPath", "/k")]);
    assert_eq!(codes(&v), [("addonImage", ViolationCode::Conflict)]);
}

#[test]
fn unknown_keys_suggest_the_closest() {
    let v = env_err(&[("addonImage", IMG), ("kernelpath", "/k")]);
    assert_eq!(codes(&v), [("kernelpath", ViolationCode::UnknownKey), ("kernelPath", ViolationCode::Missing)]);
    assert!(v[0].message.contains("did you mean `kernelPath`?"), "{}", v[0].message);
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("ADDON_VERSION", "1")]);
    assert!(v[0].message.contains("did you mean `version`?"), "{}", v[0].message);
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("zzzzzz", "1")]);
    assert!(v[0].message.contains("known keys are addonImage"), "{}", v[0].message);
    let v = plan(&kv(&[("ADDON_IMAGE", IMG), ("ADDON_KERNEL_PATH", "/k"), ("ADDON_KERNELSHA256", HEX)]))
        .expect_err("unknown");
    assert_eq!(codes(&v), [("ADDON_KERNELSHA256", ViolationCode::UnknownKey)]);
    assert!(v[0].message.contains("did you mean `ADDON_KERNEL_SHA256`?"), "{}", v[0].message);
    let v = plan(&kv(&[("ADDON_IMAGE", IMG), ("kernelPath", "/k")])).expect_err("data key in env");
    assert_eq!(codes(&v), [("kernelPath", ViolationCode::UnknownKey), ("ADDON_KERNEL_PATH", ViolationCode::Missing)]);
    assert!(v[0].message.contains("did you mean `ADDON_KERNEL_PATH`?"), "{}", v[0].message);
    // Control characters in unknown keys are escaped in messages.
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("a\nb", "")]);
    assert!(!v[0].message.contains('\n'));
}

#[test]
fn all_violations_are_reported_at_once() {
    let v = env_err(&[
        ("addonImage", "Quay.io/A/B:v1"),
        ("provider", "SE"),
        ("version", "-bad"),
        ("initrdPath", "relative"),
        ("imagePath", "/a/../b"),
        ("kernelSha256", "XYZ"),
        ("typo", "x"),
    ]);
    let c = codes(&v);
    for want in [
        ("typo", ViolationCode::UnknownKey),
        ("addonImage", ViolationCode::InvalidReference),
        ("provider", ViolationCode::InvalidProvider),
        ("version", ViolationCode::InvalidVersion),
        ("initrdPath", ViolationCode::InvalidPath),
        ("imagePath", ViolationCode::InvalidPath),
        ("imagePath", ViolationCode::Conflict),
        ("kernelSha256", ViolationCode::InvalidSha256),
        ("kernelSha256", ViolationCode::Inconsistent),
    ] {
        assert!(c.contains(&want), "{want:?} missing from {c:?}");
    }
}

#[test]
fn image_is_required() {
    let v = env_err(&[("kernelPath", "/k")]);
    assert_eq!(codes(&v), [("addonImage", ViolationCode::Missing)]);
}

#[test]
fn registry_references_accepted() {
    assert_eq!(image_ok("quay.io/a/b:v1"), "quay.io/a/b:v1");
    assert_eq!(image_ok("quay.io/a/b"), "quay.io/a/b:latest");
    assert_eq!(image_ok("localhost/b"), "localhost/b:latest");
    assert_eq!(image_ok("localhost:5000/a/b:x_"), "localhost:5000/a/b:x_");
    assert_eq!(image_ok("127.0.0.1:5000/a-b/c__d/e.f/g--h:1.0-rc_1"), "127.0.0.1:5000/a-b/c__d/e.f/g--h:1.0-rc_1");
    assert_eq!(image_ok("my-registry.example.com:65535/x:v1"), "my-registry.example.com:65535/x:v1");
    let d = alloc::format!("quay.io/a/b@sha256:{HEX}");
    assert_eq!(image_ok(&d), d);
    let d = alloc::format!("quay.io/a/b:v2@sha256:{HEX}");
    assert_eq!(image_ok(&d), d);
    let tag128 = alloc::format!("quay.io/a/b:{}", "t".repeat(128));
    assert_eq!(image_ok(&tag128), tag128);
}

#[test]
fn registry_references_rejected() {
    for bad in [
        "busybox",
        "busybox:1.36",
        "library/busybox:1",
        "quay.io",
        "quay.io/",
        "quay.io//b",
        "quay.io/a/",
        "quay.io/A/b",
        "quay.io/a/b_",
        "quay.io/a/b___c",
        "quay.io/a/-b",
        "quay.io/a/b:",
        "quay.io/a/b:.v1",
        "quay.io/a/b:-v1",
        "quay.io/a/b:v 1",
        "quay.io/a/b@sha256:abc",
        "quay.io/a/b@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
        "quay.io/a/b@sha512:abc",
        "quay.io/a/b@",
        "quay.io/a/b@x@y",
        "quay.io:0/a",
        "quay.io:65536/a",
        "quay.io:05000/a",
        "quay.io:port/a",
        "-quay.io/a",
        "quay..io/a",
        "qu_ay.io/a",
        "[::1/a",
        "[zz::1]/a",
        "[::1]x/a",
        // containers/image reads no bracketed IPv6 registry host: refused, not half-accepted.
        "[::1]:5000/a/b:v1",
        "[fe80::1]/a:v1",
        "docker://quay.io/a/b",
        "oci:relative/layout",
        "oci:/a/../b",
        "oci:/a:",
        "oci:/a:.bad",
        "oci:/",
    ] {
        let v = image_err(bad);
        assert!(v.iter().all(|v| v.key == "addonImage" && v.code == ViolationCode::InvalidReference), "{bad}: {v:?}");
    }
    let tag129 = alloc::format!("quay.io/a/b:{}", "t".repeat(129));
    assert_eq!(codes(&image_err(&tag129))[0].1, ViolationCode::InvalidReference);
    let long = alloc::format!("quay.io/{}:v1", "a".repeat(250));
    assert_eq!(codes(&image_err(&long))[0].1, ViolationCode::InvalidReference);
}

#[test]
fn docker_hub_names_are_normalised_once_and_judged_by_their_normalised_length() {
    assert_eq!(image_ok("docker.io/ubuntu"), "docker.io/library/ubuntu:latest");
    assert_eq!(image_ok("index.docker.io/a/b:v1"), "docker.io/a/b:v1");
    // `docker.io/library/` + 237 = 255 bytes: the longest name.
    let ok = alloc::format!("docker.io/{}", "a".repeat(237));
    assert_eq!(image_ok(&ok), alloc::format!("docker.io/library/{}:latest", "a".repeat(237)));
    // 238-245 fit in 255 bytes as written, not once `library/` is added.
    for n in 238..=245 {
        let v = image_err(&alloc::format!("docker.io/{}:v1", "a".repeat(n)));
        assert_eq!(codes(&v), [("addonImage", ViolationCode::InvalidReference)], "{n}");
        assert!(v[0].message.contains(&alloc::format!("is {} bytes long", n + 18)), "{}", v[0].message);
    }
}

#[test]
fn ipv6_registry_hosts_are_refused_with_advice() {
    let v = image_err("[::1]:5000/a/b:v1");
    assert_eq!(codes(&v), [("addonImage", ViolationCode::InvalidReference)]);
    assert!(v[0].message.contains("IPv6") && v[0].message.contains("IPv4"), "{}", v[0].message);
}

#[test]
fn reference_messages_help() {
    let v = image_err("busybox:1.36");
    assert!(v[0].message.contains("docker.io/library/busybox:1.36"), "{}", v[0].message);
    let v = image_err("library/busybox");
    assert!(v[0].message.contains("docker.io/library/busybox"), "{}", v[0].message);
    let v = image_err("quay.io/a/b@sha512:abc");
    assert!(v[0].message.contains("sha256:"), "{}", v[0].message);
    let v = image_err("quay.io/A/b");
    assert!(v[0].message.contains("lowercase"), "{}", v[0].message);
    // Several problems in one reference are all reported.
    let v = image_err("quay.io/A/b:.x@sha1:00");
    assert_eq!(v.len(), 3, "{v:?}");
}

#[test]
fn parsed_registry_source() {
    let p = plan_ok(&[("ADDON_IMAGE", "127.0.0.1:5000/a/b"), ("ADDON_KERNEL_PATH", "/k")]);
    assert_eq!(
        p.source,
        ImageSource::Registry(RegistryRef {
            registry: "127.0.0.1:5000".into(),
            repository: "a/b".into(),
            tag: Some("latest".into()),
            digest: None,
        })
    );
    let img = alloc::format!("quay.io/a/b@sha256:{HEX}");
    let p = plan_ok(&[("ADDON_IMAGE", &img), ("ADDON_KERNEL_PATH", "/k")]);
    assert_eq!(p.version, "sha256-0123456789ab");
    assert_eq!(p.image, img);
    match p.source {
        ImageSource::Registry(r) => {
            assert_eq!(r.tag, None);
            assert_eq!(r.digest.as_deref(), Some(&alloc::format!("sha256:{HEX}")[..]));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn layout_references() {
    let p = plan_ok(&[("ADDON_IMAGE", "oci:/var/lib/layout:v3"), ("ADDON_KERNEL_PATH", "/k")]);
    assert_eq!(p.image, "oci:/var/lib/layout:v3");
    assert_eq!(p.version, "v3");
    assert_eq!(p.source, ImageSource::Layout(LayoutRef { path: "/var/lib/layout".into(), tag: Some("v3".into()) }));
    let p = plan_ok(&[("ADDON_IMAGE", "oci:/a:b/layout"), ("ADDON_KERNEL_PATH", "/k")]);
    assert_eq!(p.image, "oci:/a:b/layout");
    assert_eq!(p.version, "latest");
    assert_eq!(p.source, ImageSource::Layout(LayoutRef { path: "/a:b/layout".into(), tag: None }));
}

#[test]
fn version_rules() {
    let e = env_ok(&[("addonImage", "quay.io/a/b:_t"), ("kernelPath", "/k"), ("version", "v1")]);
    assert_eq!(e[2].1, "v1");
    // A tag starting with `_` is a valid tag but not a valid version.
    let v = env_err(&[("addonImage", "quay.io/a/b:_t"), ("kernelPath", "/k")]);
    assert_eq!(codes(&v), [("version", ViolationCode::InvalidVersion)]);
    for bad in ["-v", ".v", "v/1", "v 1", "v:1", "ü"] {
        let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("version", bad)]);
        assert_eq!(codes(&v), [("version", ViolationCode::InvalidVersion)], "{bad}");
    }
    let v128 = "v".repeat(128);
    assert_eq!(env_ok(&[("addonImage", IMG), ("kernelPath", "/k"), ("version", &v128)])[2].1, v128);
    let v129 = "v".repeat(129);
    assert_eq!(
        codes(&env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("version", &v129)]))[0].1,
        ViolationCode::InvalidVersion
    );
}

#[test]
fn providers() {
    for (name, prov, cfg) in [
        ("se", Provider::Se, "/etc/kata-containers/kata-se/configuration.toml"),
        ("tdx", Provider::Tdx, "/etc/kata-containers/kata-tdx/configuration.toml"),
        ("snp", Provider::Snp, "/etc/kata-containers/kata-snp/configuration.toml"),
    ] {
        let p = plan_ok(&[("ADDON_IMAGE", IMG), ("ADDON_PROVIDER", name), ("ADDON_KERNEL_PATH", "/k")]);
        assert_eq!(p.provider, prov);
        let d = "/opt/kata/share/defaults/kata-containers";
        assert_eq!(
            p.runtime_configs,
            [
                cfg.into(),
                alloc::format!("{d}/configuration-qemu-{name}.toml"),
                alloc::format!("{d}/runtimes/qemu-{name}/configuration-qemu-{name}.toml"),
                alloc::format!("{d}/runtime-rs/configuration-qemu-{name}-runtime-rs.toml"),
                alloc::format!(
                    "{d}/runtime-rs/runtimes/qemu-{name}-runtime-rs/configuration-qemu-{name}-runtime-rs.toml"
                ),
            ] as [String; 5]
        );
        assert!(p.runtime_classes.is_empty());
        assert!(p.artifacts.iter().all(|a| a.verity.is_none() && a.name.is_none()));
    }
    for bad in ["SE", "sev", "qemu"] {
        let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("provider", bad)]);
        assert_eq!(codes(&v), [("provider", ViolationCode::InvalidProvider)]);
        assert!(v[0].message.contains("`se`, `tdx` and `snp`"));
    }
}

#[test]
fn se_allows_kernel_only() {
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("initrdPath", "/i")]);
    assert_eq!(codes(&v), [("initrdPath", ViolationCode::NotAllowed)]);
    let v = env_err(&[("addonImage", IMG), ("imagePath", "/i")]);
    assert_eq!(codes(&v), [("imagePath", ViolationCode::NotAllowed)]);
    let v = plan(&kv(&[("ADDON_IMAGE", IMG), ("ADDON_IMAGE_PATH", "/i")])).expect_err("se image");
    assert_eq!(codes(&v), [("ADDON_IMAGE_PATH", ViolationCode::NotAllowed)]);
}

#[test]
fn tdx_and_snp_artifacts() {
    let p = plan_ok(&[
        ("ADDON_IMAGE", IMG),
        ("ADDON_PROVIDER", "tdx"),
        ("ADDON_IMAGE_PATH", "/img"),
        ("ADDON_KERNEL_PATH", "/k"),
        ("ADDON_IMAGE_SHA256", HEX),
    ]);
    let kinds: Vec<(ArtifactKind, &str, &str, Option<&str>)> =
        p.artifacts.iter().map(|a| (a.kind, a.source.as_str(), a.file_name.as_str(), a.sha256.as_deref())).collect();
    assert_eq!(
        kinds,
        [(ArtifactKind::Kernel, "/k", "kernel", None), (ArtifactKind::Image, "/img", "image", Some(HEX))]
    );
    let p = plan_ok(&[("ADDON_IMAGE", IMG), ("ADDON_PROVIDER", "snp"), ("ADDON_INITRD_PATH", "/i")]);
    assert_eq!(p.artifacts.len(), 1);
    assert_eq!(p.artifacts[0].kind, ArtifactKind::Initrd);
    assert_eq!(p.artifacts[0].file_name, "initrd");
}

#[test]
fn artifact_presence_rules() {
    let v = env_err(&[("addonImage", IMG)]);
    assert_eq!(codes(&v), [("kernelPath", ViolationCode::Missing)]);
    let v = env_err(&[("addonImage", IMG), ("provider", "tdx"), ("initrdPath", "/i"), ("imagePath", "/m")]);
    assert_eq!(codes(&v), [("imagePath", ViolationCode::Conflict)]);
}

#[test]
fn path_rules() {
    for good in ["/k", "/a/b.c/d-e_f", "/a/.hidden", "/a/..b", "/with space/ü"] {
        env_ok(&[("addonImage", IMG), ("kernelPath", good)]);
    }
    let long_ok = alloc::format!("/{}", "a".repeat(4095));
    env_ok(&[("addonImage", IMG), ("kernelPath", &long_ok)]);
    let long = alloc::format!("/{}", "a".repeat(4096));
    for bad in
        ["k", "./k", "/", "/a/", "/a//b", "/a/./b", "/a/../b", "/..", "/a\0b", "/a\nb", "/a\x7fb", "/a\u{85}b", &long]
    {
        let v = env_err(&[("addonImage", IMG), ("kernelPath", bad)]);
        assert_eq!(codes(&v), [("kernelPath", ViolationCode::InvalidPath)], "{bad:?}");
        assert!(!v[0].message.contains('\n') && !v[0].message.contains('\0'));
    }
}

#[test]
fn sha256_rules() {
    env_ok(&[("addonImage", IMG), ("kernelPath", "/k"), ("kernelSha256", HEX)]);
    for bad in [&HEX[1..], &HEX.to_uppercase(), &alloc::format!("{HEX}0"), &alloc::format!("sha256:{HEX}")] {
        let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("kernelSha256", bad)]);
        assert_eq!(codes(&v), [("kernelSha256", ViolationCode::InvalidSha256)]);
        assert!(v[0].message.contains("64 lowercase hex"));
    }
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("initrdSha256", HEX)]);
    assert_eq!(codes(&v), [("initrdSha256", ViolationCode::Inconsistent)]);
}

#[test]
fn plan_without_version_defaults() {
    let p = plan_ok(&[("ADDON_IMAGE", "quay.io/a/b:v9"), ("ADDON_KERNEL_PATH", "/k")]);
    assert_eq!(p.version, "v9");
    assert_eq!(p.provider, Provider::Se);
}

fn base_plan(provider: &str, paths: &[(&str, &str)]) -> Plan {
    let mut e = kv(&[("ADDON_IMAGE", IMG), ("ADDON_PROVIDER", provider)]);
    e.extend(kv(paths));
    plan(&e).expect("plan")
}

fn inst(kind: ArtifactKind, path: &str) -> InstalledFile {
    InstalledFile { kind, path: path.into(), filesystem: None, verity: None }
}

const D: &str = "/etc/kata-containers/addons/v1.0-0123456789ab";

#[test]
fn render_kernel() {
    let p = base_plan("se", &[("ADDON_KERNEL_PATH", "/k")]);
    let out = render(&p, &[inst(ArtifactKind::Kernel, &alloc::format!("{D}/kernel"))]).expect("render");
    assert_eq!(out, alloc::format!("{HEADER}[hypervisor.qemu]\nkernel = \"{D}/kernel\"\n"));
}

#[test]
fn render_initrd_and_image_clear_each_other() {
    let p = base_plan("tdx", &[("ADDON_KERNEL_PATH", "/k"), ("ADDON_INITRD_PATH", "/i")]);
    let out = render(
        &p,
        &[
            inst(ArtifactKind::Initrd, &alloc::format!("{D}/initrd")),
            inst(ArtifactKind::Kernel, &alloc::format!("{D}/kernel")),
        ],
    )
    .expect("render");
    assert_eq!(
        out,
        alloc::format!("{HEADER}[hypervisor.qemu]\nkernel = \"{D}/kernel\"\ninitrd = \"{D}/initrd\"\nimage = \"\"\n")
    );
    let p = base_plan("snp", &[("ADDON_IMAGE_PATH", "/m")]);
    let out = render(&p, &[inst(ArtifactKind::Image, &alloc::format!("{D}/image"))]).expect("render");
    // An unmeasured image also clears a base's dm-verity parameters
    // (docs/design.md#measured-guests).
    assert_eq!(
        out,
        alloc::format!(
            "{HEADER}[hypervisor.qemu]\ninitrd = \"\"\nimage = \"{D}/image\"\nkernel_verity_params = \"\"\n"
        )
    );
}

#[test]
fn render_escapes_through_the_serializer() {
    let p = base_plan("se", &[("ADDON_KERNEL_PATH", "/k")]);
    let weird = "/etc/kata-containers/addons/v\"1\\x/kernel";
    let out = render(&p, &[inst(ArtifactKind::Kernel, weird)]).expect("render");
    let body = out.strip_prefix(HEADER).expect("header");
    assert_eq!(body.lines().count(), 2, "{out}");
    assert!(!HEADER.trim_end().contains('\n'));
}

#[test]
fn render_rejects_bad_installed() {
    let p = base_plan("tdx", &[("ADDON_KERNEL_PATH", "/k"), ("ADDON_IMAGE_PATH", "/m")]);
    let k = alloc::format!("{D}/kernel");
    let m = alloc::format!("{D}/image");
    let cases: Vec<(Vec<InstalledFile>, Vec<ViolationCode>)> = alloc::vec![
        (alloc::vec![inst(ArtifactKind::Kernel, &k)], alloc::vec![ViolationCode::Inconsistent]),
        (
            alloc::vec![
                inst(ArtifactKind::Kernel, &k),
                inst(ArtifactKind::Image, &m),
                inst(ArtifactKind::Initrd, "/x")
            ],
            alloc::vec![ViolationCode::Inconsistent]
        ),
        (
            alloc::vec![inst(ArtifactKind::Kernel, &k), inst(ArtifactKind::Kernel, &k), inst(ArtifactKind::Image, &m)],
            alloc::vec![ViolationCode::Inconsistent]
        ),
        (
            alloc::vec![inst(ArtifactKind::Kernel, "/boot/kernel"), inst(ArtifactKind::Image, &m)],
            alloc::vec![ViolationCode::InvalidPath]
        ),
        (
            alloc::vec![
                inst(ArtifactKind::Kernel, "/etc/kata-containers/addons/kernel"),
                inst(ArtifactKind::Image, &m)
            ],
            alloc::vec![ViolationCode::InvalidPath]
        ),
        (
            alloc::vec![inst(ArtifactKind::Kernel, &alloc::format!("{D}/../kernel")), inst(ArtifactKind::Image, &m)],
            alloc::vec![ViolationCode::InvalidPath]
        ),
        (
            alloc::vec![
                inst(ArtifactKind::Kernel, "/etc/kata-containers/addonsX/v/kernel"),
                inst(ArtifactKind::Image, &m)
            ],
            alloc::vec![ViolationCode::InvalidPath]
        ),
        (
            alloc::vec![inst(ArtifactKind::Kernel, &alloc::format!("{D}/vmlinuz")), inst(ArtifactKind::Image, &m)],
            alloc::vec![ViolationCode::Inconsistent]
        ),
        (
            alloc::vec![
                inst(ArtifactKind::Kernel, "/etc/kata-containers/addons/other/kernel"),
                inst(ArtifactKind::Image, &m)
            ],
            alloc::vec![ViolationCode::Inconsistent]
        ),
        (alloc::vec![], alloc::vec![ViolationCode::Inconsistent, ViolationCode::Inconsistent]),
    ];
    for (installed, want) in cases {
        let v = render(&p, &installed).expect_err("violations");
        assert!(v.iter().all(|v| v.key == "installed"), "{v:?}");
        assert_eq!(v.iter().map(|v| v.code).collect::<Vec<_>>(), want, "{installed:?}");
    }
}

#[test]
fn render_rejects_inconsistent_plan() {
    let good = base_plan("se", &[("ADDON_KERNEL_PATH", "/k")]);
    let k = [inst(ArtifactKind::Kernel, &alloc::format!("{D}/kernel"))];
    let mut p = good.clone();
    p.runtime_configs[0] = "/etc/kata-containers/kata-tdx/configuration.toml".into();
    assert!(
        codes(&crate::render(&p, &k, &rcs(&["/etc/kata-containers/kata-se/configuration.toml"])).expect_err("rc"))
            .contains(&("plan", ViolationCode::Inconsistent))
    );
    let mut p = good.clone();
    p.artifacts[0].file_name = "../x".into();
    assert_eq!(codes(&render(&p, &k).expect_err("name")), [("plan", ViolationCode::Inconsistent)]);
    let mut p = good.clone();
    p.artifacts.push(Artifact {
        kind: ArtifactKind::Initrd,
        source: "/i".into(),
        file_name: "initrd".into(),
        sha256: None,
        verity: None,
        name: None,
    });
    let v = render(&p, &k).expect_err("se initrd");
    assert!(codes(&v).contains(&("plan", ViolationCode::NotAllowed)));
    let mut p = good;
    p.artifacts.clear();
    assert!(codes(&render(&p, &k).expect_err("empty")).contains(&("plan", ViolationCode::Missing)));
}

/// A tiny deterministic PRNG (xorshift64*), so junk tests need no extra dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }

    fn junk(&mut self) -> String {
        const PIECES: &[&str] = &[
            "/",
            ":",
            "@",
            ".",
            "..",
            "-",
            "_",
            "__",
            "[",
            "]",
            "sha256:",
            "oci:",
            "a",
            "Z",
            "9",
            "\0",
            "\n",
            " ",
            "ü",
            "localhost",
            "quay.io",
            "0123456789abcdef",
            "\u{7f}",
            "//",
            "::1",
            "65535",
            "latest",
        ];
        let n = self.next() % 12;
        (0..n).map(|_| self.pick(PIECES)).collect()
    }
}

#[test]
fn junk_never_panics() {
    let names = [
        "addonImage",
        "provider",
        "version",
        "kernelPath",
        "initrdPath",
        "imagePath",
        "kernelSha256",
        "initrdSha256",
        "imageSha256",
        "ADDON_IMAGE",
        "ADDON_PROVIDER",
        "ADDON_VERSION",
        "ADDON_KERNEL_PATH",
        "ADDON_INITRD_PATH",
        "ADDON_IMAGE_PATH",
        "ADDON_KERNEL_SHA256",
        "ADDON_INITRD_SHA256",
        "ADDON_IMAGE_SHA256",
        "kernelpath",
        "",
        "\u{85}",
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut plans = 0;
    for _ in 0..20_000 {
        let n = rng.next() % 3;
        // Half the time, start from a valid env so that plan and render see real plans.
        let mut input = if rng.next().is_multiple_of(2) {
            kv(&[("ADDON_IMAGE", IMG), ("ADDON_PROVIDER", "tdx"), ("ADDON_KERNEL_PATH", "/k")])
        } else {
            Vec::new()
        };
        for _ in 0..n {
            let name = if rng.next().is_multiple_of(10) { rng.junk() } else { rng.pick(&names).into() };
            let value = match rng.next() % 4 {
                0 => rng.pick(&[IMG, "oci:/a/b:v1", "/k", "tdx", "snp", HEX, "1.0"]).into(),
                _ => rng.junk(),
            };
            input.push(KeyValue { name, value });
        }
        if let Err(v) = env(&input) {
            assert!(!v.is_empty());
        }
        if let Ok(p) = plan(&input) {
            plans += 1;
            let installed: Vec<InstalledFile> = p
                .artifacts
                .iter()
                .map(|a| InstalledFile {
                    kind: a.kind,
                    path: alloc::format!("{INSTALL_DIR}/{}/{}", rng.junk(), a.file_name),
                    filesystem: None,
                    verity: None,
                })
                .collect();
            let _ = render(&p, &installed);
        }
        // Junk installed lists against a fixed plan.
        let p = base_plan("tdx", &[("ADDON_KERNEL_PATH", "/k"), ("ADDON_INITRD_PATH", "/i")]);
        let kinds = [ArtifactKind::Kernel, ArtifactKind::Initrd, ArtifactKind::Image];
        let installed: Vec<InstalledFile> = (0..rng.next() % 4)
            .map(|_| InstalledFile {
                kind: kinds[(rng.next() % 3) as usize],
                path: alloc::format!("{D}/{}", rng.junk()),
                filesystem: None,
                verity: None,
            })
            .collect();
        let _ = render(&p, &installed);
    }
    assert!(plans > 0 || cfg!(miri));
}

#[test]
fn kata_prefix_moves_the_kata_deploy_candidates() {
    let e = kv(&[("ADDON_IMAGE", IMG), ("ADDON_PROVIDER", "tdx"), ("ADDON_KERNEL_PATH", "/k")]);
    let p = crate::plan(&e, &NodeOptions { kata_prefix: "/usr/local/kata".into() }).expect("plan");
    assert_eq!(p.runtime_configs[0], "/etc/kata-containers/kata-tdx/configuration.toml");
    assert!(p.runtime_configs[1..].iter().all(|c| c.starts_with("/usr/local/kata/share/defaults/kata-containers/")));
    for bad in ["relative", "/a/../b", ""] {
        let v = crate::plan(&e, &NodeOptions { kata_prefix: bad.into() }).expect_err("bad prefix");
        assert_eq!(codes(&v), [("--kata-prefix", ViolationCode::InvalidPath)], "{bad}");
    }
    // Bad env and bad prefix are reported together.
    let v = crate::plan(&kv(&[("ADDON_IMAGE", IMG)]), &NodeOptions { kata_prefix: "x".into() }).expect_err("both");
    assert!(codes(&v).contains(&("--kata-prefix", ViolationCode::InvalidPath)) && v.len() >= 2, "{v:?}");
}

#[test]
fn render_one_drop_in_per_runtime_config() {
    let p = base_plan("tdx", &[("ADDON_KERNEL_PATH", "/k")]);
    let k = [inst(ArtifactKind::Kernel, &alloc::format!("{D}/kernel"))];
    let go = "/opt/kata/share/defaults/kata-containers/runtimes/qemu-tdx/configuration-qemu-tdx.toml";
    let rs = "/opt/kata/share/defaults/kata-containers/runtime-rs/runtimes/qemu-tdx-runtime-rs/configuration-qemu-tdx-runtime-rs.toml";
    let out = crate::render(&p, &k, &rcs(&[go, rs])).expect("render");
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].runtime_config, go);
    assert_eq!(out[0].path, "/opt/kata/share/defaults/kata-containers/runtimes/qemu-tdx/config.d/50-kata-addons.toml");
    assert_eq!(
        out[1].path,
        "/opt/kata/share/defaults/kata-containers/runtime-rs/runtimes/qemu-tdx-runtime-rs/config.d/50-kata-addons.toml"
    );
    assert_eq!(out[0].contents, out[1].contents);
    // Nothing found, not a configuration file, two in one directory, unclean path.
    assert_eq!(codes(&crate::render(&p, &k, &[]).expect_err("none")), [("runtime-configs", ViolationCode::Missing)]);
    assert_eq!(
        codes(&crate::render(&p, &k, &rcs(&["/etc/passwd"])).expect_err("name")),
        [("runtime-configs", ViolationCode::InvalidPath)]
    );
    let shared = rcs(&["/d/configuration-a.toml", "/d/configuration-b.toml"]);
    assert_eq!(
        codes(&crate::render(&p, &k, &shared).expect_err("shared")),
        [("runtime-configs", ViolationCode::Conflict)]
    );
    assert_eq!(
        codes(&crate::render(&p, &k, &rcs(&["/d/../configuration.toml"])).expect_err("unclean")),
        [("runtime-configs", ViolationCode::InvalidPath)]
    );
}

#[test]
fn violation_list_is_capped_with_a_count_of_the_rest() {
    // 100 unknown keys + the two missing ones: 102 problems, 63 listed, one "and 39 more".
    let names: Vec<String> = (0..100).map(|i| alloc::format!("unknownKey{i:03}")).collect();
    let data: Vec<KeyValue> = names.iter().map(|n| KeyValue::new(n.as_str(), "x")).collect();
    let v = env(&data).expect_err("invalid");
    assert_eq!(v.len(), crate::MAX_VIOLATIONS);
    assert_eq!(v[0].key, "unknownKey000");
    let last = &v[crate::MAX_VIOLATIONS - 1];
    assert_eq!(last.key, "(more)");
    assert!(last.message.starts_with("\u{2026} and 39 more"), "{}", last.message);
    // At the cap exactly, nothing is folded.
    let data: Vec<KeyValue> = names[..62].iter().map(|n| KeyValue::new(n.as_str(), "x")).collect();
    let v = env(&data).expect_err("invalid");
    assert_eq!(v.len(), 64);
    assert!(v.iter().all(|v| v.key != "(more)"));
    // `plan` caps the same way.
    let envs: Vec<String> = (0..80).map(|i| alloc::format!("ADDON_X{i}")).collect();
    let data: Vec<KeyValue> = envs.iter().map(|n| KeyValue::new(n.as_str(), "x")).collect();
    let v = plan(&data).expect_err("invalid");
    assert_eq!(v.len(), crate::MAX_VIOLATIONS);
    assert!(v[63].message.contains("and 19 more"), "{}", v[63].message);
}

#[test]
fn known_runtime_configs_cover_every_provider_plan() {
    for prefix in [kata_addons_facts::DEFAULT_KATA_PREFIX, "/usr/local/kata"] {
        let known = kata_addons_facts::known_runtime_configs(prefix);
        assert_eq!(known.len(), 15, "{known:?}");
        for provider in ["se", "tdx", "snp"] {
            let e = kv(&[("ADDON_IMAGE", IMG), ("ADDON_PROVIDER", provider), ("ADDON_KERNEL_PATH", "/k")]);
            let p = crate::plan(&e, &NodeOptions { kata_prefix: prefix.into() }).expect("plan");
            for rc in &p.runtime_configs {
                assert!(known.contains(rc), "{provider}: {rc} not in {known:?}");
            }
        }
    }
}

/// The `runtimeClass` rules (docs/design.md#runtimeclass).
#[path = "runtime_class_tests.rs"]
mod runtime_class_tests;

#[test]
fn kata_version_and_host_key_documents_reach_the_plan() {
    let p = base_plan(
        "se",
        &[
            ("ADDON_KERNEL_PATH", "/k"),
            ("ADDON_KATA_VERSION", " 3.25.0-6.el9 "),
            ("ADDON_SE_HOST_KEY_DOCUMENTS", "/etc/hkd/a.crt, /etc/hkd/b.crt,/etc/hkd/a.crt"),
        ],
    );
    let v = p.kata_version.expect("kata version");
    assert_eq!((v.epoch, v.version.as_str(), v.release.as_deref()), (None, "3.25.0", Some("6.el9")));
    assert_eq!(p.se_host_key_documents, ["/etc/hkd/a.crt", "/etc/hkd/b.crt"]);
    let e = env_ok(&[
        ("addonImage", IMG),
        ("kernelPath", "/k"),
        ("kataVersion", "3.25.0"),
        ("seHostKeyDocuments", "/a.crt,/a.crt"),
    ]);
    assert!(e.iter().any(|(n, v)| n == "ADDON_KATA_VERSION" && v == "3.25.0"));
    assert!(e.iter().any(|(n, v)| n == "ADDON_SE_HOST_KEY_DOCUMENTS" && v == "/a.crt"));
    let p = base_plan("se", &[("ADDON_KERNEL_PATH", "/k")]);
    assert!(p.kata_version.is_none() && p.se_host_key_documents.is_empty());
}

#[test]
fn host_key_documents_are_for_se_only_and_kata_version_is_checked() {
    let errs = env_err(&[
        ("addonImage", IMG),
        ("provider", "tdx"),
        ("kernelPath", "/k"),
        ("seHostKeyDocuments", "/a.crt"),
        ("kataVersion", "3.25.0-6-el9"),
    ]);
    assert!(errs.iter().any(|v| v.key == "seHostKeyDocuments" && v.code == ViolationCode::NotAllowed), "{errs:?}");
    assert!(errs.iter().any(|v| v.key == "kataVersion" && v.code == ViolationCode::InvalidVersion), "{errs:?}");
}
