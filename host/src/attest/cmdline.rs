//! The guest kernel command line Kata composes for a runtime configuration, as both
//! runtimes compose it at the pinned Kata commit ([`KATA_COMMIT`]); the derivation, piece by
//! piece with its Kata source file and line, is in `docs/attestation.md#command-line-derivation`.
//!
//! Go runtime (`src/runtime/virtcontainers/qemu.go:191` `kernelParameters`), in order:
//! 1. the architecture's parameters (`qemu_amd64.go:64`), `intel_iommu=on iommu=pt` with
//!    `enable_iommu` (`qemu_amd64.go:115`), the root parameters of an `image`
//!    (`qemu_arch_base.go:819` `handleImagePath` → `hypervisor.go:132` `GetKernelRootParams`,
//!    nvdimm off for confidential guests: `qemu_amd64.go:149`), the console
//!    (`qemu_arch_base.go:384` `appendConsole`, called at `qemu.go:978`);
//! 2. `quiet` or `debug` and, with an image, the systemd status parameters
//!    (`qemu_arch_base.go:243`–`266`, `300`);
//! 3. `panic=1` (`qemu.go:152`), `nr_cpus` for non-confidential guests (`qemu.go:200`),
//!    `selinux=0|1` (`qemu.go:204`);
//! 4. the configuration's parameter list (`qemu.go:215`), built by `SetKernelParams`
//!    (`pkg/katautils/config.go:1559`): the systemd unit parameters with an image
//!    (`pkg/katautils/create.go:36`, `51`), `scsi_mod.scan=none` for virtio-scsi
//!    (`config.go:1581`), the agent's (`kata_agent.go:346`), then `kernel_params` split by
//!    `KernelParamFields` (`hypervisor.go:1387`); `fips=1` on a FIPS node (`create.go:221`);
//! 5. `kata.extension.<name>.verity_params=<params>` per extension (`qemu.go:217`);
//!    serialised by `SerializeParams` (`hypervisor.go:1113`), joined by one space.
//!
//! runtime-rs (`src/runtime-rs/crates/hypervisor/src/qemu/cmdline_generator.rs:184`
//! `Kernel::new`), in order: the defaults (`kernel_param.rs:127`), the root parameters when
//! there is no initrd (`cmdline_generator.rs:188`, `kernel_param.rs:144`), the agent's
//! parameters in key order (`kata-types/src/config/mod.rs:216`, `runtimes/src/manager.rs:900`)
//! before `kernel_params` (`hypervisor/mod.rs:559`, `cmdline_generator.rs:205`),
//! `selinux=0|1` (`cmdline_generator.rs:208`), the extensions (`cmdline_generator.rs:217`),
//! `intel_iommu=on iommu=pt` (`cmdline_generator.rs:3043`), `console=hvc0`
//! (`cmdline_generator.rs:3351`, `qemu/inner.rs:377`); joined by `KernelParams::to_string`
//! (`kernel_param.rs:299`).
//!
//! What Kata adds per pod (the `io.katacontainers.config.hypervisor.kernel_params`
//! annotation) is not known at install: such pods need `--append`. A configuration value the
//! derivation does not model (runtime-rs' `mem_agent`) is refused, never guessed.

use std::collections::BTreeMap;

use crate::kata_config::{Fragment, effective_value};

/// The Kata commit whose source the derivation follows (kata-containers/kata-containers).
pub(crate) const KATA_COMMIT: &str = "7c6ba40";

/// The hypervisor table both runtimes read for QEMU.
const HV: &[&str] = &["hypervisor", "qemu"];

/// Which Kata runtime reads a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Runtime {
    /// The Go runtime (`containerd-shim-kata-v2`).
    Go,
    /// runtime-rs.
    RuntimeRs,
}

impl Runtime {
    /// The runtime that reads the configuration at `node_path`: runtime-rs for kata-deploy's
    /// `…/runtime-rs/…` tree and `configuration-*-runtime-rs.toml`, the Go runtime for the
    /// others (kata-deploy's Go shims, OpenShift's `/etc/kata-containers/kata-*`).
    pub(crate) fn of_config(node_path: &str) -> Runtime {
        let name = node_path.rsplit('/').next().unwrap_or(node_path);
        if node_path.contains("/runtime-rs/") || name.ends_with("-runtime-rs.toml") {
            Runtime::RuntimeRs
        } else {
            Runtime::Go
        }
    }

    /// Its name in output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Runtime::Go => "go",
            Runtime::RuntimeRs => "runtime-rs",
        }
    }
}

/// One parameter of the composed command line and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Piece {
    /// The parameter as it appears on the command line.
    pub(crate) text: String,
    /// The Kata source (file:line at [`KATA_COMMIT`]) or the configuration file it comes from.
    pub(crate) origin: String,
}

/// A composed command line and its pieces, in order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Composed {
    /// The command line (QEMU's `-append`).
    pub(crate) cmdline: String,
    /// Its parameters with their origins.
    pub(crate) pieces: Vec<Piece>,
}

/// What the composition reads.
pub(crate) struct Inputs<'a> {
    /// The runtime that reads the configuration.
    pub(crate) runtime: Runtime,
    /// The files Kata reads for the configuration, in order (kata-addons' drop-in included).
    pub(crate) fragments: &'a [Fragment],
    /// Whether the node runs in FIPS mode (`/proc/sys/crypto/fips_enabled`; Go runtime only).
    pub(crate) fips: bool,
    /// The node's CPU count (Go's `nr_cpus` for non-confidential guests).
    pub(crate) host_cpus: u32,
}

/// One parameter before serialisation.
struct Param {
    key: String,
    value: String,
    origin: String,
}

fn p(key: &str, value: &str, origin: &str) -> Param {
    Param { key: key.to_string(), value: value.to_string(), origin: origin.to_string() }
}

/// Typed reads of the effective configuration, naming the key and file on a type error.
struct Cfg<'a> {
    fragments: &'a [Fragment],
}

/// A value in effect and the node file that set it.
type Found<T> = Option<(T, String)>;

impl Cfg<'_> {
    fn get(&self, table: &[&str], key: &str) -> Option<(&toml::Value, &str)> {
        let mut path: Vec<&str> = table.to_vec();
        path.push(key);
        effective_value(self.fragments, &path)
    }

    fn wrong(table: &[&str], key: &str, from: &str, want: &str) -> String {
        format!("`{}.{key}` in {from} is not {want}: Kata fails to load this configuration", table.join("."))
    }

    fn string(&self, table: &[&str], key: &str) -> Result<Found<String>, String> {
        match self.get(table, key) {
            None => Ok(None),
            Some((toml::Value::String(s), from)) => Ok(Some((s.clone(), from.to_string()))),
            Some((_, from)) => Err(Self::wrong(table, key, from, "a string")),
        }
    }

    fn boolean(&self, table: &[&str], key: &str) -> Result<Found<bool>, String> {
        match self.get(table, key) {
            None => Ok(None),
            Some((toml::Value::Boolean(b), from)) => Ok(Some((*b, from.to_string()))),
            Some((_, from)) => Err(Self::wrong(table, key, from, "a boolean")),
        }
    }

    fn unsigned(&self, table: &[&str], key: &str) -> Result<Found<u64>, String> {
        match self.get(table, key) {
            None => Ok(None),
            Some((toml::Value::Integer(i), from)) => match u32::try_from(*i) {
                Ok(n) => Ok(Some((u64::from(n), from.to_string()))),
                Err(_) => Err(Self::wrong(table, key, from, "an unsigned 32-bit integer")),
            },
            Some((_, from)) => Err(Self::wrong(table, key, from, "an integer")),
        }
    }

    /// A boolean, `default` when absent.
    fn flag(&self, table: &[&str], key: &str, default: bool) -> Result<bool, String> {
        Ok(self.boolean(table, key)?.map(|(b, _)| b).unwrap_or(default))
    }

    /// A non-empty string and its file.
    fn nonempty(&self, table: &[&str], key: &str) -> Result<Found<String>, String> {
        Ok(self.string(table, key)?.filter(|(s, _)| !s.trim().is_empty()))
    }
}

/// Composes the command line Kata passes to QEMU's `-append` for the configuration.
pub(crate) fn compose(inp: &Inputs<'_>) -> Result<Composed, String> {
    let c = Cfg { fragments: inp.fragments };
    let image = c.nonempty(HV, "image")?;
    let initrd = c.nonempty(HV, "initrd")?;
    if let (Some((_, fi)), Some((_, fr))) = (&image, &initrd) {
        return Err(format!(
            "both `image` ({fi}) and `initrd` ({fr}) are set: Kata refuses to start such a guest \
             (hypervisor.go `conflictingAssets`)"
        ));
    }
    let params = match inp.runtime {
        Runtime::Go => go(&c, image.is_some(), inp)?,
        Runtime::RuntimeRs => runtime_rs(&c, initrd.is_none())?,
    };
    serialise(inp.runtime, params)
}

/// `[agent.<name>]`: the agent table both runtimes read (`runtime.agent_name`, `kata`).
fn agent_table(c: &Cfg<'_>) -> Result<Vec<String>, String> {
    let name = c.string(&["runtime"], "agent_name")?.map(|(n, _)| n).filter(|n| !n.is_empty());
    Ok(vec!["agent".to_string(), name.unwrap_or_else(|| "kata".to_string())])
}

/// The user's `kernel_params`, split as both runtimes split them: on spaces outside double
/// quotes, each piece trimmed, empty pieces dropped (Go `KernelParamFields`,
/// `hypervisor.go:1387`; runtime-rs `split_kernel_params`, `kernel_param.rs:28`), then at
/// the first `=` (`hypervisor.go:1135`, `kernel_param.rs:271`).
fn split_params(s: &str, origin: &str) -> Vec<Param> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quote = false;
    let mut flush = |cur: &mut String| {
        let t = cur.trim();
        if !t.is_empty() {
            let (k, v) = t.split_once('=').unwrap_or((t, ""));
            out.push(p(k, v, origin));
        }
        cur.clear();
    };
    for ch in s.chars() {
        if ch == '"' {
            in_quote = !in_quote;
        } else if ch == ' ' && !in_quote {
            flush(&mut cur);
            continue;
        }
        cur.push(ch);
    }
    flush(&mut cur);
    out
}

/// The filesystem `rootfs_type` names (`""` = ext4 in both runtimes).
fn rootfs_type(c: &Cfg<'_>) -> Result<(String, String), String> {
    let (t, from) = c.string(HV, "rootfs_type")?.unwrap_or_default();
    let t = if t.is_empty() { "ext4".to_string() } else { t };
    match t.as_str() {
        "ext4" | "xfs" | "erofs" => Ok((t, from)),
        other => Err(format!(
            "rootfs_type {other:?} in {from} is not one Kata boots (ext4, xfs, erofs): Kata refuses to start this guest"
        )),
    }
}

/// The dm-verity parameters in effect, checked by the one shared parser.
fn verity(c: &Cfg<'_>) -> Result<Option<(kata_addons_facts::verity::VerityParams, String)>, String> {
    match c.nonempty(HV, "kernel_verity_params")? {
        None => Ok(None),
        Some((s, from)) => kata_addons_facts::verity::parse(s.trim())
            .map(|v| Some((v, from.clone())))
            .map_err(|e| format!("kernel_verity_params in {from}: {e}")),
    }
}

/// Root parameters of a measured image: the dm-verity target and `root=/dev/dm-0`
/// (Go `hypervisor.go:143`, runtime-rs `kernel_param.rs:211`: the same text).
fn verity_root(v: &kata_addons_facts::verity::VerityParams, fs: &str, blk: bool, origin: &str) -> Vec<Param> {
    let (data, hash) = if blk { ("/dev/vda1", "/dev/vda2") } else { ("/dev/pmem0p1", "/dev/pmem0p2") };
    let sectors = u64::from(v.data_block_size / 512).saturating_mul(v.data_blocks);
    let table = format!(
        "dm-verity,,,ro,0 {sectors} verity 1 {data} {hash} {} {} {} 0 sha256 {} {}",
        v.data_block_size, v.hash_block_size, v.data_blocks, v.root_hash, v.salt
    );
    let flags = if fs == "ext4" { "data=ordered,errors=remount-ro ro" } else { "ro" };
    vec![
        p("dm-mod.create", &format!("\"{table}\""), origin),
        p("root", "/dev/dm-0", origin),
        p("rootflags", flags, origin),
        p("rootfstype", fs, origin),
    ]
}

/// Root parameters of an unmeasured image (Go `hypervisor.go:181`, runtime-rs
/// `kernel_param.rs:152`).
fn plain_root(fs: &str, blk: bool, dax: bool, origin: &str) -> Vec<Param> {
    let root = if blk { "/dev/vda1" } else { "/dev/pmem0p1" };
    let flags = match (fs, dax) {
        ("ext4", true) => "dax,data=ordered,errors=remount-ro ro",
        ("ext4", false) => "data=ordered,errors=remount-ro ro",
        (_, true) => "dax ro",
        (_, false) => "ro",
    };
    vec![p("root", root, origin), p("rootflags", flags, origin), p("rootfstype", fs, origin)]
}

/// The extension parameters (Go `qemu.go:217`, runtime-rs `cmdline_generator.rs:217`).
fn extensions(c: &Cfg<'_>, origin: &str) -> Vec<Param> {
    let (list, from) = crate::kata_config::extensions(c.fragments, HV);
    let from = from.unwrap_or_default();
    list.iter()
        .map(|e| {
            p(&format!("kata.extension.{}.verity_params", e.name), &e.verity_params, &format!("{origin} ({from})"))
        })
        .collect()
}

/// The Go runtime's agent parameters (`kata_agent.go`), from the `[agent.*]` table.
fn go_agent(c: &Cfg<'_>) -> Result<Vec<Param>, String> {
    let mut out = Vec::new();
    let agent = agent_table(c)?;
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    if c.flag(&agent, "enable_debug", false)? {
        out.push(p("agent.log", "debug", "go kata_agent.go:350 (agent enable_debug)"));
    }
    if c.flag(&agent, "enable_tracing", false)? {
        out.push(p("agent.trace", "true", "go kata_agent.go:354 (agent enable_tracing)"));
    }
    if c.flag(&agent, "debug_console_enabled", false)? {
        out.push(p("agent.debug_console", "", "go kata_agent.go:363 (debug_console_enabled)"));
        out.push(p("agent.debug_console_vport", "1026", "go kata_agent.go:364 (debug_console_enabled)"));
    }
    for (key, param, line) in [
        ("cdh_api_timeout", "agent.cdh_api_timeout", "367"),
        ("launch_process_timeout", "agent.launch_process_timeout", "372"),
    ] {
        if let Some((n, from)) = c.unsigned(&agent, key)?.filter(|(n, _)| *n > 0) {
            out.push(p(param, &n.to_string(), &format!("go kata_agent.go:{line} ({key} in {from})")));
        }
    }
    if c.flag(&agent, "visible_cdi_devices", false)? {
        out.push(p("agent.visible_cdi_devices", "true", "go kata_agent.go:377 (visible_cdi_devices)"));
    }
    Ok(out)
}

/// The Go runtime's parameters, in its order (see the module documentation).
fn go(c: &Cfg<'_>, image: bool, inp: &Inputs<'_>) -> Result<Vec<Param>, String> {
    const BASE: [(&str, &str); 12] = [
        ("tsc", "reliable"),
        ("no_timer_check", ""),
        ("rcupdate.rcu_expedited", "1"),
        ("i8042.direct", "1"),
        ("i8042.dumbkbd", "1"),
        ("i8042.nopnp", "1"),
        ("i8042.noaux", "1"),
        ("noreplace-smp", ""),
        ("reboot", "k"),
        ("cryptomgr.notests", ""),
        ("net.ifnames", "0"),
        ("pci", "lastbus=0"),
    ];
    let debug = c.flag(HV, "enable_debug", false)?;
    let confidential = c.flag(HV, "confidential_guest", false)?;
    let machine = c.string(HV, "machine_type")?.map(|(m, _)| m).unwrap_or_default();
    let disable_nvdimm = c.flag(HV, "disable_image_nvdimm", false)? || machine == "microvm" || confidential;
    let mut out: Vec<Param> = BASE.iter().map(|(k, v)| p(k, v, "go qemu_amd64.go:64")).collect();
    if c.flag(HV, "enable_iommu", false)? {
        out.push(p("intel_iommu", "on", "go qemu_amd64.go:117 (enable_iommu)"));
        out.push(p("iommu", "pt", "go qemu_amd64.go:119 (enable_iommu)"));
    }
    if image {
        let (fs, _) = rootfs_type(c)?;
        match verity(c)? {
            Some((v, from)) => {
                out.extend(verity_root(&v, &fs, disable_nvdimm, &format!("go hypervisor.go:143 ({from})")))
            }
            None => out.extend(plain_root(&fs, disable_nvdimm, !disable_nvdimm, "go hypervisor.go:181 (image)")),
        }
    }
    if c.flag(HV, "use_legacy_serial", false)? {
        out.push(p("console", "ttyS0", "go qemu_arch_base.go:402"));
    } else {
        out.push(p("console", "hvc0", "go qemu_arch_base.go:421"));
        out.push(p("console", "hvc1", "go qemu_arch_base.go:422"));
    }
    if debug {
        out.push(p("debug", "", "go qemu_arch_base.go:256 (enable_debug)"));
        if image {
            out.push(p("systemd.show_status", "true", "go qemu_arch_base.go:263"));
            out.push(p("systemd.log_level", "debug", "go qemu_arch_base.go:263"));
        }
    } else {
        out.push(p("quiet", "", "go qemu_arch_base.go:243"));
        if image {
            out.push(p("systemd.show_status", "false", "go qemu_arch_base.go:249"));
        }
    }
    out.push(p("panic", "1", "go qemu.go:152"));
    if !confidential {
        let req = c.unsigned(HV, "default_maxvcpus")?.map(|(n, _)| n).unwrap_or(0);
        let host = u64::from(inp.host_cpus);
        let max = if req == 0 || req >= host { host } else { req }.min(240);
        out.push(p("nr_cpus", &max.to_string(), "go qemu.go:200 (default_maxvcpus, pkg/katautils/config.go:500)"));
    }
    let selinux = if c.flag(HV, "disable_guest_selinux", false)? { "0" } else { "1" };
    out.push(p("selinux", selinux, "go qemu.go:204 (disable_guest_selinux)"));
    if image {
        out.push(p("systemd.unit", "kata-containers.target", "go pkg/katautils/create.go:38"));
        out.push(p("systemd.mask", "systemd-networkd.service", "go pkg/katautils/create.go:42"));
        out.push(p("systemd.mask", "systemd-networkd.socket", "go pkg/katautils/create.go:46"));
    }
    let driver = c.string(HV, "block_device_driver")?.map(|(d, _)| d).unwrap_or_default();
    match driver.as_str() {
        "" | "virtio-scsi" => {
            out.push(p("scsi_mod.scan", "none", "go pkg/katautils/config.go:1584 (block_device_driver)"))
        }
        "virtio-blk" | "virtio-mmio" | "nvdimm" | "virtio-blk-ccw" => {}
        other => {
            return Err(format!(
                "block_device_driver {other:?} is not one the Go runtime accepts: Kata fails to load this configuration"
            ));
        }
    }
    out.extend(go_agent(c)?);
    if let Some((s, from)) = c.string(HV, "kernel_params")? {
        out.extend(split_params(&s, &format!("kernel_params ({from})")));
    }
    if inp.fips {
        out.push(p("fips", "1", "go pkg/katautils/create.go:238 (/proc/sys/crypto/fips_enabled)"));
    }
    out.extend(extensions(c, "go qemu.go:224"));
    Ok(out)
}

/// runtime-rs' parameters, in its order (see the module documentation).
fn runtime_rs(c: &Cfg<'_>, no_initrd: bool) -> Result<Vec<Param>, String> {
    let mut out = vec![
        p("reboot", "k", "runtime-rs kernel_param.rs:130"),
        p("panic", "1", "runtime-rs kernel_param.rs:131"),
        p("systemd.unit", "kata-containers.target", "runtime-rs kernel_param.rs:132"),
        p("systemd.mask", "systemd-networkd.service", "runtime-rs kernel_param.rs:133"),
        p("systemd.mask", "systemd-networkd.socket", "runtime-rs kernel_param.rs:134"),
    ];
    if c.flag(HV, "enable_debug", false)? {
        out.push(p("agent.log_vport", "1025", "runtime-rs kernel_param.rs:138 (enable_debug)"));
    }
    if no_initrd {
        let (driver, dfrom) = c.string(HV, "vm_rootfs_driver")?.unwrap_or_default();
        let driver = if driver.is_empty() { "virtio-blk-pci".to_string() } else { driver };
        let blk = match driver.as_str() {
            "virtio-blk-pci" | "virtio-blk-ccw" | "virtio-blk-mmio" => true,
            "virtio-pmem" => false,
            other => {
                return Err(format!(
                    "vm_rootfs_driver {other:?} in {dfrom} is not one runtime-rs boots from: it refuses to start this guest"
                ));
            }
        };
        let (fs, _) = rootfs_type(c)?;
        match verity(c)? {
            Some((v, from)) => {
                out.extend(verity_root(&v, &fs, blk, &format!("runtime-rs kernel_param.rs:243 ({from})")))
            }
            None => out.extend(plain_root(&fs, blk, !blk, "runtime-rs kernel_param.rs:152 (no initrd)")),
        }
    }
    let agent = agent_table(c)?;
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    let mem: Vec<&str> = agent.iter().copied().chain(["mem_agent"]).collect();
    if c.flag(&mem, "enable", false)? {
        return Err(format!(
            "[{}.mem_agent] enable = true: the mem-agent kernel parameters runtime-rs adds are not modelled; give --append",
            agent.join(".")
        ));
    }
    let mut kv: BTreeMap<&str, String> = BTreeMap::new();
    if c.flag(&agent, "enable_debug", false)? {
        kv.insert("agent.log", "debug".into());
    }
    if c.flag(&agent, "enable_tracing", false)? {
        kv.insert("agent.trace", "true".into());
    }
    if let Some((n, _)) = c.unsigned(&agent, "container_pipe_size")?.filter(|(n, _)| *n > 0) {
        kv.insert("agent.container_pipe_size", n.to_string());
    }
    if let Some((n, _)) = c.unsigned(&agent, "launch_process_timeout")?.filter(|(n, _)| *n > 0) {
        kv.insert("agent.launch_process_timeout", n.to_string());
    }
    // kata-types/src/config/agent.rs:233: 50 000 ms when absent.
    let cdh = c.unsigned(&agent, "cdh_api_timeout_ms")?.map(|(n, _)| n).unwrap_or(50_000);
    if cdh > 0 {
        kv.insert("agent.cdh_api_timeout", (cdh / 1000).to_string());
    }
    if c.flag(&agent, "debug_console_enabled", false)? {
        kv.insert("agent.debug_console", String::new());
        kv.insert("agent.debug_console_vport", "1026".into());
    }
    if c.flag(&agent, "visible_cdi_devices", false)? {
        kv.insert("agent.visible_cdi_devices", "true".into());
    }
    for (k, v) in kv {
        out.push(p(k, &v, "runtime-rs kata-types config/mod.rs:216, runtimes/manager.rs:900"));
    }
    if let Some((s, from)) = c.string(HV, "kernel_params")? {
        out.extend(split_params(&s, &format!("kernel_params ({from})")));
    }
    // kata-types/src/config/hypervisor/mod.rs:1820: `disable_guest_selinux` is true when absent.
    let selinux = if c.flag(HV, "disable_guest_selinux", true)? { "0" } else { "1" };
    out.push(p("selinux", selinux, "runtime-rs cmdline_generator.rs:208 (disable_guest_selinux)"));
    out.extend(extensions(c, "runtime-rs cmdline_generator.rs:220"));
    if c.flag(HV, "enable_iommu", false)? {
        out.push(p("intel_iommu", "on", "runtime-rs cmdline_generator.rs:3043 (enable_iommu)"));
        out.push(p("iommu", "pt", "runtime-rs cmdline_generator.rs:3043 (enable_iommu)"));
    }
    out.push(p("console", "hvc0", "runtime-rs cmdline_generator.rs:3351, qemu/inner.rs:377"));
    Ok(out)
}

/// Serialises the parameters: `key=value`, `key` alone when the value is empty; the Go
/// runtime drops a parameter with neither and writes the value alone without a key
/// (`hypervisor.go:1113`), runtime-rs refuses both (`kernel_param.rs:108`).
fn serialise(runtime: Runtime, params: Vec<Param>) -> Result<Composed, String> {
    let mut pieces = Vec::new();
    for q in params {
        let text = match (q.key.is_empty(), q.value.is_empty(), runtime) {
            (true, true, Runtime::Go) => continue,
            (true, _, Runtime::RuntimeRs) => {
                return Err(format!(
                    "a kernel parameter with an empty key ({:?}, from {}): runtime-rs refuses to start this guest",
                    q.value, q.origin
                ));
            }
            (true, false, Runtime::Go) => q.value,
            (false, true, _) => q.key,
            (false, false, _) => format!("{}={}", q.key, q.value),
        };
        pieces.push(Piece { text, origin: q.origin });
    }
    let cmdline = pieces.iter().map(|p| p.text.as_str()).collect::<Vec<_>>().join(" ");
    Ok(Composed { cmdline, pieces })
}

#[cfg(test)]
#[path = "cmdline_tests.rs"]
mod tests;
