//! Reads the addon configuration from where the operator put it: a ConfigMap file
//! (YAML/JSON, whole object or bare map), a ConfigMap mounted as a directory, or the
//! `ADDON_*` environment. Keys are passed to the policy untouched: the runner never
//! interprets them.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kata_addons_facts::Escaped;

use crate::error::invalid;
use crate::nodefs::{Budget, FilePath, Kind, MAX_DIR_ENTRIES, NodeFs};
use crate::policy::KeyValue;

/// Largest ConfigMap file or key file accepted (Kubernetes caps a ConfigMap at 1 MiB).
pub const MAX_BYTES: u64 = 1 << 20;

/// Most keys (ConfigMap keys or `ADDON_*` variables) passed to the policy: far more than
/// the contract knows (the guest's key table, `guest/src/keys.rs`), so this leaves room for
/// typos while bounding the policy's work (a did-you-mean per unknown key) and its
/// violation list.
pub(crate) const MAX_KEYS: usize = 128;

/// Longest key name (Kubernetes' own limit for ConfigMap keys).
pub(crate) const MAX_KEY_LEN: usize = 253;

/// Refuses a key list over [`MAX_KEYS`] or with a key name over [`MAX_KEY_LEN`].
pub fn check_counts(origin: &str, data: &[KeyValue]) -> Result<()> {
    if data.len() > MAX_KEYS {
        return Err(invalid(format!("{origin} has {} keys, more than the limit of {MAX_KEYS}", data.len())));
    }
    if let Some(kv) = data.iter().find(|kv| kv.name.len() > MAX_KEY_LEN) {
        return Err(invalid(format!(
            "{origin} has a key of {} bytes, more than the limit of {MAX_KEY_LEN} (starts {:?})",
            kv.name.len(),
            kv.name.chars().take(32).collect::<String>()
        )));
    }
    Ok(())
}

/// Env vars starting with this prefix are the addon configuration.
pub(crate) const ENV_PREFIX: &str = "ADDON_";

/// Env vars with the prefix that belong to the runner itself, not to the policy.
const RUNNER_ENV: &[&str] = &["ADDON_ACTION"];

/// Where to read the configuration from (`--configmap`, `--configmap-dir`, else the environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Source {
    /// A ConfigMap file (YAML or JSON); `-` is standard input.
    File(PathBuf),
    /// A ConfigMap mounted as a directory: one file per key.
    Dir(PathBuf),
    /// The `ADDON_*` environment.
    #[default]
    Env,
}

impl Source {
    /// Whether the source is a mounted directory (the daemon watches it for changes).
    pub(crate) fn is_dir(&self) -> bool {
        matches!(self, Source::Dir(_))
    }
}

/// Where the configuration came from, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// ConfigMap `data` (goes through the policy's `env` first).
    ConfigMap {
        /// Human description of the source (file or directory).
        origin: String,
        /// The key/value pairs, sorted by key.
        data: Vec<KeyValue>,
    },
    /// `ADDON_*` environment variables (go straight to the policy's `plan`).
    Env(Vec<KeyValue>),
}

impl Input {
    /// Reads the configuration from `source`.
    pub(crate) fn load(source: &Source) -> Result<Input> {
        if let Source::File(file) = source {
            let (origin, text) = if file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .take(MAX_BYTES + 1)
                    .read_to_string(&mut s)
                    .context("reading the ConfigMap from standard input")?;
                ("<stdin>".to_string(), s)
            } else {
                (file.display().to_string(), read_text(file)?)
            };
            if text.len() as u64 > MAX_BYTES {
                return Err(invalid(format!("ConfigMap {origin} is larger than the limit of {MAX_BYTES} bytes")));
            }
            let data = parse_configmap(&text)
                .map_err(|e| invalid(format!("{e:#}")))
                .with_context(|| format!("reading ConfigMap {origin}"))?;
            check_counts(&format!("ConfigMap {origin}"), &data)?;
            return Ok(Input::ConfigMap { origin, data });
        }
        if let Source::Dir(dir) = source {
            let data = read_configmap_dir(dir)?;
            check_counts(&format!("ConfigMap directory {}", dir.display()), &data)?;
            return Ok(Input::ConfigMap { origin: dir.display().to_string(), data });
        }
        let env = from_env(std::env::vars_os())?;
        check_counts("the ADDON_* environment", &env)?;
        Ok(Input::Env(env))
    }
}

fn read_text(path: &Path) -> Result<String> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut s = String::new();
    f.take(MAX_BYTES + 1).read_to_string(&mut s).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            invalid(format!("{} is not UTF-8 text", path.display()))
        } else {
            anyhow::Error::new(e).context(format!("reading {}", path.display()))
        }
    })?;
    Ok(s)
}

/// Parses a ConfigMap document: a whole ConfigMap (`kind: ConfigMap` / `apiVersion`
/// with `data`) or a bare key/value map. Values must be strings.
pub fn parse_configmap(text: &str) -> Result<Vec<KeyValue>> {
    let doc: serde_norway::Value = crate::yaml::from_str(text).context("not valid YAML or JSON")?;
    let map = match doc {
        serde_norway::Value::Mapping(m) => m,
        serde_norway::Value::Null => bail!("the document is empty; expected a ConfigMap or a key/value map"),
        other => bail!("expected a ConfigMap or a key/value map, found {}", kind_of(&other)),
    };
    let is_object = ["apiVersion", "kind", "metadata"].iter().any(|k| map.contains_key(*k));
    let data = if is_object {
        if let Some(kind) = map.get("kind").and_then(|k| k.as_str())
            && kind != "ConfigMap"
        {
            bail!("expected kind ConfigMap, found kind {kind}");
        }
        match map.get("data") {
            Some(serde_norway::Value::Mapping(d)) => d.clone(),
            Some(serde_norway::Value::Null) | None => bail!("the ConfigMap has no `data`"),
            Some(other) => bail!("`data` must be a map of strings, found {}", kind_of(other)),
        }
    } else {
        map
    };
    let mut out = BTreeMap::new();
    for (k, v) in data {
        let key = match k {
            serde_norway::Value::String(s) => s,
            other => bail!("ConfigMap keys must be strings, found {}", kind_of(&other)),
        };
        let value = match v {
            serde_norway::Value::String(s) => s,
            other => bail!(
                "the value of `{key}` is {}; ConfigMap data values are strings (quote it, e.g. {key}: \"...\")",
                kind_of(&other)
            ),
        };
        out.insert(key.clone(), KeyValue { name: key, value });
    }
    Ok(out.into_values().collect())
}

fn kind_of(v: &serde_norway::Value) -> &'static str {
    match v {
        serde_norway::Value::Null => "null",
        serde_norway::Value::Bool(_) => "a boolean",
        serde_norway::Value::Number(_) => "a number",
        serde_norway::Value::String(_) => "a string",
        serde_norway::Value::Sequence(_) => "a list",
        serde_norway::Value::Mapping(_) => "a map",
        serde_norway::Value::Tagged(_) => "a tagged value",
    }
}

/// Reads a ConfigMap mounted as a volume: one file per key. When kubelet's `..data` link
/// is there, it is resolved once and every key is read from that one generation directory
/// (kubelet swaps `..data` atomically; reading `key -> ..data/key` links one by one could
/// mix two generations). If the generation is replaced while it is read, the read starts
/// over, so the result is always one consistent set. Other dot-files are skipped. Every key
/// must resolve inside the directory (a symlink leading out of it is refused naming the
/// key, its target never read), and all keys together are at most [`MAX_BYTES`], as
/// Kubernetes caps a ConfigMap.
pub fn read_configmap_dir(dir: &Path) -> Result<Vec<KeyValue>> {
    let fs = NodeFs::open(dir).with_context(|| format!("opening ConfigMap directory {}", dir.display()))?;
    let mut last_err = None;
    for _ in 0..10 {
        let generation = match std::fs::read_link(dir.join("..data")) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => None, // not a symlink
            Err(e) => return Err(e).with_context(|| format!("reading {}/..data", dir.display())),
        };
        let Some(generation) = generation else { return read_key_files(&fs, dir, "") };
        let name = generation.to_str().unwrap_or_default();
        if name.is_empty() || name.contains('/') || !name.starts_with("..") || name == ".." {
            bail!(
                "{}/..data points at {}, not a generation directory beside it",
                dir.display(),
                Escaped(&generation.to_string_lossy())
            );
        }
        let read = read_key_files(&fs, dir, name);
        let still = std::fs::read_link(dir.join("..data")).ok();
        match read {
            Ok(v) if still.as_deref() == Some(generation.as_path()) => return Ok(v),
            Ok(_) => tracing::debug!("ConfigMap {} changed while it was read; reading again", dir.display()),
            Err(e) => {
                if still.as_deref() == Some(generation.as_path()) {
                    return Err(e);
                }
                last_err = Some(e);
            }
        }
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("ConfigMap {} keeps changing while it is read", dir.display())))
}

/// Reads every regular, non-dot file of `sub` (a directory name inside the mount, `""` for
/// the mount itself) as one key.
fn read_key_files(fs: &NodeFs, dir: &Path, sub: &str) -> Result<Vec<KeyValue>> {
    let budget = Budget { entries: MAX_DIR_ENTRIES, files: MAX_KEYS, bytes: MAX_BYTES, depth: 0 };
    let mut walk = fs.walk("the ConfigMap", budget);
    let shown = if sub.is_empty() { dir.display().to_string() } else { format!("{}/{sub}", dir.display()) };
    let entries = walk
        .list(&FilePath::node(sub))
        .map_err(|e| invalid(format!("ConfigMap directory {shown}: {e:#}")))?
        .with_context(|| format!("ConfigMap directory {shown} does not exist"))?;
    let mut out = BTreeMap::new();
    for e in entries {
        let key = e.name;
        if key.starts_with('.') {
            continue;
        }
        if out.len() >= MAX_KEYS {
            return Err(invalid(format!("ConfigMap directory {shown} has more than the limit of {MAX_KEYS} keys")));
        }
        let node_path = e.path.to_string();
        if !fs.stays_inside(&node_path)? {
            return Err(invalid(format!(
                "ConfigMap key {} in {shown} is a symlink leading out of the directory: a mounted ConfigMap's keys \
                 resolve inside it (kubelet's `..data` links do); refused, nothing read from its target",
                Escaped(&key)
            )));
        }
        if e.kind != Some(Kind::File) {
            continue;
        }
        let bytes = match walk.read_all(&e.path, MAX_BYTES) {
            Ok(Some(b)) => b,
            Ok(None) => continue, // gone since the listing
            Err(err) => {
                return Err(invalid(format!(
                    "ConfigMap key {} in {shown}: {err:#} (a ConfigMap holds at most {MAX_BYTES} bytes)",
                    Escaped(&key)
                )));
            }
        };
        let Ok(value) = String::from_utf8(bytes) else {
            return Err(invalid(format!("ConfigMap key {} in {shown} is not UTF-8 text", Escaped(&key))));
        };
        out.insert(key.clone(), KeyValue { name: key, value });
    }
    Ok(out.into_values().collect())
}

/// The `ADDON_*` variables of an environment, sorted by name (runner-own ones left out).
pub fn from_env(vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>) -> Result<Vec<KeyValue>> {
    let mut out = BTreeMap::new();
    for (k, v) in vars {
        let Some(name) = k.to_str() else {
            // Not ours unless it claims our prefix; one that does is a broken input, not noise.
            use std::os::unix::ffi::OsStrExt;
            if k.as_bytes().starts_with(ENV_PREFIX.as_bytes()) {
                return Err(invalid(format!(
                    "environment variable {} is not a valid name (not UTF-8); ADDON_* names are ASCII",
                    k.to_string_lossy()
                )));
            }
            continue;
        };
        if !name.starts_with(ENV_PREFIX) || RUNNER_ENV.contains(&name) {
            continue;
        }
        let Some(value) = v.to_str() else {
            return Err(invalid(format!("environment variable {name} is not valid UTF-8")));
        };
        out.insert(name.to_string(), KeyValue { name: name.to_string(), value: value.to_string() });
    }
    Ok(out.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::is_invalid_config;

    #[test]
    fn whole_configmap_and_bare_map() {
        let whole = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kata-addon-artifacts\ndata:\n  kernelPath: /k\n  addonImage: quay.io/a/b:v1\n";
        let kv = parse_configmap(whole).expect("parses");
        assert_eq!(kv.len(), 2);
        assert_eq!(kv[0].name, "addonImage");
        let bare = r#"{"addonImage": "quay.io/a/b:v1"}"#;
        assert_eq!(parse_configmap(bare).expect("parses").len(), 1);
    }

    #[test]
    fn non_string_values_are_named() {
        let err = parse_configmap("version: 1.0\n").expect_err("number");
        assert!(format!("{err:#}").contains("`version`"), "{err:#}");
        let err = parse_configmap("kind: Secret\ndata: {}\n").expect_err("kind");
        assert!(format!("{err:#}").contains("Secret"));
        assert!(parse_configmap("a: [").is_err());
        assert!(parse_configmap("").is_err());
    }

    #[test]
    fn env_filter() {
        let vars = vec![
            ("ADDON_IMAGE".into(), "x".into()),
            ("ADDON_ACTION".into(), "install".into()),
            ("PATH".into(), "/bin".into()),
        ];
        let kv = from_env(vars.into_iter()).expect("env");
        assert_eq!(kv, vec![KeyValue { name: "ADDON_IMAGE".into(), value: "x".into() }]);
    }

    /// Found by tests/tests/fuzz.rs: an `ADDON_*` value that is not UTF-8 is invalid
    /// configuration (exit 2), not an operational failure (exit 1).
    #[test]
    fn env_value_not_utf8_is_invalid_configuration() {
        use std::os::unix::ffi::OsStringExt;
        let vars = vec![("ADDON_IMAGE".into(), std::ffi::OsString::from_vec(b"quay.io/a/b:\xff".to_vec()))];
        let e = from_env(vars.into_iter()).expect_err("refused");
        assert!(is_invalid_config(&e), "{e:#}");
    }

    #[test]
    fn env_name_not_utf8_with_our_prefix_is_invalid_configuration() {
        use std::os::unix::ffi::OsStringExt;
        let ours = vec![(std::ffi::OsString::from_vec(b"ADDON_\xffIMAGE".to_vec()), "x".into())];
        let e = from_env(ours.into_iter()).expect_err("refused");
        assert!(is_invalid_config(&e), "{e:#}");
        assert!(format!("{e:#}").contains("ADDON_"), "{e:#}");
        let other = vec![(std::ffi::OsString::from_vec(b"LANG\xff".to_vec()), "x".into())];
        assert!(from_env(other.into_iter()).expect("not ours").is_empty());
    }
}
