//! Command-line arguments into domain options, once, with every flag range check here: a
//! value outside what a flag accepts is a usage error (exit 64) naming the flag.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use super::{
    Action, ConfigArgs, DaemonArgs, GlobalArgs, LayoutArgs, LimitArgs, LogFormat, NodeArgs, PreviewFormat,
    RegistryArgs, Watch, WebhookArgs,
};
use crate::error::{invalid, usage};
use crate::extract::Limits;
use crate::fetch::PullOptions;
use crate::kata_config::Selection;
use crate::node::Site;
use crate::policy::{self, PolicyOptions};
use crate::source::{Platform, RegistryOptions, proxy, retry};
use crate::trust::TrustOptions;
use crate::{configmap, daemon, logging, preview, webhook};

/// `v` seconds as a duration when `min <= v <= max`, else a usage error naming `--flag`.
fn seconds(flag: &str, v: f64, min: f64, max: f64) -> Result<Duration> {
    if !(v.is_finite() && v >= min && v <= max) {
        return Err(usage(format!("--{flag} must be between {min} and {max} seconds, got {v}")));
    }
    Ok(Duration::from_secs_f64(v))
}

impl GlobalArgs {
    /// Policy limits and cache location.
    pub(super) fn policy_options(&self) -> Result<PolicyOptions> {
        let t = self.policy_timeout;
        if !(t.is_finite() && t > 0.0 && t <= 3600.0) {
            return Err(usage(format!("--policy-timeout must be between 0 and 3600 seconds, got {t}")));
        }
        let timeout = Duration::from_secs_f64(t);
        if self.policy_memory == 0 || self.policy_memory > 4096 {
            return Err(usage(format!("--policy-memory must be between 1 and 4096 MiB, got {}", self.policy_memory)));
        }
        Ok(PolicyOptions {
            timeout,
            // At most 4096 << 20: fits every usize of a 64-bit target; saturate elsewhere.
            memory_limit: usize::try_from(self.policy_memory << 20).unwrap_or(usize::MAX),
            cache_dir: self.cache_dir.clone().or_else(policy::default_cache_dir),
        })
    }

    /// The policy component selected by `--policy-component` (or the embedded one).
    pub(super) fn load_policy(&self) -> Result<policy::Policy> {
        policy::Policy::load(self.policy_component.as_deref(), self.policy_options()?)
    }
}

impl From<LogFormat> for logging::Format {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Text => logging::Format::Text,
            LogFormat::Json => logging::Format::Json,
        }
    }
}

impl PreviewFormat {
    /// The preview output format.
    pub(super) fn format(self) -> preview::Format {
        match self {
            PreviewFormat::Text => preview::Format::Text,
            PreviewFormat::Json => preview::Format::Json,
            PreviewFormat::Env => preview::Format::Env,
            PreviewFormat::Yaml => preview::Format::Yaml,
        }
    }
}

impl ConfigArgs {
    /// Where the configuration is read from.
    pub(super) fn source(&self) -> configmap::Source {
        match (&self.configmap, &self.configmap_dir) {
            (Some(f), _) => configmap::Source::File(f.clone()),
            (None, Some(d)) => configmap::Source::Dir(d.clone()),
            (None, None) => configmap::Source::Env,
        }
    }
}

impl NodeArgs {
    /// Where on the node to work.
    pub(super) fn site(&self) -> Site {
        Site { root: self.root.clone(), lock_timeout: Duration::from_secs(self.lock_timeout) }
    }
}

impl LayoutArgs {
    /// The runtime configuration selection, as the policy checks it for a plan.
    pub(super) fn selection(&self) -> Selection {
        Selection {
            kata_prefix: self.kata_prefix.clone(),
            only: self.runtime_configs.clone(),
            allow_shared_config_d: self.allow_shared_config_d,
        }
    }

    /// The selection of a command that has no plan (uninstall): `--kata-prefix` and
    /// `--runtime-config` must have the shapes the policy accepts for install, else the
    /// input is invalid configuration (exit 2, as the policy's own refusal would be).
    pub(super) fn checked_selection(&self) -> Result<Selection> {
        if !kata_addons_facts::is_clean_path(&self.kata_prefix) {
            return Err(invalid(format!(
                "--kata-prefix {:?} is not a clean absolute path (no `.`, `..`, `//` or trailing `/`)",
                self.kata_prefix
            )));
        }
        for rc in &self.runtime_configs {
            let name = kata_addons_facts::file_name(rc);
            if !(kata_addons_facts::is_clean_path(rc) && kata_addons_facts::is_configuration_file_name(name)) {
                return Err(invalid(format!(
                    "--runtime-config {rc:?} is not the clean absolute node path of a Kata configuration*.toml"
                )));
            }
        }
        Ok(self.selection())
    }
}

impl LimitArgs {
    /// The defaults, overridden by the limit flags (each at least 1).
    pub(super) fn limits(&self) -> Result<Limits> {
        let d = Limits::default();
        let positive = |v: Option<u64>, flag: &str, default: u64| -> Result<u64> {
            match v {
                Some(0) => Err(usage(format!("{flag} must be at least 1"))),
                Some(v) => Ok(v),
                None => Ok(default),
            }
        };
        let max_layers = match self.max_layers {
            Some(0) => return Err(usage("--max-layers must be at least 1")),
            Some(n) => n,
            None => d.max_layers,
        };
        Ok(Limits {
            max_file_size: positive(self.max_file_bytes, "--max-file-bytes", d.max_file_size)?,
            max_total_size: positive(self.max_total_bytes, "--max-total-bytes", d.max_total_size)?,
            max_blob_size: d.max_blob_size,
            max_layers,
            max_layer_ratio: positive(self.max_layer_ratio, "--max-layer-ratio", d.max_layer_ratio)?,
            max_layer_bytes: positive(self.max_layer_bytes, "--max-layer-bytes", d.max_layer_bytes)?,
            max_index_entries: positive(self.max_index_entries, "--max-index-entries", d.max_index_entries)?,
            max_index_bytes: positive(self.max_index_bytes, "--max-index-bytes", d.max_index_bytes)?,
        })
    }
}

impl RegistryArgs {
    /// Registry access, trust and extraction limits of a pull whose node files (registry
    /// configuration, pull secret, trust policy, keys, lookasides) are beneath `root`.
    pub(super) fn pull_options(&self, root: &Path) -> Result<PullOptions> {
        let platform = match &self.platform {
            Some(p) => Platform::parse(p).map_err(|e| usage(format!("--platform: {e:#}")))?,
            None => Platform::current(),
        };
        if self.pull_deadline == 0 {
            return Err(usage("--pull-deadline must be at least 1 second"));
        }
        if self.timeout == 0 {
            return Err(usage("--timeout must be at least 1 second"));
        }
        let proxy = proxy::ProxyEnv::from_env()?;
        if proxy.is_set() {
            tracing::info!(proxy = %proxy, "registry proxy from the environment");
        } else {
            tracing::debug!(proxy = %proxy, "registry proxy from the environment");
        }
        let registry = RegistryOptions {
            node: crate::source::endpoints::NodeFiles {
                root: root.to_path_buf(),
                registries_conf: self.registries_conf.clone(),
                registries_conf_dir: self.registries_conf_dir.clone(),
                cert_dirs: self.cert_dir.clone(),
                auth_file: self.auth_file.clone(),
                insecure_registries: self.insecure_registry.clone(),
            },
            platform,
            timeout: Duration::from_secs(self.timeout),
            retry: retry::RetryPolicy {
                max_retries: self.retries,
                max_wait: Duration::from_secs(self.retry_budget),
                ..retry::RetryPolicy::default()
            },
            pull_deadline: Duration::from_secs(self.pull_deadline),
            proxy,
        };
        let trust = TrustOptions {
            signature_policy: self.signature_policy.clone(),
            registries_d: self.registries_d.clone(),
            root: root.to_path_buf(),
        };
        Ok(PullOptions { registry, trust, limits: self.limits.limits()? })
    }
}

/// A count within `min..=max`, else a usage error naming `--flag`.
fn count(flag: &str, v: usize, min: usize, max: usize) -> Result<usize> {
    if !(min..=max).contains(&v) {
        return Err(usage(format!("--{flag} must be between {min} and {max}, got {v}")));
    }
    Ok(v)
}

impl WebhookArgs {
    /// The webhook's options, every value checked against its range.
    pub(super) fn options(&self) -> Result<webhook::Options> {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
        Ok(webhook::Options {
            listen: self.listen,
            probe_listen: self.probe_listen,
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            concurrency: count("concurrency", self.concurrency.unwrap_or(cpus), 1, 4)?,
            review_timeout: seconds("review-timeout", self.review_timeout, 0.01, 30.0)?,
            cert_poll: seconds("cert-poll-interval", self.cert_poll_interval, 0.05, 3600.0)?,
            shutdown_delay: seconds("shutdown-delay", self.shutdown_delay, 0.0, 300.0)?,
            shutdown_timeout: seconds("shutdown-timeout", self.shutdown_timeout, 0.0, 300.0)?,
            idle_timeout: seconds("idle-timeout", self.idle_timeout, 0.1, 3600.0)?,
            max_connections: count("max-connections", self.max_connections, 1, 65536)?,
            max_connections_per_ip: count("max-connections-per-ip", self.max_connections_per_ip, 1, 65536)?,
            body_budget: count("body-budget", self.body_budget, 3, 1024)? << 20,
            metrics: self.metrics_address,
        })
    }
}

impl DaemonArgs {
    /// The daemon's options, every value checked against its range.
    pub(super) fn options(&self) -> Result<daemon::DaemonOptions> {
        if !(self.poll_interval.is_finite() && self.poll_interval >= 0.1) {
            return Err(usage("--poll-interval must be at least 0.1 seconds"));
        }
        let start_jitter = seconds("start-jitter", self.start_jitter, 0.0, 3600.0)?;
        if !(self.resync.is_finite() && (self.resync == 0.0 || (0.1..=86400.0).contains(&self.resync))) {
            return Err(usage("--resync must be 0 (never) or between 0.1 and 86400 seconds"));
        }
        let verify_interval = seconds("verify-interval", self.verify_interval, 1.0, 7.0 * 86400.0)?;
        let backoff_min = seconds("failure-backoff", self.failure_backoff, 0.1, 3600.0)?;
        let backoff_max = seconds("failure-backoff-max", self.failure_backoff_max, 0.1, 86400.0)?;
        if backoff_max < backoff_min {
            return Err(usage("--failure-backoff-max must not be below --failure-backoff"));
        }
        Ok(daemon::DaemonOptions {
            action: match self.action {
                Action::Install => daemon::Action::Install,
                Action::Uninstall => daemon::Action::Uninstall,
            },
            config: self.config.source(),
            pull: self.registry.pull_options(&self.node.root)?,
            site: self.node.site(),
            selection: match self.action {
                Action::Install => self.layout.selection(),
                Action::Uninstall => self.layout.checked_selection()?,
            },
            ready_file: self.ready_file.clone(),
            poll_interval: Duration::from_secs_f64(self.poll_interval),
            start_jitter,
            resync: (self.resync > 0.0).then(|| Duration::from_secs_f64(self.resync)),
            watch: match self.watch {
                Watch::Inotify => daemon::Watch::Inotify,
                Watch::Poll => daemon::Watch::Poll,
                Watch::None => daemon::Watch::None,
            },
            verify_interval,
            backoff_min,
            backoff_max,
            metrics: self.metrics_address,
        })
    }
}

impl super::ReferenceValuesArgs {
    /// The run-time facts given on the command line, range-checked.
    pub(super) fn overrides(&self) -> Result<crate::attest::Overrides> {
        let vcpus = match &self.vcpus {
            None => None,
            Some(v) => {
                let bad = || usage(format!("--vcpus must be a count N or a range A-B of counts 1 to 512, got {v:?}"));
                let (a, b) = v.split_once('-').unwrap_or((v, v));
                let a: u32 = a.trim().parse().map_err(|_| bad())?;
                let b: u32 = b.trim().parse().map_err(|_| bad())?;
                if a == 0 || b < a || b > 512 {
                    return Err(bad());
                }
                Some((a, b))
            }
        };
        if let Some(t) = &self.vcpu_type
            && (t.is_empty() || t.len() > 64 || !t.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        {
            return Err(usage(format!(
                "--vcpu-type must be a QEMU CPU model name (letters, digits, -, _, .), got {t:?}"
            )));
        }
        if let Some(a) = &self.append
            && (a.len() > 4096 || a.chars().any(char::is_control))
        {
            return Err(usage("--append must be at most 4096 bytes without control characters".to_string()));
        }
        Ok(crate::attest::Overrides { vcpu_type: self.vcpu_type.clone(), vcpus, append: self.append.clone() })
    }
}
