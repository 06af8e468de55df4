//! The node's registry configuration (files beneath `--root`, or the flags that replace
//! them) and the endpoints an image is pulled from, decided as containers/image decides.
//!
//! An [`Endpoint`] says where one attempt goes (mirror or source), with what TLS and which
//! configuration entry decided it; a `fetch::Pull` keeps an authenticated client
//! for it, so later steps (signature checks) can talk to the endpoint the manifest came from.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::auth::{AuthLookup, AuthSources};
use super::certs::{CertSources, HostTls};
use super::containerd_hosts::{ContainerdRegistry, CtdHost, is_proxy};
use super::paths;
use super::registries_conf::RegistriesConf;
use crate::nodefs::{FilePath, Kind, NodeFs};

/// Which files to read: the node's beneath `root`, unless a flag names others.
#[derive(Debug, Clone)]
pub(crate) struct NodeFiles {
    /// The node's root filesystem (`/`, or `/host` in the DaemonSet).
    pub root: PathBuf,
    /// `--registries-conf FILE` (must exist).
    pub registries_conf: Option<PathBuf>,
    /// `--registries-conf-dir DIR`.
    pub registries_conf_dir: Option<PathBuf>,
    /// `--cert-dir DIR` (repeatable): replaces the node's certs.d directories.
    pub cert_dirs: Vec<PathBuf>,
    /// `--auth-file FILE`.
    pub auth_file: Option<PathBuf>,
    /// `--insecure-registry HOST[:PORT]` (repeatable).
    pub insecure_registries: Vec<String>,
}

impl Default for NodeFiles {
    fn default() -> Self {
        NodeFiles {
            root: PathBuf::from("/"),
            registries_conf: None,
            registries_conf_dir: None,
            cert_dirs: Vec::new(),
            auth_file: None,
            insecure_registries: Vec::new(),
        }
    }
}

/// The loaded configuration for one operation.
#[derive(Debug, Clone)]
pub(crate) struct NodeConfig {
    /// registries.conf and drop-ins, merged.
    pub registries: RegistriesConf,
    /// Certificates.
    pub certs: CertSources,
    /// Credentials.
    pub auth: AuthSources,
    /// `--insecure-registry` hosts.
    pub insecure_registries: Vec<String>,
    /// On a node whose Kata handlers containerd serves: its hosts directories (used instead
    /// of registries.conf and certs.d, never merged with them).
    pub containerd: Option<ContainerdRegistry>,
}

/// One place to pull from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// Registry host (with port) contacted.
    pub host: String,
    /// Repository on that host.
    pub repository: String,
    /// TLS without certificate verification, then plain HTTP (registries.conf `insecure`
    /// or `--insecure-registry`).
    pub insecure: bool,
    /// A mirror (else the source).
    pub mirror: bool,
    /// The registries.conf entry that decided, if one matched (`FILE: [[registry]] prefix "…"`).
    pub decided_by: Option<String>,
    /// Set when this endpoint must not be contacted: the entry that blocks it.
    pub blocked_by: Option<String>,
    /// On a containerd node: the `hosts.toml` host (scheme, path, TLS, headers).
    pub ctd: Option<Box<CtdHost>>,
    /// On a containerd node: the `ns` query parameter sent to a host that is not the
    /// registry itself (containerd's `addNamespace`).
    pub ns: Option<String>,
}

impl Endpoint {
    /// `host/repository`.
    pub(crate) fn name(&self) -> String {
        format!("{}/{}", self.host, self.repository)
    }

    /// `mirror host/repo` or `source host/repo`, for messages.
    pub(crate) fn describe(&self) -> String {
        format!("{} {}", if self.mirror { "mirror" } else { "source" }, self.name())
    }
}

impl NodeFiles {
    /// Reads registries.conf (+ drop-ins) and prepares certificate and auth sources.
    pub(crate) fn load(&self) -> Result<NodeConfig> {
        let fs = NodeFs::open(&self.root)?;
        let (main, required) = match &self.registries_conf {
            Some(p) => (FilePath::Local(p.clone()), true),
            None => (FilePath::node(paths::REGISTRIES_CONF), false),
        };
        let dir = match &self.registries_conf_dir {
            Some(d) => FilePath::Local(d.clone()),
            None => FilePath::node(paths::REGISTRIES_CONF_D),
        };
        let registries = RegistriesConf::load(&fs, &main, required, Some(&dir))?;
        let bundle = node_bundle(&fs)?;
        let certs = if self.cert_dirs.is_empty() {
            CertSources {
                fs: fs.clone(),
                per_host: vec![FilePath::node(paths::CERTS_D), FilePath::node(paths::DOCKER_CERTS_D)],
                global: Vec::new(),
                bundle,
            }
        } else {
            let dirs: Vec<FilePath> = self.cert_dirs.iter().cloned().map(FilePath::Local).collect();
            CertSources { fs: fs.clone(), per_host: dirs.clone(), global: dirs, bundle }
        };
        let mut auth = AuthSources::new(fs.clone(), self.auth_file.as_deref(), FilePath::node(paths::PULL_SECRET));
        auth.conf_helpers = registries.credential_helpers().map(|(h, p)| (h.to_vec(), p.to_path_buf()));
        // A flag naming CRI-O's files (or `--insecure-registry`, a registries.conf setting)
        // means those files, never containerd's hosts.toml.
        let crio_flags = self.registries_conf.is_some()
            || self.registries_conf_dir.is_some()
            || !self.cert_dirs.is_empty()
            || !self.insecure_registries.is_empty();
        let containerd =
            if crio_flags { None } else { super::containerd_hosts::choose(&fs, &self.root, node_bundle(&fs)?)? };
        Ok(NodeConfig { registries, certs, auth, insecure_registries: self.insecure_registries.clone(), containerd })
    }
}

/// The node's CA bundle: the first of the distributions' locations that is a file.
fn node_bundle(fs: &NodeFs) -> Result<Option<FilePath>> {
    for p in [paths::CA_BUNDLE_RHEL, paths::CA_BUNDLE_DEBIAN] {
        let f = FilePath::node(p);
        if fs.kind(&f)? == Some(Kind::File) {
            return Ok(Some(f));
        }
    }
    Ok(None)
}

impl NodeConfig {
    /// The endpoints to try for `registry/repository`, in order (mirrors, then the source).
    /// A blocked endpoint is listed with `blocked_by` set (it fails without being contacted).
    pub(crate) fn endpoints(&self, registry: &str, repository: &str, by_digest: bool) -> Result<Vec<Endpoint>> {
        if let Some(c) = &self.containerd {
            let hosts = c.hosts(registry)?;
            let n = hosts.len();
            // Every host but the last counts as a mirror for retries and messages.
            return Ok(hosts
                .into_iter()
                .enumerate()
                .map(|(i, h)| Endpoint {
                    host: h.host.clone(),
                    repository: repository.to_string(),
                    insecure: false,
                    mirror: i + 1 < n,
                    decided_by: Some(h.from.clone()),
                    blocked_by: None,
                    ns: is_proxy(registry, &h.host).then(|| registry.to_string()),
                    ctd: Some(Box::new(h)),
                })
                .collect());
        }
        let (sources, entry) = self.registries.pull_sources(registry, repository, by_digest)?;
        let decided_by = entry.map(|e| e.describe());
        let mut out = Vec::new();
        for s in sources {
            // As containers/image: the physical reference is looked up again; an entry
            // marked blocked for it refuses this endpoint (the mirrors stay usable).
            let blocked_by = self
                .registries
                .find(&format!("{}/{}", s.host, s.repository))
                .filter(|r| r.blocked)
                .map(|r| format!("blocked by {}", r.describe()));
            let insecure = s.insecure || self.insecure_registries.contains(&s.host);
            out.push(Endpoint {
                host: s.host,
                repository: s.repository,
                insecure,
                mirror: s.mirror,
                decided_by: decided_by.clone(),
                blocked_by,
                ctd: None,
                ns: None,
            });
        }
        Ok(out)
    }

    /// TLS material for an endpoint's host.
    pub(crate) fn tls_for(&self, ep: &Endpoint) -> Result<HostTls> {
        if let (Some(c), Some(h)) = (&self.containerd, &ep.ctd) {
            return c.tls_for(h);
        }
        self.certs.for_host(&ep.host)
    }

    /// Credentials for an endpoint.
    pub(crate) fn auth_for(&self, ep: &Endpoint) -> Result<AuthLookup> {
        self.auth.lookup(&ep.host, &ep.repository).with_context(|| format!("{}: credentials", ep.describe()))
    }
}
