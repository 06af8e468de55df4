//! containerd's registry hosts: the hosts directory named by the CRI plugin's
//! `registry.config_path` (`certs.d/<host>/hosts.toml`), resolved as containerd 1.6/1.7
//! resolve it (containerd `remotes/docker/config/hosts.go` `ConfigureHosts`,
//! `loadHostDir`, `parseHostsFile`, `parseHostConfig`, `loadCertFiles`, and
//! `config_unix.go` `hostPaths`; `pkg/cri/server/image_pull.go` `hostDirFromRoots`):
//!
//! - per root of `config_path` (`:`-separated, in order), the first of `<host>_<port>_`,
//!   `<host[:port]>`, `_default` that exists; the first root with one wins;
//! - `hosts.toml` there: `[host."…"]` entries in file order, then `server` (without
//!   `server`, the registry's default host, with the file's top-level settings); no (or an
//!   empty) `hosts.toml`: the legacy `*.crt` (CA), `*.cert` (+ `*.key`) files of the
//!   directory for the default host;
//! - no directory: the default host (`docker.io` → `registry-1.docker.io`; a loopback
//!   registry over plain HTTP, as containerd 1.6 without a default scheme).
//!
//! A `hosts.toml` containerd cannot decode is logged by containerd, which then carries on
//! with the directory's certificate files; kata-addons refuses it, naming the file and line
//! (docs/registries-and-trust.md#registry-configuration-on-containerd-nodes).

use std::collections::BTreeMap;

use anyhow::{Result, anyhow, bail};

use crate::nodefs::{FilePath, Kind, MAX_CONFIG_FILE, NodeFs};

/// Largest `hosts.toml` read.
const MAX_HOSTS_TOML: u64 = 1 << 20;
/// Most `[host."…"]` entries in one `hosts.toml`.
const MAX_HOSTS: usize = 64;
/// Most entries of a legacy certificates directory looked at.
const MAX_CERT_FILES: usize = 256;

/// One registry host as containerd would contact it, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CtdHost {
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]` contacted.
    pub host: String,
    /// API root path (`/v2`, or the path given with `override_path`).
    pub path: String,
    /// May serve blobs and manifests by digest.
    pub pull: bool,
    /// May resolve tags.
    pub resolve: bool,
    /// CA files (`ca`): the system roots plus these.
    pub ca: Vec<FilePath>,
    /// Client certificate and key files (`client`; no key: the key is in the certificate file).
    pub client: Vec<(FilePath, Option<FilePath>)>,
    /// `skip_verify`.
    pub skip_verify: Option<bool>,
    /// Extra request headers (`header`).
    pub header: Vec<(String, String)>,
    /// Where this host came from (`FILE:LINE [host."…"]`, `FILE: server`, a default).
    pub from: String,
}

impl CtdHost {
    /// `scheme://host/path`, for messages.
    pub(crate) fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.host, self.path)
    }

    /// The default host of a registry, with no settings (`hostConfig{}` filled in by
    /// `ConfigureHosts`).
    fn default_for(registry: &str, from: String) -> CtdHost {
        let mut h = CtdHost {
            scheme: "https".into(),
            host: registry.to_string(),
            path: "/v2".into(),
            pull: true,
            resolve: true,
            ca: Vec::new(),
            client: Vec::new(),
            skip_verify: None,
            header: Vec::new(),
            from,
        };
        if registry == "docker.io" {
            h.host = "registry-1.docker.io".into();
        } else if is_localhost(registry) {
            h.scheme = "http".into();
            h.skip_verify = Some(true);
        }
        h
    }
}

/// containerd's `docker.IsLocalhost`: `localhost` or a loopback IP, with or without a port.
fn is_localhost(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None if host.matches(':').count() == 1 => host.split(':').next().unwrap_or(host),
        None => host,
    };
    name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The hosts directories of a containerd node.
#[derive(Debug, Clone)]
pub(crate) struct HostsDirs {
    /// The node files reader.
    pub fs: NodeFs,
    /// The directories of `config_path`, in order (node paths).
    pub roots: Vec<String>,
    /// Where `config_path` was set (for messages).
    pub from: String,
}

/// The resolved hosts of one registry and the directory that decided them.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The hosts, in the order containerd tries them.
    pub hosts: Vec<CtdHost>,
    /// The host directory used, if one exists.
    pub dir: Option<String>,
}

/// containerd's `hostDirectory`: `host:port` as `host_port_`.
fn host_directory(host: &str) -> Option<String> {
    let idx = host.rfind(':')?;
    (idx > 0).then(|| format!("{}_{}_", &host[..idx], &host[idx + 1..]))
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).map_or(1, |t| t.matches('\n').count() + 1)
}

impl HostsDirs {
    /// The hosts containerd uses for `registry` (`host[:port]` as in the image reference).
    pub(crate) fn resolve(&self, registry: &str) -> Result<Resolved> {
        if registry.is_empty() || registry.contains('/') || registry.starts_with('.') {
            bail!("invalid registry host {registry:?}");
        }
        let Some(dir) = self.find_dir(registry)? else {
            let from = format!(
                "default host (no directory for {registry} in config_path {:?}, set by {})",
                self.roots.join(":"),
                self.from
            );
            return Ok(Resolved { hosts: vec![CtdHost::default_for(registry, from)], dir: None });
        };
        let toml_path = FilePath::node(&format!("{dir}/hosts.toml"));
        let text = self.fs.read_string(&toml_path, MAX_HOSTS_TOML)?;
        let mut hosts = match text.filter(|t| !t.is_empty()) {
            Some(t) => parse_hosts_file(&dir, &toml_path.to_string(), &t)?,
            None => self.load_cert_files(&dir)?,
        };
        if let Some(last) = hosts.last_mut()
            && last.host.is_empty()
        {
            let d = CtdHost::default_for(registry, String::new());
            last.host = d.host;
            last.path = d.path;
            last.pull = true;
            last.resolve = true;
            if d.scheme == "http" {
                last.scheme = d.scheme;
                last.skip_verify = d.skip_verify;
            } else {
                last.scheme = "https".into();
            }
        }
        Ok(Resolved { hosts, dir: Some(dir) })
    }

    /// The host directory of `registry`: the first root with one of `hostPaths`.
    fn find_dir(&self, registry: &str) -> Result<Option<String>> {
        for root in &self.roots {
            let mut names = Vec::new();
            if let Some(d) = host_directory(registry) {
                names.push(d);
            }
            names.push(registry.to_string());
            names.push("_default".to_string());
            for n in names {
                let p = format!("{}/{n}", root.trim_end_matches('/'));
                match self.fs.kind(&FilePath::node(&p))? {
                    Some(Kind::Dir) => return Ok(Some(p)),
                    Some(_) => bail!("{p}: not a directory (containerd fails to read its hosts.toml)"),
                    None => {}
                }
            }
        }
        Ok(None)
    }

    /// containerd's `loadCertFiles`: `*.crt` are CAs, `*.cert` client certificates with
    /// their `*.key` beside them if present, for the default host.
    fn load_cert_files(&self, dir: &str) -> Result<Vec<CtdHost>> {
        let mut h = CtdHost::default_for("", format!("{dir}: certificate files (no hosts.toml)"));
        h.host.clear();
        let entries = self.fs.list(&FilePath::node(dir))?.unwrap_or_default();
        if entries.len() > MAX_CERT_FILES {
            bail!("{dir}: more than {MAX_CERT_FILES} entries");
        }
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        for e in &entries {
            if e.kind == Some(Kind::Dir) {
                continue;
            }
            if e.name.ends_with(".crt") {
                h.ca.push(e.path.clone());
            }
            if let Some(base) = e.name.strip_suffix(".cert") {
                let key = format!("{base}.key");
                let key = names.contains(&key.as_str()).then(|| FilePath::node(&format!("{dir}/{key}")));
                h.client.push((e.path.clone(), key));
            }
        }
        Ok(vec![h])
    }
}

/// A path of `hosts.toml` as containerd's `makeAbsPath` makes it: absolute as written,
/// else beside the file.
fn abs_path(p: &str, dir: &str) -> FilePath {
    if p.starts_with('/') { FilePath::node(p) } else { FilePath::node(&format!("{dir}/{p}")) }
}

/// A string or an array of strings (`ca`, a header value), else an error naming `what`.
fn strings(v: &toml::Value, what: &str) -> Result<Vec<String>> {
    match v {
        toml::Value::String(s) => Ok(vec![s.clone()]),
        toml::Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(|| anyhow!("{what}: {x} is not a string")))
            .collect(),
        other => bail!("{what}: invalid type {} (a string or an array of strings)", other.type_str()),
    }
}

/// containerd's `parseHostConfig` on one table: `server` ("" for the top level without one).
fn parse_host(server: &str, dir: &str, t: &toml::Table, from: String) -> Result<CtdHost> {
    let what = |k: &str| format!("{from}: `{k}`");
    let override_path = match t.get("override_path") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| anyhow!("{} must be true or false", what("override_path")))?,
    };
    let mut h = CtdHost {
        scheme: String::new(),
        host: String::new(),
        path: String::new(),
        pull: true,
        resolve: true,
        ca: Vec::new(),
        client: Vec::new(),
        skip_verify: None,
        header: Vec::new(),
        from: from.clone(),
    };
    if !server.is_empty() {
        let s = if server.starts_with("http") { server.to_string() } else { format!("https://{server}") };
        let u = reqwest::Url::parse(&s).map_err(|e| anyhow!("{from}: unable to parse server {s:?}: {e}"))?;
        h.scheme = u.scheme().to_string();
        // Go's `url.URL.Host`: the authority as written (a default port is kept).
        let authority = s.split_once("://").map_or("", |(_, rest)| rest);
        let authority = authority.split(['/', '?', '#']).next().unwrap_or_default();
        if u.host_str().is_none() || authority.is_empty() || authority.contains('@') {
            bail!("{from}: server {s:?} names no host");
        }
        h.host = authority.to_string();
        let raw = u.path();
        let mut path = if raw.is_empty() || raw == "/" { String::new() } else { clean(raw) };
        if path.is_empty() {
            if !override_path {
                path = "/v2".into();
            }
        } else if !path.ends_with("/v2") && !override_path {
            path.push_str("/v2");
        }
        h.path = path;
    }
    if let Some(v) = t.get("skip_verify") {
        h.skip_verify = Some(v.as_bool().ok_or_else(|| anyhow!("{} must be true or false", what("skip_verify")))?);
    }
    if let Some(v) = t.get("capabilities") {
        let caps = strings(v, &what("capabilities"))?;
        if !caps.is_empty() {
            h.pull = false;
            h.resolve = false;
            for c in caps {
                match c.to_ascii_lowercase().as_str() {
                    "pull" => h.pull = true,
                    "resolve" => h.resolve = true,
                    "push" => {}
                    _ => bail!("{}: unknown capability {c:?} (pull, resolve, push)", what("capabilities")),
                }
            }
        }
    }
    if let Some(v) = t.get("ca") {
        h.ca = strings(v, &what("ca"))?.iter().map(|p| abs_path(p, dir)).collect();
    }
    if let Some(v) = t.get("client") {
        match v {
            toml::Value::String(s) => h.client.push((abs_path(s, dir), None)),
            toml::Value::Array(a) => {
                for p in a {
                    match p {
                        toml::Value::String(s) => h.client.push((abs_path(s, dir), None)),
                        toml::Value::Array(_) => {
                            let pair = strings(p, &what("client"))?;
                            let [cert, key] = pair.as_slice() else {
                                bail!("{}: invalid pair {p} (a certificate and a key file)", what("client"));
                            };
                            h.client.push((abs_path(cert, dir), Some(abs_path(key, dir))));
                        }
                        other => bail!("{}: invalid type {}", what("client"), other.type_str()),
                    }
                }
            }
            other => bail!("{}: invalid type {}", what("client"), other.type_str()),
        }
    }
    if let Some(v) = t.get("header") {
        let Some(hdr) = v.as_table() else { bail!("{} must be a table", what("header")) };
        for (k, v) in hdr {
            for value in strings(v, &format!("{from}: header {k:?}"))? {
                h.header.push((k.clone(), value));
            }
        }
    }
    for k in t.keys() {
        if !["capabilities", "ca", "client", "skip_verify", "header", "override_path", "server", "host"]
            .contains(&k.as_str())
        {
            tracing::warn!("{from}: unknown key {k:?} ignored (containerd ignores it too)");
        }
    }
    Ok(h)
}

/// Go's `path.Clean` for an absolute URL path.
fn clean(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    format!("/{}", out.join("/"))
}

/// containerd's `parseHostsFile`: `[host."…"]` entries in file order, then `server` (or the
/// default host, filled in by the caller). A file that does not parse is refused naming
/// its line.
fn parse_hosts_file(dir: &str, file: &str, text: &str) -> Result<Vec<CtdHost>> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(1);
        anyhow!(
            "{file}:{line}: not valid TOML ({}); containerd would log \"failed to decode hosts.toml\"",
            e.message().trim()
        )
    })?;
    let spans =
        toml::de::DeTable::parse(text).map_err(|e| anyhow!("{file}: not valid TOML ({})", e.message().trim()))?;
    let mut order: BTreeMap<usize, String> = BTreeMap::new();
    if let Some(hosts) = spans.get_ref().iter().find(|(k, _)| k.get_ref() == "host").map(|(_, v)| v)
        && let Some(t) = hosts.get_ref().as_table()
    {
        for (k, _) in t.iter() {
            order.insert(k.span().start, k.get_ref().to_string());
        }
    }
    let host_table = match table.get("host") {
        None => toml::Table::new(),
        Some(toml::Value::Table(t)) => t.clone(),
        Some(v) => bail!("{file}: `host` is a {}, not a table of hosts", v.type_str()),
    };
    if host_table.len() > MAX_HOSTS {
        bail!("{file}: more than {MAX_HOSTS} hosts");
    }
    let mut out = Vec::new();
    for (offset, name) in order {
        let Some(toml::Value::Table(t)) = host_table.get(&name) else {
            bail!("{file}:{}: host {name:?} is not a table", line_of(text, offset));
        };
        let from = format!("{file}:{} [host.{name:?}]", line_of(text, offset));
        out.push(parse_host(&name, dir, t, from)?);
    }
    let server = match table.get("server") {
        None => String::new(),
        Some(toml::Value::String(s)) => s.clone(),
        Some(v) => bail!("{file}: `server` is a {}, not a string", v.type_str()),
    };
    let from = if server.is_empty() {
        format!("{file}: no server, the registry itself")
    } else {
        let line = text.lines().position(|l| l.trim_start().starts_with("server")).map_or(1, |i| i + 1);
        format!("{file}:{line} server")
    };
    out.push(parse_host(&server, dir, &table, from)?);
    Ok(out)
}

/// containerd's registry configuration of a node, and why it applies.
#[derive(Debug, Clone)]
pub(crate) struct ContainerdRegistry {
    /// The hosts directories.
    pub dirs: HostsDirs,
    /// Why containerd's configuration is used (for `status` and the log).
    pub why: String,
    /// The node's CA bundle (containerd's system pool).
    bundle: Option<FilePath>,
}

/// The node's containerd hosts directories when containerd serves its Kata handlers
/// (logged, with the reason), else `None` (CRI-O's files apply).
pub(crate) fn choose(
    fs: &NodeFs,
    root: &std::path::Path,
    bundle: Option<FilePath>,
) -> Result<Option<ContainerdRegistry>> {
    let root = crate::node::Root::open(root)?;
    let Some(c) = crate::kata_config::containerd_registry(&root)? else {
        return Ok(None);
    };
    let shown = if c.roots.is_empty() { "none".to_string() } else { c.roots.join(":") };
    tracing::info!(
        "registry configuration: containerd hosts.toml (config_path {shown}, from {}), because {}; \
         registries.conf and containers certs.d are not read",
        c.from,
        c.why
    );
    let dirs = HostsDirs { fs: fs.clone(), roots: c.roots, from: c.from };
    Ok(Some(ContainerdRegistry { dirs, why: c.why, bundle }))
}

/// containerd's `isProxy`: a host other than the registry itself (Docker Hub's API host
/// counts as Docker Hub).
pub(crate) fn is_proxy(registry: &str, host: &str) -> bool {
    registry != host && !(registry == "docker.io" && host == "registry-1.docker.io")
}

impl ContainerdRegistry {
    /// The hosts of `registry` in containerd's order.
    pub(crate) fn hosts(&self, registry: &str) -> Result<Vec<CtdHost>> {
        let r = self.dirs.resolve(registry)?;
        if r.hosts.is_empty() {
            bail!("{}: no hosts for {registry}", r.dir.unwrap_or_default());
        }
        Ok(r.hosts)
    }

    /// TLS material of one host.
    pub(crate) fn tls_for(&self, h: &CtdHost) -> Result<super::certs::HostTls> {
        tls_for(&self.dirs.fs, h, self.bundle.as_ref())
    }
}

/// TLS material of one containerd host: the CA files (with the node bundle: containerd
/// adds `ca` to the system pool) and the first client pair.
pub(crate) fn tls_for(fs: &NodeFs, h: &CtdHost, bundle: Option<&FilePath>) -> Result<super::certs::HostTls> {
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;
    let mut tls = super::certs::HostTls::default();
    if let Some(b) = bundle
        && let Some(data) = fs.read(b, MAX_CONFIG_FILE)?
    {
        tls.roots.extend(super::certs::parse_pem_lenient(&data, std::path::Path::new(&b.to_string())));
    }
    for ca in &h.ca {
        let data = fs.read(ca, MAX_CONFIG_FILE)?.ok_or_else(|| anyhow!("{}: unable to read CA cert {ca}", h.from))?;
        let certs = super::certs::parse_pem_lenient(&data, std::path::Path::new(&ca.to_string()));
        if certs.is_empty() {
            bail!("{}: unable to load CA cert {ca} (no certificate in it)", h.from);
        }
        tls.roots.extend(certs);
    }
    if let Some((cert, key)) = h.client.first() {
        let cert_pem =
            fs.read(cert, MAX_CONFIG_FILE)?.ok_or_else(|| anyhow!("{}: unable to read CERT file {cert}", h.from))?;
        let key_pem = match key {
            Some(k) => {
                fs.read(k, MAX_CONFIG_FILE)?.ok_or_else(|| anyhow!("{}: unable to read CERT file {k}", h.from))?
            }
            None => cert_pem.clone(),
        };
        PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| anyhow!("{}: failed to load X509 key pair {cert}: private key does not parse: {e}", h.from))?;
        if h.client.len() > 1 {
            tracing::warn!("{}: {} client certificates; only the first ({cert}) is presented", h.from, h.client.len());
        }
        let mut pem = cert_pem;
        pem.push(b'\n');
        if key.is_some() {
            pem.extend_from_slice(&key_pem);
        }
        tls.identity =
            Some(super::certs::ClientIdentity { cert_file: std::path::PathBuf::from(cert.to_string()), pem });
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(d: &std::path::Path) -> HostsDirs {
        HostsDirs { fs: NodeFs::open(d).unwrap(), roots: vec!["/certs.d".into()], from: "test".into() }
    }

    fn write(d: &std::path::Path, rel: &str, text: &str) {
        let p = d.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn order_server_default_and_ports() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "certs.d/reg.example_5000_/hosts.toml",
            "server = \"https://reg.example:5000\"\n[host.\"http://b.mirror\"]\n  capabilities = [\"pull\"]\n\
             [host.\"https://a.mirror/x\"]\n  override_path = true\n  ca = [\"ca.pem\", \"/abs.pem\"]\n",
        );
        write(d.path(), "certs.d/_default/hosts.toml", "[host.\"https://spegel:30020\"]\n");
        let r = dirs(d.path()).resolve("reg.example:5000").unwrap();
        let urls: Vec<String> = r.hosts.iter().map(CtdHost::url).collect();
        assert_eq!(urls, ["http://b.mirror/v2", "https://a.mirror/x", "https://reg.example:5000/v2"]);
        assert!(r.hosts[0].pull && !r.hosts[0].resolve);
        assert_eq!(r.hosts[1].ca, [FilePath::node("/certs.d/reg.example_5000_/ca.pem"), FilePath::node("/abs.pem")]);
        assert!(r.hosts[1].from.ends_with(":4 [host.\"https://a.mirror/x\"]"), "{}", r.hosts[1].from);
        let r = dirs(d.path()).resolve("docker.io").unwrap();
        let urls: Vec<String> = r.hosts.iter().map(CtdHost::url).collect();
        assert_eq!(urls, ["https://spegel:30020/v2", "https://registry-1.docker.io/v2"]);
        let r = dirs(tempfile::tempdir().unwrap().path()).resolve("127.0.0.1:5000").unwrap();
        assert_eq!(r.hosts[0].url(), "http://127.0.0.1:5000/v2");
    }

    #[test]
    fn broken_file_names_the_line_and_legacy_certs() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "certs.d/q.example/hosts.toml",
            "server = \"https://q.example\"\n[host.\"x\"\ncapabilities = 1\n",
        );
        let e = format!("{:#}", dirs(d.path()).resolve("q.example").unwrap_err());
        assert!(e.contains("/certs.d/q.example/hosts.toml:2"), "{e}");
        write(d.path(), "certs.d/c.example/ca.crt", "x");
        write(d.path(), "certs.d/c.example/client.cert", "x");
        write(d.path(), "certs.d/c.example/client.key", "x");
        let r = dirs(d.path()).resolve("c.example").unwrap();
        assert_eq!(r.hosts.len(), 1);
        assert_eq!(r.hosts[0].url(), "https://c.example/v2");
        assert_eq!(r.hosts[0].ca.len(), 1);
        assert!(r.hosts[0].client[0].1.is_some());
        write(d.path(), "certs.d/k.example/hosts.toml", "[host.\"m\"]\ncapabilities = [\"fetch\"]\n");
        assert!(format!("{:#}", dirs(d.path()).resolve("k.example").unwrap_err()).contains("unknown capability"));
    }
}
