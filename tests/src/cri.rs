//! Node roots in exactly the formats kata-deploy (kata-containers 7c6ba40,
//! `tools/packaging/kata-deploy/binary/src/`) and the container runtimes write, and
//! containerd itself as the oracle of what a handler runs.
//!
//! - [`KataDeploy`]: one kata-deploy install (prefix, multi-install suffix) of shims and
//!   custom runtimes: Kata configurations, their `config.d` fragments, and the runtime
//!   handlers kata-deploy writes for CRI-O and containerd.
//! - [`containerd_dump`]: `containerd --config F config dump` run on a copy of a node root
//!   (chrooted in a private mount namespace, the runner's `/usr` bound in), so imports of
//!   node paths (`/opt/kata/containerd/config.d/...`) resolve inside the root.

use std::path::Path;
use std::process::Command;

use crate::node::Node;

/// The `[hypervisor.qemu]` settings of a shim's configuration, as its template sets them
/// (kata-containers `src/runtime/config/configuration-<shim>.toml.in` and
/// `src/runtime-rs/config/configuration-<shim>-runtime-rs.toml.in`): SNP shims
/// `confidential_guest` + `sev_snp_guest` (lines 41/44 of configuration-qemu-snp.toml.in,
/// 42/45 of configuration-qemu-nvidia-gpu-snp.toml.in), TDX shims `confidential_guest` +
/// `tdx_quote_generation_service_socket_port` (lines 19/41 of configuration-qemu-tdx.toml.in,
/// 20/42 of configuration-qemu-nvidia-gpu-tdx.toml.in), plain `qemu` neither.
pub fn shim_config(shim: &str) -> String {
    let base = shim.strip_suffix("-runtime-rs").unwrap_or(shim);
    let gpu = base.contains("nvidia-gpu");
    let (kernel, image) = if gpu {
        ("vmlinuz-nvidia-gpu-confidential.container", "kata-containers-nvidia-gpu-confidential.img")
    } else if base == "qemu" {
        ("vmlinux.container", "kata-containers.img")
    } else {
        ("vmlinuz-confidential.container", "kata-containers-confidential.img")
    };
    let mut s = format!(
        "[hypervisor.qemu]\npath = \"/opt/kata/bin/qemu-system-x86_64\"\nkernel = \"/opt/kata/share/kata-containers/{kernel}\"\n\
         image = \"/opt/kata/share/kata-containers/{image}\"\nmachine_type = \"q35\"\nrootfs_type = \"ext4\"\n"
    );
    if base.ends_with("-tdx") {
        s.push_str("tdx_quote_generation_service_socket_port = 4050\n");
    }
    if base.ends_with("-snp") || base.ends_with("-tdx") {
        s.push_str("confidential_guest = true\n");
    }
    if base.ends_with("-snp") {
        s.push_str("sev_snp_guest = true\nsnp_guest_policy = 196608\n");
    }
    s.push_str(
        "kernel_params = \"\"\n\n[agent.kata]\ndebug_console_enabled = false\n\n[runtime]\nenable_debug = false\n",
    );
    s
}

/// kata-deploy's default x86_64 QEMU shims (config.rs `get_default_shims_for_arch`, less
/// the non-QEMU ones).
pub const SHIMS: &[&str] = &[
    "qemu",
    "qemu-runtime-rs",
    "qemu-nvidia-gpu",
    "qemu-nvidia-gpu-runtime-rs",
    "qemu-nvidia-gpu-snp",
    "qemu-nvidia-gpu-snp-runtime-rs",
    "qemu-nvidia-gpu-tdx",
    "qemu-nvidia-gpu-tdx-runtime-rs",
    "qemu-snp",
    "qemu-snp-runtime-rs",
    "qemu-tdx",
    "qemu-tdx-runtime-rs",
];

/// The CRI plugin ID kata-deploy writes for containerd config version 2
/// (runtime/containerd.rs `CONTAINERD_V2_CRI_PLUGIN_ID`).
pub const V2: &str = "\"io.containerd.grpc.v1.cri\"";
/// ... for version >= 3 (`CONTAINERD_V3_RUNTIME_PLUGIN_ID`).
pub const V3: &str = "\"io.containerd.cri.v1.runtime\"";

/// kata-deploy's `KATA_DEPLOY_CONFIG_WARNING` (artifacts/install.rs, prepended by
/// `add_kata_deploy_warning` to every copied configuration), first lines.
const WARNING: &str = "# =============================================================================\n\
# IMPORTANT: This file is managed by kata-deploy. Do not modify it directly!\n\
# =============================================================================\n\n";

/// One kata-deploy installation on a node.
pub struct KataDeploy<'a> {
    /// The node.
    pub node: &'a Node,
    /// `dest_dir` (config.rs `from_env`): `/opt/kata`, `/opt/kata-<suffix>` with
    /// `MULTI_INSTALL_SUFFIX`.
    pub dest_dir: String,
    /// `MULTI_INSTALL_SUFFIX`.
    pub suffix: Option<String>,
}

impl<'a> KataDeploy<'a> {
    /// The default install (`/opt/kata`).
    pub fn new(node: &'a Node) -> Self {
        KataDeploy { node, dest_dir: "/opt/kata".into(), suffix: None }
    }

    /// A multi-install (config.rs: `dest_dir = format!("{dest_dir}-{suffix}")`).
    pub fn multi(node: &'a Node, suffix: &str) -> Self {
        KataDeploy { node, dest_dir: format!("/opt/kata-{suffix}"), suffix: Some(suffix.into()) }
    }

    /// config.rs `shim_handler`: `kata-<shim>[-<suffix>]`.
    pub fn handler(&self, shim: &str) -> String {
        match &self.suffix {
            Some(s) => format!("kata-{shim}-{s}"),
            None => format!("kata-{shim}"),
        }
    }

    /// utils/system.rs `get_kata_containers_original_config_path`: runtime-rs shims live
    /// under `runtime-rs/`.
    fn defaults(&self, shim: &str) -> String {
        let go = format!("{}/share/defaults/kata-containers", self.dest_dir);
        if shim.ends_with("-runtime-rs") { format!("{go}/runtime-rs") } else { go }
    }

    /// utils/system.rs `get_kata_containers_config_path` + `configuration-<shim>.toml`: the
    /// ConfigPath kata-deploy writes for a shim.
    pub fn config_path(&self, shim: &str) -> String {
        format!("{}/runtimes/{shim}/configuration-{shim}.toml", self.defaults(shim))
    }

    /// The shim binary (`get_kata_containers_runtime_path`).
    pub fn runtime_path(&self, shim: &str) -> String {
        if shim.ends_with("-runtime-rs") {
            format!("{}/runtime-rs/bin/containerd-shim-kata-v2", self.dest_dir)
        } else {
            format!("{}/bin/containerd-shim-kata-v2", self.dest_dir)
        }
    }

    /// `setup_runtime_directory` + `write_common_drop_ins` (artifacts/install.rs): the
    /// configuration copied into `runtimes/<shim>/` with the warning prepended, the
    /// original replaced by the relative symlink `runtimes/<shim>/configuration-<shim>.toml`,
    /// and `config.d/10-installation-prefix.toml` on a non-default prefix. Returns the
    /// node path of the configuration.
    pub fn install_shim(&self, shim: &str) -> String {
        let path = self.config_path(shim);
        self.node.write(&path, &format!("{WARNING}{}", shim_config(shim)));
        let link = self.node.path(&format!("{}/configuration-{shim}.toml", self.defaults(shim)));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("runtimes/{shim}/configuration-{shim}.toml"), link).expect("symlink");
        std::fs::create_dir_all(self.node.path(&format!("{}/runtimes/{shim}/config.d", self.defaults(shim))))
            .expect("config.d");
        self.prefix_fragment(&format!("{}/runtimes/{shim}/config.d", self.defaults(shim)));
        path
    }

    /// `install_custom_runtime_configs`: `custom-runtimes/<handler>/configuration-<base>.toml`
    /// (a plain copy of the base shim's original configuration, warning prepended) with its
    /// own `config.d`, the common fragments, and the user's drop-in as `50-overrides.toml`.
    pub fn install_custom(&self, handler: &str, base: &str, overrides: Option<&str>) -> String {
        let dir = format!("{}/share/defaults/kata-containers/custom-runtimes/{handler}", self.dest_dir);
        let path = format!("{dir}/configuration-{base}.toml");
        self.node.write(&path, &format!("{WARNING}{}", shim_config(base)));
        std::fs::create_dir_all(self.node.path(&format!("{dir}/config.d"))).expect("config.d");
        self.prefix_fragment(&format!("{dir}/config.d"));
        if let Some(o) = overrides {
            self.node.write(&format!("{dir}/config.d/50-overrides.toml"), o);
        }
        path
    }

    /// The custom runtime's ConfigPath (containerd.rs `configure_custom_containerd_runtime`).
    pub fn custom_config_path(&self, handler: &str, base: &str) -> String {
        format!("{}/share/defaults/kata-containers/custom-runtimes/{handler}/configuration-{base}.toml", self.dest_dir)
    }

    /// `generate_installation_prefix_drop_in` (artifacts/install.rs 1507-1560): on a
    /// non-default prefix, `[hypervisor.qemu]` `path`, `kernel`, `image` AND `initrd`
    /// (all three), `firmware`, `firmware_volume`.
    fn prefix_fragment(&self, config_d: &str) {
        if self.dest_dir == "/opt/kata" {
            return;
        }
        let d = &self.dest_dir;
        self.node.write(
            &format!("{config_d}/10-installation-prefix.toml"),
            &format!(
                "# Installation prefix adjustments\n# Generated by kata-deploy\n\n[hypervisor.qemu]\n\
                 path = \"{d}/bin/qemu-system-x86_64-installation-prefix\"\n\
                 kernel = \"{d}/share/kata-containers/vmlinux.container\"\n\
                 image = \"{d}/share/kata-containers/kata-containers.img\"\n\
                 initrd = \"{d}/share/kata-containers/kata-containers-initrd.img\"\n\
                 firmware = \"{d}/share/kata-containers/firmware/\"\n\
                 firmware_volume = \"{d}/share/kata-containers/firmware/\"\n"
            ),
        );
    }

    /// One containerd handler table as `write_containerd_runtime_config` (runtime/containerd.rs)
    /// writes it under `plugin` (`"io.containerd.grpc.v1.cri"` for config version 2,
    /// `"io.containerd.cri.v1.runtime"` for >= 3, `cri` for none).
    pub fn containerd_handler(plugin: &str, handler: &str, runtime_path: &str, config_path: &str) -> String {
        format!(
            "[plugins.{plugin}.containerd.runtimes.{handler}]\nruntime_type = \"io.containerd.{handler}.v2\"\n\
             runtime_path = \"{runtime_path}\"\nprivileged_without_host_devices = true\n\
             pod_annotations = [\"io.katacontainers.*\"]\n\
             container_annotations = [\"io.kubernetes.container.terminationMessage*\"]\n\n\
             [plugins.{plugin}.containerd.runtimes.{handler}.options]\nConfigPath = \"{config_path}\"\n\n"
        )
    }

    /// The containerd drop-in for `shims` (`configure_containerd_runtime` each), at
    /// `{dest_dir}/containerd/config.d/kata-deploy.toml` (config.rs
    /// `containerd_drop_in_conf_file`). Returns its node path and text.
    pub fn containerd_drop_in(&self, plugin: &str, shims: &[&str], custom: &[(&str, &str)]) -> (String, String) {
        let mut text = String::new();
        for shim in shims {
            text.push_str(&Self::containerd_handler(
                plugin,
                &self.handler(shim),
                &self.runtime_path(shim),
                &self.config_path(shim),
            ));
        }
        for (handler, base) in custom {
            text.push_str(&Self::containerd_handler(
                plugin,
                handler,
                &self.runtime_path(base),
                &self.custom_config_path(handler, base),
            ));
        }
        let path = format!("{}/containerd/config.d/kata-deploy.toml", self.dest_dir);
        self.node.write(&path, &text);
        (path, text)
    }

    /// The CRI-O drop-in (runtime/crio.rs `configure_crio` + `write_crio_runtime_config`,
    /// tabs as written) at `/etc/crio/crio.conf.d//99-kata-deploy[-<suffix>]`.
    pub fn crio_drop_in(&self, shims: &[&str], custom: &[(&str, &str)]) -> String {
        let mut text = String::from("[crio]\n  storage_option = [\n\t\"overlay.skip_mount_home=true\",\n  ]\n");
        let mut add = |name: &str, rt: &str, cfg: &str| {
            text.push_str(&format!(
                "\n[crio.runtime.runtimes.{name}]\n\truntime_path = \"{rt}\"\n\truntime_type = \"vm\"\n\t\
                 runtime_root = \"/run/vc\"\n\truntime_config_path = \"{cfg}\"\n\tprivileged_without_host_devices = true\n"
            ));
        };
        for shim in shims {
            add(&self.handler(shim), &self.runtime_path(shim), &self.config_path(shim));
        }
        for (handler, base) in custom {
            add(handler, &self.runtime_path(base), &self.custom_config_path(handler, base));
        }
        let name = match &self.suffix {
            Some(s) => format!("99-kata-deploy-{s}"),
            None => "99-kata-deploy".to_string(),
        };
        let path = format!("/etc/crio/crio.conf.d/{name}");
        self.node.write(&path, &text);
        self.node.write("/etc/crio/crio.conf.d/100-debug", "");
        path
    }
}

/// Why [`containerd_dump`] cannot run here, if it cannot (no `containerd`, no `unshare`).
pub fn containerd_missing() -> Option<String> {
    for tool in ["containerd", "unshare", "chroot", "mount"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("{tool} is not installed (tests/run installs Debian's containerd)"));
        }
    }
    None
}

/// containerd's own merged configuration of a node root: `containerd --config <main>
/// config dump` on a copy of `root`, chrooted in a private mount namespace with the
/// runner's `/usr` bound in (the copy is dropped afterwards; `root` is not touched). It
/// runs from the main file's directory: Debian's containerd 1.6.20 takes a relative glob
/// import from its working directory (fixed in 1.6.30), so only there do both agree.
pub fn containerd_dump(root: &Path, main: &str) -> toml::Table {
    let dir = Path::new(main).parent().expect("main has a directory");
    containerd_dump_from(root, main, &dir.to_string_lossy())
}

/// [`containerd_dump`] run from the node directory `cwd` (where Debian's containerd takes
/// relative glob imports from).
pub fn containerd_dump_from(root: &Path, main: &str, cwd: &str) -> toml::Table {
    let copy = tempfile::tempdir().expect("oracle root");
    let c = copy.path();
    let st = Command::new("cp").arg("-a").arg(format!("{}/.", root.display())).arg(c).status().expect("cp");
    assert!(st.success(), "copying the node root");
    std::fs::create_dir_all(c.join("usr")).expect("usr");
    for (l, t) in [("lib", "usr/lib"), ("lib64", "usr/lib64"), ("bin", "usr/bin"), ("sbin", "usr/sbin")] {
        let _ = std::os::unix::fs::symlink(t, c.join(l));
    }
    // chroot(1) changes to the new `/`: the `cd` runs inside it.
    let script = format!(
        "mount --rbind /usr '{0}/usr' && exec chroot '{0}' /bin/sh -c \"cd '{1}' && exec /usr/bin/containerd --config '{2}' config dump\"",
        c.display(),
        cwd,
        main
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("run containerd");
    assert!(
        out.status.success(),
        "containerd config dump failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("containerd's dump is TOML")
}

/// A handler's `options.ConfigPath` in a containerd 1.6 dump (always version 2, CRI
/// plugin `io.containerd.grpc.v1.cri`).
pub fn dumped_config_path(dump: &toml::Table, handler: &str) -> Option<String> {
    dump.get("plugins")?
        .get("io.containerd.grpc.v1.cri")?
        .get("containerd")?
        .get("runtimes")?
        .get(handler)?
        .get("options")?
        .get("ConfigPath")?
        .as_str()
        .map(str::to_string)
}
