//! Credentials from containers auth.json / docker config.json files.
//!
//! Credential helpers (`credHelpers`, `credsStore`) are never executed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde::Deserialize;

/// Username and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
    /// Which file and key they came from (for messages).
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({} from {})", self.username, self.source)
    }
}

#[derive(Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// Canonical name of a registry host: docker.io aliases become `docker.io`.
pub fn normalize_registry(host: &str) -> String {
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" | "docker.io" => "docker.io".to_string(),
        h => h.to_string(),
    }
}

/// Normalises an auth file key: drops `http(s)://`, old docker `/v1/` suffixes, aliases.
fn normalize_key(key: &str) -> String {
    let k = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    let k = k.trim_end_matches('/');
    let had_scheme = k.len() != key.trim_end_matches('/').len();
    // Legacy docker keys are URLs: keep only the host.
    let k = if had_scheme { k.split('/').next().unwrap_or(k) } else { k };
    match k.split_once('/') {
        Some((host, rest)) => format!("{}/{rest}", normalize_registry(host)),
        None => normalize_registry(k),
    }
}

/// The auth files searched, in order, when no `--auth-file` is given.
pub fn default_auth_files() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os("REGISTRY_AUTH_FILE").filter(|p| !p.is_empty()) {
        v.push(PathBuf::from(p));
    }
    v.push(PathBuf::from("/tmp/regauth/auth.json"));
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        v.push(PathBuf::from(d).join("containers/auth.json"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        v.push(PathBuf::from(h).join(".docker/config.json"));
    }
    v
}

fn decode(entry: &AuthEntry, source: String) -> Result<Option<Credentials>> {
    if let Some(a) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(a.trim())
            .with_context(|| format!("{source}: \"auth\" is not valid base64"))?;
        let s = String::from_utf8(raw).with_context(|| format!("{source}: \"auth\" is not UTF-8"))?;
        let Some((u, p)) = s.split_once(':') else {
            bail!("{source}: \"auth\" does not decode to user:password");
        };
        return Ok(Some(Credentials { username: u.to_string(), password: p.to_string(), source }));
    }
    match (&entry.username, &entry.password) {
        (Some(u), Some(p)) if !u.is_empty() => {
            Ok(Some(Credentials { username: u.clone(), password: p.clone(), source }))
        }
        _ => Ok(None),
    }
}

/// Finds credentials for `registry/repository` in one file (most specific key wins).
pub fn lookup_in_file(path: &Path, registry: &str, repository: &str) -> Result<Option<Credentials>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read auth file {}", path.display()))?;
    let file: AuthFile =
        serde_json::from_str(&text).with_context(|| format!("auth file {} is not valid JSON", path.display()))?;
    let registry = normalize_registry(registry);
    let entries: Vec<(String, &AuthEntry)> = file.auths.iter().map(|(k, v)| (normalize_key(k), v)).collect();
    let mut candidates = Vec::new();
    let mut scope = format!("{registry}/{repository}");
    loop {
        candidates.push(scope.clone());
        match scope.rfind('/') {
            Some(i) => scope.truncate(i),
            None => break,
        }
    }
    for c in candidates {
        // Several raw keys can normalise to one; the exact (already canonical) key wins.
        let mut found: Option<&AuthEntry> = None;
        for (k, v) in &entries {
            if *k == c {
                found = Some(v);
            }
        }
        if let Some(e) = file.auths.get(&c).or(found) {
            let source = format!("{} (key {c:?})", path.display());
            if let Some(cred) = decode(e, source)? {
                return Ok(Some(cred));
            }
        }
    }
    Ok(None)
}

/// Finds credentials for a registry: `--auth-file` only if given, else the default search.
pub fn lookup(explicit: Option<&Path>, registry: &str, repository: &str) -> Result<Option<Credentials>> {
    if let Some(p) = explicit {
        return lookup_in_file(p, registry, repository);
    }
    for p in default_auth_files() {
        if !p.exists() {
            continue;
        }
        match lookup_in_file(&p, registry, repository) {
            Ok(Some(c)) => return Ok(Some(c)),
            Ok(None) => {}
            Err(e) => tracing::warn!("ignoring auth file {}: {e:#}", p.display()),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_wins() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(
            &p,
            serde_json::json!({"auths": {
                "https://index.docker.io/v1/": {"auth": b("hub:x")},
                "r.example:5000": {"auth": b("host:1")},
                "r.example:5000/ns": {"username": "ns", "password": "2"},
                "r.example:5000/ns/repo": {"auth": b("repo:3")},
            }})
            .to_string(),
        )
        .unwrap();
        let u = |reg: &str, repo: &str| lookup_in_file(&p, reg, repo).unwrap().map(|c| c.username);
        assert_eq!(u("r.example:5000", "ns/repo").as_deref(), Some("repo"));
        assert_eq!(u("r.example:5000", "ns/other").as_deref(), Some("ns"));
        assert_eq!(u("r.example:5000", "x/y").as_deref(), Some("host"));
        assert_eq!(u("docker.io", "library/busybox").as_deref(), Some("hub"));
        assert_eq!(u("other", "x"), None);
    }
}
