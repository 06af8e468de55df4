//! Reference values for remote attestation: what the installed guest will measure, per
//! target runtime configuration, named as Trustee's policies name them (see
//! `docs/attestation.md`). Each provider module turns a [`Target`] (the effective Kata
//! configuration of one runtime configuration and the installed files) into [`Value`]s;
//! a value that cannot be computed is [`Value::Unavailable`] with the reason, never a guess.

use std::path::Path;

use anyhow::{Context, Result, bail};
use cap_std::fs::OpenOptionsExt;
use serde::Serialize;

pub(crate) mod cmdline;
pub(crate) mod hkd;
pub(crate) mod invalidates;
pub(crate) mod publish;
pub(crate) mod report;
pub(crate) mod se;
pub mod snp;

use crate::kata_config::{self, Fragment, Setting};
use crate::node::Root;
use crate::policy::{ExtensionImage, Provider};
use crate::state::FileRecord;

/// One reference value as Trustee's RVPS stores it: a name and the accepted values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RefValue {
    /// Trustee's name of the value (`snp_launch_measurement`, `se.tag`, ...).
    pub(crate) name: String,
    /// Every accepted value (one per vCPU count where the measurement depends on it).
    pub(crate) values: Vec<String>,
    /// What the value was computed from.
    pub(crate) provenance: Vec<Provenance>,
}

/// One input of a reference value: what it is, and the node file and configuration key it
/// came from, when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Provenance {
    /// What the input is (`kernel`, `firmware`, `kernel command line`, ...), with its value
    /// or digest when short.
    pub(crate) what: String,
    /// Node path of the file it came from (an installed file, or the configuration
    /// fragment that set the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) file: Option<String>,
    /// The configuration key (dotted, e.g. `hypervisor.qemu.firmware`) or command-line flag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) key: Option<String>,
}

/// A reference value, or why it could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub(crate) enum Value {
    /// Computed.
    Computed(RefValue),
    /// Not computed: the name it would have and the reason.
    Unavailable {
        /// Trustee's name of the value.
        name: String,
        /// Why it is not computed (the missing input, the unsupported case).
        reason: String,
    },
}

/// What only the node knows at run time, given on the command line of `reference-values`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Overrides {
    /// The vCPU type QEMU runs the guest with (`--vcpu-type`).
    pub(crate) vcpu_type: Option<String>,
    /// The vCPU counts to publish a value for, inclusive (`--vcpus N` or `A-B`).
    pub(crate) vcpus: Option<(u32, u32)>,
    /// Appended to the composed kernel command line (`--append`).
    pub(crate) append: Option<String>,
}

/// The inputs of one target runtime configuration: its effective Kata configuration (the
/// main file and every `config.d` fragment merged as Kata merges them, kata-addons' drop-in
/// included) and what kata-addons installed for it.
#[derive(Debug)]
pub(crate) struct Target<'a> {
    /// The addon's provider.
    pub(crate) provider: Provider,
    /// Node path of the resolved `configuration*.toml`.
    pub(crate) runtime_config: String,
    /// The RuntimeClass handler that runs it, if the addon was installed for one.
    pub(crate) handler: Option<String>,
    /// The hypervisor table (dotted, `hypervisor.qemu`).
    pub(crate) table: String,
    /// Effective `firmware`.
    pub(crate) firmware: Option<Setting>,
    /// Effective `kernel`.
    pub(crate) kernel: Option<Setting>,
    /// Effective `initrd`.
    pub(crate) initrd: Option<Setting>,
    /// Effective `image`.
    pub(crate) image: Option<Setting>,
    /// Effective `kernel_params`.
    pub(crate) kernel_params: Option<Setting>,
    /// Effective `rootfs_type`.
    pub(crate) rootfs_type: Option<Setting>,
    /// Effective `kernel_verity_params`.
    pub(crate) kernel_verity_params: Option<Setting>,
    /// Effective `default_vcpus` (TOML syntax for a number).
    pub(crate) default_vcpus: Option<Setting>,
    /// Effective `default_maxvcpus`.
    pub(crate) default_maxvcpus: Option<Setting>,
    /// Effective `cpu_features`.
    pub(crate) cpu_features: Option<Setting>,
    /// Effective `confidential_guest` (`true`/`false`).
    pub(crate) confidential_guest: Option<Setting>,
    /// Effective `machine_type`.
    pub(crate) machine_type: Option<Setting>,
    /// Effective `guest_extension_images`, in order.
    pub(crate) extensions: Vec<ExtensionImage>,
    /// The fragment that set `guest_extension_images` last.
    pub(crate) extensions_from: Option<String>,
    /// The files kata-addons installed (the state's records: digests, dm-verity parameters).
    pub(crate) files: Vec<FileRecord>,
    /// Run-time facts given on the command line.
    pub(crate) overrides: Overrides,
    /// IBM SE host key documents (node path or file, and the key's hash).
    pub(crate) host_keys: Vec<(String, hkd::HostKey)>,
    /// Every fragment Kata reads for this configuration, in order (for keys not above).
    pub(crate) fragments: Vec<Fragment>,
    /// The node root, for reading the files the configuration names.
    root: &'a Root,
}

impl<'a> Target<'a> {
    /// The target of the runtime configuration `runtime_config` (node path) from the
    /// fragments Kata reads for it.
    pub(crate) fn new(
        root: &'a Root,
        provider: Provider,
        runtime_config: &str,
        handler: Option<String>,
        fragments: Vec<Fragment>,
        files: Vec<FileRecord>,
        overrides: Overrides,
    ) -> Target<'a> {
        let table = kata_addons_facts::HYPERVISOR_TABLE.to_string();
        let dotted: Vec<&str> = table.split('.').collect();
        let get = |k: &str| {
            let mut key = dotted.clone();
            key.push(k);
            kata_config::effective(&fragments, &key)
        };
        let (extensions, extensions_from) = kata_config::extensions(&fragments, &dotted);
        Target {
            provider,
            runtime_config: runtime_config.to_string(),
            handler,
            firmware: get("firmware"),
            kernel: get("kernel"),
            initrd: get("initrd"),
            image: get("image"),
            kernel_params: get("kernel_params"),
            rootfs_type: get("rootfs_type"),
            kernel_verity_params: get("kernel_verity_params"),
            default_vcpus: get("default_vcpus"),
            default_maxvcpus: get("default_maxvcpus"),
            cpu_features: get("cpu_features"),
            confidential_guest: get("confidential_guest"),
            machine_type: get("machine_type"),
            extensions,
            extensions_from,
            table,
            files,
            overrides,
            host_keys: Vec::new(),
            fragments,
            root,
        }
    }

    /// The provenance of a setting: its key in the hypervisor table and the fragment.
    pub(crate) fn provenance(&self, key: &str, s: &Setting) -> Provenance {
        Provenance {
            what: format!("{key} = {:?}", s.value),
            file: Some(s.from.clone()),
            key: Some(format!("{}.{key}", self.table)),
        }
    }

    /// Opens a regular file the configuration names (node path), resolved inside the node
    /// root as the node resolves it; returns it with its size.
    pub(crate) fn open(&self, node_path: &str) -> Result<(std::fs::File, u64)> {
        let rel = self.root.resolve(node_path).with_context(|| format!("resolving {node_path} on the node"))?;
        let rel = if rel.as_os_str().is_empty() { Path::new(".").to_path_buf() } else { rel };
        // Non-blocking, and checked on the opened handle: a FIFO cannot stall the runner.
        let mut o = cap_std::fs::OpenOptions::new();
        o.read(true).custom_flags(libc::O_NONBLOCK);
        let f = self.root.dir().open_with(&rel, &o).with_context(|| format!("opening {node_path}"))?.into_std();
        let meta = f.metadata().with_context(|| format!("inspecting {node_path}"))?;
        if !meta.is_file() {
            bail!("{node_path} is not a regular file");
        }
        Ok((f, meta.len()))
    }
}

/// The reference values of one target: the installed files' digests and dm-verity root
/// hashes (every provider), then the provider's launch measurement values.
pub(crate) fn reference_values(t: &Target) -> Vec<Value> {
    let mut out = artifact_values(t);
    match t.provider {
        Provider::Se => out.extend(se_values(t)),
        Provider::Snp => out.extend(snp::reference_values(t)),
        Provider::Tdx => {
            for name in ["mr_td", "rtmr_1", "rtmr_2"] {
                out.push(Value::Unavailable {
                    name: name.into(),
                    reason: "not computed (MRTD/RTMR not implemented): the TDX measurement of the firmware, kernel, \
                             initrd and command line is not computed by kata-addons yet"
                        .into(),
                });
            }
        }
    }
    out
}

/// The digests and dm-verity root hashes of the installed files, from the state's records.
fn artifact_values(t: &Target) -> Vec<Value> {
    let mut out = Vec::new();
    for f in &t.files {
        let prov = |what: &str| {
            vec![Provenance {
                what: format!("{what} of the installed {} ({})", f.kind, f.source),
                file: Some(f.path.clone()),
                key: None,
            }]
        };
        if let Some(sha) = &f.sha256 {
            out.push(Value::Computed(RefValue {
                name: format!("kata_addons.{}.sha256", f.kind),
                values: vec![sha.clone()],
                provenance: prov("sha256"),
            }));
        }
        if let Some(v) = &f.verity {
            out.push(Value::Computed(RefValue {
                name: format!("kata_addons.{}.root_hash", f.kind),
                values: vec![v.root_hash.clone()],
                provenance: prov("dm-verity root hash"),
            }));
        }
    }
    out
}

/// IBM SE: the header of the kernel Kata boots (an SE image), and its values.
fn se_values(t: &Target) -> Vec<Value> {
    const NAMES: [&str; 4] = ["se.version", "se.tag", "se.image_phkh", "se.attestation_phkh"];
    let unavailable = |reason: String| {
        NAMES.iter().map(|n| Value::Unavailable { name: (*n).into(), reason: reason.clone() }).collect::<Vec<_>>()
    };
    let Some(kernel) = &t.kernel else {
        return unavailable(format!("{} sets no kernel", t.runtime_config));
    };
    let header = t.open(&kernel.value).and_then(|(f, _)| se::find(&f, &kernel.value));
    match header {
        Ok(h) => {
            let mut values = se::values(&h, &kernel.value, &t.host_keys);
            for v in &mut values {
                if let Value::Computed(r) = v {
                    r.provenance.insert(0, t.provenance("kernel", kernel));
                }
            }
            values
        }
        Err(e) => unavailable(format!("{e:#}")),
    }
}
