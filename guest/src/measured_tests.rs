//! The measured-guest rules of docs/design.md#measured-guests: keys, validation, and the drop-in.

use alloc::string::String;
use alloc::vec::Vec;

use crate::*;

const IMG: &str = "quay.io/a/guest:v1";
const RH: &str = "278d7cfa2bf79e43ca873d5f203bf2622358a5c0cbbadc3b0d3757675fa1a6ef";
const D: &str = "/etc/kata-containers/addons/v1-0123456789ab";
const RC: &str = "/etc/kata-containers/kata-snp/configuration.toml";

fn params() -> String {
    alloc::format!("root_hash={RH},salt=0011aabb,data_blocks=74,data_block_size=4096,hash_block_size=4096")
}

fn data(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
    let mut v = alloc::vec![KeyValue::new("addonImage", IMG), KeyValue::new("provider", "snp")];
    v.extend(pairs.iter().map(|(n, x)| KeyValue::new(*n, *x)));
    v
}

fn errs(pairs: &[(&str, &str)]) -> Vec<(String, ViolationCode)> {
    match env(&data(pairs)) {
        Ok(e) => panic!("expected violations for {pairs:?}, got {e:?}"),
        Err(v) => v.into_iter().map(|v| (v.key, v.code)).collect(),
    }
}

fn plan_of(pairs: &[(&str, &str)]) -> Plan {
    let e = env(&data(pairs)).expect("env");
    crate::plan(&e, &NodeOptions::default()).expect("plan")
}

fn vp() -> VerityParams {
    VerityParams {
        root_hash: String::from(RH),
        salt: String::from("0011aabb"),
        data_blocks: 74,
        data_block_size: 4096,
        hash_block_size: 4096,
    }
}

fn facts(keys: &[(&str, &str, &str)], exts: &[(&str, &str, &str)]) -> RuntimeConfigFacts {
    RuntimeConfigFacts {
        path: String::from(RC),
        handler: None,
        keys: keys
            .iter()
            .map(|(k, v, f)| EffectiveKey { key: (*k).into(), value: (*v).into(), from: (*f).into() })
            .collect(),
        extensions: exts
            .iter()
            .map(|(n, p, v)| ExtensionImage { name: (*n).into(), path: (*p).into(), verity_params: (*v).into() })
            .collect(),
        extensions_from: None,
    }
}

#[test]
fn keys_env_order_and_plan() {
    let p = params();
    let e = env(&data(&[
        ("extensionSha256", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
        ("extensionName", "coco"),
        ("extensionPath", "/ext.img"),
        ("imageVerityParams", &p),
        ("imagePath", "/guest.img"),
        ("extensionVerityPath", "/root_hash_coco.txt"),
    ]))
    .expect("env");
    let names: Vec<&str> = e.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "ADDON_IMAGE",
            "ADDON_PROVIDER",
            "ADDON_VERSION",
            "ADDON_IMAGE_PATH",
            "ADDON_IMAGE_VERITY_PARAMS",
            "ADDON_EXTENSION_PATH",
            "ADDON_EXTENSION_NAME",
            "ADDON_EXTENSION_VERITY_PATH",
            "ADDON_EXTENSION_SHA256"
        ]
    );
    let plan = crate::plan(&e, &NodeOptions::default()).expect("plan");
    assert_eq!(plan.artifacts[0].verity, Some(VeritySource::Params(vp())));
    let ext = &plan.artifacts[1];
    assert_eq!(
        (ext.kind, ext.name.as_deref(), ext.file_name.as_str()),
        (ArtifactKind::Extension, Some("coco"), "extension")
    );
    assert_eq!(ext.verity, Some(VeritySource::File("/root_hash_coco.txt".into())));
    // An extension alone is an artifact.
    assert!(env(&data(&[("extensionPath", "/e.img"), ("extensionName", "coco")])).is_ok());
}

/// Inputs and the (key, code) one of the violations must have.
type Case<'a> = (Vec<(&'a str, &'a str)>, (&'a str, ViolationCode));

#[test]
fn validation_rules() {
    let p = params();
    let cases: Vec<Case<'_>> = alloc::vec![
        (
            alloc::vec![("kernelPath", "/k"), ("imageVerityParams", &p)],
            ("imageVerityParams", ViolationCode::Inconsistent)
        ),
        (
            alloc::vec![("imagePath", "/i"), ("imageVerityParams", &p), ("imageVerityPath", "/v")],
            ("imageVerityPath", ViolationCode::Conflict)
        ),
        (
            alloc::vec![("imagePath", "/i"), ("imageVerityPath", "v.txt")],
            ("imageVerityPath", ViolationCode::InvalidPath)
        ),
        (
            alloc::vec![("imagePath", "/i"), ("imageVerityParams", "root_hash=ab")],
            ("imageVerityParams", ViolationCode::InvalidVerity)
        ),
        (alloc::vec![("extensionPath", "/e")], ("extensionName", ViolationCode::Missing)),
        (alloc::vec![("kernelPath", "/k"), ("extensionName", "coco")], ("extensionName", ViolationCode::Inconsistent)),
        (
            alloc::vec![("extensionPath", "/e"), ("extensionName", "co.co")],
            ("extensionName", ViolationCode::InvalidName)
        ),
        (
            alloc::vec![("extensionPath", "/e"), ("extensionName", "0123456789a")],
            ("extensionName", ViolationCode::InvalidName)
        ),
        (alloc::vec![("extensionPath", "e"), ("extensionName", "coco")], ("extensionPath", ViolationCode::InvalidPath)),
        (
            alloc::vec![("extensionPath", "/e"), ("extensionName", "coco"), ("extensionSha256", "AB")],
            ("extensionSha256", ViolationCode::InvalidSha256)
        ),
        (
            alloc::vec![("kernelPath", "/k"), ("extensionVerityParams", &p)],
            ("extensionVerityParams", ViolationCode::Inconsistent)
        ),
        (
            alloc::vec![
                ("extensionPath", "/e"),
                ("extensionName", "coco"),
                ("extensionVerityParams", &p),
                ("extensionVerityPath", "/v")
            ],
            ("extensionVerityPath", ViolationCode::Conflict)
        ),
    ];
    for (input, want) in cases {
        let got = errs(&input);
        assert!(got.iter().any(|(k, c)| k == want.0 && *c == want.1), "{input:?}: {got:?}");
    }
    // Ten bytes fit `extension-<name>` in the 20-byte virtio-blk ID.
    assert!(env(&data(&[("extensionPath", "/e"), ("extensionName", "0123456789")])).is_ok());
    // Duplicate keys inside the parameters: Kata takes the last, the mount script the first.
    let dup = alloc::format!("{p},salt=00");
    assert!(
        errs(&[("imagePath", "/i"), ("imageVerityParams", &dup)])
            .contains(&("imageVerityParams".into(), ViolationCode::InvalidVerity))
    );
}

#[test]
fn se_refuses_images_verity_and_extensions() {
    let p = params();
    let mut d = alloc::vec![KeyValue::new("addonImage", IMG), KeyValue::new("kernelPath", "/k")];
    d.push(KeyValue::new("extensionPath", "/e"));
    d.push(KeyValue::new("extensionName", "coco"));
    d.push(KeyValue::new("imageVerityParams", p.as_str()));
    let got: Vec<(String, ViolationCode)> = env(&d).expect_err("se").into_iter().map(|v| (v.key, v.code)).collect();
    for k in ["extensionPath", "extensionName", "imageVerityParams"] {
        assert!(got.contains(&(k.into(), ViolationCode::NotAllowed)), "{k}: {got:?}");
    }
}

#[test]
fn drop_in_for_a_measured_image_and_an_extension() {
    let p = params();
    let plan = plan_of(&[
        ("imagePath", "/g.img"),
        ("imageVerityParams", &p),
        ("extensionPath", "/e"),
        ("extensionName", "coco"),
    ]);
    let installed = [
        InstalledFile {
            kind: ArtifactKind::Image,
            path: alloc::format!("{D}/image"),
            filesystem: Some(Filesystem::Erofs),
            verity: Some(vp()),
        },
        InstalledFile {
            kind: ArtifactKind::Extension,
            path: alloc::format!("{D}/extension"),
            filesystem: Some(Filesystem::Erofs),
            verity: None,
        },
    ];
    let base = "/opt/kata/configuration-qemu-snp.toml";
    let rc = facts(
        &[("kernel_verity_params", "root_hash=aa", base), ("rootfs_type", "ext4", base)],
        &[("coco", "/opt/kata/coco.img", "root_hash=bb"), ("devkit", "/opt/kata/devkit.img", "")],
    );
    let out = crate::render(&plan, &installed, &[rc]).expect("render");
    let t: toml::Table = toml::from_str(&out[0].contents).expect("toml");
    let q = &t["hypervisor"]["qemu"];
    assert_eq!(q["image"].as_str(), Some(alloc::format!("{D}/image").as_str()));
    assert_eq!(q["initrd"].as_str(), Some(""));
    assert_eq!(q["kernel_verity_params"].as_str(), Some(p.as_str()));
    assert_eq!(q["rootfs_type"].as_str(), Some("erofs"));
    let ext = q["guest_extension_images"].as_array().expect("array");
    // Ours replaces the same-named entry in place; the others are kept in order.
    assert_eq!(ext.len(), 2);
    assert_eq!(ext[0]["name"].as_str(), Some("coco"));
    assert_eq!(ext[0]["path"].as_str(), Some(alloc::format!("{D}/extension").as_str()));
    assert_eq!(ext[0]["verity_params"].as_str(), Some(""));
    assert_eq!(ext[1]["name"].as_str(), Some("devkit"));

    // A new name is appended.
    let plan2 = plan_of(&[("extensionPath", "/e"), ("extensionName", "mine")]);
    let ours = [InstalledFile {
        kind: ArtifactKind::Extension,
        path: alloc::format!("{D}/extension"),
        filesystem: Some(Filesystem::Erofs),
        verity: None,
    }];
    let out = crate::render(&plan2, &ours, &[facts(&[], &[("coco", "/c", "x")])]).expect("render");
    let t: toml::Table = toml::from_str(&out[0].contents).expect("toml");
    let names: Vec<&str> = t["hypervisor"]["qemu"]["guest_extension_images"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["coco", "mine"]);
    assert!(t["hypervisor"]["qemu"].get("kernel_verity_params").is_none(), "an extension alone leaves the image keys");
}

#[test]
fn unmeasured_image_for_a_measured_node_is_refused_naming_the_file() {
    let plan = plan_of(&[("imagePath", "/g.img")]);
    let installed = [InstalledFile {
        kind: ArtifactKind::Image,
        path: alloc::format!("{D}/image"),
        filesystem: Some(Filesystem::Ext4),
        verity: None,
    }];
    let base = "/opt/kata/configuration-qemu-snp.toml";
    let v = crate::render(&plan, &installed, &[facts(&[("kernel_verity_params", "root_hash=aa", base)], &[])])
        .expect_err("refused");
    assert_eq!((v[0].key.as_str(), v[0].code), (base, ViolationCode::NodeRefuses));
    // An unmeasured node takes it, with the base's parameters cleared.
    let out = crate::render(&plan, &installed, &[facts(&[("kernel_verity_params", "", base)], &[])]).expect("ok");
    assert!(out[0].contents.contains("kernel_verity_params = \"\"\nrootfs_type = \"ext4\""), "{}", out[0].contents);
}

#[test]
fn installed_must_match_the_plan() {
    let p = params();
    let plan = plan_of(&[("imagePath", "/g.img"), ("imageVerityParams", &p)]);
    let mut other = vp();
    other.salt = "00".into();
    for verity in [None, Some(other)] {
        let installed = [InstalledFile {
            kind: ArtifactKind::Image,
            path: alloc::format!("{D}/image"),
            filesystem: Some(Filesystem::Erofs),
            verity,
        }];
        let v = crate::render(&plan, &installed, &[facts(&[], &[])]).expect_err("inconsistent");
        assert_eq!(v[0].code, ViolationCode::Inconsistent);
    }
}
