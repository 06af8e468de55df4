//! containers-registries.conf(5) and containers-registries.conf.d(5), v2 and v1, read the
//! way containers/image (`pkg/sysregistriesv2`) reads them: the main file, then the drop-ins
//! in lexical order, an entry of a later file replacing the one with the same prefix.
//!
//! Every problem containers/image refuses to load is an error naming the file and entry.
//! Keys it does not know are warnings naming file and key. Settings about short names
//! (`unqualified-search-registries`, `short-name-mode`, `[aliases]`) are validated but
//! never change a decision here: every reference this program pulls is fully qualified.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::reference;
use crate::nodefs::{Budget, FilePath, Kind, MAX_CONFIG_FILE, NodeFs};

/// What reading registries.conf.d may cost: a handful of small files on a real node.
const DROP_IN_BUDGET: Budget = Budget { entries: 4096, files: 256, bytes: 16 << 20, depth: 0 };

/// The `credential-helpers` value that means "the auth files of containers-auth.json(5)".
pub(crate) const AUTH_FILE_HELPER: &str = "containers-auth.json";

/// `pull-from-mirror` of a mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PullFromMirror {
    /// Used for tag and digest pulls (the default).
    All,
    /// Used only for pulls by digest.
    DigestOnly,
    /// Used only for pulls by tag.
    TagOnly,
}

/// One place (`location`) of a registry entry: the source or a mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfEndpoint {
    /// `host[:port][/path]` that replaces the matched prefix ("" only for wildcard sources).
    pub location: String,
    /// TLS without verification, then plain HTTP.
    pub insecure: bool,
    /// When this mirror is used.
    pub pull_from_mirror: PullFromMirror,
}

/// One `[[registry]]` after normalisation (prefix defaults to location).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registry {
    /// Matched against `host/repository`; `*.example.com` matches sub-domains.
    pub prefix: String,
    /// The source endpoint.
    pub source: ConfEndpoint,
    /// Mirrors, in order.
    pub mirrors: Vec<ConfEndpoint>,
    /// Pulling from the source endpoint is refused.
    pub blocked: bool,
    /// Mirrors are used only for pulls by digest.
    pub mirror_by_digest_only: bool,
    /// The file that defined this entry.
    pub file: PathBuf,
}

impl Registry {
    /// `FILE: [[registry]] prefix "…"`, for messages.
    pub(crate) fn describe(&self) -> String {
        format!("{}: [[registry]] prefix {:?}", self.file.display(), self.prefix)
    }
}

/// One rewritten place to pull from, in the order containers/image tries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PullSource {
    /// Registry host (with port) to contact.
    pub host: String,
    /// Repository on that host.
    pub repository: String,
    /// TLS without verification, then plain HTTP.
    pub insecure: bool,
    /// A mirror (else the source).
    pub mirror: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawFile {
    #[serde(default)]
    registry: Option<Vec<RawRegistry>>,
    #[serde(default)]
    unqualified_search_registries: Option<Vec<String>>,
    #[serde(default)]
    credential_helpers: Option<Vec<String>>,
    #[serde(default)]
    short_name_mode: Option<String>,
    #[serde(default)]
    additional_layer_store_auth_helper: Option<String>,
    #[serde(default)]
    aliases: Option<BTreeMap<String, String>>,
    /// v1: `[registries.search]`, `[registries.insecure]`, `[registries.block]`.
    #[serde(default)]
    registries: Option<RawV1>,
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize, Default)]
struct RawV1 {
    #[serde(default)]
    search: Option<RawV1List>,
    #[serde(default)]
    insecure: Option<RawV1List>,
    #[serde(default)]
    block: Option<RawV1List>,
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize, Default)]
struct RawV1List {
    #[serde(default)]
    registries: Option<Vec<String>>,
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "kebab-case")]
struct RawEndpoint {
    #[serde(default)]
    location: Option<String>,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    pull_from_mirror: Option<String>,
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "kebab-case")]
struct RawRegistry {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(flatten)]
    endpoint: RawEndpoint,
    #[serde(default)]
    mirror: Vec<RawEndpoint>,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror_by_digest_only: bool,
}

/// One file, checked and normalised.
#[derive(Debug, Default)]
struct ParsedFile {
    registries: Vec<Registry>,
    credential_helpers: Option<Vec<String>>,
}

/// The merged configuration of registries.conf and its drop-ins.
#[derive(Debug, Default, Clone)]
pub(crate) struct RegistriesConf {
    /// Entries by prefix (the merge key), sorted.
    registries: BTreeMap<String, Registry>,
    /// `credential-helpers` and the file that set it, if any file did.
    credential_helpers: Option<(Vec<String>, PathBuf)>,
}

/// `location` (or prefix) as containers/image accepts it: no scheme, no trailing `/`.
fn parse_location(input: &str, what: &str) -> Result<String> {
    let t = input.trim_end_matches('/');
    if t.starts_with("http://") || t.starts_with("https://") {
        bail!("{what}: invalid location {input:?}: URI schemes are not supported");
    }
    Ok(t.to_string())
}

fn warn_unknown(file: &Path, table: &str, unknown: &BTreeMap<String, toml::Value>) {
    for k in unknown.keys() {
        tracing::warn!(
            "{}: unknown key {:?}{} ignored (containers/image ignores it too)",
            file.display(),
            k,
            if table.is_empty() { String::new() } else { format!(" in {table}") }
        );
    }
}

fn pull_from_mirror(v: Option<&str>, what: &str) -> Result<PullFromMirror> {
    Ok(match v {
        None | Some("") | Some("all") => PullFromMirror::All,
        Some("digest-only") => PullFromMirror::DigestOnly,
        Some("tag-only") => PullFromMirror::TagOnly,
        Some(other) => bail!("{what}: unsupported pull-from-mirror value {other:?} (all, digest-only or tag-only)"),
    })
}

fn parse_file(text: &str, file: &Path, drop_in: bool) -> Result<ParsedFile> {
    let f = file.display();
    let raw: RawFile =
        toml::from_str(text).with_context(|| format!("{f}: not a valid containers-registries.conf (TOML)"))?;
    warn_unknown(file, "", &raw.unknown);
    let v2_set = raw.registry.is_some()
        || raw.unqualified_search_registries.is_some()
        || raw.credential_helpers.is_some()
        || raw.short_name_mode.is_some()
        || raw.additional_layer_store_auth_helper.is_some()
        || raw.aliases.is_some();
    let registries = match &raw.registries {
        Some(v1) => v1_registries(v1, file, drop_in, v2_set)?,
        None => raw.registry.clone().unwrap_or_default(),
    };
    check_global_keys(&raw, file)?;
    let mut out = Vec::new();
    for (i, r) in registries.iter().enumerate() {
        out.push(registry_entry(r, i + 1, file)?);
    }
    check_repeated_locations(&out, file)?;
    Ok(ParsedFile { registries: first_per_prefix(out, file), credential_helpers: raw.credential_helpers })
}

/// The `[[registry]]` entries of a v1 file (`[registries]`), converted as containers/image
/// converts them: one entry per location, blocked then insecure. A drop-in or a file that
/// also sets v2 keys (`v2_set`) is refused.
fn v1_registries(v1: &RawV1, file: &Path, drop_in: bool, v2_set: bool) -> Result<Vec<RawRegistry>> {
    let f = file.display();
    warn_unknown(file, "[registries]", &v1.unknown);
    for (name, l) in [("search", &v1.search), ("insecure", &v1.insecure), ("block", &v1.block)] {
        if let Some(l) = l {
            warn_unknown(file, &format!("[registries.{name}]"), &l.unknown);
        }
    }
    if drop_in {
        bail!("{f}: a registries.conf.d drop-in must be in the v2 format, this one uses v1 [registries]");
    }
    if v2_set {
        bail!("{f}: mixes the v1 format ([registries]) and the v2 format; containers/image refuses this");
    }
    let mut order: Vec<String> = Vec::new();
    let mut map: BTreeMap<String, RawRegistry> = BTreeMap::new();
    for (list, is_block) in [(&v1.block, true), (&v1.insecure, false)] {
        for loc in list.as_ref().and_then(|l| l.registries.clone()).unwrap_or_default() {
            let what = format!("{f}: [registries.{}]", if is_block { "block" } else { "insecure" });
            let loc = parse_location(&loc, &what)?;
            let e = map.entry(loc.clone()).or_insert_with(|| {
                order.push(loc.clone());
                RawRegistry {
                    prefix: Some(loc.clone()),
                    endpoint: RawEndpoint { location: Some(loc.clone()), ..RawEndpoint::default() },
                    ..RawRegistry::default()
                }
            });
            if is_block {
                e.blocked = true;
            } else {
                e.endpoint.insecure = true;
            }
        }
    }
    Ok(order.iter().filter_map(|l| map.remove(l)).collect())
}

/// Checks the file-wide keys: the search registries, `[aliases]`, `short-name-mode` and
/// `additional-layer-store-auth-helper` (warned about, never executed).
fn check_global_keys(raw: &RawFile, file: &Path) -> Result<()> {
    let f = file.display();
    // v1 `[registries.search]` is converted to `unqualified-search-registries` (ConvertToV2),
    // then both are validated the same way (postProcessRegistries).
    let v1_search = raw.registries.as_ref().and_then(|v1| v1.search.as_ref()).and_then(|l| l.registries.as_ref());
    let (search_key, search) = match (&raw.unqualified_search_registries, v1_search) {
        (Some(l), _) => ("unqualified-search-registries", Some(l)),
        (None, Some(l)) => ("[registries.search] registries", Some(l)),
        (None, None) => ("", None),
    };
    if let Some(list) = search {
        for r in list {
            let what = format!("{f}: {search_key}");
            let r = parse_location(r, &what)?;
            if !kata_addons_facts::reference::is_registry_host(&r) {
                bail!("{what}: invalid entry {r:?} (must be host[:port])");
            }
        }
        tracing::debug!("{f}: {search_key} applies to short names only; every reference here is fully qualified");
    }
    for (name, value) in raw.aliases.iter().flatten() {
        check_alias(name, value).with_context(|| format!("{f}: [aliases] {name:?}"))?;
    }
    if let Some(m) = &raw.short_name_mode
        && !matches!(m.as_str(), "" | "disabled" | "enforcing" | "permissive")
    {
        bail!("{f}: short-name-mode: invalid value {m:?} (disabled, enforcing or permissive)");
    }
    if let Some(a) = &raw.additional_layer_store_auth_helper
        && !a.is_empty()
    {
        tracing::warn!(
            "{f}: additional-layer-store-auth-helper {a:?} is not applicable (no additional layer store is used) and not executed"
        );
    }
    Ok(())
}

/// The `n`th `[[registry]]` entry of `file`, checked: its prefix (the location when unset)
/// and its mirrors.
fn registry_entry(r: &RawRegistry, n: usize, file: &Path) -> Result<Registry> {
    let f = file.display();
    let what0 = format!("{f}: [[registry]] #{n}");
    warn_unknown(file, &format!("[[registry]] #{n}"), &r.endpoint.unknown);
    let location = parse_location(r.endpoint.location.as_deref().unwrap_or(""), &what0)?;
    let prefix = match r.prefix.as_deref().unwrap_or("") {
        "" => {
            if location.is_empty() {
                bail!("{what0}: both location and prefix are unset");
            }
            location.clone()
        }
        p => {
            let p = parse_location(p, &what0)?;
            if !p.starts_with("*.") && location.is_empty() {
                bail!("{what0}: location is unset and prefix {p:?} is not of the form *.example.com");
            }
            p
        }
    };
    let what = format!("{f}: [[registry]] prefix {prefix:?}");
    if prefix.starts_with("*.") && prefix.contains(['/', '@', ':']) {
        bail!("{what}: a wildcard prefix must be of the form *.example.com");
    }
    if r.endpoint.pull_from_mirror.is_some() {
        bail!("{what}: pull-from-mirror must not be set for the source, only in [[registry.mirror]]");
    }
    let mut mirrors = Vec::new();
    for (j, m) in r.mirror.iter().enumerate() {
        let mwhat = format!("{what}: [[registry.mirror]] #{}", j + 1);
        warn_unknown(file, &format!("[[registry]] prefix {prefix:?} [[registry.mirror]] #{}", j + 1), &m.unknown);
        let loc = parse_location(m.location.as_deref().unwrap_or(""), &mwhat)?;
        if loc.is_empty() {
            bail!("{mwhat}: mirror location is unset");
        }
        if r.mirror_by_digest_only && m.pull_from_mirror.is_some() {
            bail!(
                "{mwhat}: mirror-by-digest-only of the registry and pull-from-mirror of mirror {loc:?} cannot be set at the same time"
            );
        }
        let pfm = pull_from_mirror(m.pull_from_mirror.as_deref(), &mwhat)?;
        mirrors.push(ConfEndpoint { location: loc, insecure: m.insecure, pull_from_mirror: pfm });
    }
    Ok(Registry {
        prefix,
        source: ConfEndpoint { location, insecure: r.endpoint.insecure, pull_from_mirror: PullFromMirror::All },
        mirrors,
        blocked: r.blocked,
        mirror_by_digest_only: r.mirror_by_digest_only,
        file: file.to_path_buf(),
    })
}

/// The same location (or wildcard prefix) may appear several times, with the same
/// security settings only.
fn check_repeated_locations(out: &[Registry], file: &Path) -> Result<()> {
    let f = file.display();
    for a in out {
        let key_a = if a.source.location.is_empty() { &a.prefix } else { &a.source.location };
        for b in out {
            let key_b = if b.source.location.is_empty() { &b.prefix } else { &b.source.location };
            if key_a != key_b {
                continue;
            }
            if a.source.insecure != b.source.insecure {
                bail!("{f}: registry {key_a:?} is defined several times with conflicting 'insecure' settings");
            }
            if a.blocked != b.blocked {
                bail!("{f}: registry {key_a:?} is defined several times with conflicting 'blocked' settings");
            }
        }
    }
    Ok(())
}

/// The first entry of a prefix wins inside one file (later ones are dead, with a warning).
fn first_per_prefix(out: Vec<Registry>, file: &Path) -> Vec<Registry> {
    let f = file.display();
    let mut seen = std::collections::BTreeSet::new();
    let mut registries = Vec::new();
    for r in out {
        if seen.insert(r.prefix.clone()) {
            registries.push(r);
        } else {
            tracing::warn!(
                "{f}: [[registry]] prefix {:?} appears again; only the first entry counts (as in containers/image)",
                r.prefix
            );
        }
    }
    registries
}

/// A reference as `reference.Parse` splits it (no normalisation): domain (when the first
/// component can be one and more follow), path, and whether a tag or digest is present.
fn plain_reference(s: &str) -> Result<(Option<&str>, &str, bool)> {
    let (name, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    if digest.is_some_and(|d| !reference::valid_digest(d)) {
        bail!("{s:?} has an invalid digest");
    }
    let last = name.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (name, tag) = match name[last..].rfind(':') {
        Some(i) => (&name[..last + i], Some(&name[last + i + 1..])),
        None => (name, None),
    };
    if tag.is_some_and(|t| !reference::valid_tag(t)) {
        bail!("{s:?} has an invalid tag");
    }
    let (domain, path) = match name.split_once('/') {
        Some((d, p)) if reference::valid_domain(d) => (Some(d), p),
        _ => (None, name),
    };
    if !reference::valid_repository(path) || name.len() > reference::NAME_TOTAL_LENGTH_MAX {
        bail!("{s:?} is not a valid reference");
    }
    if digest.is_some() {
        bail!("{s:?} must not contain a digest");
    }
    Ok((domain, path, tag.is_some()))
}

/// containers/image's `validateShortName` (the alias) and `parseShortNameValue` (its
/// value, `""` resetting an earlier alias): a short name maps to a fully qualified name,
/// neither with a tag or digest.
fn check_alias(name: &str, value: &str) -> Result<()> {
    let (domain, _, tagged) = plain_reference(name).context("invalid short name")?;
    let qualified = |d: Option<&str>| d.is_some_and(|d| d.contains(['.', ':']) || d == "localhost");
    if tagged {
        bail!("invalid short name: must not contain a tag");
    }
    if qualified(domain) {
        bail!("invalid short name: must not contain a registry");
    }
    if value.is_empty() {
        return Ok(());
    }
    let (domain, _, tagged) = plain_reference(value).with_context(|| format!("invalid alias {value:?}"))?;
    if tagged {
        bail!("invalid alias {value:?}: must not contain a tag");
    }
    if !qualified(domain) {
        bail!("invalid alias {value:?}: must contain registry and repository");
    }
    Ok(())
}

/// containers/image's prefix match on `host/repository`: the length matched, or `None`.
fn matching_prefix(name: &str, prefix: &str) -> Option<usize> {
    if let Some(domain) = prefix.strip_prefix('*') {
        // ".example.com" must occur in the host part and end it.
        let index = name.find(domain)?;
        if name[..index].contains('/') {
            return None;
        }
        let end = index + domain.len();
        return match name.as_bytes().get(end) {
            None | Some(b':' | b'/' | b'@') => Some(end),
            _ => None,
        };
    }
    if name == prefix {
        return Some(prefix.len());
    }
    if name.len() > prefix.len() && name.starts_with(prefix) {
        return matches!(name.as_bytes()[prefix.len()], b':' | b'/' | b'@').then_some(prefix.len());
    }
    None
}

impl RegistriesConf {
    /// Reads `main` (missing is fine unless `main_required`) and then every `*.conf` file
    /// directly in `drop_in_dir`, in lexical order, each through the node-file reader.
    pub(crate) fn load(
        fs: &NodeFs,
        main: &FilePath,
        main_required: bool,
        drop_in_dir: Option<&FilePath>,
    ) -> Result<Self> {
        let mut conf = RegistriesConf::default();
        match fs.read_string(main, MAX_CONFIG_FILE).context("reading the registries configuration")? {
            Some(text) => {
                let file = PathBuf::from(main.to_string());
                let parsed = parse_file(&text, &file, false)?;
                conf.merge(parsed, &file);
            }
            None if !main_required => tracing::debug!("{main}: not present, no registries configuration"),
            None => bail!("registries configuration {main} does not exist"),
        }
        if let Some(dir) = drop_in_dir {
            let mut walk = fs.walk("registries.conf.d", DROP_IN_BUDGET);
            let entries = walk.list(dir).context("reading registries.conf.d")?.unwrap_or_default();
            for e in entries.iter().filter(|e| e.name.ends_with(".conf") && e.kind != Some(Kind::Dir)) {
                let Some(bytes) =
                    walk.read_all(&e.path, MAX_CONFIG_FILE).context("reading a drop-in registries configuration")?
                else {
                    continue;
                };
                let text = String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", e.path))?;
                let file = PathBuf::from(e.path.to_string());
                let parsed = parse_file(&text, &file, true)?;
                conf.merge(parsed, &file);
            }
        }
        Ok(conf)
    }

    /// Parses one file's text (the unit tests' way in).
    #[cfg(test)]
    pub(crate) fn parse(text: &str, file: &Path) -> Result<Self> {
        let mut conf = RegistriesConf::default();
        let parsed = parse_file(text, file, false)?;
        conf.merge(parsed, file);
        Ok(conf)
    }

    fn merge(&mut self, parsed: ParsedFile, file: &Path) {
        for r in parsed.registries {
            if let Some(old) = self.registries.get(&r.prefix) {
                tracing::debug!("{} replaces {}", r.describe(), old.describe());
            }
            self.registries.insert(r.prefix.clone(), r);
        }
        if let Some(h) = parsed.credential_helpers {
            self.credential_helpers = Some((h, file.to_path_buf()));
        }
    }

    /// `credential-helpers` and the file that set it, if set.
    pub(crate) fn credential_helpers(&self) -> Option<(&[String], &Path)> {
        self.credential_helpers.as_ref().map(|(h, p)| (h.as_slice(), p.as_path()))
    }

    /// The entry with the longest prefix matching `name` (`host/repository`), if any.
    pub(crate) fn find(&self, name: &str) -> Option<&Registry> {
        let mut best: Option<&Registry> = None;
        for r in self.registries.values() {
            if matching_prefix(name, &r.prefix).is_some() && best.is_none_or(|b| r.prefix.len() > b.prefix.len()) {
                best = Some(r);
            }
        }
        best
    }

    /// Where to pull `registry/repository` from: the usable mirrors in order, then the source,
    /// each with the matched prefix rewritten to its location. `by_digest`: the reference
    /// is pinned by digest. Returns the deciding entry, if one matched.
    pub(crate) fn pull_sources(
        &self,
        registry: &str,
        repository: &str,
        by_digest: bool,
    ) -> Result<(Vec<PullSource>, Option<&Registry>)> {
        let name = format!("{registry}/{repository}");
        let Some(r) = self.find(&name) else {
            return Ok((
                vec![PullSource {
                    host: registry.to_string(),
                    repository: repository.to_string(),
                    insecure: false,
                    mirror: false,
                }],
                None,
            ));
        };
        let mut eps: Vec<(&ConfEndpoint, bool)> = Vec::new();
        for m in &r.mirrors {
            let use_it = if r.mirror_by_digest_only {
                by_digest
            } else {
                match m.pull_from_mirror {
                    PullFromMirror::All => true,
                    PullFromMirror::DigestOnly => by_digest,
                    PullFromMirror::TagOnly => !by_digest,
                }
            };
            if use_it {
                eps.push((m, true));
            } else {
                tracing::debug!("{}: mirror {:?} not used for this reference", r.describe(), m.location);
            }
        }
        eps.push((&r.source, false));
        let matched = matching_prefix(&name, &r.prefix).context("internal: prefix no longer matches")?;
        let mut out = Vec::new();
        for (ep, mirror) in eps {
            let rewritten =
                if ep.location.is_empty() { name.clone() } else { format!("{}{}", ep.location, &name[matched..]) };
            let (host, repository) = reference::split_name(&rewritten).with_context(|| {
                format!("{}: rewriting {name:?} to location {:?} gives an invalid reference", r.describe(), ep.location)
            })?;
            // containers/image parses the result as a canonical name: no implied docker.io.
            if format!("{host}/{repository}") != rewritten {
                bail!(
                    "{}: rewriting {name:?} to location {:?} gives {rewritten:?}, which is not a fully qualified reference",
                    r.describe(),
                    ep.location
                );
            }
            out.push(PullSource { host, repository, insecure: ep.insecure, mirror });
        }
        Ok((out, Some(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(text: &str) -> RegistriesConf {
        RegistriesConf::parse(text, Path::new("/t/registries.conf")).unwrap()
    }

    fn hosts(c: &RegistriesConf, reg: &str, repo: &str, digest: bool) -> Vec<String> {
        c.pull_sources(reg, repo, digest)
            .unwrap()
            .0
            .iter()
            .map(|p| format!("{}/{}{}", p.host, p.repository, if p.insecure { " (insecure)" } else { "" }))
            .collect()
    }

    #[test]
    fn prefixes_mirrors_rewrites() {
        let c = conf(
            r#"
[[registry]]
prefix = "example.com/foo"
location = "internal:5000/bar"
insecure = true
[[registry.mirror]]
location = "mirror1:5000/m"
[[registry.mirror]]
location = "mirror2.local"
insecure = true

[[registry]]
location = "example.com"

[[registry]]
prefix = ""
location = "quay.io/org"
[[registry.mirror]]
location = "mirror.local:5000/org"
pull-from-mirror = "digest-only"

[[registry]]
prefix = "*.example.org"
[[registry.mirror]]
location = "m.example.org:443"
"#,
        );
        assert_eq!(
            hosts(&c, "example.com", "foo/img", false),
            ["mirror1:5000/m/img", "mirror2.local/img (insecure)", "internal:5000/bar/img (insecure)"]
        );
        assert_eq!(hosts(&c, "example.com", "foobar/img", false), ["example.com/foobar/img"]);
        assert_eq!(hosts(&c, "quay.io", "org/k", false), ["quay.io/org/k"]);
        assert_eq!(hosts(&c, "quay.io", "org/k", true), ["mirror.local:5000/org/k", "quay.io/org/k"]);
        assert_eq!(hosts(&c, "a.example.org", "x/y", false), ["m.example.org:443/x/y", "a.example.org/x/y"]);
        assert_eq!(hosts(&c, "example.org", "x/y", false), ["example.org/x/y"]);
    }

    #[test]
    fn refusals() {
        let bad = |t: &str| RegistriesConf::parse(t, Path::new("/t/r.conf")).unwrap_err().to_string();
        assert!(bad("[[registry]]\ninsecure = true\n").contains("both location and prefix are unset"));
        assert!(bad("[[registry]]\nprefix = \"a.io\"\n").contains("location is unset"));
        assert!(bad("[[registry]]\nlocation = \"https://a.io\"\n").contains("URI schemes"));
        assert!(
            bad("[registries.block]\nregistries = [\"a.io\"]\n[[registry]]\nlocation = \"b.io\"\n").contains("mixes")
        );
        assert!(
            bad("[[registry]]\nlocation = \"a.io\"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"all\"\n")
                .contains("cannot be set at the same time")
        );
        assert!(
            bad("[[registry]]\nlocation = \"a.io\"\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"x\"\n")
                .contains("unsupported")
        );
        assert!(bad("[[registry]]\nprefix = \"*.a.io/x\"\n").contains("wildcard"));
        assert!(
            bad("[[registry]]\nlocation = \"a.io\"\n[[registry]]\nlocation = \"a.io\"\ninsecure = true\n")
                .contains("conflicting")
        );
        assert!(bad("short-name-mode = \"x\"\n").contains("short-name-mode"));
        assert!(bad("[[registry]]\nlocation = \"a.io\"\npull-from-mirror = \"all\"\n").contains("only in"));
    }

    #[test]
    fn v1_and_blocked() {
        let c = conf(
            "[registries.block]\nregistries = [\"bad.io\"]\n[registries.insecure]\nregistries = [\"ins.io:5000\"]\n",
        );
        assert!(c.find("bad.io/x").is_some_and(|r| r.blocked));
        assert_eq!(hosts(&c, "ins.io:5000", "x", false), ["ins.io:5000/x (insecure)"]);
        assert!(c.find("other.io/x").is_none());
    }

    #[test]
    fn drop_ins_replace_by_prefix() {
        let d = tempfile::tempdir().unwrap();
        let main = d.path().join("registries.conf");
        std::fs::write(&main, "[[registry]]\nlocation = \"a.io\"\nblocked = true\n").unwrap();
        let dir = d.path().join("registries.conf.d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("10-x.conf"),
            "[[registry]]\nlocation = \"a.io\"\n[[registry.mirror]]\nlocation = \"m1\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("20-y.conf"),
            "[[registry]]\nlocation = \"a.io\"\n[[registry.mirror]]\nlocation = \"m2\"\n",
        )
        .unwrap();
        std::fs::write(dir.join("ignored.txt"), "garbage").unwrap();
        let fs = NodeFs::open(Path::new("/")).unwrap();
        let (main, dir) = (FilePath::Local(main), FilePath::Local(dir));
        let c = RegistriesConf::load(&fs, &main, true, Some(&dir)).unwrap();
        let r = c.find("a.io/x").unwrap();
        assert!(!r.blocked);
        assert_eq!(r.mirrors[0].location, "m2");
        std::fs::write(d.path().join("registries.conf.d/30-v1.conf"), "[registries.block]\nregistries = [\"a.io\"]\n")
            .unwrap();
        let e = RegistriesConf::load(&fs, &main, true, Some(&dir)).unwrap_err().to_string();
        assert!(e.contains("30-v1.conf") && e.contains("v2"), "{e}");
    }
}
