//! End-to-end tests of `kata-addons preview` and `policy export`: the real binary, the
//! embedded policy component in wasmtime, real files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kata-addons"));
    // Keep the developer's environment out: no ADDON_* leaking in, private cache.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ADDON_") {
            c.env_remove(k);
        }
    }
    c
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kata-addon-artifacts.yaml")
}

fn run(c: &mut Command) -> Output {
    c.output().expect("kata-addons runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn json_preview_of_the_documented_configmap() {
    let cache = tempfile::tempdir().expect("tempdir");
    let o = run(bin()
        .args(["preview", "--output", "json", "--cache-dir"])
        .arg(cache.path())
        .arg("--configmap")
        .arg(example()));
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let env: Vec<(String, String)> = v["env"]
        .as_array()
        .expect("env array")
        .iter()
        .map(|e| (e["name"].as_str().unwrap_or("").to_string(), e["value"].as_str().unwrap_or("").to_string()))
        .collect();
    assert!(env.contains(&("ADDON_PROVIDER".into(), "se".into())), "{env:?}");
    assert!(env.contains(&("ADDON_VERSION".into(), "v1.0".into())), "{env:?}");
    assert!(
        env.contains(&("ADDON_IMAGE".into(), "quay.io/openshift_sandboxed_containers/kata-se-artifacts:v1.0".into()))
    );
    assert_eq!(v["artifacts"][0]["kind"], "kernel");
    assert_eq!(v["artifacts"][0]["source"], "/artifacts/kernel/vmlinuz");
    assert_eq!(v["artifacts"].as_array().map(Vec::len), Some(1));
    let drop_in = &v["dropIns"][0];
    assert_eq!(drop_in["path"], "/etc/kata-containers/kata-se/config.d/50-kata-addons.toml");
    let toml_text = drop_in["contents"].as_str().expect("contents");
    let doc: toml::Table = toml::from_str(toml_text).expect("drop-in is TOML");
    let kernel = doc["hypervisor"]["qemu"]["kernel"].as_str().expect("kernel key");
    assert!(kernel.starts_with("/etc/kata-containers/addons/v1.0-"), "{kernel}");
    assert!(kernel.ends_with("/kernel"), "{kernel}");
    // The cache now holds the compiled component; a second run uses it and agrees.
    let o2 = run(bin()
        .args(["preview", "--output", "json", "--cache-dir"])
        .arg(cache.path())
        .arg("--configmap")
        .arg(example()));
    assert_eq!(stdout(&o), stdout(&o2));
}

#[test]
fn env_and_yaml_outputs() {
    let o = run(bin().args(["preview", "--output", "env", "--configmap"]).arg(example()));
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let text = stdout(&o);
    assert!(text.lines().any(|l| l == "ADDON_PROVIDER=se"), "{text}");
    assert!(text.lines().any(|l| l == "ADDON_KERNEL_PATH=/artifacts/kernel/vmlinuz"), "{text}");

    let o = run(bin().args(["preview", "--output", "yaml", "--configmap"]).arg(example()));
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let doc: serde_norway::Value = serde_norway::from_slice(&o.stdout).expect("yaml");
    let list = doc["env"].as_sequence().expect("env list");
    assert!(list.iter().any(|e| e["name"] == "ADDON_VERSION" && e["value"] == "v1.0"), "{}", stdout(&o));
}

#[test]
fn env_input_and_stdin_and_dir() {
    // ADDON_* environment, no ConfigMap.
    let o = run(bin()
        .args(["preview", "--output", "env"])
        .env("ADDON_IMAGE", "registry.example.com:5000/kata/tdx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        .env("ADDON_PROVIDER", "tdx")
        .env("ADDON_KERNEL_PATH", "/k/vmlinuz")
        .env("ADDON_INITRD_PATH", "/k/initrd.img"));
    assert!(o.status.success(), "stderr: {}", stderr(&o));

    // A bare JSON map on stdin.
    let mut child = bin()
        .args(["preview", "--output", "text", "--configmap", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(br#"{"addonImage": "quay.io/a/b:v2", "kernelPath": "/vmlinuz", "provider": "snp", "imagePath": "/rootfs.img"}"#)
            .expect("write");
    }
    let o = child.wait_with_output().expect("wait");
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(text.contains("kata-snp"), "{text}");
    assert!(text.contains("initrd = \"\""), "{text}");

    // A ConfigMap mounted as a directory (Kubernetes' ..data layout).
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("..2026_11_29_00_00_00.000000001");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("addonImage"), "quay.io/a/b:v3\n").expect("write");
    std::fs::write(data.join("kernelPath"), "/vmlinuz").expect("write");
    std::os::unix::fs::symlink(data.file_name().expect("name"), dir.path().join("..data")).expect("symlink");
    for k in ["addonImage", "kernelPath"] {
        std::os::unix::fs::symlink(format!("..data/{k}"), dir.path().join(k)).expect("symlink");
    }
    let o = run(bin().args(["preview", "--output", "env", "--configmap-dir"]).arg(dir.path()));
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    assert!(stdout(&o).contains("ADDON_VERSION=v3"), "{}", stdout(&o));
}

#[test]
fn invalid_configuration_exits_2_naming_every_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cm = dir.path().join("bad.yaml");
    std::fs::write(
        &cm,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kata-addon-artifacts}\ndata:\n  addonImage: quay.io/a/b:v1\n  kernelpath: /k\n  provider: sev\n",
    )
    .expect("write");
    let o = run(bin().args(["preview", "--configmap"]).arg(&cm));
    assert_eq!(o.status.code(), Some(2), "stderr: {}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("kernelpath") && err.contains("kernelPath"), "{err}");
    assert!(err.contains("provider"), "{err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn unreadable_input_is_a_clear_error_not_a_panic() {
    let o = run(bin().args(["preview", "--configmap", "/nonexistent/cm.yaml"]));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/nonexistent/cm.yaml"), "{}", stderr(&o));

    let dir = tempfile::tempdir().expect("tempdir");
    let cm = dir.path().join("broken.yaml");
    std::fs::write(&cm, "data: [unclosed\n").expect("write");
    let o = run(bin().args(["preview", "--configmap"]).arg(&cm));
    // Malformed YAML is invalid configuration (exit 2), not an operational failure.
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("broken.yaml"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));

    std::fs::write(&cm, "addonImage: quay.io/a/b:v1\nversion: 1.0\n").expect("write");
    let o = run(bin().args(["preview", "--configmap"]).arg(&cm));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("`version`"), "{}", stderr(&o));
}

#[test]
fn policy_export_writes_the_embedded_component() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("policy.wasm");
    let o = run(bin().args(["policy", "export"]).arg(&out));
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let bytes = std::fs::read(&out).expect("exported");
    assert_eq!(bytes, kata_addons::GUEST_WASM);
    // The exported file works as `--policy-component`.
    let o = run(bin().arg("--policy-component").arg(&out).args(["preview", "--configmap"]).arg(example()));
    assert!(o.status.success(), "stderr: {}", stderr(&o));
}
