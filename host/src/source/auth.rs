//! Credentials per containers-auth.json(5), searched as containers/image searches them.
//!
//! `--auth-file` is the only file read, as skopeo's `--authfile`. Otherwise, in order:
//! `$REGISTRY_AUTH_FILE` (skipped when absent: the DaemonSet's optional pull secret; skopeo
//! would read only this file, a deliberate difference so the node pull secret still
//! applies), the node pull secret (`R/var/lib/kubelet/config.json`),
//! `$XDG_RUNTIME_DIR/containers/auth.json`, `$XDG_CONFIG_HOME` (or `~/.config`)`/containers/auth.json`,
//! `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`), `~/.dockercfg` (legacy format).
//! The first file with an entry for the image wins; inside a file the most specific key
//! (`host/ns/repo` … `host`) wins. Credential helpers (`credHelpers`, `credsStore`,
//! registries.conf `credential-helpers`) are never executed: they are reported, and named
//! in the message of a refused (HTTP 401) pull.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde::Deserialize;

use super::reference::DOCKER_HUB;
use crate::nodefs::{FilePath, MAX_CONFIG_FILE, NodeFs};

/// Username and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
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

/// The result of a lookup: credentials, and credential helpers that would have been asked.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuthLookup {
    /// Credentials found, if any.
    pub creds: Option<Credentials>,
    /// One line per credential helper configured for this registry (never executed).
    pub helpers: Vec<String>,
}

impl AuthLookup {
    /// What a 401 from this registry should add: the helpers configured and what to do.
    pub(crate) fn helper_hint(&self) -> Option<String> {
        (!self.helpers.is_empty()).then(|| {
            format!(
                "{}; credential helpers are never executed here: put the credentials in an auth file \
                 (--auth-file, REGISTRY_AUTH_FILE or the node pull secret) as \"auths\" entries",
                self.helpers.join("; ")
            )
        })
    }
}

/// Where credentials are searched.
#[derive(Debug, Clone)]
pub(crate) struct AuthSources {
    /// The node files reader (the node pull secret is a node file).
    pub fs: NodeFs,
    /// The only file read, if set (`--auth-file`).
    pub explicit: Option<FilePath>,
    /// Searched in order when there is no explicit file: (path, legacy `.dockercfg` format).
    pub search: Vec<(FilePath, bool)>,
    /// registries.conf `credential-helpers` (and its file), when set.
    pub conf_helpers: Option<(Vec<String>, PathBuf)>,
}

#[derive(Deserialize, Default)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// containers/image's key normalisation for registry names: Docker Hub aliases.
fn normalize_registry(host: &str) -> String {
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" | "docker.io" => DOCKER_HUB.to_string(),
        h => h.to_string(),
    }
}

/// Normalises an auth file key: drops `http(s)://` (then only the host counts), aliases.
fn normalize_key(key: &str, legacy: bool) -> String {
    let k = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    let k = if legacy || k.len() != key.len() { k.split('/').next().unwrap_or(k) } else { k };
    match k.split_once('/') {
        Some((host, rest)) => format!("{}/{rest}", normalize_registry(host)),
        None => normalize_registry(k),
    }
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|p| !p.is_empty()).map(PathBuf::from)
}

impl AuthSources {
    /// The sources for this process: `flag` (`--auth-file`) alone, else the search list
    /// (`$REGISTRY_AUTH_FILE`, the node pull secret `pull_secret`, the user's files).
    pub(crate) fn new(fs: NodeFs, flag: Option<&Path>, pull_secret: FilePath) -> Self {
        if let Some(p) = flag {
            return AuthSources {
                fs,
                explicit: Some(FilePath::Local(p.to_path_buf())),
                search: Vec::new(),
                conf_helpers: None,
            };
        }
        let mut search: Vec<(FilePath, bool)> = Vec::new();
        if let Some(p) = env_path("REGISTRY_AUTH_FILE") {
            search.push((FilePath::Local(p), false));
        }
        search.push((pull_secret, false));
        let mut user = Vec::new();
        if let Some(d) = env_path("XDG_RUNTIME_DIR") {
            user.push((d.join("containers/auth.json"), false));
        }
        let home = env_path("HOME");
        if let Some(c) = env_path("XDG_CONFIG_HOME").or_else(|| home.as_ref().map(|h| h.join(".config"))) {
            user.push((c.join("containers/auth.json"), false));
        }
        if let Some(d) = env_path("DOCKER_CONFIG") {
            user.push((d.join("config.json"), false));
        } else if let Some(h) = &home {
            user.push((h.join(".docker/config.json"), false));
        }
        if let Some(h) = &home {
            user.push((h.join(".dockercfg"), true));
        }
        search.extend(user.into_iter().map(|(p, l)| (FilePath::Local(p), l)));
        AuthSources { fs, explicit: None, search, conf_helpers: None }
    }

    /// Finds credentials for `registry/repository` (the endpoint actually contacted).
    pub(crate) fn lookup(&self, registry: &str, repository: &str) -> Result<AuthLookup> {
        let mut out = AuthLookup::default();
        let use_files = match &self.conf_helpers {
            None => true,
            Some((helpers, file)) => {
                for h in helpers.iter().filter(|h| *h != super::registries_conf::AUTH_FILE_HELPER) {
                    out.helpers.push(format!("{}: credential-helpers names {h:?}", file.display()));
                }
                helpers.iter().any(|h| h == super::registries_conf::AUTH_FILE_HELPER)
            }
        };
        if !use_files {
            warn_helpers(&out, registry, repository);
            return Ok(out);
        }
        if let Some(p) = &self.explicit {
            let text = self.read(p)?.with_context(|| format!("auth file {p} does not exist"))?;
            out.creds = lookup_in_file(&text, p, false, registry, repository, &mut out.helpers)?;
            warn_helpers(&out, registry, repository);
            return Ok(out);
        }
        for (p, legacy) in &self.search {
            let Some(text) = self.read(p)? else { continue };
            if let Some(c) = lookup_in_file(&text, p, *legacy, registry, repository, &mut out.helpers)? {
                out.creds = Some(c);
                break;
            }
        }
        warn_helpers(&out, registry, repository);
        Ok(out)
    }
}

/// One warning per configured credential helper (per process): it is not executed, and
/// what the pull uses instead.
fn warn_helpers(out: &AuthLookup, registry: &str, repository: &str) {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let using = match &out.creds {
        Some(c) => format!("credentials from {}", c.source),
        None => "anonymous access".to_string(),
    };
    for h in &out.helpers {
        let new = WARNED.lock().map(|mut w| w.insert(h.clone())).unwrap_or(true);
        if new {
            tracing::warn!(
                "{h}: credential helpers are never executed here; {registry}/{repository} is pulled with {using} \
                 (put the credentials in an auth file as \"auths\" entries if the registry needs them)"
            );
        }
    }
}

impl AuthSources {
    fn read(&self, p: &FilePath) -> Result<Option<String>> {
        self.fs.read_string(p, MAX_CONFIG_FILE).context("reading an auth file")
    }
}

fn decode(entry: &AuthEntry, source: String) -> Result<Option<Credentials>> {
    if entry.identitytoken.as_deref().is_some_and(|t| !t.is_empty()) {
        bail!(
            "{source}: \"identitytoken\" (an OAuth2 refresh token) is not supported; \
             store a user name and password (\"auth\") for this registry instead"
        );
    }
    if let Some(a) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(a.trim())
            .with_context(|| format!("{source}: \"auth\" is not valid base64"))?;
        let s = String::from_utf8(raw).with_context(|| format!("{source}: \"auth\" is not UTF-8"))?;
        let Some((u, p)) = s.split_once(':') else {
            bail!("{source}: \"auth\" does not decode to user:password");
        };
        return Ok(Some(Credentials {
            username: u.to_string(),
            password: p.trim_end_matches('\n').to_string(),
            source,
        }));
    }
    // Kubernetes-style entries with separate fields (kubelet reads these too).
    match (&entry.username, &entry.password) {
        (Some(u), Some(p)) if !u.is_empty() => {
            Ok(Some(Credentials { username: u.clone(), password: p.clone(), source }))
        }
        _ => Ok(None),
    }
}

/// Finds credentials for `registry/repository` in one file (most specific key wins).
fn lookup_in_file(
    text: &str,
    path: &FilePath,
    legacy: bool,
    registry: &str,
    repository: &str,
    helpers: &mut Vec<String>,
) -> Result<Option<Credentials>> {
    let file: AuthFile = if legacy {
        let auths: BTreeMap<String, AuthEntry> = serde_json::from_str(text)
            .with_context(|| format!("auth file {} is not valid JSON (legacy .dockercfg format)", path))?;
        AuthFile { auths, ..AuthFile::default() }
    } else {
        serde_json::from_str(text).with_context(|| format!("auth file {} is not valid JSON", path))?
    };
    let registry = normalize_registry(registry);
    for (k, h) in &file.cred_helpers {
        if normalize_key(k, true) == registry {
            helpers.push(format!("{}: credHelpers {k:?} names helper {h:?}", path));
        }
    }
    if let Some(s) = file.creds_store.as_deref().filter(|s| !s.is_empty()) {
        helpers.push(format!("{}: credsStore names helper {s:?}", path));
    }
    // Several raw keys can normalise to one: an exact (already normal) key wins.
    let mut entries: BTreeMap<String, (&String, &AuthEntry)> = BTreeMap::new();
    for (k, v) in &file.auths {
        let n = normalize_key(k, legacy);
        let exact = *k == n;
        if exact || !entries.contains_key(&n) {
            entries.insert(n, (k, v));
        }
    }
    let mut scope = format!("{registry}/{repository}");
    loop {
        if let Some((raw, e)) = entries.get(&scope) {
            let source = format!("{} (key {raw:?})", path);
            if let Some(cred) = decode(e, source)? {
                return Ok(Some(cred));
            }
        }
        match scope.rfind('/') {
            Some(i) => scope.truncate(i),
            None => break,
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_wins_and_helpers_are_reported() {
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
                "tok.example": {"identitytoken": "abc"},
            }, "credHelpers": {"h.example": "ecr-login"}})
            .to_string(),
        )
        .unwrap();
        let s = AuthSources::new(NodeFs::open(Path::new("/")).unwrap(), Some(&p), FilePath::node("/none"));
        let u = |reg: &str, repo: &str| s.lookup(reg, repo).unwrap().creds.map(|c| c.username);
        assert_eq!(u("r.example:5000", "ns/repo").as_deref(), Some("repo"));
        assert_eq!(u("r.example:5000", "ns/other").as_deref(), Some("ns"));
        assert_eq!(u("r.example:5000", "x/y").as_deref(), Some("host"));
        assert_eq!(u("docker.io", "library/busybox").as_deref(), Some("hub"));
        assert_eq!(u("other", "x"), None);
        let h = s.lookup("h.example", "x").unwrap();
        assert!(h.creds.is_none() && h.helper_hint().unwrap().contains("ecr-login"));
        let e = format!("{:#}", s.lookup("tok.example", "x").unwrap_err());
        assert!(e.contains("identitytoken") && e.contains("tok.example"), "{e}");
    }
}
