//! What the webhook answers: only CREATE/UPDATE of the ConfigMap `kata-addon-artifacts`
//! runs the policy (on the blocking pool, at most `concurrency` at once, within the review
//! deadline); its DELETE is allowed with a warning; everything else is allowed untouched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::review::{ConfigMapIn, ObjectHead, RequestIn, ResponseOut, StatusOut};
use super::warnings::{preview_warnings, warning};
use crate::configmap::{self, Input};
use crate::policy::{KeyValue, Policy, PolicyError, Violation, ViolationCode};
use crate::preview;

/// The one ConfigMap the webhook validates.
pub const CONFIGMAP_NAME: &str = "kata-addon-artifacts";

/// What the webhook decided about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Allowed, with warnings.
    Allow(Vec<String>),
    /// Denied: HTTP-style code, reason, message.
    Deny {
        /// 422 for an invalid ConfigMap, 500 when the policy failed.
        code: u16,
        /// `Invalid` or `InternalError`.
        reason: &'static str,
        /// Every problem, one per line.
        message: String,
    },
}

impl Decision {
    /// The `response` of the AdmissionReview answering request `uid`.
    pub(super) fn into_response(self, uid: &str) -> ResponseOut<'_> {
        match self {
            Decision::Allow(warnings) => ResponseOut { uid, allowed: true, status: None, warnings },
            Decision::Deny { code, reason, message } => ResponseOut {
                uid,
                allowed: false,
                status: Some(StatusOut::failure(code, reason, message)),
                warnings: Vec::new(),
            },
        }
    }

    fn invalid(message: String) -> Decision {
        Decision::Deny { code: 422, reason: "Invalid", message }
    }

    fn internal(message: String) -> Decision {
        Decision::Deny { code: 500, reason: "InternalError", message }
    }
}

/// A request the webhook cannot answer with a review (HTTP 400).
#[derive(Debug)]
pub(super) struct BadRequest(pub String);

/// Runs the policy for reviews: the component, its slots, the deadline of one review.
pub(super) struct Reviewer {
    policy: Arc<Policy>,
    slots: Arc<Semaphore>,
    review_timeout: Duration,
}

/// Which request runs the policy.
enum Target<'a> {
    /// Not the ConfigMap (or not an operation that changes it): allowed untouched.
    Other,
    /// DELETE of the ConfigMap.
    Delete,
    /// CREATE/UPDATE of the ConfigMap, with its object and, for an UPDATE, the one before.
    Write(ConfigMapIn<'a>, Option<Box<ConfigMapIn<'a>>>),
}

fn classify<'a>(req: &RequestIn<'a>) -> Result<Target<'a>, BadRequest> {
    let is_configmap = req.kind.group.is_empty()
        && req.kind.kind == "ConfigMap"
        && req.sub_resource.as_deref().unwrap_or_default().is_empty();
    if !is_configmap {
        return Ok(Target::Other);
    }
    let name = match req.name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => n == CONFIGMAP_NAME,
        // generateName: the object's own name decides (read from the raw object only then).
        None => req
            .object
            .and_then(|o| serde_json::from_str::<ObjectHead<'_>>(o.get()).ok())
            .is_some_and(|h| h.metadata.name.as_deref() == Some(CONFIGMAP_NAME)),
    };
    if !name {
        return Ok(Target::Other);
    }
    match &*req.operation {
        "DELETE" => Ok(Target::Delete),
        "CREATE" | "UPDATE" => {
            let Some(object) = req.object else {
                return Err(BadRequest(format!("{} of ConfigMap {CONFIGMAP_NAME} without an object", req.operation)));
            };
            let cm: ConfigMapIn<'a> = serde_json::from_str(object.get())
                .map_err(|e| BadRequest(format!("the object is not a valid ConfigMap: {e}")))?;
            // The old object only feeds warnings: one that does not parse gives none.
            let old = req.old_object.and_then(|o| serde_json::from_str::<ConfigMapIn<'a>>(o.get()).ok()).map(Box::new);
            Ok(Target::Write(cm, old))
        }
        _ => Ok(Target::Other),
    }
}

/// `binaryData` is never read by the runner; a key in both maps is ambiguous.
fn binary_data_violations(cm: &ConfigMapIn<'_>) -> Vec<Violation> {
    let data = cm.data.as_ref();
    let mut out = Vec::new();
    for key in cm.binary_data.iter().flat_map(|b| b.keys()) {
        if data.is_some_and(|d| d.contains_key(key)) {
            out.push(Violation {
                key: key.to_string(),
                code: ViolationCode::Conflict,
                message: "is set in both data and binaryData; set it in data only".to_string(),
            });
        } else {
            out.push(Violation {
                key: format!("binaryData.{key}"),
                code: ViolationCode::NotAllowed,
                message: "kata-addons reads text values from data only; move the value to data".to_string(),
            });
        }
    }
    out
}

/// The ConfigMap's `data` as policy input, within the limits the runner puts on any
/// ConfigMap input ([`configmap::MAX_BYTES`] of keys and values, [`configmap::check_counts`]).
/// Sizes are checked on the borrowed view before anything is copied.
fn configmap_input(cm: &ConfigMapIn<'_>) -> anyhow::Result<Input> {
    let origin = format!("ConfigMap {}/{CONFIGMAP_NAME}", cm.metadata.namespace.as_deref().unwrap_or_default());
    let entries = cm.data.iter().flatten();
    let bytes: u64 = entries.clone().map(|(k, v)| (k.len() + v.len()) as u64).sum();
    if bytes > configmap::MAX_BYTES {
        anyhow::bail!("{origin} data is larger than the limit of {} bytes", configmap::MAX_BYTES);
    }
    let data: Vec<KeyValue> = entries.map(|(k, v)| KeyValue { name: k.to_string(), value: v.to_string() }).collect();
    configmap::check_counts(&origin, &data)?;
    Ok(Input::ConfigMap { origin, data })
}

impl Reviewer {
    /// Reviews with `policy`, at most `concurrency` evaluations at once, each review
    /// answered within `review_timeout` (queueing included).
    pub(super) fn new(policy: Policy, concurrency: usize, review_timeout: Duration) -> Reviewer {
        Reviewer { policy: Arc::new(policy), slots: Arc::new(Semaphore::new(concurrency)), review_timeout }
    }

    /// The policy component's digest (logged at start).
    pub(super) fn policy_sha256(&self) -> String {
        self.policy.sha256().to_string()
    }

    /// Decides one request.
    pub(super) async fn decide(&self, req: &RequestIn<'_>) -> Result<Decision, BadRequest> {
        Ok(match classify(req)? {
            Target::Other => Decision::Allow(Vec::new()),
            Target::Delete => Decision::Allow(vec![warning(
                "kata-addons: nodes keep the installed addon; run the uninstall DaemonSet to remove it",
            )]),
            Target::Write(cm, old) => match self.evaluate(&cm).await {
                Decision::Allow(mut w) => {
                    if let Some(old) = &old {
                        w.extend(super::warnings::kata_version_pairing(old.data.as_ref(), cm.data.as_ref()));
                    }
                    Decision::Allow(w)
                }
                other => other,
            },
        })
    }

    /// Runs the policy for one ConfigMap on the blocking pool, within the review deadline.
    async fn evaluate(&self, cm: &ConfigMapIn<'_>) -> Decision {
        let deadline = Instant::now() + self.review_timeout;
        let binary = binary_data_violations(cm);
        let input = match configmap_input(cm) {
            Ok(i) => i,
            Err(e) => return Decision::invalid(format!("invalid configuration: {e:#}")),
        };
        let permit = match tokio::time::timeout_at(deadline.into(), Arc::clone(&self.slots).acquire_owned()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Decision::internal("the webhook is shutting down".to_string()),
            Err(_) => {
                return Decision::internal(format!(
                    "the kata-addons policy did not get to run within {:?} (webhook overloaded); retry",
                    self.review_timeout
                ));
            }
        };
        let policy = Arc::clone(&self.policy);
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            preview::compute(&policy, &input)
        });
        let result = match tokio::time::timeout_at(deadline.into(), task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Decision::internal(format!("the kata-addons policy evaluation failed: {e}")),
            Err(_) => {
                return Decision::internal(format!(
                    "the kata-addons policy did not finish within {:?}; the ConfigMap was not checked",
                    self.review_timeout
                ));
            }
        };
        match result {
            Ok(p) if binary.is_empty() => Decision::Allow(preview_warnings(&p)),
            Ok(_) => Decision::invalid(PolicyError::Rejected(binary).to_string()),
            Err(PolicyError::Rejected(v)) => Decision::invalid(PolicyError::Rejected([binary, v].concat()).to_string()),
            Err(e) => Decision::internal(format!("the kata-addons policy could not check the ConfigMap: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_data_is_named() {
        let cm: ConfigMapIn<'_> =
            serde_json::from_str(r#"{"data":{"kernelPath":"/k"},"binaryData":{"kernelPath":"AQ==","blob":"Ag=="}}"#)
                .expect("configmap");
        let v = binary_data_violations(&cm);
        let keys: Vec<&str> = v.iter().map(|v| v.key.as_str()).collect();
        assert_eq!(keys, ["binaryData.blob", "kernelPath"]);
    }
}
