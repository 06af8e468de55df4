//! Image references, one grammar for the ConfigMap (the policy guest) and the node's own
//! files (the runner): `registry/repository[:tag][@sha256:<hex>]` as containers/image's
//! `docker/reference` reads it, and `oci:/path/to/layout[:tag]`.
//!
//! - registry host: DNS-style labels (letters, digits, inner `-`, separated by `.`) with
//!   an optional `:port` (1-65535, no leading zero); like containers/image, a bracketed
//!   IPv6 address (`[::1]:5000`) is not a registry host;
//! - Docker Hub aliasing happens here only: `index.docker.io` is `docker.io`, and a
//!   one-component Docker Hub repository gets `library/`; a name without a registry host
//!   (`busybox`) means Docker Hub only where [`Familiar::DockerHub`] says so;
//! - the 255-byte limit on `registry/repository` applies after that normalisation, so a
//!   name is judged the same whichever way it was written.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::grammar::{is_sha256_hex, is_tag, show};

/// Longest `registry/repository`, in bytes (containers/image's `NameTotalLengthMax`).
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;
/// Docker Hub's canonical registry name.
pub const DOCKER_HUB: &str = "docker.io";
/// Docker Hub's legacy registry name, read as [`DOCKER_HUB`].
pub const LEGACY_DOCKER_HUB: &str = "index.docker.io";
/// The Docker Hub namespace of one-component repositories (`busybox` = `library/busybox`).
pub const OFFICIAL_NAMESPACE: &str = "library";
/// The tag a reference without tag or digest means.
pub const DEFAULT_TAG: &str = "latest";
/// Prefix of a local OCI layout reference.
pub const LAYOUT_PREFIX: &str = "oci:";
/// Longest registry host name (without port), in bytes.
const MAX_HOST: usize = 253;
/// Longest DNS label, in bytes.
const MAX_LABEL: usize = 63;

/// A registry reference, normalised (Docker Hub aliasing applied).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Named {
    /// Registry host, with port if any.
    pub registry: String,
    /// Repository path (lowercase components separated by `/`).
    pub repository: String,
    /// Tag, if any.
    pub tag: Option<String>,
    /// Pinned manifest digest (`sha256:` + 64 lowercase hex), if any.
    pub digest: Option<String>,
}

impl Named {
    /// `registry/repository`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The same reference with tag [`DEFAULT_TAG`] when it has neither tag nor digest.
    pub fn with_default_tag(mut self) -> Named {
        if self.tag.is_none() && self.digest.is_none() {
            self.tag = Some(String::from(DEFAULT_TAG));
        }
        self
    }
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// How a name without a registry host (`busybox`, `library/busybox`) is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Familiar {
    /// Refused: the registry must be written out (the ConfigMap's `addonImage`).
    Refused,
    /// Docker Hub, as containers/image reads it (node files: policy scopes, signatures).
    DockerHub,
}

/// One problem with a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefError {
    /// Empty.
    Empty,
    /// Starts with a URL scheme (the reference, what follows `://`).
    Scheme(String, String),
    /// No repository after the registry (the reference).
    NoRepository(String),
    /// No registry host (the reference; the first component, if it was taken for one).
    NoRegistry(String, Option<String>),
    /// A bracketed IPv6 registry host (the host).
    Ipv6Host(String),
    /// A registry host that is not DNS-style labels (the host).
    BadHost(String),
    /// A registry port that is not 1-65535 (the port).
    BadPort(String),
    /// A repository with an empty component (the repository).
    EmptyComponent(String),
    /// A repository with uppercase letters (the repository).
    Uppercase(String),
    /// A repository component outside the grammar (the component).
    BadComponent(String),
    /// `:` with nothing after it.
    EmptyTag,
    /// A tag outside the tag grammar (the tag).
    BadTag(String),
    /// A digest that is not `sha256:` + 64 lowercase hex (the digest).
    BadDigest(String),
    /// A digest algorithm other than sha256 (the algorithm).
    DigestAlgorithm(String),
    /// `registry/repository` longer than [`NAME_TOTAL_LENGTH_MAX`] after normalisation (its length).
    NameTooLong(usize),
    /// A layout reference whose path is not a clean absolute path (the problem).
    LayoutPath(crate::grammar::PathError),
    /// Parts that are not in normalised form (`registry/repository` as given).
    NotNormalised(String),
}

const DIGEST_RULE: &str = "a digest is `sha256:` followed by 64 lowercase hex characters";

impl fmt::Display for RefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefError::Empty => f.write_str("the image reference is empty"),
            RefError::Scheme(s, rest) => {
                write!(f, "{} has a URL scheme: write the reference without it, e.g. {}", show(s), show(rest))
            }
            RefError::NoRepository(s) => write!(
                f,
                "{} has no repository: write `registry/repository[:tag]`, e.g. `quay.io/org/name:v1`",
                show(s)
            ),
            RefError::NoRegistry(s, None) => write!(
                f,
                "{} has no registry host: write it out in full, e.g. {}",
                show(s),
                show(&format!("{DOCKER_HUB}/{OFFICIAL_NAMESPACE}/{s}"))
            ),
            RefError::NoRegistry(s, Some(first)) => write!(
                f,
                "{} has no registry host ({} is not a host name): write it out in full, e.g. {}",
                show(s),
                show(first),
                show(&format!("{DOCKER_HUB}/{s}"))
            ),
            RefError::Ipv6Host(h) => write!(
                f,
                "registry host {} is a bracketed IPv6 address, which image references do not accept \
                 (containers/image refuses it too): use a host name (e.g. from /etc/hosts) or an IPv4 address",
                show(h)
            ),
            RefError::BadHost(h) => write!(
                f,
                "registry host {} is invalid: use DNS labels of letters, digits and inner `-` separated by `.`, optionally with `:port`",
                show(h)
            ),
            RefError::BadPort(p) => {
                write!(f, "registry port {} is invalid: a port is a number from 1 to 65535", show(p))
            }
            RefError::EmptyComponent(r) => {
                write!(f, "repository {} has an empty path component: components are separated by single `/`", show(r))
            }
            RefError::Uppercase(r) => write!(f, "repository {} must be lowercase", show(r)),
            RefError::BadComponent(c) => write!(
                f,
                "repository path component {} is invalid: use lowercase letters and digits, separated by `.`, `_`, `__` or `-`",
                show(c)
            ),
            RefError::EmptyTag => f.write_str("the tag after `:` is empty: drop the `:` or give a tag such as `v1.0`"),
            RefError::BadTag(t) => write!(
                f,
                "tag {} is invalid: a tag is 1-128 characters from `A-Za-z0-9_.-` and does not start with `.` or `-`",
                show(t)
            ),
            RefError::BadDigest(d) => write!(f, "digest {} is invalid: {DIGEST_RULE}", show(d)),
            RefError::DigestAlgorithm(a) => write!(f, "digest algorithm {} is not supported: {DIGEST_RULE}", show(a)),
            RefError::NameTooLong(n) => write!(
                f,
                "the name `registry/repository` is {n} bytes long (Docker Hub names counted with `{DOCKER_HUB}/` \
                 and `{OFFICIAL_NAMESPACE}/`): at most {NAME_TOTAL_LENGTH_MAX} are accepted"
            ),
            RefError::LayoutPath(e) => write!(f, "local OCI layout `oci:<path>[:tag]`: {e}"),
            RefError::NotNormalised(n) => write!(
                f,
                "{} is not a normalised Docker Hub name: write `{DOCKER_HUB}` (not `{LEGACY_DOCKER_HUB}`) and \
                 `{OFFICIAL_NAMESPACE}/<name>` for a one-component repository",
                show(n)
            ),
        }
    }
}

/// One line for a list of reference problems (`; `-separated).
pub fn describe(problems: &[RefError]) -> String {
    let mut out = String::new();
    for (i, p) in problems.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(&alloc::format!("{p}"));
    }
    out
}

/// A parsed reference: a registry image or a local OCI layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// An image in a registry.
    Registry(Named),
    /// An image in a local OCI layout directory.
    Layout {
        /// Layout directory (a clean absolute path).
        path: String,
        /// Tag (`org.opencontainers.image.ref.name`), if any.
        tag: Option<String>,
    },
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Registry(n) => n.fmt(f),
            Reference::Layout { path, tag } => {
                write!(f, "{LAYOUT_PREFIX}{path}")?;
                if let Some(t) = tag {
                    write!(f, ":{t}")?;
                }
                Ok(())
            }
        }
    }
}

/// Parses `oci:/path[:tag]` or a registry reference (see [`parse_named`]); `Err` lists
/// every problem found.
pub fn parse(s: &str, familiar: Familiar) -> Result<Reference, Vec<RefError>> {
    match s.strip_prefix(LAYOUT_PREFIX) {
        Some(rest) => {
            let (path, tag) = split_layout(rest);
            let mut errs = Vec::new();
            if let Err(e) = crate::grammar::check_path(path) {
                errs.push(RefError::LayoutPath(e));
            }
            if let Some(e) = tag.and_then(tag_error) {
                errs.push(e);
            }
            if errs.is_empty() {
                Ok(Reference::Layout { path: String::from(path), tag: tag.map(String::from) })
            } else {
                Err(errs)
            }
        }
        None => parse_named(s, familiar).map(Reference::Registry),
    }
}

/// Splits the part after `oci:` into the layout path and the tag after the last `:` that
/// follows the last `/`.
pub fn split_layout(rest: &str) -> (&str, Option<&str>) {
    split_tag(rest)
}

/// Splits `name[:tag]` at the last `:` after the last `/`.
fn split_tag(s: &str) -> (&str, Option<&str>) {
    let after = s.rfind('/').map_or(0, |i| i + 1);
    match s[after..].rfind(':') {
        Some(j) => (&s[..after + j], Some(&s[after + j + 1..])),
        None => (s, None),
    }
}

fn tag_error(t: &str) -> Option<RefError> {
    match t {
        "" => Some(RefError::EmptyTag),
        t if !is_tag(t) => Some(RefError::BadTag(String::from(t))),
        _ => None,
    }
}

/// Whether the first component of a name is a registry host (containers/image's
/// `splitDockerDomain`: it contains `.` or `:`, or is `localhost`; a bracket starts one too).
fn is_registry_like(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first.starts_with('[') || first == "localhost"
}

/// Parses and normalises `registry/repository[:tag][@sha256:<hex>]`; `Err` lists every
/// problem found. The tag is kept as written (none when absent): see
/// [`Named::with_default_tag`].
pub fn parse_named(s: &str, familiar: Familiar) -> Result<Named, Vec<RefError>> {
    if s.is_empty() {
        return Err(alloc::vec![RefError::Empty]);
    }
    if let Some(i) = s.find("://") {
        return Err(alloc::vec![RefError::Scheme(String::from(s), String::from(&s[i + 3..]))]);
    }
    let mut errs = Vec::new();
    let (name_tag, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest
        && let Some(e) = digest_error(d)
    {
        errs.push(e);
    }
    let (name, tag) = split_tag(name_tag);
    if let Some(e) = tag.and_then(tag_error) {
        errs.push(e);
    }
    let (host, repo) = match name.split_once('/') {
        Some((first, rest)) if is_registry_like(first) => (first, rest),
        Some((first, _)) if familiar == Familiar::Refused => {
            errs.insert(0, RefError::NoRegistry(String::from(s), Some(String::from(first))));
            return Err(errs);
        }
        None if familiar == Familiar::Refused => {
            errs.insert(
                0,
                if is_registry_like(name) {
                    RefError::NoRepository(String::from(s))
                } else {
                    RefError::NoRegistry(String::from(s), None)
                },
            );
            return Err(errs);
        }
        _ => (DOCKER_HUB, name),
    };
    if let Some(e) = host_error(host) {
        errs.insert(0, e);
    }
    if let Some(e) = repository_error(repo) {
        errs.push(e);
    }
    let registry = if host == LEGACY_DOCKER_HUB { DOCKER_HUB } else { host };
    let repository = if registry == DOCKER_HUB && !repo.contains('/') {
        format!("{OFFICIAL_NAMESPACE}/{repo}")
    } else {
        String::from(repo)
    };
    if let Some(e) = length_error(registry, &repository) {
        errs.push(e);
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(Named {
        registry: String::from(registry),
        repository,
        tag: tag.map(String::from),
        digest: digest.map(String::from),
    })
}

/// Checks a reference given as parts (as a plan carries it) against the same grammar,
/// normalisation included: `Ok` exactly when [`parse_named`] gives these parts for some text.
pub fn check_parts(
    registry: &str,
    repository: &str,
    tag: Option<&str>,
    digest: Option<&str>,
) -> Result<(), Vec<RefError>> {
    let errs: Vec<RefError> = [
        host_error(registry),
        repository_error(repository),
        tag.and_then(tag_error),
        digest.and_then(digest_error),
        (registry == LEGACY_DOCKER_HUB || (registry == DOCKER_HUB && !repository.contains('/')))
            .then(|| RefError::NotNormalised(format!("{registry}/{repository}"))),
        length_error(registry, repository),
    ]
    .into_iter()
    .flatten()
    .collect();
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

/// `registry/repository` over [`NAME_TOTAL_LENGTH_MAX`] bytes.
fn length_error(registry: &str, repository: &str) -> Option<RefError> {
    let len = registry.len() + 1 + repository.len();
    (len > NAME_TOTAL_LENGTH_MAX).then_some(RefError::NameTooLong(len))
}

/// Whether `registry` is a registry host as references write it (`host[:port]`).
pub fn is_registry_host(registry: &str) -> bool {
    host_error(registry).is_none()
}

/// Whether `repository` is a repository path (`component(/component)*`).
pub fn is_repository(repository: &str) -> bool {
    repository_error(repository).is_none()
}

fn digest_error(d: &str) -> Option<RefError> {
    match d.split_once(':') {
        Some(("sha256", hex)) if is_sha256_hex(hex) => None,
        Some(("sha256", _)) | None => Some(RefError::BadDigest(String::from(d))),
        Some((algo, _)) => Some(RefError::DigestAlgorithm(String::from(algo))),
    }
}

/// `host[:port]`, host DNS-style labels.
fn host_error(h: &str) -> Option<RefError> {
    if h.starts_with('[') {
        return Some(RefError::Ipv6Host(String::from(h)));
    }
    let (name, port) = match h.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (h, None),
    };
    if !is_hostname(name) {
        return Some(RefError::BadHost(String::from(h)));
    }
    match port {
        Some(p) if !is_port(p) => Some(RefError::BadPort(String::from(p))),
        _ => None,
    }
}

fn is_hostname(n: &str) -> bool {
    n.len() <= MAX_HOST
        && n.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= MAX_LABEL
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                && b.first() != Some(&b'-')
                && b.last() != Some(&b'-')
        })
}

fn is_port(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 5
        && !p.starts_with('0')
        && p.bytes().all(|c| c.is_ascii_digit())
        && p.parse::<u32>().is_ok_and(|n| (1..=65535).contains(&n))
}

fn repository_error(repo: &str) -> Option<RefError> {
    for c in repo.split('/') {
        if c.is_empty() {
            return Some(RefError::EmptyComponent(String::from(repo)));
        }
        if !is_component(c) {
            if c.bytes().any(|b| b.is_ascii_uppercase()) {
                return Some(RefError::Uppercase(String::from(repo)));
            }
            return Some(RefError::BadComponent(String::from(c)));
        }
    }
    None
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn is_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while i < b.len() && alnum(b[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == b.len() {
            return true;
        }
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if b.get(i) == Some(&b'_') {
                    i += 1;
                }
            }
            b'-' => {
                while b.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn named(s: &str) -> Named {
        match parse_named(s, Familiar::DockerHub) {
            Ok(n) => n,
            Err(e) => panic!("{s}: {e:?}"),
        }
    }

    #[test]
    fn docker_hub_aliasing() {
        assert_eq!(named("busybox").to_string(), "docker.io/library/busybox");
        assert_eq!(named("index.docker.io/foo/bar:1").to_string(), "docker.io/foo/bar:1");
        assert_eq!(named("docker.io/ubuntu").to_string(), "docker.io/library/ubuntu");
        assert_eq!(named("localhost/ubuntu").to_string(), "localhost/ubuntu");
        assert!(parse_named("busybox", Familiar::Refused).is_err());
        assert_eq!(
            parse_named("docker.io/ubuntu", Familiar::Refused).map(|n| n.repository),
            Ok(String::from("library/ubuntu"))
        );
    }

    #[test]
    fn the_length_limit_counts_the_normalised_name() {
        // `docker.io/` + 245 = 255 as written; with `library/` it is 263.
        for n in 238..=245 {
            let s = alloc::format!("docker.io/{}", "a".repeat(n));
            let e = parse_named(&s, Familiar::Refused).expect_err("too long once normalised");
            assert!(matches!(e[..], [RefError::NameTooLong(l)] if l == n + 18), "{n}: {e:?}");
        }
        let s = alloc::format!("docker.io/{}", "a".repeat(237));
        assert_eq!(named(&s).name().len(), 255);
        let s = alloc::format!("quay.io/{}", "a".repeat(247));
        assert_eq!(named(&s).name().len(), 255);
    }

    #[test]
    fn ipv6_hosts_are_refused_as_containers_image_does() {
        for s in ["[::1]:5000/a/b:v1", "[fe80::1]/a:v1", "[::1/a"] {
            let e = parse_named(s, Familiar::Refused).expect_err(s);
            assert!(matches!(&e[0], RefError::Ipv6Host(_)), "{s}: {e:?}");
        }
    }

    #[test]
    fn grammar() {
        let d = alloc::format!("sha256:{}", "a".repeat(64));
        let r = named(&alloc::format!("127.0.0.1:5000/a/b-c__d.e:v1@{d}"));
        assert_eq!(r.name(), "127.0.0.1:5000/a/b-c__d.e");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        for bad in [
            "r.io/A",
            "r.io/a//b",
            "r.io/a___b",
            "r.io/-a",
            "r.io/a:",
            "r.io:x/a",
            "r.io/a.-b",
            "r.io:0/a",
            "-r.io/a",
            "r.io/a@sha512:00",
            "",
        ] {
            assert!(parse_named(bad, Familiar::DockerHub).is_err(), "{bad}");
        }
        assert!(parse_named("r.io/a---b", Familiar::DockerHub).is_ok());
        assert_eq!(parse_named("quay.io/A/b:.x@sha1:00", Familiar::Refused).map_err(|e| e.len()), Err(3));
        assert_eq!(
            parse("oci:/x/y:t", Familiar::Refused),
            Ok(Reference::Layout { path: String::from("/x/y"), tag: Some(String::from("t")) })
        );
        assert_eq!(split_layout("/a:b/layout"), ("/a:b/layout", None));
        assert!(parse("oci:relative", Familiar::Refused).is_err());
    }

    #[test]
    fn parts_pass_exactly_when_the_text_would_give_them() {
        let n = named("quay.io/a/b:v1");
        assert_eq!(check_parts(&n.registry, &n.repository, n.tag.as_deref(), None), Ok(()));
        assert!(check_parts("docker.io", "ubuntu", None, None).is_err());
        assert!(check_parts("index.docker.io", "a/b", None, None).is_err());
        assert!(check_parts("[::1]:5000", "a/b", None, None).is_err());
        assert!(check_parts("quay.io", "a/b", Some(".x"), None).is_err());
        assert!(check_parts("quay.io", "a/b", None, Some("sha256:00")).is_err());
        assert!(check_parts("quay.io", &"a".repeat(248), None, None).is_err());
    }
}
