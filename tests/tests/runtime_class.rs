//! RuntimeClass resolution (docs/design.md#runtimeclass) on node roots in kata-deploy's formats, with
//! Debian's containerd as the oracle: for every containerd fixture, `containerd --config F
//! config dump` must give the handler the `ConfigPath` kata-addons resolves. CRI-O is not
//! packaged here: its fixtures follow its documented rules (crio.conf(5), crio.conf.d:
//! lexical order, later files win) and cri-o's `UpdateFromPath` walk.

use kata_addons::kata_config::{self as runtime_class};
use kata_addons::node::Root;
use kata_addons::policy::Provider;
use kata_addons_tests::cri::{
    KataDeploy, SHIMS, V2, V3, containerd_dump, containerd_dump_from, containerd_missing, dumped_config_path,
};
use kata_addons_tests::node::Node;

fn resolve(node: &Node, handlers: &[&str], tee: Provider) -> anyhow::Result<Vec<(String, String)>> {
    let root = Root::open(node.root()).expect("root");
    let hs: Vec<String> = handlers.iter().map(|h| h.to_string()).collect();
    Ok(runtime_class::resolve(&root, &hs, tee)?.into_iter().map(|t| (t.handler, t.config.resolved)).collect())
}

fn refusal(node: &Node, handlers: &[&str], tee: Provider) -> String {
    match resolve(node, handlers, tee) {
        Ok(t) => panic!("resolved {t:?}, expected a refusal"),
        Err(e) => format!("{e:#}"),
    }
}

/// Every handler resolves to what containerd's own dump says, and that is kata-deploy's path.
fn agrees_with_containerd(node: &Node, main: &str, cases: &[(&str, &str, Provider)]) {
    if let Some(why) = containerd_missing() {
        panic!("needs containerd: {why}");
    }
    let dump = containerd_dump(node.root(), main);
    for (handler, expected, tee) in cases {
        let ours = resolve(node, &[handler], *tee).unwrap_or_else(|e| panic!("{handler}: {e:#}"));
        assert_eq!(ours, vec![(handler.to_string(), expected.to_string())], "{handler}");
        assert_eq!(dumped_config_path(&dump, handler).as_deref(), Some(*expected), "containerd's dump for {handler}");
    }
}

/// A GPU node set up by kata-deploy for containerd 2.0/2.1: the drop-in in
/// `/opt/kata/containerd/config.d/kata-deploy.toml`, added to the main config's `imports`
/// (containerd.rs `configure_containerd`: `append_to_toml_array(imports_file, ".imports", ...)`).
#[test]
fn gpu_shims_through_a_containerd_import_agree_with_containerd() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    for s in SHIMS {
        kd.install_shim(s);
    }
    let (drop_in, _) = kd.containerd_drop_in(V2, SHIMS, &[]);
    node.write(
        "/etc/containerd/config.toml",
        &format!(
            "version = 2\nimports = [\"{drop_in}\"]\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n\
             default_runtime_name = \"runc\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
             runtime_type = \"io.containerd.runc.v2\"\n"
        ),
    );
    agrees_with_containerd(
        &node,
        "/etc/containerd/config.toml",
        &[
            ("kata-qemu-nvidia-gpu-snp", &kd.config_path("qemu-nvidia-gpu-snp"), Provider::Snp),
            ("kata-qemu-nvidia-gpu-snp-runtime-rs", &kd.config_path("qemu-nvidia-gpu-snp-runtime-rs"), Provider::Snp),
            ("kata-qemu-nvidia-gpu-tdx", &kd.config_path("qemu-nvidia-gpu-tdx"), Provider::Tdx),
            ("kata-qemu-nvidia-gpu-tdx-runtime-rs", &kd.config_path("qemu-nvidia-gpu-tdx-runtime-rs"), Provider::Tdx),
            ("kata-qemu-snp", &kd.config_path("qemu-snp"), Provider::Snp),
            ("kata-qemu-tdx-runtime-rs", &kd.config_path("qemu-tdx-runtime-rs"), Provider::Tdx),
        ],
    );
    // The list in its order, duplicates already collapsed by the policy.
    let both = resolve(&node, &["kata-qemu-nvidia-gpu-snp", "kata-qemu-snp"], Provider::Snp).expect("two");
    assert_eq!(both.len(), 2);
}

/// containerd >= 2.2: kata-deploy writes `/etc/containerd/conf.d/kata-deploy.toml` when the
/// main config imports `/etc/containerd/conf.d` (config.rs `get_containerd_paths`).
#[test]
fn conf_d_glob_import_agrees_with_containerd() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-nvidia-gpu-snp");
    let (_, text) = kd.containerd_drop_in(V2, &["qemu-nvidia-gpu-snp"], &[]);
    node.write("/etc/containerd/conf.d/kata-deploy.toml", &text);
    node.write("/etc/containerd/config.toml", "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n");
    agrees_with_containerd(
        &node,
        "/etc/containerd/config.toml",
        &[("kata-qemu-nvidia-gpu-snp", &kd.config_path("qemu-nvidia-gpu-snp"), Provider::Snp)],
    );
}

/// A relative import is taken from the importing file's directory, cleaned first; a
/// relative glob too (current containerd; the oracle runs from that directory).
#[test]
fn relative_imports_agree_with_containerd() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-snp");
    kd.install_shim("qemu-nvidia-gpu-tdx");
    node.write("/etc/containerd/config.toml", "version = 2\nimports = [\"extra/../extra/snp.toml\"]\n");
    node.write("/etc/containerd/extra/snp.toml", "imports = [\"more/*.toml\"]\n");
    node.write(
        "/etc/containerd/extra/more/tdx.toml",
        &KataDeploy::containerd_handler(
            V2,
            "kata-qemu-nvidia-gpu-tdx",
            &kd.runtime_path("qemu-nvidia-gpu-tdx"),
            &kd.config_path("qemu-nvidia-gpu-tdx"),
        ),
    );
    if let Some(why) = containerd_missing() {
        panic!("needs containerd: {why}");
    }
    // The second level's relative glob is taken from its importer's directory
    // (/etc/containerd/extra) by current containerd, from the working directory by
    // Debian's 1.6.20: run that one from /etc/containerd/extra.
    let dump = containerd_dump_from(node.root(), "/etc/containerd/config.toml", "/etc/containerd/extra");
    let ours = resolve(&node, &["kata-qemu-nvidia-gpu-tdx"], Provider::Tdx).expect("relative imports");
    assert_eq!(ours, vec![("kata-qemu-nvidia-gpu-tdx".to_string(), kd.config_path("qemu-nvidia-gpu-tdx"))]);
    assert_eq!(dumped_config_path(&dump, "kata-qemu-nvidia-gpu-tdx"), Some(kd.config_path("qemu-nvidia-gpu-tdx")));
}

/// k3s: the rendered config imports the versioned drop-in directory
/// (config.rs `k3s_rke2_rendered_has_import`), where kata-deploy writes
/// `config.toml.d/kata-deploy.toml` (`k3s_rke2_drop_in_dir_name`).
#[test]
fn k3s_drop_in_directory_agrees_with_containerd() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-nvidia-gpu-tdx");
    let dir = "/var/lib/rancher/k3s/agent/etc/containerd";
    let (_, text) = kd.containerd_drop_in(V2, &["qemu-nvidia-gpu-tdx"], &[]);
    node.write(&format!("{dir}/config.toml.d/kata-deploy.toml"), &text);
    node.write(
        &format!("{dir}/config.toml"),
        &format!(
            "# File generated by k3s. DO NOT EDIT.\nversion = 2\nimports = [\"{dir}/config.toml.d/*.toml\"]\n\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n"
        ),
    );
    agrees_with_containerd(
        &node,
        &format!("{dir}/config.toml"),
        &[("kata-qemu-nvidia-gpu-tdx", &kd.config_path("qemu-nvidia-gpu-tdx"), Provider::Tdx)],
    );
}

/// A multi-install (`/opt/kata-<suffix>`, handlers `kata-<shim>-<suffix>`) beside the default
/// one, and a custom runtime (`custom-runtimes/<handler>/configuration-<base>.toml`), written
/// as kata-deploy writes them for containerd < 2.0: into the main config itself
/// (containerd.rs `get_containerd_output_path` without drop-in support).
#[test]
fn multi_install_and_custom_runtime_agree_with_containerd() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    let gpu = KataDeploy::multi(&node, "gpu");
    kd.install_shim("qemu-nvidia-gpu-snp");
    gpu.install_shim("qemu-nvidia-gpu-snp");
    kd.install_custom("my-gpu-snp", "qemu-nvidia-gpu-snp", Some("[hypervisor.qemu]\ndefault_memory = 8192\n"));
    let (_, a) = kd.containerd_drop_in(V2, &["qemu-nvidia-gpu-snp"], &[("my-gpu-snp", "qemu-nvidia-gpu-snp")]);
    let (_, b) = gpu.containerd_drop_in(V2, &["qemu-nvidia-gpu-snp"], &[]);
    node.write("/etc/containerd/config.toml", &format!("version = 2\n\n{a}{b}"));
    agrees_with_containerd(
        &node,
        "/etc/containerd/config.toml",
        &[
            ("kata-qemu-nvidia-gpu-snp", &kd.config_path("qemu-nvidia-gpu-snp"), Provider::Snp),
            ("kata-qemu-nvidia-gpu-snp-gpu", &gpu.config_path("qemu-nvidia-gpu-snp"), Provider::Snp),
            ("my-gpu-snp", &kd.custom_config_path("my-gpu-snp", "qemu-nvidia-gpu-snp"), Provider::Snp),
        ],
    );
    assert!(gpu.config_path("qemu-nvidia-gpu-snp").starts_with("/opt/kata-gpu/share/defaults/kata-containers/"));
}

/// A config without `version` is version 1: the CRI plugin is `plugins.cri` (kata-deploy's
/// `CONTAINERD_LEGACY_CRI_PLUGIN_ID`), which containerd's dump shows as version 2.
#[test]
fn legacy_cri_plugin_name_agrees_with_containerd() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-snp");
    node.write(
        "/etc/containerd/config.toml",
        &KataDeploy::containerd_handler(
            "cri",
            "kata-qemu-snp",
            &kd.runtime_path("qemu-snp"),
            &kd.config_path("qemu-snp"),
        ),
    );
    agrees_with_containerd(
        &node,
        "/etc/containerd/config.toml",
        &[("kata-qemu-snp", &kd.config_path("qemu-snp"), Provider::Snp)],
    );
}

/// containerd 1.x replaces a plugin section per file, 2.x merges: a later file with a CRI
/// section but without the handler hides it from 1.x only. The files do not say which
/// containerd runs, so the handler is refused naming both readings; containerd 1.6 (the
/// oracle) indeed no longer has it.
#[test]
fn a_handler_containerd_1_and_2_read_differently_is_refused() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-snp");
    node.write(
        "/etc/containerd/config.toml",
        &format!(
            "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n{}",
            KataDeploy::containerd_handler(
                V2,
                "kata-qemu-snp",
                &kd.runtime_path("qemu-snp"),
                &kd.config_path("qemu-snp")
            )
        ),
    );
    node.write(
        "/etc/containerd/conf.d/10-snapshotter.toml",
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nsnapshotter = \"overlayfs\"\n",
    );
    if let Some(why) = containerd_missing() {
        panic!("needs containerd: {why}");
    }
    let dump = containerd_dump(node.root(), "/etc/containerd/config.toml");
    assert_eq!(dumped_config_path(&dump, "kata-qemu-snp"), None, "containerd 1.6 replaced the CRI section");
    let e = refusal(&node, &["kata-qemu-snp"], Provider::Snp);
    assert!(e.contains("containerd 1.x and 2.x read these files differently") && e.contains("1.x: not defined"), "{e}");
    assert!(e.contains("/etc/containerd/conf.d/10-snapshotter.toml"), "{e}");
}

/// Version 3 (containerd 2.x only): the handler is under `io.containerd.cri.v1.runtime`; a
/// version-2 section in the same files is migrated only where the v3 one has no runtimes.
#[test]
fn version_3_split_cri_plugin() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-tdx");
    kd.install_shim("qemu-nvidia-gpu-tdx");
    let (_, text) = kd.containerd_drop_in(V3, &["qemu-nvidia-gpu-tdx"], &[]);
    node.write("/etc/containerd/conf.d/kata-deploy.toml", &text);
    node.write(
        "/etc/containerd/config.toml",
        &format!(
            "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n{}",
            KataDeploy::containerd_handler(
                V2,
                "kata-qemu-tdx",
                &kd.runtime_path("qemu-tdx"),
                &kd.config_path("qemu-tdx")
            )
        ),
    );
    assert_eq!(
        resolve(&node, &["kata-qemu-nvidia-gpu-tdx"], Provider::Tdx).expect("v3 handler"),
        vec![("kata-qemu-nvidia-gpu-tdx".to_string(), kd.config_path("qemu-nvidia-gpu-tdx"))]
    );
    // containerd 2.x ignores a version-2 section in a version-3 configuration.
    let e = refusal(&node, &["kata-qemu-tdx"], Provider::Tdx);
    assert!(e.contains("no container runtime on the node defines this handler"), "{e}");
}

/// CRI-O: `crio.conf`, then every file of `crio.conf.d` (no extension needed, walked into
/// subdirectories) in lexical order, a later handler table replacing an earlier one.
/// OpenShift's `kata-cc` handler is written in the form of the sandboxed-containers
/// operator's own CRI-O drop-ins (`config/peerpods/mc-50-crio-config.yaml`: `runtime_path
/// = "/usr/bin/containerd-shim-kata-v2"`, `runtime_type = "vm"`, `runtime_config_path`).
#[test]
fn crio_drop_ins_in_lexical_order_later_wins() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-nvidia-gpu-snp-runtime-rs");
    kd.install_shim("qemu-snp");
    kd.crio_drop_in(&["qemu-nvidia-gpu-snp-runtime-rs", "qemu-snp"], &[]);
    node.write("/etc/kata-containers/kata-snp/configuration.toml", &kata_addons_tests::cri::shim_config("qemu-snp"));
    node.write("/etc/crio/crio.conf", "[crio.runtime]\ndefault_runtime = \"crun\"\n");
    node.write(
        "/etc/crio/crio.conf.d/50-kata-cc",
        "[crio.runtime.runtimes.kata-cc]\n  runtime_path = \"/usr/bin/containerd-shim-kata-v2\"\n  runtime_type = \"vm\"\n  \
         runtime_root = \"/run/vc\"\n  runtime_config_path = \"/etc/kata-containers/kata-snp/configuration.toml\"\n  \
         privileged_without_host_devices = true\n",
    );
    assert_eq!(
        resolve(&node, &["kata-cc", "kata-qemu-nvidia-gpu-snp-runtime-rs"], Provider::Snp).expect("crio"),
        vec![
            ("kata-cc".to_string(), "/etc/kata-containers/kata-snp/configuration.toml".to_string()),
            ("kata-qemu-nvidia-gpu-snp-runtime-rs".to_string(), kd.config_path("qemu-nvidia-gpu-snp-runtime-rs")),
        ]
    );
    // A file walked later (in the subdirectory `zz/`, after `99-kata-deploy`) redefines
    // kata-cc: its whole table replaces the earlier one.
    node.write(
        "/etc/crio/crio.conf.d/zz/override.conf",
        &format!(
            "[crio.runtime.runtimes.kata-cc]\nruntime_type = \"vm\"\nruntime_path = \"/usr/bin/containerd-shim-kata-v2\"\n\
             runtime_config_path = \"{}\"\n",
            kd.config_path("qemu-snp")
        ),
    );
    assert_eq!(
        resolve(&node, &["kata-cc"], Provider::Snp).expect("later wins"),
        vec![("kata-cc".to_string(), kd.config_path("qemu-snp"))]
    );
    node.write(
        "/etc/crio/crio.conf.d/zzz-runtime-only",
        "[crio.runtime.runtimes.kata-cc]\nruntime_type = \"vm\"\nruntime_path = \"/usr/bin/containerd-shim-kata-v2\"\n",
    );
    let e = refusal(&node, &["kata-cc"], Provider::Snp);
    assert!(
        e.contains("without a Kata configuration path") && e.contains("/etc/crio/crio.conf.d/zzz-runtime-only"),
        "{e}"
    );
}

/// Every refusal names the handler and every CRI file read; one bad handler refuses the list.
#[test]
fn refusals_name_the_handler_and_every_file_read() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    for s in ["qemu", "qemu-snp", "qemu-tdx", "qemu-nvidia-gpu-snp"] {
        kd.install_shim(s);
    }
    let (drop_in, mut text) = kd.containerd_drop_in(V2, &["qemu", "qemu-snp", "qemu-tdx", "qemu-nvidia-gpu-snp"], &[]);
    // A handler whose ConfigPath is missing, one whose ConfigPath is a dangling symlink,
    // one whose configuration does not parse.
    text.push_str(&KataDeploy::containerd_handler(
        V2,
        "kata-gone",
        &kd.runtime_path("qemu-snp"),
        "/opt/kata/gone.toml",
    ));
    text.push_str(&KataDeploy::containerd_handler(
        V2,
        "kata-dangling",
        &kd.runtime_path("qemu-snp"),
        "/opt/kata/share/defaults/kata-containers/configuration-qemu-removed.toml",
    ));
    text.push_str(&KataDeploy::containerd_handler(
        V2,
        "kata-broken",
        &kd.runtime_path("qemu-snp"),
        "/opt/kata/broken.toml",
    ));
    node.write(&drop_in, &text);
    node.write("/opt/kata/broken.toml", "[hypervisor.qemu\nkernel = \n");
    std::os::unix::fs::symlink(
        "runtimes/qemu-removed/configuration-qemu-removed.toml",
        node.path("/opt/kata/share/defaults/kata-containers/configuration-qemu-removed.toml"),
    )
    .expect("dangling symlink");
    node.write(
        "/etc/containerd/config.toml",
        &format!(
            "version = 2\nimports = [\"{drop_in}\"]\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
             runtime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun]\n\
             runtime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun.options]\n\
             BinaryName = \"/usr/bin/crun\"\n"
        ),
    );
    let files = ["/etc/containerd/config.toml", drop_in.as_str()];
    let cases: &[(&str, &str)] = &[
        ("kata-nope", "no container runtime on the node defines this handler"),
        ("kata-gone", "its Kata configuration /opt/kata/gone.toml"),
        ("kata-dangling", "does not exist on the node (missing, or a dangling symlink)"),
        ("kata-broken", "Kata cannot load this configuration: /opt/kata/broken.toml"),
        ("runc", "not Kata Containers: runtime_type = \"io.containerd.runc.v2\""),
        ("crun", "BinaryName = \"/usr/bin/crun\""),
        ("kata-qemu-tdx", "a tdx configuration (tdx_quote_generation_service_socket_port is set), not snp"),
        ("kata-qemu", "not a confidential guest configuration"),
    ];
    for (h, why) in cases {
        let e = refusal(&node, &[h], Provider::Snp);
        assert!(e.contains(&format!("runtimeClass handler `{h}`")) && e.contains(why), "{h}: {e}");
        for f in files {
            assert!(e.contains(f), "{h}: the refusal does not name {f}: {e}");
        }
    }
    // One bad handler refuses the whole list, naming each bad one.
    let e = refusal(&node, &["kata-qemu-nvidia-gpu-snp", "kata-nope", "kata-qemu-tdx"], Provider::Snp);
    assert!(
        e.contains("`kata-nope`") && e.contains("`kata-qemu-tdx`") && !e.contains("`kata-qemu-nvidia-gpu-snp`"),
        "{e}"
    );
    // A handler in a CRI-O of the same node with another config path is ambiguous.
    node.write(
        "/etc/crio/crio.conf.d/99-x",
        &format!(
            "[crio.runtime.runtimes.kata-qemu-snp]\nruntime_type = \"vm\"\nruntime_path = \"/usr/bin/containerd-shim-kata-v2\"\n\
             runtime_config_path = \"{}\"\n",
            kd.config_path("qemu-nvidia-gpu-snp")
        ),
    );
    let e = refusal(&node, &["kata-qemu-snp"], Provider::Snp);
    assert!(e.contains("define it differently"), "{e}");
}

/// A handler whose config path changes in the CRI configuration is drift; the set follows
/// `--runtime-config`; every Kata handler's configuration is a place kata-addons looks for
/// its drop-ins.
#[test]
fn drift_selection_and_known_configurations() {
    let node = Node::empty();
    let kd = KataDeploy::new(&node);
    kd.install_shim("qemu-nvidia-gpu-snp");
    kd.install_shim("qemu-nvidia-gpu-snp-runtime-rs");
    let (drop_in, _) = kd.containerd_drop_in(V2, &["qemu-nvidia-gpu-snp", "qemu-nvidia-gpu-snp-runtime-rs"], &[]);
    node.write("/etc/containerd/config.toml", &format!("version = 2\nimports = [\"{drop_in}\"]\n"));
    let root = Root::open(node.root()).expect("root");
    let hs = vec!["kata-qemu-nvidia-gpu-snp".to_string(), "kata-qemu-nvidia-gpu-snp-runtime-rs".to_string()];
    let all = runtime_class::discover(&root, &hs, Provider::Snp, &[], &Default::default()).expect("both");
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].handler.as_deref(), Some("kata-qemu-nvidia-gpu-snp"));
    let only = kata_addons::kata_config::Selection {
        only: vec![kd.config_path("qemu-nvidia-gpu-snp-runtime-rs")],
        ..Default::default()
    };
    let one = runtime_class::discover(&root, &hs, Provider::Snp, &[], &only).expect("restricted");
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].handler.as_deref(), Some("kata-qemu-nvidia-gpu-snp-runtime-rs"));
    let mut known = runtime_class::config_paths(&root).expect("known");
    known.sort();
    assert_eq!(known, vec![kd.config_path("qemu-nvidia-gpu-snp-runtime-rs"), kd.config_path("qemu-nvidia-gpu-snp")]);

    let recorded = vec![("kata-qemu-nvidia-gpu-snp".to_string(), kd.config_path("qemu-nvidia-gpu-snp"))];
    assert!(runtime_class::drift(&root, &recorded, Provider::Snp).expect("drift").is_empty());
    // kata-deploy points the handler at another shim's configuration.
    let (_, text) = kd.containerd_drop_in(V2, &["qemu-nvidia-gpu-snp-runtime-rs"], &[]);
    let moved = text.replace("kata-qemu-nvidia-gpu-snp-runtime-rs", "kata-qemu-nvidia-gpu-snp");
    node.write(&drop_in, &moved);
    let d = runtime_class::drift(&root, &recorded, Provider::Snp).expect("drift");
    assert!(d.len() == 1 && d[0].contains("now runs") && d[0].contains("runtime-rs"), "{d:?}");
    node.write(&drop_in, "");
    let d = runtime_class::drift(&root, &recorded, Provider::Snp).expect("drift");
    assert!(d.len() == 1 && d[0].contains("no longer resolves"), "{d:?}");
}
