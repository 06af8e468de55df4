//! containers-policy.json(5): parsing as strict as containers/image's (unknown keys,
//! duplicate keys, empty requirement lists, unknown requirement types and malformed entries
//! make the whole file fail to load) and the scope lookup of the `docker` and `oci`
//! transports.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

use super::policy_fields::{self, only_keys};
pub(crate) use super::policy_fields::{Json, KeySource};
use super::reference::{DockerRef, DockerRefExt};

/// Requires every key of `exact` and nothing else.
fn exact_keys(obj: &[(String, Json)], exact: &[&str], what: &str) -> Result<()> {
    only_keys(obj, exact, what)?;
    for k in exact {
        if !obj.iter().any(|(o, _)| o == k) {
            bail!("{what}: missing key {k:?}");
        }
    }
    Ok(())
}

/// How a signature's claimed identity must relate to the image (`signedIdentity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IdentityMatch {
    /// Same repository and the same tag or digest.
    MatchExact,
    /// Same reference if the image is named by tag; same repository if by digest (default).
    MatchRepoDigestOrExact,
    /// Same repository, any tag or digest.
    MatchRepository,
    /// Exactly this reference (with tag or digest).
    ExactReference(String),
    /// This repository, any tag or digest.
    ExactRepository(String),
    /// `prefix` of the image name replaced by `signed_prefix`, then as `MatchRepoDigestOrExact`.
    RemapIdentity {
        /// Prefix of the image's name.
        prefix: String,
        /// What the signature names instead.
        signed_prefix: String,
    },
}

impl IdentityMatch {
    /// The JSON `type` name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            IdentityMatch::MatchExact => "matchExact",
            IdentityMatch::MatchRepoDigestOrExact => "matchRepoDigestOrExact",
            IdentityMatch::MatchRepository => "matchRepository",
            IdentityMatch::ExactReference(_) => "exactReference",
            IdentityMatch::ExactRepository(_) => "exactRepository",
            IdentityMatch::RemapIdentity { .. } => "remapIdentity",
        }
    }

    fn parse(v: &Json, what: &str) -> Result<IdentityMatch> {
        let obj = v.object(what)?;
        let ty = v.get("type").with_context(|| format!("{what}: missing \"type\""))?.string(what)?;
        let what = format!("{what} {ty:?}");
        let str_of = |k: &str| -> Result<String> {
            Ok(v.get(k).with_context(|| format!("{what}: missing {k:?}"))?.string(&what)?.to_string())
        };
        Ok(match ty {
            "matchExact" | "matchRepoDigestOrExact" | "matchRepository" => {
                exact_keys(obj, &["type"], &what)?;
                match ty {
                    "matchExact" => IdentityMatch::MatchExact,
                    "matchRepoDigestOrExact" => IdentityMatch::MatchRepoDigestOrExact,
                    _ => IdentityMatch::MatchRepository,
                }
            }
            "exactReference" => {
                exact_keys(obj, &["type", "dockerReference"], &what)?;
                let r = str_of("dockerReference")?;
                let parsed = DockerRef::parse(&r).with_context(|| format!("{what}: invalid dockerReference {r:?}"))?;
                if parsed.is_name_only() {
                    bail!("{what}: dockerReference {r:?} contains neither a tag nor digest");
                }
                IdentityMatch::ExactReference(r)
            }
            "exactRepository" => {
                exact_keys(obj, &["type", "dockerRepository"], &what)?;
                let r = str_of("dockerRepository")?;
                DockerRef::parse(&r).with_context(|| format!("{what}: invalid dockerRepository {r:?}"))?;
                IdentityMatch::ExactRepository(r)
            }
            "remapIdentity" => {
                exact_keys(obj, &["type", "prefix", "signedPrefix"], &what)?;
                let prefix = str_of("prefix")?;
                let signed_prefix = str_of("signedPrefix")?;
                for p in [&prefix, &signed_prefix] {
                    if !policy_fields::valid_remap_prefix(p) {
                        bail!("{what}: prefix {p:?} is not valid");
                    }
                }
                IdentityMatch::RemapIdentity { prefix, signed_prefix }
            }
            other => bail!("{what}: unknown policy reference match type {other:?}"),
        })
    }

    /// Whether a signature claiming `signed` is acceptable for `image` (the reference
    /// as the user named it, `None` for a transport without Docker identity).
    pub(crate) fn matches(&self, image: Option<&DockerRef>, signed: &str) -> bool {
        let Ok(signed) = DockerRef::parse(signed) else { return false };
        match self {
            IdentityMatch::MatchExact => image
                .is_some_and(|i| !i.is_name_only() && !signed.is_name_only() && signed.to_string() == i.to_string()),
            IdentityMatch::MatchRepoDigestOrExact => image.is_some_and(|i| repo_digest_or_exact(i, &signed)),
            IdentityMatch::MatchRepository => image.is_some_and(|i| signed.name() == i.name()),
            IdentityMatch::ExactReference(r) => DockerRef::parse(r)
                .is_ok_and(|i| !i.is_name_only() && !signed.is_name_only() && signed.to_string() == i.to_string()),
            IdentityMatch::ExactRepository(r) => DockerRef::parse(r).is_ok_and(|i| signed.name() == i.name()),
            IdentityMatch::RemapIdentity { prefix, signed_prefix } => {
                let Some(i) = image else { return false };
                let name = i.name();
                let matches = name == *prefix
                    || (name.len() > prefix.len()
                        && name.starts_with(prefix.as_str())
                        && name.as_bytes()[prefix.len()] == b'/');
                if !matches {
                    return repo_digest_or_exact(i, &signed);
                }
                let full = i.to_string();
                let remapped = full.replacen(prefix.as_str(), signed_prefix, 1);
                match DockerRef::parse_canonical(&remapped) {
                    Ok(r) => repo_digest_or_exact(&r, &signed),
                    Err(_) => false,
                }
            }
        }
    }
}

fn repo_digest_or_exact(intended: &DockerRef, signed: &DockerRef) -> bool {
    if signed.is_name_only() {
        return false;
    }
    if intended.tag.is_some() {
        signed.to_string() == intended.to_string()
    } else if intended.digest.is_some() {
        signed.name() == intended.name()
    } else {
        false
    }
}

/// One policy requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Requirement {
    /// Accept without looking at signatures.
    InsecureAcceptAnything,
    /// Refuse.
    Reject,
    /// GPG simple signing.
    SignedBy {
        /// `keyType` as written (only `GPGKeys` is evaluated; the others reject, as in containers/image).
        key_type: String,
        /// The trusted keys.
        keys: KeySource,
        /// Identity rule.
        identity: IdentityMatch,
    },
    /// Sigstore signatures with public keys.
    SigstoreSigned {
        /// The trusted keys (`None` when the entry uses Fulcio, PKI or Rekor, which this
        /// build refuses at evaluation, naming the field).
        keys: Option<KeySource>,
        /// The unsupported fields used by the entry (fulcio, pki, rekor*), if any.
        unsupported: Vec<String>,
        /// Identity rule.
        identity: IdentityMatch,
    },
    /// `signedBaseLayer`: loads, but containers/image never accepts with it.
    SignedBaseLayer,
}

impl Requirement {
    /// The JSON `type` name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Requirement::InsecureAcceptAnything => "insecureAcceptAnything",
            Requirement::Reject => "reject",
            Requirement::SignedBy { .. } => "signedBy",
            Requirement::SigstoreSigned { .. } => "sigstoreSigned",
            Requirement::SignedBaseLayer => "signedBaseLayer",
        }
    }
}

fn parse_identity(v: &Json, what: &str) -> Result<IdentityMatch> {
    match v.get("signedIdentity") {
        None => Ok(IdentityMatch::MatchRepoDigestOrExact),
        Some(si) => IdentityMatch::parse(si, &format!("{what}: signedIdentity")),
    }
}

fn parse_requirement(v: &Json, what: &str) -> Result<Requirement> {
    let obj = v.object(what)?;
    let ty = match v.get("type") {
        Some(t) => t.string(what)?,
        None => bail!("{what}: requirement without \"type\""),
    };
    let what = format!("{what}: {ty}");
    match ty {
        "insecureAcceptAnything" => {
            exact_keys(obj, &["type"], &what)?;
            Ok(Requirement::InsecureAcceptAnything)
        }
        "reject" => {
            exact_keys(obj, &["type"], &what)?;
            Ok(Requirement::Reject)
        }
        "signedBy" => {
            only_keys(obj, &["type", "keyType", "keyPath", "keyPaths", "keyData", "signedIdentity"], &what)?;
            let (key_type, keys) = policy_fields::signed_by_keys(v, &what)?;
            Ok(Requirement::SignedBy { key_type, keys, identity: parse_identity(v, &what)? })
        }
        "sigstoreSigned" => {
            let known = [
                "type",
                "keyPath",
                "keyPaths",
                "keyData",
                "keyDatas",
                "fulcio",
                "pki",
                "rekorPublicKeyPath",
                "rekorPublicKeyPaths",
                "rekorPublicKeyData",
                "rekorPublicKeyDatas",
                "signedIdentity",
            ];
            only_keys(obj, &known, &what)?;
            let (keys, unsupported) = policy_fields::sigstore_keys(v, &what)?;
            Ok(Requirement::SigstoreSigned { keys, unsupported, identity: parse_identity(v, &what)? })
        }
        "signedBaseLayer" => {
            exact_keys(obj, &["type", "baseLayerIdentity"], &what)?;
            let bli = v.get("baseLayerIdentity").with_context(|| format!("{what}: missing baseLayerIdentity"))?;
            IdentityMatch::parse(bli, &format!("{what}: baseLayerIdentity"))?;
            Ok(Requirement::SignedBaseLayer)
        }
        other => bail!("{what}: unknown policy requirement type {other:?}"),
    }
}

fn parse_requirements(v: &Json, what: &str) -> Result<Vec<Requirement>> {
    let Json::Array(a) = v else { bail!("{what}: expected an array of requirements, found {}", v.kind()) };
    if a.is_empty() {
        bail!("{what}: list of verification policy requirements must not be empty");
    }
    a.iter().enumerate().map(|(i, r)| parse_requirement(r, &format!("{what}[{i}]"))).collect()
}

/// A loaded policy.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    /// `default`.
    pub default: Vec<Requirement>,
    /// `transports.<name>.<scope>`.
    pub transports: BTreeMap<String, BTreeMap<String, Vec<Requirement>>>,
}

impl Policy {
    /// Parses policy.json text; errors name the entry (`transports.docker."scope"[0]: …`).
    pub(crate) fn parse(text: &[u8]) -> Result<Policy> {
        let doc = Json::parse(text).context("not valid JSON")?;
        let obj = doc.object("policy")?;
        only_keys(obj, &["default", "transports"], "policy")?;
        let default = parse_requirements(doc.get("default").context("default policy is missing")?, "default")?;
        let mut transports = BTreeMap::new();
        if let Some(t) = doc.get("transports") {
            for (name, scopes) in t.object("transports")? {
                let mut map = BTreeMap::new();
                for (scope, reqs) in scopes.object(&format!("transports.{name}"))? {
                    let what = format!("scope {scope:?} of transport {name:?}");
                    if !scope.is_empty()
                        && let Err(why) = policy_fields::validate_scope(name, scope)
                    {
                        bail!("{what}: invalid scope: {why}");
                    }
                    map.insert(scope.clone(), parse_requirements(reqs, &what)?);
                }
                transports.insert(name.clone(), map);
            }
        }
        Ok(Policy { default, transports })
    }

    /// The requirements for an image, with the scope that decided (`""` = transport
    /// default, `None` = global default), as containers/image looks them up: the full
    /// identity, then each namespace from the most specific, then the transport's `""`,
    /// then `default`.
    pub(crate) fn requirements_for(
        &self,
        transport: &str,
        identity: &str,
        namespaces: &[String],
    ) -> (Option<String>, &[Requirement]) {
        if let Some(scopes) = self.transports.get(transport) {
            for s in std::iter::once(identity).chain(namespaces.iter().map(String::as_str)) {
                if let Some(r) = scopes.get(s) {
                    return (Some(s.to_string()), r);
                }
            }
            if let Some(r) = scopes.get("") {
                return (Some(String::new()), r);
            }
        }
        (None, &self.default)
    }
}

/// Policy scopes searched for a Docker reference after its full identity: the repository,
/// each parent namespace, the host[:port], then `*.domain` wildcards of the host without port.
pub(crate) fn docker_namespaces(name: &str) -> Vec<String> {
    let mut res = Vec::new();
    let mut n = name;
    loop {
        res.push(n.to_string());
        match n.rfind('/') {
            Some(i) => n = &n[..i],
            None => break,
        }
    }
    let mut host = n.split(':').next().unwrap_or(n);
    while let Some(i) = host.find('.') {
        host = &host[i + 1..];
        res.push(format!("*.{host}"));
    }
    res
}

/// Policy scopes of an OCI layout directory after its identity: the directory itself and
/// each parent except `/`.
pub(crate) fn oci_namespaces(dir: &str) -> Vec<String> {
    let mut res = Vec::new();
    let mut p = dir;
    loop {
        if p == "/" || p.is_empty() {
            break;
        }
        res.push(p.to_string());
        match p.rfind('/') {
            Some(i) if i > 0 => p = &p[..i],
            _ => break,
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_as_containers_image() {
        assert_eq!(
            docker_namespaces("example.com:8443/ns/repo"),
            ["example.com:8443/ns/repo", "example.com:8443/ns", "example.com:8443", "*.com"]
        );
        assert_eq!(
            docker_namespaces("a.b.example.com/r"),
            ["a.b.example.com/r", "a.b.example.com", "*.b.example.com", "*.example.com", "*.com"]
        );
        assert_eq!(oci_namespaces("/var/lib/img"), ["/var/lib/img", "/var/lib", "/var"]);
    }

    #[test]
    fn strict_parsing() {
        let ok = br#"{"default":[{"type":"reject"}],"transports":{"docker":{"q.io/o":[{"type":"insecureAcceptAnything"}]}}}"#;
        let p = Policy::parse(ok).unwrap();
        assert_eq!(
            p.requirements_for("docker", "q.io/o/r:1", &docker_namespaces("q.io/o/r")).0.as_deref(),
            Some("q.io/o")
        );
        for bad in [
            &br#"{"default":[]}"#[..],
            br#"{"transports":{}}"#,
            br#"{"default":[{"type":"reject"}],"x":1}"#,
            br#"{"default":[{"type":"reject","x":1}]}"#,
            br#"{"default":[{"type":"nope"}]}"#,
            br#"{"default":[{"type":"reject"}],"default":[{"type":"reject"}]}"#,
            br#"{"default":[{"type":"signedBy","keyType":"GPGKeys"}]}"#,
            br#"{"default":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/a","keyData":"AA=="}]}"#,
            br#"{"default":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/a","signedIdentity":{"type":"exactReference","dockerReference":"a/b"}}]}"#,
            br#"{"default":[{"type":"reject"}],"transports":{"oci":{"relative":[{"type":"reject"}]}}}"#,
        ] {
            assert!(Policy::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn identity_forms() {
        let tagged = DockerRef::parse("q.io/o/r:1").unwrap();
        let digested = DockerRef::parse(&format!("q.io/o/r@sha256:{}", "a".repeat(64))).unwrap();
        assert!(IdentityMatch::MatchExact.matches(Some(&tagged), "q.io/o/r:1"));
        assert!(!IdentityMatch::MatchExact.matches(Some(&tagged), "q.io/o/r:2"));
        assert!(IdentityMatch::MatchRepoDigestOrExact.matches(Some(&digested), "q.io/o/r:any"));
        assert!(!IdentityMatch::MatchRepoDigestOrExact.matches(Some(&tagged), "q.io/o/r:2"));
        assert!(IdentityMatch::MatchRepository.matches(Some(&tagged), "q.io/o/r:2"));
        assert!(!IdentityMatch::MatchRepository.matches(Some(&tagged), "q.io/o/x:1"));
        assert!(IdentityMatch::ExactReference("x.io/a:1".into()).matches(None, "x.io/a:1"));
        assert!(IdentityMatch::ExactRepository("x.io/a".into()).matches(None, "x.io/a:7"));
        let remap = IdentityMatch::RemapIdentity { prefix: "q.io/o".into(), signed_prefix: "s.io/p".into() };
        assert!(remap.matches(Some(&tagged), "s.io/p/r:1"));
        assert!(!remap.matches(Some(&tagged), "q.io/o/r:1"));
    }
}
