//! The "simple signing" payload shared by GPG signatures and sigstore attachments:
//! `{"critical": {"type", "image": {"docker-manifest-digest"}, "identity": {"docker-reference"}},
//! "optional": {…}}`, parsed as strictly as containers/image does.

use anyhow::{Result, bail};

use super::policy_json::Json;

/// `critical.type` of a GPG simple signature.
pub(crate) const ATOMIC_TYPE: &str = "atomic container signature";
/// `critical.type` of a sigstore (cosign) payload.
pub(crate) const COSIGN_TYPE: &str = "cosign container image signature";

/// What a verified payload claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Payload {
    /// `critical.image.docker-manifest-digest`.
    pub manifest_digest: String,
    /// `critical.identity.docker-reference`.
    pub docker_reference: String,
}

fn exact<'a>(v: &'a Json, keys: &[&str], what: &str) -> Result<&'a [(String, Json)]> {
    let obj = v.object(what)?;
    for (k, _) in obj {
        if !keys.contains(&k.as_str()) {
            bail!("{what}: unexpected key {k:?}");
        }
    }
    for k in keys {
        if v.get(k).is_none() {
            bail!("{what}: missing key {k:?}");
        }
    }
    Ok(obj)
}

/// Parses a payload of the expected `critical.type` (only after its signature verified).
pub(crate) fn parse(bytes: &[u8], expected_type: &str) -> Result<Payload> {
    let doc = Json::parse(bytes)?;
    exact(&doc, &["critical", "optional"], "signature payload")?;
    if let Some(o) = doc.get("optional")
        && *o != Json::Null
    {
        o.object("optional")?;
        if let Some(Json::Number(t)) = o.get("timestamp")
            && t.fract() != 0.0
        {
            bail!("field optional.timestamp is not an integer");
        }
    }
    let critical = doc.get("critical").map(|c| exact(c, &["type", "image", "identity"], "critical"));
    let Some(critical) = critical else { bail!("missing critical") };
    critical?;
    let c = doc.get("critical");
    let field = |k: &str| c.and_then(|c| c.get(k));
    let ty = field("type").map(|t| t.string("critical.type")).transpose()?.unwrap_or_default();
    if ty != expected_type {
        bail!("unrecognized signature type {ty:?}");
    }
    let image =
        field("image").map(|i| exact(i, &["docker-manifest-digest"], "critical.image").map(|_| i)).transpose()?;
    let identity =
        field("identity").map(|i| exact(i, &["docker-reference"], "critical.identity").map(|_| i)).transpose()?;
    let digest = image
        .and_then(|i| i.get("docker-manifest-digest"))
        .map(|d| d.string("docker-manifest-digest"))
        .transpose()?
        .unwrap_or_default();
    let (algo, hex) = digest.split_once(':').unwrap_or(("", ""));
    if algo.is_empty() || hex.is_empty() {
        bail!("invalid docker-manifest-digest value {digest:?}");
    }
    let reference = identity
        .and_then(|i| i.get("docker-reference"))
        .map(|d| d.string("docker-reference"))
        .transpose()?
        .unwrap_or_default();
    Ok(Payload { manifest_digest: digest.to_string(), docker_reference: reference.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_payload() {
        let ok = br#"{"critical":{"type":"atomic container signature","image":{"docker-manifest-digest":"sha256:aa"},"identity":{"docker-reference":"q.io/r:1"}},"optional":{"creator":"x","timestamp":5}}"#;
        let p = parse(ok, ATOMIC_TYPE).unwrap();
        assert_eq!(p.manifest_digest, "sha256:aa");
        assert_eq!(p.docker_reference, "q.io/r:1");
        assert!(parse(ok, COSIGN_TYPE).is_err());
        let extra = br#"{"critical":{"type":"atomic container signature","image":{"docker-manifest-digest":"sha256:aa"},"identity":{"docker-reference":"q.io/r:1"},"x":1},"optional":{}}"#;
        assert!(parse(extra, ATOMIC_TYPE).is_err());
        let nested = br#"{"critical":{"type":"atomic container signature","image":{"docker-manifest-digest":"sha256:aa","y":2},"identity":{"docker-reference":"q.io/r:1"}},"optional":{}}"#;
        assert!(parse(nested, ATOMIC_TYPE).is_err());
    }
}
