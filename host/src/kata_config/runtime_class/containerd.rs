//! containerd's CRI runtime handlers, read as containerd loads its configuration
//! (containerd `cmd/containerd/server/config/config.go` `LoadConfig` in 2.x,
//! `services/server/config/config.go` in 1.6/1.7): the distribution's main file, then its
//! `imports` breadth first, each file once; an import is cleaned, a relative one taken from
//! the importing file's directory, and one containing `*` expanded as Go's `filepath.Glob`
//! (sorted). The files are merged as the two generations of containerd merge them:
//! - 1.x replaces each `plugins.<id>` section with the later file's; the effective
//!   `version` (the last one set) picks the CRI section: `plugins.cri` (none or 1) or
//!   `plugins."io.containerd.grpc.v1.cri"` (2); 1.x refuses a higher version.
//! - 2.x merges plugin tables key by key; a file of version 0/1 has its plugin IDs renamed
//!   (`cri` -> `io.containerd.grpc.v1.cri`); the effective version is the last one set (3
//!   by default) and below 3 the `io.containerd.grpc.v1.cri` runtimes move to
//!   `io.containerd.cri.v1.runtime` unless that already has runtimes
//!   (`plugins/cri/runtime/plugin.go` `configMigration`).
//!
//! Which containerd reads the files is taken from what they say ([`Generation`]); where
//! they do not say it, a handler the two readings define differently is disputed
//! (refused, naming both).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use anyhow::{Result, bail};

use super::files::{self, Budget, FileId, Files, Kind, MAX_FILE, Visit, Walk};
use super::{CriConfig, CriRegistry, Handler};
use crate::nodefs::FilePath;

/// Where a distribution keeps the configuration its containerd is started with.
struct Location {
    /// The runtime's name in messages.
    runtime: &'static str,
    /// Node path of the main file.
    main: &'static str,
    /// k0s: a directory whose `*.toml` files k0s adds to the imports while the main file
    /// carries its management marker.
    managed_drop_ins: Option<(&'static str, &'static str)>,
}

/// kata-deploy's `config.rs` (`get_containerd_paths`) and its Helm chart's
/// `containerdConfPath` (`templates/_helpers.tpl`) name these: the directory the chart
/// mounts at `/etc/containerd` per distribution, and the file in it containerd reads.
/// k3s/RKE2 render `config.toml` from `config.toml.tmpl`/`config-v3.toml.tmpl` (the
/// rendered file, with its imports of `config.toml.d`/`config-v3.toml.d`, is what
/// containerd reads); microk8s renders `containerd.toml` from `containerd-template.toml`,
/// the file kata-deploy edits.
const LOCATIONS: &[Location] = &[
    Location { runtime: "containerd", main: "/etc/containerd/config.toml", managed_drop_ins: None },
    Location {
        runtime: "k3s containerd",
        main: "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        managed_drop_ins: None,
    },
    Location {
        runtime: "RKE2 containerd",
        main: "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
        managed_drop_ins: None,
    },
    Location {
        runtime: "k0s containerd",
        main: "/etc/k0s/containerd.toml",
        // k0s (k0sproject/k0s:docs/runtime.md): files in containerd.d are added as imports while
        // containerd.toml is k0s-managed (its `# k0s_managed=true` line).
        managed_drop_ins: Some(("/etc/k0s/containerd.d", "# k0s_managed=true")),
    },
    Location {
        runtime: "microk8s containerd",
        main: "/var/snap/microk8s/current/args/containerd-template.toml",
        managed_drop_ins: None,
    },
];

/// Directories to watch for changes of containerd's handlers.
pub(crate) const DIRS: &[&str] = &[
    "/etc/containerd",
    "/etc/containerd/conf.d",
    "/var/lib/rancher/k3s/agent/etc/containerd",
    "/var/lib/rancher/rke2/agent/etc/containerd",
    "/etc/k0s",
    "/etc/k0s/containerd.d",
    "/var/snap/microk8s/current/args",
];

/// Most files one containerd configuration may consist of.
const MAX_FILES: usize = 256;

/// What loading one containerd configuration with all its imports may cost. containerd's
/// files are a few KiB; the byte total keeps an import fan-out (every file importing
/// every other) within the DaemonSet's memory limit: each file is read once (by device
/// and inode) and the whole load is refused, naming the file, once the total is reached.
const BUDGET: Budget = Budget { entries: 16384, files: MAX_FILES, bytes: 4 << 20, depth: 0 };

/// The CRI runtime plugin of containerd 2.x (config version 3).
const V3_RUNTIME: &str = "io.containerd.cri.v1.runtime";
/// The CRI plugin of config version 2.
const V2_CRI: &str = "io.containerd.grpc.v1.cri";
/// The CRI plugin's ID in a config of version 1 (or none).
const V1_CRI: &str = "cri";

/// Whether a containerd handler runs Kata Containers: its shim binary (`runtime_path`) is
/// `containerd-shim-kata-v2`, or, without one, its `runtime_type` names a Kata shim
/// (`io.containerd.kata.v2`, `io.containerd.kata-<x>.v2`: containerd runs
/// `containerd-shim-kata[-<x>]-v2`). runc-type shims (runc, crun via `BinaryName`) are not.
pub(crate) fn is_kata(h: &Handler) -> bool {
    if let Some(p) = h.runtime_path.as_deref().filter(|p| !p.is_empty()) {
        let name = p.rsplit('/').next().unwrap_or(p);
        return name.starts_with("containerd-shim-kata");
    }
    let shim =
        h.runtime_type.as_deref().and_then(|t| t.strip_prefix("io.containerd.")).and_then(|t| t.strip_suffix(".v2"));
    shim.is_some_and(|s| s == "kata" || s.starts_with("kata-"))
}

/// One loaded file.
struct File {
    path: String,
    /// `version`, 0 when not set.
    version: i64,
    /// The `plugins` table.
    plugins: toml::Table,
    /// `imports`, as written.
    imports: Vec<String>,
}

/// Every containerd configuration the node has, one per distribution location present.
pub(crate) fn read_all(files: &Files) -> Result<Vec<CriConfig>> {
    let mut out = Vec::new();
    for loc in LOCATIONS {
        if files.kind(loc.main)?.is_none() {
            continue;
        }
        out.push(read_location(files, loc)?);
    }
    Ok(out)
}

/// Loads one distribution's containerd configuration and reads its handlers.
fn read_location(files: &Files, loc: &Location) -> Result<CriConfig> {
    let mut c = CriConfig { runtime: loc.runtime.to_string(), ..Default::default() };
    let loaded = match load(files, loc, &mut c.files) {
        Ok(l) => l,
        Err(e) => {
            c.broken = Some(format!("{e:#}"));
            c.registry = Some(CriRegistry::default());
            return Ok(c);
        }
    };
    c.registry = Some(match (generation(loc, &loaded), registry_v1(&loaded)) {
        (Generation::Two, _) | (_, None) => registry_v2(&loaded),
        (Generation::One, Some(r)) => r,
        (Generation::Either, Some(r1)) => {
            let r2 = registry_v2(&loaded);
            if r1.config_path == r2.config_path && r1.inline == r2.inline {
                r1
            } else {
                CriRegistry {
                    disputed: Some(format!(
                        "containerd 1.x and 2.x read the registry settings of these files differently (1.x: \
                         config_path {:?} from {}; 2.x: config_path {:?} from {}), and the files do not say which \
                         containerd runs (`version = 3` would say 2.x)",
                        r1.config_path, r1.config_path_from, r2.config_path, r2.config_path_from
                    )),
                    ..r2
                }
            }
        }
    });
    let v2 = reading_v2(&loaded);
    match (generation(loc, &loaded), reading_v1(&loaded)) {
        (Generation::Two, _) | (_, None) => c.handlers = v2,
        (Generation::One, Some(v1)) => c.handlers = v1,
        (Generation::Either, Some(v1)) => {
            let names: std::collections::BTreeSet<&String> = v1.keys().chain(v2.keys()).collect();
            for name in names {
                match (v1.get(name), v2.get(name)) {
                    (Some(a), Some(b)) if same(a, b) => {
                        c.handlers.insert(name.clone(), b.clone());
                    }
                    (a, b) => {
                        let show = |h: Option<&Handler>| match h {
                            Some(h) => format!("{} (from {})", h.describe(), h.defined_in),
                            None => "not defined".to_string(),
                        };
                        c.disputed.insert(
                            name.clone(),
                            format!(
                                "containerd 1.x and 2.x read these files differently for this handler (1.x replaces \
                                 a plugin section per file, 2.x merges them): 1.x: {}; 2.x: {}; the files do not \
                                 say which containerd runs (`version = 3` would say 2.x, `version = 1` 1.x), so \
                                 kata-addons does not guess",
                                show(a),
                                show(b)
                            ),
                        );
                    }
                }
            }
        }
    }
    Ok(c)
}

/// Which containerd the files are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Generation {
    /// 1.x: the effective version is 1 (or none), which containerd 2.0 no longer reads
    /// (its CRI runtimes stay under the unmigrated `io.containerd.grpc.v1.cri`).
    One,
    /// 2.x: a version >= 3 (1.x refuses it); a kata-deploy drop-in among the imports
    /// (kata-deploy writes drop-ins only for containerd >= 2.0: runtime/manager.rs
    /// `is_containerd_capable_of_drop_in`); k0s's managed drop-ins (k0s merges them).
    Two,
    /// Version 2 without either sign: both may run these files.
    Either,
}

/// What the files say about the containerd that reads them.
fn generation(loc: &Location, files: &[File]) -> Generation {
    let version = files.iter().rev().map(|f| f.version).find(|v| *v != 0).unwrap_or(1);
    let kata_deploy_import = files.iter().skip(1).any(|f| {
        let name = f.path.rsplit('/').next().unwrap_or_default();
        name.starts_with("kata-deploy") && name.ends_with(".toml")
    });
    if version >= 3 || kata_deploy_import || loc.managed_drop_ins.is_some() {
        Generation::Two
    } else if version <= 1 {
        Generation::One
    } else {
        Generation::Either
    }
}

/// The same runtime settings (where they were read may differ).
fn same(a: &Handler, b: &Handler) -> bool {
    a.runtime_type == b.runtime_type
        && a.runtime_path == b.runtime_path
        && a.config_path == b.config_path
        && a.binary_name == b.binary_name
}

/// Reads the main file and its imports in containerd's order, recording each path read.
/// containerd loads each path once; a file reached again by another path (a symlink) is
/// applied again, as containerd does, but not read again.
fn load(files: &Files, loc: &Location, read: &mut Vec<String>) -> Result<Vec<File>> {
    let mut walk = files.walk("containerd's configuration with its imports", BUDGET);
    let mut pending: VecDeque<(String, Option<String>)> = VecDeque::from([(loc.main.to_string(), None)]);
    let mut queued: HashSet<String> = HashSet::from([loc.main.to_string()]);
    let mut first_of: HashMap<FileId, usize> = HashMap::new();
    let mut out: Vec<File> = Vec::new();
    while let Some((path, importer)) = pending.pop_front() {
        read.push(path.clone());
        let by = || importer.as_ref().map(|i| format!(" (imported by {i})")).unwrap_or_default();
        let visit = match walk.read(&FilePath::node(&path), MAX_FILE) {
            Ok(Some(v)) => v,
            Ok(None) => bail!("{path}{} does not exist: containerd fails to load its configuration", by()),
            Err(e) => bail!("{e:#}{}", by()),
        };
        let mut file = match visit {
            Visit::Again(id) => match first_of.get(&id).and_then(|i| out.get(*i)) {
                Some(f) => File {
                    path: path.clone(),
                    version: f.version,
                    plugins: f.plugins.clone(),
                    imports: f.imports.clone(),
                },
                None => bail!("{path}{} is read twice", by()),
            },
            Visit::Read(id, bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{path}{} is not UTF-8 text", by()))?;
                let mut f = parse(&path, &text, &by)?;
                if out.is_empty()
                    && let Some((dir, marker)) = loc.managed_drop_ins
                    && text.lines().any(|l| l.trim() == marker)
                {
                    f.imports.push(format!("{dir}/*.toml"));
                }
                first_of.insert(id, out.len());
                f
            }
        };
        for i in std::mem::take(&mut file.imports) {
            for p in resolve_import(&mut walk, files, &path, &i)? {
                if queued.insert(p.clone()) {
                    pending.push_back((p, Some(path.clone())));
                }
            }
            file.imports.push(i);
        }
        out.push(file);
    }
    Ok(out)
}

/// One file's `version`, `plugins` and `imports`.
fn parse(path: &str, text: &str, by: &dyn Fn() -> String) -> Result<File> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{path}{} is not valid TOML: {}", by(), e.message()))?;
    let version = match table.get("version") {
        None => 0,
        Some(toml::Value::Integer(v)) => *v,
        Some(v) => bail!("{path}: `version` is a {}, not an integer", v.type_str()),
    };
    let plugins = match table.get("plugins") {
        None => toml::Table::new(),
        Some(toml::Value::Table(t)) => t.clone(),
        Some(v) => bail!("{path}: `plugins` is a {}, not a table", v.type_str()),
    };
    let imports: Vec<String> = match table.get("imports") {
        None => Vec::new(),
        Some(toml::Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| anyhow::anyhow!("{path}: `imports` holds something other than strings"))?,
        Some(v) => bail!("{path}: `imports` is a {}, not an array", v.type_str()),
    };
    Ok(File { path: path.to_string(), version, plugins, imports })
}

/// One import of `parent` as containerd resolves it: cleaned, made absolute from the
/// parent's directory, and, if it contains `*`, expanded as a glob (sorted; no match =
/// nothing). containerd before 1.6.30/1.7.15 took a relative glob from its working
/// directory instead (`/` as a service); kata-deploy writes absolute imports.
fn resolve_import(walk: &mut Walk<'_>, files: &Files, parent: &str, import: &str) -> Result<Vec<String>> {
    let joined = if import.starts_with('/') {
        import.to_string()
    } else {
        let dir = parent.rsplit_once('/').map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
        files::join(dir, import)
    };
    let path = files::clean_abs(&joined);
    if !path.contains('*') {
        return Ok(vec![path]);
    }
    glob(walk, files, &path)
}

/// Go's `filepath.Glob` of an absolute pattern beneath the root: each component with a
/// meta character matched against the sorted entries of every directory matched so far.
fn glob(walk: &mut Walk<'_>, files: &Files, pattern: &str) -> Result<Vec<String>> {
    let opts = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    let mut current = vec!["/".to_string()];
    let parts: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let mut next = Vec::new();
        let meta = part.contains(['*', '?', '[']);
        let pat = if meta {
            Some(glob::Pattern::new(part).map_err(|e| anyhow::anyhow!("import pattern {pattern:?}: {e}"))?)
        } else {
            None
        };
        for dir in &current {
            match &pat {
                None => {
                    let p = files::join(dir, part);
                    if !last || files.kind(&p)?.is_some() || listed(walk, dir, part)? {
                        next.push(p);
                    }
                }
                Some(pat) => {
                    let Some(entries) = walk.list(&FilePath::node(dir))? else { continue };
                    for e in entries {
                        if pat.matches_with(&e.name, opts) {
                            next.push(files::join(dir, &e.name));
                        }
                    }
                }
            }
            if next.len() > MAX_FILES {
                bail!("import pattern {pattern:?} matches more than {MAX_FILES} paths");
            }
        }
        if !last {
            let mut dirs = Vec::new();
            for p in next {
                if files.kind(&p)? == Some(Kind::Dir) {
                    dirs.push(p);
                }
            }
            next = dirs;
        }
        current = next;
    }
    Ok(current)
}

/// Whether `dir` has an entry `name` (a dangling symlink too: Go's `Lstat` finds it, so
/// `Glob` returns it).
fn listed(walk: &mut Walk<'_>, dir: &str, name: &str) -> Result<bool> {
    Ok(walk.list(&FilePath::node(dir))?.is_some_and(|entries| entries.iter().any(|e| e.name == name)))
}

/// containerd 2.x's map merge (dario.cat/mergo with override): tables merge key by key,
/// anything else is replaced by the later value.
fn merge(to: &mut toml::Table, from: &toml::Table) {
    for (k, v) in from {
        match (to.get_mut(k), v) {
            (Some(toml::Value::Table(t)), toml::Value::Table(f)) => merge(t, f),
            _ => {
                to.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The runtimes table under `plugins.<plugin>.containerd.runtimes`.
fn runtimes<'a>(plugins: &'a toml::Table, plugin: &str) -> Option<&'a toml::Table> {
    plugins.get(plugin)?.get("containerd")?.get("runtimes")?.as_table()
}

/// The handlers of a runtimes table; `files` (in load order, each with the plugin ID it
/// uses for the CRI section) say which file defined each last.
fn handlers(runtimes: Option<&toml::Table>, files: &[(&File, &str)]) -> BTreeMap<String, Handler> {
    let mut out = BTreeMap::new();
    let Some(runtimes) = runtimes else { return out };
    for (name, v) in runtimes {
        let Some(t) = v.as_table() else { continue };
        let s = |t: Option<&toml::Value>, k: &str| {
            t.and_then(|t| t.get(k)).and_then(toml::Value::as_str).map(str::to_string)
        };
        let options = t.get("options");
        let defined_in = files
            .iter()
            .rev()
            .find(|(f, id)| runtimes_of(f, id).is_some_and(|r| r.contains_key(name)))
            .map(|(f, _)| f.path.clone())
            .unwrap_or_default();
        out.insert(
            name.clone(),
            Handler {
                runtime_type: s(Some(v), "runtime_type"),
                runtime_path: s(Some(v), "runtime_path"),
                config_path: s(options, "ConfigPath"),
                binary_name: s(options, "BinaryName"),
                defined_in,
            },
        );
    }
    out
}

/// The runtimes table of one file's CRI section under `id`.
fn runtimes_of<'a>(f: &'a File, id: &str) -> Option<&'a toml::Table> {
    runtimes(&f.plugins, id)
}

/// containerd 1.x's reading; `None` when 1.x would refuse the version.
fn reading_v1(files: &[File]) -> Option<BTreeMap<String, Handler>> {
    let mut version = 0;
    let mut plugins = toml::Table::new();
    for f in files {
        if f.version != 0 {
            version = f.version;
        }
        for (k, v) in &f.plugins {
            plugins.insert(k.clone(), v.clone());
        }
    }
    let id = match version {
        0 | 1 => V1_CRI,
        2 => V2_CRI,
        _ => return None,
    };
    // Only the last file with a CRI section counts in 1.x: it replaced the others.
    let last = files.iter().rev().find(|f| f.plugins.contains_key(id));
    let provenance: Vec<(&File, &str)> = last.map(|f| (f, id)).into_iter().collect();
    Some(handlers(runtimes(&plugins, id), &provenance))
}

/// containerd 2.x's reading.
fn reading_v2(files: &[File]) -> BTreeMap<String, Handler> {
    let mut version = 3;
    let mut plugins = toml::Table::new();
    let mut renamed: Vec<(&File, toml::Table)> = Vec::new();
    for f in files {
        let mut p = f.plugins.clone();
        if f.version == 0 || f.version == 1 {
            if let Some(cri) = p.remove(V1_CRI) {
                p.insert(V2_CRI.to_string(), cri);
            }
        } else {
            version = f.version;
        }
        merge(&mut plugins, &p);
        renamed.push((f, p));
    }
    let mut from_v2 = false;
    if version < 3 {
        let src = runtimes(&plugins, V2_CRI).cloned();
        let dst_has = runtimes(&plugins, V3_RUNTIME).is_some();
        if let (Some(src), false) = (src, dst_has) {
            let dst = plugins.entry(V3_RUNTIME).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let Some(dst) = dst.as_table_mut() {
                let c = dst.entry("containerd").or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if let Some(c) = c.as_table_mut() {
                    c.insert("runtimes".to_string(), toml::Value::Table(src));
                    from_v2 = true;
                }
            }
        }
    }
    // Provenance on the renamed plugin tables (a v1 file's `cri` counts as V2_CRI).
    let id = if from_v2 { V2_CRI } else { V3_RUNTIME };
    let shadow: Vec<File> = renamed
        .iter()
        .map(|(f, p)| File { path: f.path.clone(), version: f.version, plugins: p.clone(), imports: Vec::new() })
        .collect();
    let provenance: Vec<(&File, &str)> = shadow.iter().map(|f| (f, id)).collect();
    handlers(runtimes(&plugins, V3_RUNTIME), &provenance)
}

/// The CRI images plugin of containerd 2.x (config version 3), which holds `registry`.
const V3_IMAGES: &str = "io.containerd.cri.v1.images";

/// containerd 2.x's `config_path` when none is set and no inline form is used
/// (containerd `internal/cri/config/config.go`, `Registry.ConfigPath`).
pub(crate) const V2_DEFAULT_CONFIG_PATH: &str = "/etc/containerd/certs.d:/etc/docker/certs.d";

/// Records one file's `registry` table into `out` (a later file's key wins).
fn note_registry(out: &mut CriRegistry, reg: &toml::Table, file: &str) {
    if let Some(p) = reg.get("config_path").and_then(toml::Value::as_str) {
        out.config_path = p.to_string();
        out.config_path_from = file.to_string();
    }
    for key in ["mirrors", "configs"] {
        if reg.get(key).and_then(toml::Value::as_table).is_some_and(|t| !t.is_empty()) {
            out.inline.retain(|(k, _)| k != key);
            out.inline.push((key.to_string(), file.to_string()));
        }
    }
}

/// containerd 1.x's registry settings: only the last file with a CRI section counts (it
/// replaced the others); no `config_path` means no hosts directory. `None` when 1.x would
/// refuse the version.
fn registry_v1(files: &[File]) -> Option<CriRegistry> {
    let version = files.iter().rev().map(|f| f.version).find(|v| *v != 0).unwrap_or(0);
    let id = match version {
        0 | 1 => V1_CRI,
        2 => V2_CRI,
        _ => return None,
    };
    let mut out =
        CriRegistry { config_path_from: "containerd 1.x default (no hosts directory)".into(), ..Default::default() };
    if let Some(f) = files.iter().rev().find(|f| f.plugins.contains_key(id))
        && let Some(reg) = f.plugins.get(id).and_then(|p| p.get("registry")).and_then(toml::Value::as_table)
    {
        note_registry(&mut out, reg, &f.path);
    }
    Some(out)
}

/// containerd 2.x's registry settings: every file's `registry` merged key by key (a file of
/// version 0/1 names the CRI plugin `cri`, of version 2 `io.containerd.grpc.v1.cri`, of
/// version 3 `io.containerd.cri.v1.images`); an empty `config_path` without `mirrors` is the
/// 2.x default directories.
fn registry_v2(files: &[File]) -> CriRegistry {
    let mut out = CriRegistry::default();
    for f in files {
        let ids: &[&str] = match f.version {
            0 | 1 => &[V1_CRI],
            2 => &[V2_CRI],
            _ => &[V2_CRI, V3_IMAGES],
        };
        for id in ids {
            if let Some(reg) = f.plugins.get(*id).and_then(|p| p.get("registry")).and_then(toml::Value::as_table) {
                note_registry(&mut out, reg, &f.path);
            }
        }
    }
    // 2.x fills in its default whenever `config_path` is empty and no `mirrors` are set
    // (containerd `plugins/cri/images/plugin.go`).
    if out.config_path.is_empty() && !out.inline.iter().any(|(k, _)| k == "mirrors") {
        out.config_path = V2_DEFAULT_CONFIG_PATH.to_string();
        out.config_path_from = "containerd 2.x default".to_string();
    }
    out
}
