//! How reference values are published: `reference-values.json` and `--output json` (the
//! values with their inputs and provenance), `--output rvps` (one Trustee RVPS message per
//! target, in RVPS' `sample` provenance format), and `--output text` for people.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use base64::Engine;
use serde::Serialize;

use super::{Target, Value};
use crate::kata_config::Setting;
use crate::policy::ExtensionImage;
use crate::state::FileRecord;

/// The RVPS message version Trustee's RVPS expects (`rvps/src/lib.rs`, `MESSAGE_VERSION`).
pub(crate) const RVPS_VERSION: &str = "0.1.0";
/// The RVPS provenance type whose payload is a base64 JSON map `{name: [values]}`.
pub(crate) const RVPS_SAMPLE: &str = "sample";

/// What a target's values were computed from, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Inputs {
    /// Effective configuration keys of the hypervisor table that are set, with the fragment.
    pub(crate) config: BTreeMap<String, Setting>,
    /// Effective `guest_extension_images`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) extensions: Vec<ExtensionImage>,
    /// The fragment that set `guest_extension_images` last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) extensions_from: Option<String>,
    /// The files kata-addons installed.
    pub(crate) files: Vec<FileRecord>,
    /// Run-time facts from the command line.
    pub(crate) overrides: super::Overrides,
    /// Host key documents used (IBM SE).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) host_key_documents: Vec<String>,
    /// The node files Kata reads for the configuration, in the order it merges them.
    pub(crate) fragments: Vec<String>,
}

/// The reference values of one target runtime configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TargetValues {
    /// Node path of the resolved runtime configuration.
    pub(crate) runtime_config: String,
    /// The RuntimeClass handler, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) handler: Option<String>,
    /// The provider.
    pub(crate) provider: String,
    /// The values, computed or not.
    pub(crate) values: Vec<Value>,
    /// What they were computed from.
    pub(crate) inputs: Inputs,
}

impl TargetValues {
    /// Computes the values of `t`.
    pub(crate) fn of(t: &Target) -> TargetValues {
        let mut config = BTreeMap::new();
        for (k, v) in [
            ("firmware", &t.firmware),
            ("kernel", &t.kernel),
            ("initrd", &t.initrd),
            ("image", &t.image),
            ("kernel_params", &t.kernel_params),
            ("rootfs_type", &t.rootfs_type),
            ("kernel_verity_params", &t.kernel_verity_params),
            ("default_vcpus", &t.default_vcpus),
            ("default_maxvcpus", &t.default_maxvcpus),
            ("cpu_features", &t.cpu_features),
            ("confidential_guest", &t.confidential_guest),
            ("machine_type", &t.machine_type),
        ] {
            if let Some(v) = v {
                config.insert(format!("{}.{k}", t.table), v.clone());
            }
        }
        TargetValues {
            runtime_config: t.runtime_config.clone(),
            handler: t.handler.clone(),
            provider: t.provider.to_string(),
            values: super::reference_values(t),
            inputs: Inputs {
                config,
                extensions: t.extensions.clone(),
                extensions_from: t.extensions_from.clone(),
                files: t.files.clone(),
                overrides: t.overrides.clone(),
                host_key_documents: t.host_keys.iter().map(|(d, _)| d.clone()).collect(),
                fragments: t.fragments.iter().map(|f| f.path.clone()).collect(),
            },
        }
    }

    /// The values that could not be computed.
    pub(crate) fn unavailable(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().filter_map(|v| match v {
            Value::Unavailable { name, reason } => Some((name.as_str(), reason.as_str())),
            Value::Computed(_) => None,
        })
    }

    /// The RVPS `sample` message of the computed values: `{"version", "type", "payload"}`,
    /// the payload the base64 (standard alphabet) of the JSON map `{name: [values]}`.
    pub(crate) fn rvps_message(&self) -> Result<String> {
        let mut payload: BTreeMap<&str, &[String]> = BTreeMap::new();
        for v in &self.values {
            if let Value::Computed(r) = v {
                payload.insert(&r.name, &r.values);
            }
        }
        let payload = serde_json::to_vec(&payload).context("serialising the RVPS payload")?;
        let msg = serde_json::json!({
            "version": RVPS_VERSION,
            "type": RVPS_SAMPLE,
            "payload": base64::engine::general_purpose::STANDARD.encode(payload),
        });
        serde_json::to_string(&msg).context("serialising the RVPS message")
    }
}

/// Every target's values, as published in `reference-values.json` and `--output json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Published {
    /// One entry per target runtime configuration.
    pub(crate) targets: Vec<TargetValues>,
}

impl Published {
    /// The JSON document (pretty, newline-terminated).
    pub(crate) fn json(&self) -> Result<String> {
        let mut s = serde_json::to_string_pretty(self).context("serialising the reference values")?;
        s.push('\n');
        Ok(s)
    }

    /// One RVPS message per target, one per line.
    pub(crate) fn rvps(&self) -> Result<String> {
        let mut s = String::new();
        for t in &self.targets {
            s.push_str(&t.rvps_message()?);
            s.push('\n');
        }
        Ok(s)
    }

    /// For people: per target, each value or why it is missing.
    pub(crate) fn text(&self) -> String {
        let mut s = String::new();
        for t in &self.targets {
            let handler = t.handler.as_deref().map(|h| format!(" (RuntimeClass handler {h})")).unwrap_or_default();
            s.push_str(&format!("{}{handler}, provider {}:\n", t.runtime_config, t.provider));
            for v in &t.values {
                match v {
                    Value::Computed(r) => {
                        s.push_str(&format!("  {} = {}\n", r.name, r.values.join(", ")));
                        for p in &r.provenance {
                            let at = [p.key.as_deref(), p.file.as_deref()]
                                .into_iter()
                                .flatten()
                                .collect::<Vec<_>>()
                                .join(" in ");
                            if at.is_empty() {
                                s.push_str(&format!("      from {}\n", p.what));
                            } else {
                                s.push_str(&format!("      from {} ({at})\n", p.what));
                            }
                        }
                    }
                    Value::Unavailable { name, reason } => s.push_str(&format!("  {name}: not computed: {reason}\n")),
                }
            }
        }
        s
    }

    /// A one-line summary: how many values per target, and which could not be computed.
    pub(crate) fn summary(&self) -> String {
        let computed: usize =
            self.targets.iter().map(|t| t.values.iter().filter(|v| matches!(v, Value::Computed(_))).count()).sum();
        let missing: Vec<String> =
            self.targets.iter().flat_map(|t| t.unavailable().map(|(n, _)| n.to_string())).collect();
        let mut missing_unique: Vec<String> = Vec::new();
        for m in missing {
            if !missing_unique.contains(&m) {
                missing_unique.push(m);
            }
        }
        if missing_unique.is_empty() {
            format!("{computed} reference values for {} runtime configurations", self.targets.len())
        } else {
            format!(
                "{computed} reference values for {} runtime configurations; not computed: {}",
                self.targets.len(),
                missing_unique.join(", ")
            )
        }
    }

    /// Whether any value could not be computed.
    pub(crate) fn incomplete(&self) -> bool {
        self.targets.iter().any(|t| t.unavailable().next().is_some())
    }
}
