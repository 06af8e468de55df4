//! containers-registries.d(5): where signatures live (`lookaside`, with the legacy name
//! `sigstore`) and whether sigstore attachments are read (`use-sigstore-attachments`).
//! Only the reading side matters here: `*-staging` entries are for writers.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::policy_json::docker_namespaces;
use crate::nodefs::{Budget, FilePath, MAX_CONFIG_FILE, NodeFs};

/// What reading registries.d may cost: a handful of small YAML files on a real node.
const BUDGET: Budget = Budget { entries: 4096, files: 256, bytes: 16 << 20, depth: 0 };

#[derive(Debug, Clone, Default, Deserialize)]
struct Namespace {
    #[serde(default)]
    lookaside: Option<String>,
    #[serde(default, rename = "lookaside-staging")]
    _lookaside_staging: Option<String>,
    #[serde(default)]
    sigstore: Option<String>,
    #[serde(default, rename = "sigstore-staging")]
    _sigstore_staging: Option<String>,
    #[serde(default, rename = "use-sigstore-attachments")]
    use_sigstore_attachments: Option<bool>,
}

impl Namespace {
    fn lookaside(&self) -> Option<&str> {
        self.lookaside.as_deref().filter(|s| !s.is_empty()).or(self.sigstore.as_deref().filter(|s| !s.is_empty()))
    }
}

#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    #[serde(default, rename = "default-docker")]
    default_docker: Option<Namespace>,
    #[serde(default)]
    docker: Option<BTreeMap<String, Namespace>>,
}

/// The merged registries.d configuration.
#[derive(Debug, Default, Clone)]
pub(crate) struct RegistriesD {
    default_docker: Option<Namespace>,
    docker: BTreeMap<String, (Namespace, String)>,
    default_from: String,
}

/// Where to read simple signatures for one image, and whether to read sigstore attachments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SignatureConfig {
    /// Lookaside base URL (`file://…`, `http(s)://…`), `None` when nothing is configured.
    pub lookaside: Option<String>,
    /// The registries.d entry that named the lookaside (for messages).
    pub lookaside_from: Option<String>,
    /// Whether sigstore attachments are read.
    pub use_sigstore_attachments: bool,
}

impl RegistriesD {
    /// Merges the `*.yaml` files of `dir` (a missing directory is empty). A namespace or
    /// `default-docker` defined in two files is an error, as in containers/image.
    pub(crate) fn load(files: Vec<(String, Vec<u8>)>) -> Result<RegistriesD> {
        let mut out = RegistriesD::default();
        for (name, bytes) in files {
            let text = String::from_utf8(bytes).with_context(|| format!("{name}: not UTF-8"))?;
            let cfg: ConfigFile = crate::yaml::from_str(&text).with_context(|| format!("parsing {name}"))?;
            if let Some(d) = cfg.default_docker {
                if out.default_docker.is_some() {
                    bail!("\"default-docker\" defined both in {} and {name}", out.default_from);
                }
                out.default_docker = Some(d);
                out.default_from = name.clone();
            }
            for (ns, c) in cfg.docker.unwrap_or_default() {
                if let Some((_, first)) = out.docker.get(&ns) {
                    bail!("\"docker\" namespace {ns:?} defined both in {first} and {name}");
                }
                out.docker.insert(ns, (c, name.clone()));
            }
        }
        Ok(out)
    }

    /// Reads the `*.yaml` files of a directory (a node directory or a flag's), in name
    /// order; a missing directory, or a file gone since the listing, is nothing.
    pub(crate) fn read_dir(fs: &NodeFs, dir: &FilePath) -> Result<Vec<(String, Vec<u8>)>> {
        let mut walk = fs.walk("registries.d", BUDGET);
        let mut out = Vec::new();
        for e in walk.list(dir)?.unwrap_or_default() {
            if !e.name.ends_with(".yaml") {
                continue;
            }
            if let Some(b) = walk.read_all(&e.path, MAX_CONFIG_FILE)? {
                out.push((e.path.to_string(), b));
            }
        }
        Ok(out)
    }

    /// The configuration for the image at `identity` (policy identity of the reference
    /// actually pulled from) with repository name `name`: the most specific `docker`
    /// namespace that sets the field, else `default-docker`.
    pub(crate) fn for_image(&self, identity: &str, name: &str) -> SignatureConfig {
        let scopes: Vec<String> = std::iter::once(identity.to_string()).chain(docker_namespaces(name)).collect();
        let mut lookaside = None;
        let mut attachments = None;
        for s in &scopes {
            if let Some((ns, file)) = self.docker.get(s) {
                if lookaside.is_none()
                    && let Some(l) = ns.lookaside()
                {
                    lookaside = Some((l.to_string(), format!("{file}: docker {s:?}")));
                }
                if attachments.is_none() {
                    attachments = ns.use_sigstore_attachments;
                }
            }
        }
        if let Some(d) = &self.default_docker {
            if lookaside.is_none()
                && let Some(l) = d.lookaside()
            {
                lookaside = Some((l.to_string(), format!("{}: default-docker", self.default_from)));
            }
            if attachments.is_none() {
                attachments = d.use_sigstore_attachments;
            }
        }
        let (lookaside, lookaside_from) = match lookaside {
            Some((l, f)) => (Some(l), Some(f)),
            None => (None, None),
        };
        SignatureConfig { lookaside, lookaside_from, use_sigstore_attachments: attachments.unwrap_or(false) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_namespace_wins() {
        let d = RegistriesD::load(vec![
            ("a.yaml".into(), b"default-docker:\n  lookaside: file:///d\n".to_vec()),
            (
                "b.yaml".into(),
                b"docker:\n  q.io/o:\n    sigstore: https://s/o\n    use-sigstore-attachments: true\n  q.io:\n    lookaside: https://s/h\n"
                    .to_vec(),
            ),
        ])
        .unwrap();
        let c = d.for_image("q.io/o/r:1", "q.io/o/r");
        assert_eq!(c.lookaside.as_deref(), Some("https://s/o"));
        assert!(c.use_sigstore_attachments);
        let c = d.for_image("x.io/r:1", "x.io/r");
        assert_eq!(c.lookaside.as_deref(), Some("file:///d"));
        assert!(!c.use_sigstore_attachments);
        assert!(
            RegistriesD::load(vec![
                ("a.yaml".into(), b"default-docker: {}\n".to_vec()),
                ("b.yaml".into(), b"default-docker: {}\n".to_vec())
            ])
            .is_err()
        );
    }
}
