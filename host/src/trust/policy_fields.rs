//! The JSON values of containers-policy.json(5) (objects in file order, duplicate keys
//! refused) and the field-level rules containers/image's parser applies to them (`signature/policy_config.go`, `policy_config_sigstore.go`): each field's JSON type
//! (Go's `encoding/json`: a `null` leaves a string empty and a list or byte field unset; any
//! other wrong type fails the file), the key sources of `signedBy` and `sigstoreSigned`
//! (`newPRSignedBy`, `newPRSigstoreSigned`, `newPRSigstoreSignedFulcio`,
//! `newPRSigstoreSignedPKI`), the scopes each transport accepts
//! (`ValidatePolicyConfigurationScope`) and the `remapIdentity` prefixes
//! (`validateIdentityRemappingPrefix`).

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::source::reference::{valid_digest, valid_domain, valid_repository};

/// A JSON value whose objects keep their keys in order and refuse duplicates
/// (containers/image refuses duplicate keys in policy.json).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// Any number.
    Number(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object, keys in file order, no duplicates.
    Object(Vec<(String, Json)>),
}

impl<'de> serde::Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> std::result::Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, v: bool) -> std::result::Result<Json, E> {
                Ok(Json::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Json, E> {
                Ok(Json::Number(v as f64))
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Json, E> {
                Ok(Json::Number(v as f64))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Json, E> {
                Ok(Json::Number(v))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Json, E> {
                Ok(Json::String(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> std::result::Result<Json, E> {
                Ok(Json::String(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> std::result::Result<Json, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = a.next_element()? {
                    out.push(v);
                }
                Ok(Json::Array(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> std::result::Result<Json, A::Error> {
                let mut out: Vec<(String, Json)> = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, Json>()? {
                    if out.iter().any(|(o, _)| *o == k) {
                        return Err(de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    out.push((k, v));
                }
                Ok(Json::Object(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl Json {
    /// Parses text strictly (duplicate keys refused).
    pub(crate) fn parse(text: &[u8]) -> Result<Json> {
        serde_json::from_slice(text).map_err(|e| anyhow!("{e}"))
    }

    /// The JSON type, for messages (`a number`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    /// The object's entries, or an error naming `what`.
    pub(crate) fn object(&self, what: &str) -> Result<&[(String, Json)]> {
        match self {
            Json::Object(o) => Ok(o),
            other => bail!("{what}: expected an object, found {}", other.kind()),
        }
    }

    /// The string, or an error naming `what`.
    pub(crate) fn string(&self, what: &str) -> Result<&str> {
        match self {
            Json::String(s) => Ok(s),
            other => bail!("{what}: expected a string, found {}", other.kind()),
        }
    }

    /// Looks a key up in an object (`None` for other values).
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(o) => o.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Where public keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// Node paths (`keyPath` / `keyPaths`), read beneath `--root`.
    Paths(Vec<String>),
    /// Inline keys (`keyData` / `keyDatas`, base64 in the file).
    Data(Vec<Vec<u8>>),
}

impl KeySource {}

/// A string field: `None` absent, `""` for `null` (Go leaves the string empty).
pub(crate) fn string(v: &Json, key: &str, what: &str) -> Result<Option<String>> {
    match v.get(key) {
        None => Ok(None),
        Some(Json::Null) => Ok(Some(String::new())),
        Some(x) => Ok(Some(x.string(&format!("{what}: {key}"))?.to_string())),
    }
}

fn decode(s: &str, what: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).with_context(|| format!("{what}: not valid base64"))
}

/// A byte field (base64 in the file): `None` absent, `Some(None)` for `null`.
pub(crate) fn bytes(v: &Json, key: &str, what: &str) -> Result<Option<Option<Vec<u8>>>> {
    let what = format!("{what}: {key}");
    match v.get(key) {
        None => Ok(None),
        Some(Json::Null) => Ok(Some(None)),
        Some(x) => Ok(Some(Some(decode(x.string(&what)?, &what)?))),
    }
}

/// A list field: `None` absent, `Some(None)` for `null`; each element read by `elem`.
fn list<T>(v: &Json, key: &str, what: &str, elem: impl Fn(&Json, &str) -> Result<T>) -> Result<Option<Option<Vec<T>>>> {
    let what = format!("{what}: {key}");
    match v.get(key) {
        None => Ok(None),
        Some(Json::Null) => Ok(Some(None)),
        Some(Json::Array(a)) => {
            Ok(Some(Some(a.iter().enumerate().map(|(i, x)| elem(x, &format!("{what}[{i}]"))).collect::<Result<_>>()?)))
        }
        Some(other) => bail!("{what}: expected an array, found {}", other.kind()),
    }
}

/// A list of strings (a `null` element is `""`).
pub(crate) fn strings(v: &Json, key: &str, what: &str) -> Result<Option<Option<Vec<String>>>> {
    list(v, key, what, |x, w| match x {
        Json::Null => Ok(String::new()),
        x => Ok(x.string(w)?.to_string()),
    })
}

/// A list of base64 byte strings (a `null` element is empty).
fn byte_list(v: &Json, key: &str, what: &str) -> Result<Option<Option<Vec<Vec<u8>>>>> {
    list(v, key, what, |x, w| match x {
        Json::Null => Ok(Vec::new()),
        x => decode(x.string(w)?, w),
    })
}

/// A list option of containers/image (`PRSigstoreSignedWithKeyPaths` …): present means a
/// non-empty list.
fn non_empty<T>(v: Option<Option<Vec<T>>>, key: &str, what: &str) -> Result<Option<Vec<T>>> {
    match v {
        None => Ok(None),
        Some(Some(l)) if !l.is_empty() => Ok(Some(l)),
        Some(_) => bail!("{what}: {key:?} contains no entries"),
    }
}

/// The keys of a `signedBy` entry (`prSignedBy.UnmarshalJSON`, `newPRSignedBy`).
pub(crate) fn signed_by_keys(v: &Json, what: &str) -> Result<(String, KeySource)> {
    let key_type = string(v, "keyType", what)?.unwrap_or_default();
    let path = string(v, "keyPath", what)?;
    let paths = strings(v, "keyPaths", what)?;
    let data = bytes(v, "keyData", what)?;
    match (path.is_some(), paths.is_some(), data.is_some()) {
        (false, false, false) => {
            bail!("{what}: exactly one of keyPath, keyPaths and keyData must be specified, none of them present")
        }
        (true, false, false) | (false, true, false) | (false, false, true) => {}
        _ => bail!("{what}: exactly one of keyPath, keyPaths and keyData must be specified, more than one present"),
    }
    if !matches!(key_type.as_str(), "GPGKeys" | "signedByGPGKeys" | "X509Certificates" | "signedByX509CAs") {
        bail!("{what}: invalid keyType {key_type:?}");
    }
    let keys = match (path.filter(|p| !p.is_empty()), paths.flatten(), data.flatten()) {
        (Some(p), None, None) => KeySource::Paths(vec![p]),
        (None, Some(p), None) => KeySource::Paths(p),
        (None, None, Some(d)) => KeySource::Data(vec![d]),
        _ => bail!("{what}: exactly one of keyPath, keyPaths and keyData must be specified"),
    };
    Ok((key_type, keys))
}

/// Refuses keys outside `allowed` (containers/image's paranoid unmarshalling).
pub(crate) fn only_keys(obj: &[(String, Json)], allowed: &[&str], what: &str) -> Result<()> {
    for (k, _) in obj {
        if !allowed.contains(&k.as_str()) {
            bail!("{what}: unknown key {k:?}");
        }
    }
    Ok(())
}

/// `fulcio` (`newPRSigstoreSignedFulcio`).
fn fulcio(v: &Json, what: &str) -> Result<()> {
    let what = format!("{what}: fulcio");
    only_keys(v.object(&what)?, &["caPath", "caData", "oidcIssuer", "subjectEmail"], &what)?;
    let ca_path = string(v, "caPath", &what)?.unwrap_or_default();
    let ca_data = bytes(v, "caData", &what)?.flatten();
    match (ca_path.is_empty(), ca_data.is_none()) {
        (false, false) => bail!("{what}: caPath and caData cannot be used simultaneously"),
        (true, true) => bail!("{what}: at least one of caPath and caData must be specified"),
        _ => {}
    }
    if string(v, "oidcIssuer", &what)?.unwrap_or_default().is_empty() {
        bail!("{what}: oidcIssuer not specified");
    }
    if string(v, "subjectEmail", &what)?.unwrap_or_default().is_empty() {
        bail!("{what}: subjectEmail not specified");
    }
    Ok(())
}

/// `pki` (`newPRSigstoreSignedPKI`).
fn pki(v: &Json, what: &str) -> Result<()> {
    let what = format!("{what}: pki");
    let known =
        ["caRootsPath", "caRootsData", "caIntermediatesPath", "caIntermediatesData", "subjectEmail", "subjectHostname"];
    only_keys(v.object(&what)?, &known, &what)?;
    let roots_path = string(v, "caRootsPath", &what)?.unwrap_or_default();
    let roots_data = bytes(v, "caRootsData", &what)?.flatten();
    match (roots_path.is_empty(), roots_data.is_none()) {
        (false, false) => bail!("{what}: caRootsPath and caRootsData cannot be used simultaneously"),
        (true, true) => bail!("{what}: at least one of caRootsPath and caRootsData must be specified"),
        _ => {}
    }
    let int_path = string(v, "caIntermediatesPath", &what)?.unwrap_or_default();
    let int_data = bytes(v, "caIntermediatesData", &what)?.flatten();
    if !int_path.is_empty() && int_data.is_some() {
        bail!("{what}: caIntermediatesPath and caIntermediatesData cannot be used simultaneously");
    }
    let email = string(v, "subjectEmail", &what)?.unwrap_or_default();
    let host = string(v, "subjectHostname", &what)?.unwrap_or_default();
    if email.is_empty() && host.is_empty() {
        bail!("{what}: at least one of subjectEmail, subjectHostname must be specified");
    }
    Ok(())
}

/// The keys of a `sigstoreSigned` entry (`prSigstoreSigned.UnmarshalJSON`,
/// `newPRSigstoreSigned`): the public keys, or `None` with the fields this build does not
/// evaluate (fulcio, pki, rekor*), which refuse at evaluation.
pub(crate) fn sigstore_keys(v: &Json, what: &str) -> Result<(Option<KeySource>, Vec<String>)> {
    let path = string(v, "keyPath", what)?.filter(|p| !p.is_empty());
    let paths = non_empty(strings(v, "keyPaths", what)?, "keyPaths", what)?;
    let data = bytes(v, "keyData", what)?.flatten();
    let datas = non_empty(byte_list(v, "keyDatas", what)?, "keyDatas", what)?;
    let fulcio = v.get("fulcio").map(|f| fulcio(f, what)).transpose()?.is_some();
    let pki = v.get("pki").map(|p| pki(p, what)).transpose()?.is_some();
    let rekor = [
        string(v, "rekorPublicKeyPath", what)?.filter(|p| !p.is_empty()).map(|_| "rekorPublicKeyPath"),
        non_empty(strings(v, "rekorPublicKeyPaths", what)?, "rekorPublicKeyPaths", what)?
            .map(|_| "rekorPublicKeyPaths"),
        bytes(v, "rekorPublicKeyData", what)?.flatten().map(|_| "rekorPublicKeyData"),
        non_empty(byte_list(v, "rekorPublicKeyDatas", what)?, "rekorPublicKeyDatas", what)?
            .map(|_| "rekorPublicKeyDatas"),
    ];
    let rekor: Vec<&str> = rekor.into_iter().flatten().collect();
    let sources = [path.is_some(), paths.is_some(), data.is_some(), datas.is_some(), fulcio, pki];
    if sources.iter().filter(|s| **s).count() != 1 {
        bail!("{what}: exactly one of keyPath, keyPaths, keyData, keyDatas, fulcio, and pki must be specified");
    }
    if rekor.len() > 1 {
        bail!(
            "{what}: at most one of rekorPublicKeyPath, rekorPublicKeyPaths, rekorPublicKeyData and rekorPublicKeyDatas can be used simultaneously"
        );
    }
    if fulcio && rekor.is_empty() {
        bail!("{what}: at least one of the rekorPublicKey* fields must be specified if fulcio is used");
    }
    if pki && !rekor.is_empty() {
        bail!("{what}: rekorPublicKey* fields are not supported for pki");
    }
    let mut unsupported: Vec<String> = Vec::new();
    if fulcio {
        unsupported.push("fulcio".into());
    }
    if pki {
        unsupported.push("pki".into());
    }
    unsupported.extend(rekor.iter().map(|s| s.to_string()));
    let keys = match (path, paths, data, datas) {
        _ if !unsupported.is_empty() => None,
        (Some(p), ..) => Some(KeySource::Paths(vec![p])),
        (_, Some(p), ..) => Some(KeySource::Paths(p)),
        (_, _, Some(d), _) => Some(KeySource::Data(vec![d])),
        (_, _, _, Some(d)) => Some(KeySource::Data(d)),
        _ => None,
    };
    Ok((keys, unsupported))
}

/// An absolute, clean path other than `/` (`filepath.Clean(scope) == scope`).
fn absolute_clean(scope: &str) -> Result<(), String> {
    if !scope.starts_with('/') {
        return Err("must be an absolute path".into());
    }
    if scope == "/" {
        return Err("use the generic default scope \"\" instead of \"/\"".into());
    }
    if scope.ends_with('/') || scope[1..].split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("not in canonical (cleaned) path form".into());
    }
    Ok(())
}

/// containers-storage scopes (`storageTransport.ValidatePolicyConfigurationScope`):
/// `[store]` or `[driver@/graph/root]`, then optionally a name with an ID or digest.
fn storage_scope(scope: &str) -> Result<(), String> {
    let bad = || Err("not a [store-specification] scope".to_string());
    let Some(rest) = scope.strip_prefix('[') else { return bad() };
    let Some(close) = rest.find(']').filter(|i| *i >= 1) else { return bad() };
    let spec = &rest[..close];
    let graph = match spec.split_once('@') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => b,
        Some(_) => return bad(),
        None => spec,
    };
    if !graph.starts_with('/') {
        return Err("the store's graph root must be an absolute path".into());
    }
    let image = &rest[close + 1..];
    let id = |s: &str| valid_digest(&format!("sha256:{s}"));
    let fields: Vec<&str> = image.splitn(3, '@').collect();
    match fields.as_slice() {
        [_, x] if !id(x) && !valid_digest(x) => Err(format!("{x:?} is neither a valid digest nor a valid ID")),
        [_, d, i] if !valid_digest(d) || !id(i) => Err(format!("{d:?}@{i:?} is not a valid digest and ID")),
        _ => Ok(()),
    }
}

/// Whether `scope` is valid for `transport`, as the transport's
/// `ValidatePolicyConfigurationScope` decides (unknown transports accept any scope).
pub(crate) fn validate_scope(transport: &str, scope: &str) -> Result<(), String> {
    match transport {
        "dir" | "sif" | "oci" | "oci-archive" => absolute_clean(scope),
        "docker-archive" | "tarball" => {
            Err(format!("{transport}: does not support any scopes except the default \"\" one"))
        }
        "docker-daemon" if valid_digest(scope) => Err("an algo:digest value cannot be used as a namespace".into()),
        "openshift" if !openshift_scope(scope) => Err("invalid scope name".into()),
        "containers-storage" => storage_scope(scope),
        _ => Ok(()),
    }
}

/// `^[^/]*(/[^:/]*(/[^:/]*(:[^:/]*)?)?)?$` (openshift's scopeRegexp).
fn openshift_scope(scope: &str) -> bool {
    let mut parts = scope.splitn(3, '/');
    let _cluster = parts.next();
    let Some(ns) = parts.next() else { return true };
    if ns.contains(':') {
        return false;
    }
    let Some(stream) = parts.next() else { return true };
    !stream.contains('/') && stream.matches(':').count() <= 1
}

/// `validateIdentityRemappingPrefix`: a domain alone, or a name that starts with a domain
/// (`docker.io/library`, `ns/shortname`; a prefix naming no image simply never matches).
pub(crate) fn valid_remap_prefix(p: &str) -> bool {
    match p.split_once('/') {
        Some((domain, rest)) => valid_domain(domain) && valid_repository(rest),
        None => valid_domain(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remap_prefixes_as_containers_image() {
        for ok in [
            "docker.io/library",
            "docker.io/testing",
            "ns/shortname",
            "index.docker.io/library",
            "quay.io/library",
            "example.com:5000",
            "localhost",
            "registry/a__b/c-d--e.f",
        ] {
            assert!(valid_remap_prefix(ok), "{ok}");
        }
        for bad in ["", "docker.io/Library", "a_b/c", "example.com:/x", "-a.com/x", "quay.io/", "quay.io//x", "q.io/a_"]
        {
            assert!(!valid_remap_prefix(bad), "{bad}");
        }
    }

    #[test]
    fn scopes_per_transport() {
        assert!(validate_scope("dir", "/var/lib/images").is_ok());
        for bad in ["relative/dir", "/", "/a/", "/a//b", "/a/./b", "/a/../b"] {
            assert!(validate_scope("dir", bad).is_err(), "{bad}");
        }
        assert!(validate_scope("docker-archive", "/x").is_err());
        assert!(validate_scope("docker-daemon", &format!("sha256:{}", "a".repeat(64))).is_err());
        assert!(validate_scope("docker-daemon", "busybox").is_ok());
        assert!(validate_scope("containers-storage", "[overlay@/var/lib/containers/storage]busybox").is_ok());
        assert!(validate_scope("containers-storage", "busybox").is_err());
        assert!(validate_scope("openshift", "c/ns/stream:tag").is_ok());
        assert!(validate_scope("openshift", "c/ns:x").is_err());
        assert!(validate_scope("unknown-transport", "anything").is_ok());
    }
}
