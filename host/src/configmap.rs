//! Reads the addon configuration from where the operator put it: a ConfigMap file
//! (YAML/JSON, whole object or bare map), a ConfigMap mounted as a directory, or the
//! `ADDON_*` environment. Keys are passed to the policy untouched: the runner never
//! interprets them.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::cli::ConfigArgs;
use crate::policy::KeyValue;

/// Largest ConfigMap file or key file accepted (Kubernetes caps a ConfigMap at 1 MiB).
const MAX_BYTES: u64 = 1 << 20;

/// Env vars starting with this prefix are the addon configuration.
pub const ENV_PREFIX: &str = "ADDON_";

/// Env vars with the prefix that belong to the runner itself, not to the policy.
const RUNNER_ENV: &[&str] = &["ADDON_ACTION"];

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
    /// Reads the configuration selected by the command-line options.
    pub fn load(args: &ConfigArgs) -> Result<Input> {
        if let Some(file) = &args.configmap {
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
                bail!("ConfigMap {origin} is larger than {MAX_BYTES} bytes");
            }
            let data = parse_configmap(&text).with_context(|| format!("reading ConfigMap {origin}"))?;
            return Ok(Input::ConfigMap { origin, data });
        }
        if let Some(dir) = &args.configmap_dir {
            let data = read_configmap_dir(dir)?;
            return Ok(Input::ConfigMap { origin: dir.display().to_string(), data });
        }
        Ok(Input::Env(from_env(std::env::vars_os())?))
    }
}

fn read_text(path: &Path) -> Result<String> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut s = String::new();
    f.take(MAX_BYTES + 1)
        .read_to_string(&mut s)
        .with_context(|| format!("reading {} (it must be UTF-8 text)", path.display()))?;
    Ok(s)
}

/// Parses a ConfigMap document: a whole ConfigMap (`kind: ConfigMap` / `apiVersion`
/// with `data`) or a bare key/value map. Values must be strings.
pub fn parse_configmap(text: &str) -> Result<Vec<KeyValue>> {
    let doc: serde_norway::Value = serde_norway::from_str(text).context("not valid YAML or JSON")?;
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

/// Reads a ConfigMap mounted as a volume: one file per key. Kubernetes' own entries
/// (`..data`, `..<timestamp>`) and other dot-files are skipped.
pub fn read_configmap_dir(dir: &Path) -> Result<Vec<KeyValue>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading ConfigMap directory {}", dir.display()))?;
    let mut out = BTreeMap::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name();
        let Some(key) = name.to_str() else {
            bail!("ConfigMap directory {} holds a file whose name is not UTF-8: {:?}", dir.display(), name);
        };
        if key.starts_with('.') {
            continue;
        }
        let path: PathBuf = entry.path();
        if !path.is_file() {
            continue;
        }
        let value = read_text(&path).with_context(|| format!("reading ConfigMap key `{key}`"))?;
        if value.len() as u64 > MAX_BYTES {
            bail!("ConfigMap key file {} is larger than {MAX_BYTES} bytes", path.display());
        }
        out.insert(key.to_string(), KeyValue { name: key.to_string(), value });
    }
    Ok(out.into_values().collect())
}

/// The `ADDON_*` variables of an environment, sorted by name (runner-own ones left out).
pub fn from_env(vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>) -> Result<Vec<KeyValue>> {
    let mut out = BTreeMap::new();
    for (k, v) in vars {
        let Some(name) = k.to_str() else { continue };
        if !name.starts_with(ENV_PREFIX) || RUNNER_ENV.contains(&name) {
            continue;
        }
        let Some(value) = v.to_str() else {
            bail!("environment variable {name} is not valid UTF-8");
        };
        out.insert(name.to_string(), KeyValue { name: name.to_string(), value: value.to_string() });
    }
    Ok(out.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
