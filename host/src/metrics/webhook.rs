//! The webhook's metrics (docs/metrics.md#webhook). Every label value is a fixed word: no
//! client address, name or error text.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// What the webhook answered to a `POST /validate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum Answer {
    /// Allowed (with or without warnings).
    allowed,
    /// Denied: the ConfigMap is invalid.
    denied,
    /// Not reviewed (a malformed or refused request, an overload) or the policy failed.
    error,
}

/// Which limit refused or closed a connection or a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum Refusal {
    /// The source address had its most connections.
    per_address,
    /// Every connection slot was taken and none was idle.
    capacity,
    /// An idle connection was closed to make room for a new one.
    evicted_idle,
    /// The TLS handshake did not finish in time.
    handshake_timeout,
    /// The body budget (global, or the client's share) was not available: 503.
    body_budget,
    /// The body was larger than allowed: 413.
    body_too_large,
    /// The body did not arrive in time: 408.
    body_timeout,
}

/// `{decision}` of `kata_addons_webhook_requests_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DecisionLabel {
    decision: Answer,
}

/// `{reason}` of `kata_addons_webhook_rejected_connections_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: Refusal,
}

/// The webhook's metrics; clones record into the same series.
#[derive(Debug, Clone)]
pub(crate) struct WebhookMetrics {
    requests: Family<DecisionLabel, Counter>,
    duration: Histogram,
    warnings: Counter,
    rejected: Family<ReasonLabel, Counter>,
}

impl WebhookMetrics {
    /// The webhook's families, registered into `r`.
    pub(crate) fn register(r: &mut Registry) -> WebhookMetrics {
        let m = WebhookMetrics {
            requests: Family::default(),
            duration: Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            warnings: Counter::default(),
            rejected: Family::default(),
        };
        for decision in [Answer::allowed, Answer::denied, Answer::error] {
            drop(m.requests.get_or_create(&DecisionLabel { decision }));
        }
        for reason in [
            Refusal::per_address,
            Refusal::capacity,
            Refusal::evicted_idle,
            Refusal::handshake_timeout,
            Refusal::body_budget,
            Refusal::body_too_large,
            Refusal::body_timeout,
        ] {
            drop(m.rejected.get_or_create(&ReasonLabel { reason }));
        }
        r.register(
            "kata_addons_webhook_requests",
            "Admission requests (POST /validate) by decision: allowed, denied (invalid ConfigMap), error",
            m.requests.clone(),
        );
        r.register_with_unit(
            "kata_addons_webhook_request_duration",
            "Time from a request's arrival to its answer, body included",
            Unit::Seconds,
            m.duration.clone(),
        );
        r.register("kata_addons_webhook_warnings", "Admission warnings sent with allowed requests", m.warnings.clone());
        r.register(
            "kata_addons_webhook_rejected_connections",
            "Connections and requests refused or closed by a limit, by the limit that fired",
            m.rejected.clone(),
        );
        m
    }

    /// A request was answered with `answer` and `warnings` admission warnings after `took`.
    pub(crate) fn answered(&self, answer: Answer, warnings: usize, took: Duration) {
        self.requests.get_or_create(&DecisionLabel { decision: answer }).inc();
        self.duration.observe(took.as_secs_f64());
        self.warnings.inc_by(warnings as u64);
    }

    /// A limit fired.
    pub(crate) fn refused(&self, why: Refusal) {
        self.rejected.get_or_create(&ReasonLabel { reason: why }).inc();
    }
}
