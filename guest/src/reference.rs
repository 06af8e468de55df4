//! `addonImage` parsing: `registry/repo[:tag][@sha256:<hex>]` or `oci:/abs/path[:tag]`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::checks::{check_path, is_sha256_hex, is_tag, show};
use crate::wit::{ImageSource, LayoutRef, RegistryRef};

/// Longest accepted repository name (`registry/repository`), as in the distribution spec.
const MAX_NAME: usize = 255;

/// A parsed image reference.
pub(crate) struct Reference {
    /// Normalised reference string (explicit `latest` tag when neither tag nor digest).
    pub normalised: String,
    /// The parsed reference.
    pub source: ImageSource,
}

/// Parses a (trimmed, non-empty) reference; `Err` lists every problem found.
pub(crate) fn parse(s: &str) -> Result<Reference, Vec<String>> {
    match s.strip_prefix("oci:") {
        Some(rest) => parse_layout(rest),
        None => parse_registry(s),
    }
}

/// Splits `name[:tag]` at the last `:` after the last `/`.
fn split_tag(s: &str) -> (&str, Option<&str>) {
    let after = s.rfind('/').map_or(0, |i| i + 1);
    match s[after..].rfind(':') {
        Some(j) => (&s[..after + j], Some(&s[after + j + 1..])),
        None => (s, None),
    }
}

fn tag_error(t: &str) -> String {
    if t.is_empty() {
        String::from("the tag after `:` is empty: drop the `:` or give a tag such as `v1.0`")
    } else {
        format!(
            "tag {} is invalid: a tag is 1-128 characters from `A-Za-z0-9_.-` and does not start with `.` or `-`",
            show(t)
        )
    }
}

fn parse_layout(rest: &str) -> Result<Reference, Vec<String>> {
    let mut errs = Vec::new();
    let (path, tag) = split_tag(rest);
    if let Err(e) = check_path(path) {
        errs.push(format!("local OCI layout `oci:<path>[:tag]`: {e}"));
    }
    if let Some(t) = tag
        && !is_tag(t)
    {
        errs.push(tag_error(t));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(Reference {
        normalised: format!("oci:{rest}"),
        source: ImageSource::Layout(LayoutRef { path: String::from(path), tag: tag.map(String::from) }),
    })
}

fn parse_registry(s: &str) -> Result<Reference, Vec<String>> {
    if let Some(i) = s.find("://") {
        let rest = &s[i + 3..];
        return Err(alloc::vec![format!(
            "{} has a URL scheme: write the reference without it, e.g. {}",
            show(s),
            show(rest)
        )]);
    }
    let mut errs = Vec::new();
    let (name_tag, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest
        && let Err(e) = check_digest(d)
    {
        errs.push(e);
    }
    let (name, tag) = split_tag(name_tag);
    if let Some(t) = tag
        && !is_tag(t)
    {
        errs.push(tag_error(t));
    }
    let Some((host, repo)) = name.split_once('/') else {
        let hint = if name.contains('.') || name == "localhost" {
            format!("{} has no repository: write `registry/repository[:tag]`, e.g. `quay.io/org/name:v1`", show(s))
        } else {
            format!(
                "{} has no registry host: write it out in full, e.g. {}",
                show(s),
                show(&format!("docker.io/library/{s}"))
            )
        };
        errs.insert(0, hint);
        return Err(errs);
    };
    if !(host.contains('.') || host.contains(':') || host == "localhost") {
        errs.insert(
            0,
            format!(
                "{} has no registry host ({} is not a host name): write it out in full, e.g. {}",
                show(s),
                show(host),
                show(&format!("docker.io/{s}"))
            ),
        );
    } else if let Err(e) = check_host(host) {
        errs.insert(0, e);
    }
    if let Err(e) = check_repository(repo) {
        errs.push(e);
    }
    if name.len() > MAX_NAME {
        errs.push(format!(
            "the name `registry/repository` is {} bytes long: at most {MAX_NAME} are accepted",
            name.len()
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let tag = match (tag, digest) {
        (None, None) => Some("latest"),
        (t, _) => t,
    };
    let mut normalised = String::from(name);
    if let Some(t) = tag {
        normalised.push(':');
        normalised.push_str(t);
    }
    if let Some(d) = digest {
        normalised.push('@');
        normalised.push_str(d);
    }
    Ok(Reference {
        normalised,
        source: ImageSource::Registry(RegistryRef {
            registry: String::from(host),
            repository: String::from(repo),
            tag: tag.map(String::from),
            digest: digest.map(String::from),
        }),
    })
}

fn check_digest(d: &str) -> Result<(), String> {
    const ACCEPTED: &str = "a digest is `sha256:` followed by 64 lowercase hex characters";
    match d.split_once(':') {
        Some(("sha256", hex)) if is_sha256_hex(hex) => Ok(()),
        Some(("sha256", hex)) => Err(format!("digest hex {} is invalid: {ACCEPTED}", show(hex))),
        Some((algo, _)) => Err(format!("digest algorithm {} is not supported: {ACCEPTED}", show(algo))),
        None => Err(format!("digest {} is invalid: {ACCEPTED}", show(d))),
    }
}

/// `host[:port]`, where host is DNS labels or a bracketed IPv6 address.
fn check_host(h: &str) -> Result<(), String> {
    let (port, bad_host) = if let Some(rest) = h.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else {
            return Err(format!("registry host {} has an unterminated `[`", show(h)));
        };
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err(format!("registry host {}: only `:port` may follow `]`", show(h))),
            },
        };
        (port, addr.parse::<core::net::Ipv6Addr>().is_err())
    } else {
        let (name, port) = match h.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (h, None),
        };
        (port, !is_hostname(name))
    };
    if bad_host {
        return Err(format!(
            "registry host {} is invalid: use DNS labels of letters, digits and inner `-` separated by `.`, or `[ipv6]`, optionally with `:port`",
            show(h)
        ));
    }
    if let Some(p) = port
        && !is_port(p)
    {
        return Err(format!("registry port {} is invalid: a port is a number from 1 to 65535", show(p)));
    }
    Ok(())
}

fn is_hostname(n: &str) -> bool {
    n.len() <= 253
        && n.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
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

fn check_repository(repo: &str) -> Result<(), String> {
    for c in repo.split('/') {
        if c.is_empty() {
            return Err(format!(
                "repository {} has an empty path component: components are separated by single `/`",
                show(repo)
            ));
        }
        if !is_component(c) {
            if c.bytes().any(|b| b.is_ascii_uppercase()) {
                return Err(format!("repository {} must be lowercase", show(repo)));
            }
            return Err(format!(
                "repository path component {} is invalid: use lowercase letters and digits, separated by `.`, `_`, `__` or `-`",
                show(c)
            ));
        }
    }
    Ok(())
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
