//! AdmissionReview (`admission.k8s.io/v1`) on the wire. The envelope is not part of the
//! OpenAPI spec (so not in k8s-openapi); `Status` in the answer is [`StatusOut`], the
//! fields of a meta/v1 `Status` a denial sets, serialised as k8s-openapi serialises its
//! `Status` (the webhook tests parse it with k8s-openapi's type).
//!
//! Requests are parsed into borrowed, typed views of the body: strings without escapes
//! point into the body, `object` is kept as raw JSON until the request turns out to be
//! about the ConfigMap (then only `metadata.name`, `data` and the keys of `binaryData`
//! are read). Nothing is copied into a `serde_json::Value`, so a 3 MiB body of any shape
//! costs little more than its own bytes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The AdmissionReview API version served (in and out).
pub(crate) const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// The parts of an AdmissionReview request the webhook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(default, borrow)]
    api_version: Cow<'a, str>,
    #[serde(default, borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: Option<RequestIn<'a>>,
}

/// `{group, version, kind}` of the object under review.
#[derive(Debug, Deserialize)]
pub(super) struct Gvk<'a> {
    /// API group (`""` for the core group).
    #[serde(default, borrow)]
    pub group: Cow<'a, str>,
    /// Object kind.
    #[serde(default, borrow)]
    pub kind: Cow<'a, str>,
}

/// The parts of `AdmissionRequest` the webhook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RequestIn<'a> {
    /// Echoed in the answer.
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    /// What the object is.
    #[serde(borrow)]
    pub kind: Gvk<'a>,
    /// `status`, `scale`, …; empty for the object itself.
    #[serde(default, borrow)]
    pub sub_resource: Option<Cow<'a, str>>,
    /// The object's name (empty for a generateName CREATE).
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    /// Its namespace.
    #[serde(default, borrow)]
    pub namespace: Option<Cow<'a, str>>,
    /// CREATE, UPDATE, DELETE or CONNECT.
    #[serde(borrow)]
    pub operation: Cow<'a, str>,
    /// The new object, unparsed (`null` for DELETE).
    #[serde(default, borrow)]
    pub object: Option<&'a RawValue>,
    /// The object before an UPDATE, unparsed.
    #[serde(default, borrow)]
    pub old_object: Option<&'a RawValue>,
    /// Whether the API server will not persist the change.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// `metadata` of an object: only what names it.
#[derive(Debug, Default, Deserialize)]
pub(super) struct MetaIn<'a> {
    /// `metadata.name`.
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    /// `metadata.namespace`.
    #[serde(default, borrow)]
    pub namespace: Option<Cow<'a, str>>,
}

/// Any object, read only for its name.
#[derive(Debug, Deserialize)]
pub(super) struct ObjectHead<'a> {
    /// Its metadata.
    #[serde(default, borrow)]
    pub metadata: MetaIn<'a>,
}

/// A ConfigMap as the webhook reads it: text values of `data`, keys of `binaryData`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConfigMapIn<'a> {
    /// Its metadata.
    #[serde(default, borrow)]
    pub metadata: MetaIn<'a>,
    /// `data`: string keys and values.
    #[serde(default, borrow)]
    pub data: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
    /// `binaryData`: only the keys matter (the values are never read).
    #[serde(default, borrow)]
    pub binary_data: Option<BTreeMap<Cow<'a, str>, IgnoredAny>>,
}

/// Parses the body into the request it carries, or says why it is not an AdmissionReview
/// of the version served.
pub(super) fn parse(body: &[u8]) -> Result<RequestIn<'_>, String> {
    let review: ReviewIn<'_> = serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    if review.api_version != REVIEW_API_VERSION || review.kind != "AdmissionReview" {
        return Err(format!(
            "expected apiVersion {REVIEW_API_VERSION} kind AdmissionReview, got apiVersion {:?} kind {:?}",
            review.api_version, review.kind
        ));
    }
    review.request.ok_or_else(|| "the AdmissionReview has no request".to_string())
}

/// The review sent back.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

/// `AdmissionResponse`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ResponseOut<'a> {
    /// The request's uid.
    pub uid: &'a str,
    /// The decision.
    pub allowed: bool,
    /// Why not (denials only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusOut>,
    /// Shown to the user (`kubectl` prints them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A meta/v1 `Status` with the fields a denial sets, in k8s-openapi's field order: the
/// Kubernetes API objects crate (the whole API of one release) is not built for one struct.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StatusOut {
    /// Always `v1`.
    api_version: &'static str,
    /// Always `Status`.
    kind: &'static str,
    /// The HTTP status code of the denial.
    code: u16,
    /// Every problem, one per line.
    message: String,
    /// An empty `ListMeta`.
    metadata: Empty,
    /// The machine-readable reason (`Invalid`, `InternalError`, ...).
    reason: &'static str,
    /// Always `Failure`.
    status: &'static str,
}

/// Serialises as `{}`.
#[derive(Debug, Serialize)]
struct Empty {}

impl StatusOut {
    /// The status of a denial.
    pub(super) fn failure(code: u16, reason: &'static str, message: String) -> StatusOut {
        StatusOut { api_version: "v1", kind: "Status", code, message, metadata: Empty {}, reason, status: "Failure" }
    }
}

/// The AdmissionReview answer carrying `response`, as JSON.
pub(super) fn answer(response: ResponseOut<'_>) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&ReviewOut { api_version: REVIEW_API_VERSION, kind: "AdmissionReview", response })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_strings_are_borrowed_and_a_huge_object_is_not_parsed() {
        let filler = "0,".repeat(100_000);
        let body = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u1",
            "kind":{{"group":"","version":"v1","kind":"Secret"}},"operation":"CREATE","object":[{filler}0]}}}}"#
        );
        let req = parse(body.as_bytes()).expect("parses");
        assert!(matches!(req.uid, Cow::Borrowed("u1")));
        assert!(req.object.is_some_and(|o| o.get().len() > 200_000));
    }

    #[test]
    fn a_denial_status_is_a_meta_v1_status() {
        let json = serde_json::to_string(&StatusOut::failure(422, "Invalid", "bad\nworse".into())).expect("json");
        assert_eq!(
            json,
            r#"{"apiVersion":"v1","kind":"Status","code":422,"message":"bad\nworse","metadata":{},"reason":"Invalid","status":"Failure"}"#
        );
    }

    #[test]
    fn escaped_strings_and_binary_data_keys() {
        let cm: ConfigMapIn<'_> =
            serde_json::from_str(r#"{"metadata":{"name":"a"},"data":{"k":"line\nnext"},"binaryData":{"b":"AAEC"}}"#)
                .expect("configmap");
        let data = cm.data.expect("data");
        assert_eq!(data["k"], "line\nnext");
        assert_eq!(cm.binary_data.expect("binaryData").keys().collect::<Vec<_>>(), ["b"]);
        assert!(serde_json::from_str::<ConfigMapIn<'_>>(r#"{"data":{"k":7}}"#).is_err());
    }

    /// JSON nested 520,000 levels (within the API server's 3 MiB) is refused by serde_json's
    /// recursion limit (128, on by default: the `unbounded_depth` feature is not enabled)
    /// as it parses, in linear time, wherever it sits: the review itself, or the object
    /// kept raw and parsed as a ConfigMap later.
    #[test]
    fn deeply_nested_json_is_refused_while_parsing() {
        let started = std::time::Instant::now();
        let deep = format!("{}{}", "[".repeat(520_000), "]".repeat(520_000));
        let review = |object: &str, uid: &str| {
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":{uid},
                "kind":{{"group":"","version":"v1","kind":"ConfigMap"}},"operation":"CREATE","object":{object}}}}}"#
            )
        };
        let Err(e) = parse(review("{}", &deep).as_bytes()) else { panic!("a nested uid was accepted") };
        assert!(e.contains("recursion limit exceeded") || e.contains("invalid type"), "{e}");
        if let Ok(req) = parse(review(&deep, "\"u\"").as_bytes()) {
            let o = req.object.expect("object");
            let Err(e) = serde_json::from_str::<ConfigMapIn<'_>>(o.get()) else {
                panic!("a nested object was accepted")
            };
            assert!(
                e.to_string().contains("recursion limit exceeded") || e.to_string().contains("invalid type"),
                "{e}"
            );
        }
        let cm = format!(r#"{{"data":{{"addonImage":{deep}}}}}"#);
        assert!(serde_json::from_str::<ConfigMapIn<'_>>(&cm).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    }
}
