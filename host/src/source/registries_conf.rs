//! containers-registries.conf (v2): location rewrites, mirrors, insecure and blocked registries.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// Default registries.conf path, used when present.
pub const DEFAULT_PATH: &str = "/etc/containers/registries.conf";

#[derive(Debug, Deserialize, Default)]
struct ConfFile {
    #[serde(default)]
    registry: Vec<RegistryEntry>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "kebab-case")]
struct RegistryEntry {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    location: Option<String>,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror: Vec<Mirror>,
    #[serde(default)]
    mirror_by_digest_only: bool,
}

#[derive(Debug, Deserialize, Default, Clone)]
struct Mirror {
    location: String,
    #[serde(default)]
    insecure: bool,
}

/// A parsed registries.conf.
#[derive(Debug, Default)]
pub struct RegistriesConf {
    entries: Vec<RegistryEntry>,
    source: Option<PathBuf>,
}

/// One place to pull an image from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Registry host (with port).
    pub host: String,
    /// Repository path on that host.
    pub repository: String,
    /// Plain HTTP.
    pub insecure: bool,
    /// Whether this is a mirror (not the primary location).
    pub mirror: bool,
}

fn prefix_matches(prefix: &str, name: &str) -> Option<usize> {
    if let Some(suffix) = prefix.strip_prefix("*.") {
        let host = name.split('/').next().unwrap_or(name);
        return (host.ends_with(&format!(".{suffix}"))).then_some(host.len());
    }
    if name == prefix || name.starts_with(&format!("{prefix}/")) { Some(prefix.len()) } else { None }
}

fn split_location(loc: &str) -> (String, String) {
    match loc.split_once('/') {
        Some((h, r)) => (h.to_string(), r.to_string()),
        None => (loc.to_string(), String::new()),
    }
}

fn join_repo(base: &str, rest: &str) -> String {
    match (base.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_string(),
        (false, true) => base.to_string(),
        (false, false) => format!("{base}/{rest}"),
    }
}

impl RegistriesConf {
    /// Loads `explicit`, else the default file when present, else an empty configuration.
    pub fn load(explicit: Option<&Path>) -> Result<Self> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => {
                let p = PathBuf::from(DEFAULT_PATH);
                if !p.exists() {
                    return Ok(RegistriesConf::default());
                }
                p
            }
        };
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read registries.conf {}", path.display()))?;
        Self::parse(&text, Some(path))
    }

    /// Parses registries.conf text.
    pub fn parse(text: &str, source: Option<PathBuf>) -> Result<Self> {
        let name = source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "registries.conf".into());
        let conf: ConfFile =
            toml::from_str(text).with_context(|| format!("{name}: not a valid registries.conf (v2)"))?;
        for e in &conf.registry {
            if e.prefix.is_none() && e.location.is_none() {
                bail!("{name}: a [[registry]] has neither prefix nor location");
            }
        }
        Ok(RegistriesConf { entries: conf.registry, source })
    }

    /// The endpoints to try for `registry/repository`, mirrors first, primary last.
    pub fn endpoints(
        &self,
        registry: &str,
        repository: &str,
        by_digest: bool,
        insecure_flags: &[String],
    ) -> Result<Vec<Endpoint>> {
        let name = format!("{registry}/{repository}");
        let mut best: Option<(usize, &RegistryEntry)> = None;
        for e in &self.entries {
            let prefix = e.prefix.as_deref().or(e.location.as_deref()).unwrap_or_default();
            if let Some(len) = prefix_matches(prefix, &name)
                && best.is_none_or(|(l, _)| len > l)
            {
                best = Some((len, e));
            }
        }
        let flag_insecure = |host: &str| insecure_flags.iter().any(|h| h == host);
        let Some((len, e)) = best else {
            return Ok(vec![Endpoint {
                host: registry.to_string(),
                repository: repository.to_string(),
                insecure: flag_insecure(registry),
                mirror: false,
            }]);
        };
        let src = self.source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "registries.conf".into());
        if e.blocked {
            bail!("registry {registry} is blocked for {name} by {src}");
        }
        let wildcard = e.prefix.as_deref().is_some_and(|p| p.starts_with("*."));
        let rest = name[len..].trim_start_matches('/');
        let mut out = Vec::new();
        if !e.mirror_by_digest_only || by_digest {
            for m in &e.mirror {
                let (host, base) = split_location(&m.location);
                let repository = if wildcard { repository.to_string() } else { join_repo(&base, rest) };
                out.push(Endpoint { insecure: m.insecure || flag_insecure(&host), host, repository, mirror: true });
            }
        }
        let (host, repository) = match (&e.location, wildcard) {
            (Some(loc), false) if !loc.is_empty() => {
                let (h, base) = split_location(loc);
                (h, join_repo(&base, rest))
            }
            _ => (registry.to_string(), repository.to_string()),
        };
        out.push(Endpoint { insecure: e.insecure || flag_insecure(&host), host, repository, mirror: false });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_prefix_blocked() {
        let c = RegistriesConf::parse(
            r#"
[[registry]]
prefix = "example.com/foo"
location = "internal:5000/bar"
insecure = true
[[registry.mirror]]
location = "mirror1:5000/m"
[[registry.mirror]]
location = "mirror2"
insecure = true

[[registry]]
location = "example.com"

[[registry]]
location = "bad.io"
blocked = true
"#,
            None,
        )
        .unwrap();
        let e = c.endpoints("example.com", "foo/img", false, &[]).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!((e[0].host.as_str(), e[0].repository.as_str(), e[0].insecure), ("mirror1:5000", "m/img", false));
        assert_eq!((e[1].host.as_str(), e[1].repository.as_str(), e[1].insecure), ("mirror2", "img", true));
        assert_eq!((e[2].host.as_str(), e[2].repository.as_str(), e[2].insecure), ("internal:5000", "bar/img", true));
        let e = c.endpoints("example.com", "other/img", false, &["example.com".into()]).unwrap();
        assert_eq!(
            e,
            vec![Endpoint {
                host: "example.com".into(),
                repository: "other/img".into(),
                insecure: true,
                mirror: false
            }]
        );
        assert!(c.endpoints("bad.io", "x", false, &[]).is_err());
        assert_eq!(c.endpoints("foo.io", "x", false, &[]).unwrap().len(), 1);
    }
}
