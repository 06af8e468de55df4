//! The `runtimeClass` key: handlers trimmed, deduplicated, in order, and checked as
//! Kubernetes checks a RuntimeClass handler (docs/design.md#runtimeclass).

use super::*;

#[test]
fn runtime_classes_are_trimmed_deduplicated_and_in_order() {
    let base = [("addonImage", IMG), ("provider", "snp"), ("kernelPath", "/k")];
    let mut data = base.to_vec();
    data.push(("runtimeClass", " kata-qemu-nvidia-gpu-snp , kata-qemu-snp,kata-qemu-nvidia-gpu-snp "));
    let env = env_ok(&data);
    let rc = env.iter().find(|(k, _)| k == "ADDON_RUNTIME_CLASS").expect("ADDON_RUNTIME_CLASS");
    assert_eq!(rc.1, "kata-qemu-nvidia-gpu-snp,kata-qemu-snp");
    assert_eq!(env.last().map(|(k, _)| k.as_str()), Some("ADDON_RUNTIME_CLASS"), "fixed order: last");
    let p = plan_ok(&[
        ("ADDON_IMAGE", IMG),
        ("ADDON_PROVIDER", "snp"),
        ("ADDON_KERNEL_PATH", "/k"),
        ("ADDON_RUNTIME_CLASS", &rc.1),
    ]);
    assert_eq!(p.runtime_classes, ["kata-qemu-nvidia-gpu-snp", "kata-qemu-snp"]);
    // The standard candidates are still there (used only without handlers).
    assert!(!p.runtime_configs.is_empty());
    // Empty after trimming = absent.
    let mut data = base.to_vec();
    data.push(("runtimeClass", "  "));
    assert!(env_ok(&data).iter().all(|(k, _)| k != "ADDON_RUNTIME_CLASS"));
}

#[test]
fn an_invalid_runtime_class_names_the_handler() {
    for (value, bad) in [
        ("kata-qemu-snp, Kata_GPU", "Kata_GPU"),
        ("-kata", "-kata"),
        ("kata-", "kata-"),
        ("kata.qemu", "kata.qemu"),
        (&"a".repeat(64) as &str, "aaaaaaaa"),
    ] {
        let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("runtimeClass", value)]);
        assert_eq!(codes(&v), [("runtimeClass", ViolationCode::InvalidName)], "{value}");
        assert!(v[0].message.contains(bad) && v[0].message.contains("DNS-1123"), "{}", v[0].message);
    }
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("runtimeClass", "kata-a,,kata-b")]);
    assert_eq!(codes(&v), [("runtimeClass", ViolationCode::InvalidName)]);
    assert!(v[0].message.contains("entry 2 is empty"), "{}", v[0].message);
    let v = plan(&kv(&[("ADDON_IMAGE", IMG), ("ADDON_KERNEL_PATH", "/k"), ("ADDON_RUNTIME_CLASS", "Bad")]))
        .expect_err("invalid");
    assert_eq!(codes(&v), [("ADDON_RUNTIME_CLASS", ViolationCode::InvalidName)]);
    let many: Vec<String> = (0..33).map(|i| alloc::format!("kata-{i}")).collect();
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("runtimeClass", &many.join(","))]);
    assert_eq!(codes(&v), [("runtimeClass", ViolationCode::InvalidName)]);
    assert!(v[0].message.contains("at most 32"), "{}", v[0].message);
}

/// A huge list is one violation naming the key and the limit, found before any entry is
/// parsed or compared (the dedupe was quadratic in the entry count).
#[test]
fn a_huge_runtime_class_list_is_one_violation() {
    let huge: Vec<String> = (0..20_000).map(|i| alloc::format!("kata-{i}")).collect();
    let v = env_err(&[("addonImage", IMG), ("kernelPath", "/k"), ("runtimeClass", &huge.join(","))]);
    assert_eq!(codes(&v), [("runtimeClass", ViolationCode::InvalidName)]);
    assert!(v[0].message.contains("20000 comma-separated entries: at most 64"), "{}", v[0].message);
    let dup: Vec<&str> = core::iter::repeat_n("kata-qemu-snp", 64).collect();
    let env =
        env_ok(&[("addonImage", IMG), ("provider", "snp"), ("kernelPath", "/k"), ("runtimeClass", &dup.join(","))]);
    assert!(env.iter().any(|(k, v)| k == "ADDON_RUNTIME_CLASS" && v == "kata-qemu-snp"));
}
