//! `runtimeClass` end to end with the real binary (docs/design.md#runtimeclass): a GPU node
//! as kata-deploy sets it up (every default x86_64 QEMU shim, the containerd drop-in),
//! where containerd's own `config dump` says which file the handler runs, and kata-addons
//! must change exactly that one's `config.d`; the default set without `runtimeClass`;
//! switching handlers; multi-install nodes (`10-installation-prefix.toml`); refusals (exit
//! 1 and 2, node unchanged); drift; status reporting a key a later fragment shadows.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use kata_addons_tests::cri::{KataDeploy, SHIMS, V2, containerd_dump, containerd_missing, dumped_config_path};
use kata_addons_tests::node::{Node, content_snapshot, layout_with, noise};
use kata_addons_tests::{run_kata_env, show};

const DROP_IN: &str = "50-kata-addons.toml";

/// Snapshot without the node lock the runner keeps under `/run`.
fn snap(node: &Node) -> BTreeMap<String, String> {
    let mut m = content_snapshot(node.root());
    m.retain(|k, _| !k.starts_with("run"));
    m
}

/// A kernel + initrd addon image.
struct Addon {
    _dir: tempfile::TempDir,
    image: String,
}

fn addon() -> Addon {
    let dir = tempfile::tempdir().expect("images");
    layout_with(
        &dir.path().join("l"),
        "v1",
        &[("boot/vmlinuz", &noise(50_000, 1)), ("boot/initrd.img", &noise(30_000, 2))],
    );
    Addon { image: format!("oci:{}:v1", dir.path().join("l").display()), _dir: dir }
}

struct Run<'a> {
    node: &'a Node,
    env: Vec<(&'static str, String)>,
}

impl Run<'_> {
    fn new<'a>(node: &'a Node, a: &Addon, provider: &str, runtime_class: Option<&str>, initrd: bool) -> Run<'a> {
        let mut env = vec![
            ("ADDON_IMAGE", a.image.clone()),
            ("ADDON_PROVIDER", provider.to_string()),
            ("ADDON_KERNEL_PATH", "/boot/vmlinuz".to_string()),
        ];
        if initrd {
            env.push(("ADDON_INITRD_PATH", "/boot/initrd.img".to_string()));
        }
        if let Some(rc) = runtime_class {
            env.push(("ADDON_RUNTIME_CLASS", rc.to_string()));
        }
        Run { node, env }
    }

    fn root(&self) -> &str {
        self.node.root().to_str().expect("utf-8 root")
    }

    fn run(&self, cmd: &str) -> Output {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        run_kata_env(&[cmd, "--root", self.root()], &env)
    }

    fn status(&self) -> (Option<i32>, serde_json::Value) {
        let o = run_kata_env(&["status", "--root", self.root(), "--output", "json"], &[]);
        let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("status json: {e}\n{}", show(&o)));
        (o.status.code(), v)
    }
}

/// The files (not directories) that differ between two snapshots.
fn changed(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    let is_dir = |k: &String| a.get(k).or(b.get(k)).is_some_and(|v| v.starts_with("dir "));
    let mut out: Vec<String> =
        a.keys().chain(b.keys()).filter(|k| a.get(*k) != b.get(*k) && !is_dir(k)).cloned().collect();
    out.sort();
    out.dedup();
    out
}

/// kata-deploy's GPU node: every default shim, and the containerd 2.x drop-in imported by
/// the main config (containerd.rs `configure_containerd`).
fn gpu_node() -> (Node, String) {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    for s in SHIMS {
        kd.install_shim(s);
    }
    let (drop_in, _) = kd.containerd_drop_in(V2, SHIMS, &[]);
    node.write("/etc/containerd/config.toml", &format!("version = 2\nimports = [\"{drop_in}\"]\n"));
    (node, drop_in)
}

fn rel(p: &str) -> String {
    p.trim_start_matches('/').to_string()
}

/// A GPU-node root installs only into the GPU shim's `config.d` (the one containerd's dump
/// names for the handler), everything else byte-identical; uninstall restores it.
#[test]
fn gpu_node_installs_only_into_the_gpu_shims_config_d() {
    if let Some(why) = containerd_missing() {
        panic!("needs containerd: {why}");
    }
    let (node, _) = gpu_node();
    let handler = "kata-qemu-nvidia-gpu-snp";
    let dump = containerd_dump(node.root(), "/etc/containerd/config.toml");
    let config = dumped_config_path(&dump, handler).expect("containerd defines the handler");
    let dir = Path::new(&config).parent().expect("dir").to_string_lossy().into_owned();
    let a = addon();
    let run = Run::new(&node, &a, "snp", Some(handler), true);
    let before = snap(&node);
    let o = run.run("install");
    assert!(o.status.success(), "{}", show(&o));
    let after = snap(&node);
    let diff = changed(&before, &after);
    let outside: Vec<&String> = diff.iter().filter(|p| !p.starts_with("etc/kata-containers/addons")).collect();
    assert_eq!(outside, vec![&rel(&format!("{dir}/config.d/{DROP_IN}"))], "only the handler's config.d changes");
    let kernel = node.qemu_of(&config, "kernel").expect("kernel");
    assert!(kernel.starts_with("/etc/kata-containers/addons/v1-"), "{kernel}");
    assert_eq!(node.qemu_of(&config, "image").as_deref(), Some(""));

    let (code, st) = run.status();
    assert_eq!(code, Some(0), "{st:#}");
    assert_eq!(st["state"]["runtimeClasses"], serde_json::json!([handler]), "{st:#}");
    assert_eq!(st["state"]["dropIns"][0]["handler"], handler, "{st:#}");
    assert_eq!(st["state"]["dropIns"][0]["runtimeConfig"], config.as_str(), "{st:#}");

    let o = run.run("uninstall");
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(snap(&node), before, "uninstall did not restore the node");
}

/// Without `runtimeClass` the standard set stays: the provider's `qemu-snp` shims, never
/// the GPU or custom ones. Switching from one handler to another moves the drop-in.
#[test]
fn default_set_unchanged_and_switching_handlers_moves_the_drop_in() {
    let (node, _) = gpu_node();
    let kd = KataDeploy::new(&node);
    let a = addon();
    let before = snap(&node);
    let o = Run::new(&node, &a, "snp", None, true).run("install");
    assert!(o.status.success(), "{}", show(&o));
    let diff = changed(&before, &snap(&node));
    let outside: Vec<String> = diff.into_iter().filter(|p| !p.starts_with("etc/kata-containers/addons")).collect();
    let mut want = vec![
        rel(&format!("{}/config.d/{DROP_IN}", parent(&kd.config_path("qemu-snp")))),
        rel(&format!("{}/config.d/{DROP_IN}", parent(&kd.config_path("qemu-snp-runtime-rs")))),
    ];
    want.sort();
    assert_eq!(outside, want, "the standard set of snp");

    let gpu = kd.config_path("qemu-nvidia-gpu-snp");
    let gpu_rs = kd.config_path("qemu-nvidia-gpu-snp-runtime-rs");
    let o = Run::new(&node, &a, "snp", Some("kata-qemu-nvidia-gpu-snp"), true).run("install");
    assert!(o.status.success(), "{}", show(&o));
    assert!(node.config_d_of(&gpu).contains(&DROP_IN.to_string()));
    assert!(!node.config_d_of(&kd.config_path("qemu-snp")).contains(&DROP_IN.to_string()), "left in the old set");
    let o = Run::new(&node, &a, "snp", Some("kata-qemu-nvidia-gpu-snp-runtime-rs"), true).run("install");
    assert!(o.status.success(), "{}", show(&o));
    assert!(node.config_d_of(&gpu_rs).contains(&DROP_IN.to_string()));
    assert!(!node.config_d_of(&gpu).contains(&DROP_IN.to_string()), "the drop-in did not move");
    let o = Run::new(&node, &a, "snp", None, true).run("uninstall");
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(snap(&node), before);
}

fn parent(p: &str) -> &str {
    p.rsplit_once('/').map_or("", |(d, _)| d)
}

/// A handler whose config path changes in the CRI configuration is drift (status exit 4);
/// install follows it, moving the drop-in.
#[test]
fn a_handler_moved_by_the_cri_configuration_is_drift() {
    let (node, drop_in) = gpu_node();
    let kd = KataDeploy::new(&node);
    let a = addon();
    let run = Run::new(&node, &a, "tdx", Some("kata-qemu-nvidia-gpu-tdx"), true);
    let o = run.run("install");
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(run.status().0, Some(0));
    let text = std::fs::read_to_string(node.path(&drop_in)).expect("drop-in");
    let old = kd.config_path("qemu-nvidia-gpu-tdx");
    let new = kd.config_path("qemu-nvidia-gpu-tdx-runtime-rs");
    node.write(&drop_in, &text.replace(&format!("ConfigPath = \"{old}\""), &format!("ConfigPath = \"{new}\"")));
    let (code, st) = run.status();
    assert_eq!(code, Some(4), "{st:#}");
    assert!(st["problems"].to_string().contains("now runs"), "{st:#}");
    let o = run.run("install");
    assert!(o.status.success(), "{}", show(&o));
    assert!(node.config_d_of(&new).contains(&DROP_IN.to_string()));
    assert!(!node.config_d_of(&old).contains(&DROP_IN.to_string()));
    assert_eq!(run.status().0, Some(0));
}

/// A multi-install's `10-installation-prefix.toml` sets `kernel`, `image` and `initrd`
/// together: a kernel-only addon is refused naming it (exit 1, node unchanged); an initrd
/// addon clears `image` and installs. A custom runtime's `50-overrides.toml` that sets a
/// key of ours is reported by status as shadowing it.
#[test]
fn multi_install_prefix_fragment_and_shadowing() {
    let node = Node::empty();
    let gpu = KataDeploy::multi(&node, "gpu");
    let kd = KataDeploy::new(&node);
    gpu.install_shim("qemu-nvidia-gpu-snp");
    kd.install_shim("qemu-nvidia-gpu-snp");
    kd.install_custom("my-gpu", "qemu-nvidia-gpu-snp", Some("[hypervisor.qemu]\nkernel = \"/opt/user/vmlinuz\"\n"));
    let (a_in, _) = kd.containerd_drop_in(V2, &["qemu-nvidia-gpu-snp"], &[("my-gpu", "qemu-nvidia-gpu-snp")]);
    let (b_in, _) = gpu.containerd_drop_in(V2, &["qemu-nvidia-gpu-snp"], &[]);
    node.write("/etc/containerd/config.toml", &format!("version = 2\nimports = [\"{a_in}\", \"{b_in}\"]\n"));
    let a = addon();
    let before = snap(&node);
    let o = Run::new(&node, &a, "snp", Some("kata-qemu-nvidia-gpu-snp-gpu"), false).run("install");
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("10-installation-prefix.toml") && err.contains("initrd"), "{err}");
    assert_eq!(snap(&node), before, "a refused install changed the node");

    let o = Run::new(&node, &a, "snp", Some("kata-qemu-nvidia-gpu-snp-gpu"), true).run("install");
    assert!(o.status.success(), "{}", show(&o));
    let config = gpu.config_path("qemu-nvidia-gpu-snp");
    assert_eq!(node.qemu_of(&config, "image").as_deref(), Some(""));

    let run = Run::new(&node, &a, "snp", Some("my-gpu"), true);
    let o = run.run("install");
    assert!(o.status.success(), "{}", show(&o));
    let (code, st) = run.status();
    assert_eq!(code, Some(4), "{st:#}");
    assert!(st["problems"].to_string().contains("50-overrides.toml"), "{st:#}");
}

/// Refusals: an unknown handler, another TEE, runc (exit 1, naming the handler and the CRI
/// files read, node unchanged); an invalid handler name (exit 2).
#[test]
fn refusals_leave_the_node_unchanged() {
    let (node, drop_in) = gpu_node();
    let a = addon();
    let before = snap(&node);
    for (rc, why) in [
        ("kata-nope", "no container runtime on the node defines this handler"),
        ("kata-qemu-nvidia-gpu-tdx", "not snp"),
        ("kata-qemu-snp,kata-qemu-nvidia-gpu", "not a confidential guest configuration"),
    ] {
        let o = Run::new(&node, &a, "snp", Some(rc), true).run("install");
        assert_eq!(o.status.code(), Some(1), "{rc}: {}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(why) && err.contains(&drop_in) && err.contains("/etc/containerd/config.toml"),
            "{rc}: {err}"
        );
        assert_eq!(snap(&node), before, "{rc}: the node changed");
    }
    let o = Run::new(&node, &a, "snp", Some("kata-qemu-snp, Kata_GPU"), true).run("install");
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Kata_GPU"), "{}", show(&o));
    assert_eq!(snap(&node), before);
}

/// MachineConfig mode runs `install --root /host --configmap FILE` before CRI-O starts
/// (host/deploy/machineconfig/kata-addons-install.service): the same key in that file
/// resolves OpenShift's `kata-cc` CRI-O handler (a drop-in in the form of the
/// sandboxed-containers operator's `config/peerpods/mc-50-crio-config.yaml`) from the
/// files alone, and only its configuration gets the drop-in.
#[test]
fn machineconfig_mode_configmap_file_with_runtime_class() {
    let node = Node::empty();
    let snp = node.openshift("snp");
    node.write(&snp, &kata_addons_tests::cri::shim_config("qemu-snp"));
    let tdx = node.openshift("tdx");
    node.write(&tdx, &kata_addons_tests::cri::shim_config("qemu-tdx"));
    node.write(
        "/etc/crio/crio.conf.d/50-kata-cc",
        &format!(
            "[crio.runtime.runtimes.kata-cc]\n  runtime_path = \"/usr/bin/containerd-shim-kata-v2\"\n  runtime_type = \"vm\"\n  \
             runtime_root = \"/run/vc\"\n  runtime_config_path = \"{snp}\"\n  privileged_without_host_devices = true\n"
        ),
    );
    let a = addon();
    let cm = tempfile::NamedTempFile::new().expect("configmap");
    std::fs::write(
        cm.path(),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kata-addon-artifacts\ndata:\n  addonImage: {}\n  \
             provider: snp\n  kernelPath: /boot/vmlinuz\n  initrdPath: /boot/initrd.img\n  runtimeClass: kata-cc\n",
            a.image
        ),
    )
    .expect("write configmap");
    let root = node.root().to_str().expect("utf-8");
    let o = run_kata_env(&["install", "--root", root, "--configmap", cm.path().to_str().expect("utf-8")], &[]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(node.config_d_of(&snp).contains(&DROP_IN.to_string()));
    assert!(node.config_d_of(&tdx).is_empty());
}

/// The RuntimeClass example of docs/configuration.md is a ConfigMap the policy accepts, with
/// the handlers in the plan.
#[test]
fn documented_runtime_class_example_is_accepted() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"))
        .expect("docs/configuration.md");
    let section = &doc[doc.find("## Targeting by RuntimeClass").expect("section")..];
    let start = section.find("```yaml\n").expect("yaml block") + 8;
    let yaml = &section[start..start + section[start..].find("```").expect("end")];
    let cm = tempfile::NamedTempFile::new().expect("configmap");
    std::fs::write(cm.path(), yaml).expect("write");
    let o = run_kata_env(
        &["preview", "--output", "json", "--root", "/nonexistent", "--configmap", cm.path().to_str().expect("utf-8")],
        &[],
    );
    assert!(o.status.success(), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        v["plan"]["runtimeClasses"],
        serde_json::json!(["kata-qemu-nvidia-gpu-snp", "kata-qemu-nvidia-gpu-snp-runtime-rs"]),
        "{v:#}"
    );
}
