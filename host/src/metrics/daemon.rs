//! The daemon's metrics (docs/metrics.md#daemon). Every label value is a fixed word or
//! comes from the installed state (one series, replaced at each install), never from an
//! error message or a ConfigMap value that was refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use super::{bounded, now_seconds};

/// How a reconcile (a ConfigMap applied, or a check of the node) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum Reconciled {
    /// Something was written: a new version, or drift repaired.
    installed,
    /// The node already matched: nothing written.
    up_to_date,
    /// Invalid configuration: not tried again until it changes.
    refused,
    /// An operational failure (registry, disk, image): tried again after its backoff.
    failed,
}

/// What a drift repair put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum Repair {
    /// Drop-ins rewritten from the state (the files were intact).
    drop_in,
    /// Installed files replaced (pulled again).
    files,
}

/// `{result}` of `kata_addons_reconcile_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabel {
    result: Reconciled,
}

/// `{reason}` of `kata_addons_repairs_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: Repair,
}

/// The labels of `kata_addons_installed_info`: what the state records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Installed {
    version: String,
    image: String,
    digest: String,
    provider: String,
    runtime_class: String,
}

/// `{release}` of `kata_addons_node_kata_release_info`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReleaseLabel {
    release: String,
}

/// What is installed, as the metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InstalledInfo {
    /// Addon version label.
    pub version: String,
    /// Image reference as configured.
    pub image: String,
    /// Manifest digest.
    pub digest: String,
    /// Provider name (`se`, `tdx`, `snp`).
    pub provider: String,
    /// RuntimeClass handlers, comma-separated (empty: the provider's standard runtimes).
    pub runtime_class: String,
}

/// A gauge whose value is the time left until a deadline, computed when scraped.
#[derive(Debug, Clone, Default)]
struct Countdown {
    /// Milliseconds after `origin` of the deadline; 0 = none.
    deadline_ms: Arc<AtomicU64>,
    origin: Arc<std::sync::OnceLock<Instant>>,
}

impl Countdown {
    fn origin(&self) -> Instant {
        *self.origin.get_or_init(Instant::now)
    }

    /// The deadline is `wait` from now (`None`: no deadline).
    fn set(&self, wait: Option<Duration>) {
        let ms = wait.map_or(0, |w| {
            let at = Instant::now().saturating_duration_since(self.origin()) + w;
            u64::try_from(at.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        self.deadline_ms.store(ms, Ordering::Relaxed);
    }

    /// Seconds left, 0 when none or passed.
    fn left(&self) -> f64 {
        let ms = self.deadline_ms.load(Ordering::Relaxed);
        if ms == 0 {
            return 0.0;
        }
        let now = Instant::now().saturating_duration_since(self.origin());
        Duration::from_millis(ms).saturating_sub(now).as_secs_f64()
    }
}

impl TypedMetric for Countdown {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for Countdown {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.left())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Bytes of layer blobs this process streamed from registries and layouts, read when
/// scraped (the fetch layer counts them in [`crate::progress`]).
#[derive(Debug, Clone, Copy, Default)]
struct PulledBytes;

impl TypedMetric for PulledBytes {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for PulledBytes {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&crate::progress::pulled_bytes(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// The daemon's metrics; clones record into the same series.
#[derive(Debug, Clone)]
pub(crate) struct DaemonMetrics {
    installed: Family<Installed, Gauge>,
    reconciles: Family<ResultLabel, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    last_failure: Gauge<f64, AtomicU64>,
    ready: Gauge,
    backoff: Countdown,
    repairs: Family<ReasonLabel, Counter>,
    pull_duration: Histogram,
    kata_release: Family<ReleaseLabel, Gauge>,
}

impl DaemonMetrics {
    /// The daemon's families, registered into `r`.
    pub(crate) fn register(r: &mut Registry) -> DaemonMetrics {
        let m = DaemonMetrics {
            installed: Family::default(),
            reconciles: Family::default(),
            last_success: Gauge::default(),
            last_failure: Gauge::default(),
            ready: Gauge::default(),
            backoff: Countdown::default(),
            repairs: Family::default(),
            pull_duration: Histogram::new([1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0]),
            kata_release: Family::default(),
        };
        for result in [Reconciled::installed, Reconciled::up_to_date, Reconciled::refused, Reconciled::failed] {
            drop(m.reconciles.get_or_create(&ResultLabel { result }));
        }
        for reason in [Repair::drop_in, Repair::files] {
            drop(m.repairs.get_or_create(&ReasonLabel { reason }));
        }
        r.register(
            "kata_addons_installed_info",
            "What is installed on this node (value 1): version, image, manifest digest, provider and RuntimeClass handlers",
            m.installed.clone(),
        );
        r.register(
            "kata_addons_reconcile",
            "Reconciles (a ConfigMap applied, or a check of the node) by result: installed, up_to_date, refused, failed",
            m.reconciles.clone(),
        );
        r.register_with_unit(
            "kata_addons_last_success_timestamp",
            "When the node was last found or made to match the current ConfigMap (Unix time; 0: never)",
            Unit::Seconds,
            m.last_success.clone(),
        );
        r.register_with_unit(
            "kata_addons_last_failure_timestamp",
            "When a reconcile last failed or was refused (Unix time; 0: never)",
            Unit::Seconds,
            m.last_failure.clone(),
        );
        r.register(
            "kata_addons_ready",
            "1 while the daemon is ready (its readiness file exists and has no `not ready:` line), else 0",
            m.ready.clone(),
        );
        r.register_with_unit(
            "kata_addons_backoff",
            "Time until the next attempt of a failed change or a rate-limited repair; 0 when none is waiting",
            Unit::Seconds,
            m.backoff.clone(),
        );
        r.register(
            "kata_addons_repairs",
            "Drift repairs by what was put back: drop_in (drop-ins rewritten), files (installed files replaced)",
            m.repairs.clone(),
        );
        r.register_with_unit(
            "kata_addons_pull",
            "Bytes of layer blobs pulled (streamed and verified) by this daemon",
            Unit::Bytes,
            PulledBytes,
        );
        r.register_with_unit(
            "kata_addons_pull_duration",
            "Duration of the installs that pulled layer blobs",
            Unit::Seconds,
            m.pull_duration.clone(),
        );
        r.register(
            "kata_addons_node_kata_release_info",
            "The node's Kata release (value 1) when known: the kata-containers package's version-release",
            m.kata_release.clone(),
        );
        m
    }

    /// A reconcile ended with `result`; `current` = it was of the ConfigMap as it is now.
    pub(crate) fn reconciled(&self, result: Reconciled, current: bool) {
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        match result {
            Reconciled::installed | Reconciled::up_to_date if current => {
                self.last_success.set(now_seconds());
            }
            Reconciled::installed | Reconciled::up_to_date => {}
            Reconciled::refused | Reconciled::failed => {
                self.last_failure.set(now_seconds());
            }
        }
    }

    /// `info` is what is installed now (replaces the previous series).
    pub(crate) fn installed(&self, info: &InstalledInfo) {
        let labels = Installed {
            version: bounded(&info.version),
            image: bounded(&info.image),
            digest: bounded(&info.digest),
            provider: bounded(&info.provider),
            runtime_class: bounded(&info.runtime_class),
        };
        if self.installed.get(&labels).is_some() {
            return;
        }
        self.installed.clear();
        self.installed.get_or_create(&labels).set(1);
    }

    /// The node's Kata release, when known (replaces the previous series).
    pub(crate) fn kata_release(&self, release: Option<&str>) {
        let label = release.map(|r| ReleaseLabel { release: bounded(r) });
        if label.as_ref().is_some_and(|l| self.kata_release.get(l).is_some()) {
            return;
        }
        self.kata_release.clear();
        if let Some(l) = label {
            self.kata_release.get_or_create(&l).set(1);
        }
    }

    /// A drift repair put back `what`.
    pub(crate) fn repaired(&self, what: Repair) {
        self.repairs.get_or_create(&ReasonLabel { reason: what }).inc();
    }

    /// Whether the daemon is ready (the readiness file's decision).
    pub(crate) fn ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The next attempt of something that failed is `wait` from now (`None`: none waits).
    pub(crate) fn backoff(&self, wait: Option<Duration>) {
        self.backoff.set(wait);
    }

    /// An install that pulled layer blobs took `took`.
    pub(crate) fn pulled(&self, took: Duration) {
        self.pull_duration.observe(took.as_secs_f64());
    }
}
