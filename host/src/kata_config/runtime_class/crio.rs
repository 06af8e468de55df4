//! CRI-O's runtime handlers, read as CRI-O reads them (cri-o `pkg/config/config.go`,
//! `UpdateFromFile` then `UpdateFromPath`): `/etc/crio/crio.conf`, then every file under
//! `/etc/crio/crio.conf.d/` whatever its name (kata-deploy writes `99-kata-deploy`), walked
//! as Go's `filepath.Walk` walks (lexical order, depth first, symlinks never descended).
//! CRI-O reads every entry that is not a directory as a file, so a symlink to a directory
//! (a loop `loop -> .` too) makes CRI-O fail to load its configuration: such a
//! configuration is broken here, naming the entry. The walk is bounded (files, bytes,
//! entries, depth), each file read once. Each file is decoded over the previous result; a handler table
//! `[crio.runtime.runtimes.<handler>]` in a later file replaces the whole earlier entry
//! (BurntSushi/toml decodes each map value afresh), so the later file wins.

use std::collections::HashMap;

use anyhow::Result;

use super::files::{Budget, Entry, FileId, Files, Kind, MAX_FILE, Visit};
use super::{CriConfig, Handler};
use crate::nodefs::FilePath;

/// The runtime's name in messages.
pub(crate) const RUNTIME: &str = "CRI-O";
/// CRI-O's main configuration file.
const MAIN: &str = "/etc/crio/crio.conf";
/// CRI-O's drop-in directory.
const DROP_IN_DIR: &str = "/etc/crio/crio.conf.d";
/// Directories to watch for changes of CRI-O's handlers.
pub(crate) const DIRS: &[&str] = &["/etc/crio", DROP_IN_DIR];
/// What reading CRI-O's configuration may cost: its files are a few KiB (kata-deploy
/// writes one drop-in), so these are far above any real node and far below what would
/// hurt the DaemonSet's memory limit.
const BUDGET: Budget = Budget { entries: 4096, files: 256, bytes: 8 << 20, depth: 8 };

/// The OCI runtimes CRI-O defines without any configuration (`default_runtime`).
pub(crate) fn is_builtin(handler: &str) -> bool {
    matches!(handler, "runc" | "crun")
}

/// Whether a CRI-O handler runs Kata Containers: a VM runtime (`runtime_type = "vm"`)
/// whose binary (`runtime_path`, else the handler name looked up in `$PATH`) is Kata's
/// shim, `containerd-shim-kata-v2` (or a `containerd-shim-kata-*` wrapper).
pub(crate) fn is_kata(handler: &str, h: &Handler) -> bool {
    let binary = h.runtime_path.as_deref().filter(|p| !p.is_empty()).unwrap_or(handler);
    let name = binary.rsplit('/').next().unwrap_or(binary);
    h.runtime_type.as_deref() == Some("vm") && name.starts_with("containerd-shim-kata")
}

/// An optional string setting of a handler table; an error if it is not a string.
fn string(t: &toml::Table, key: &str, at: &str) -> Result<Option<String>, String> {
    match t.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!("{at}: `{key}` is a {}, not a string", v.type_str())),
    }
}

/// Applies one file's handler tables over `c`.
fn apply(c: &mut CriConfig, path: &str, table: &toml::Table) -> Result<(), String> {
    let runtimes = table.get("crio").and_then(|v| v.get("runtime")).and_then(|v| v.get("runtimes"));
    let Some(runtimes) = runtimes else { return Ok(()) };
    let Some(runtimes) = runtimes.as_table() else {
        return Err(format!("{path}: crio.runtime.runtimes is not a table"));
    };
    for (name, v) in runtimes {
        let at = format!("{path}: [crio.runtime.runtimes.{name}]");
        let Some(t) = v.as_table() else { return Err(format!("{at} is not a table")) };
        let h = Handler {
            runtime_type: string(t, "runtime_type", &at)?,
            runtime_path: string(t, "runtime_path", &at)?,
            config_path: string(t, "runtime_config_path", &at)?,
            binary_name: None,
            defined_in: path.to_string(),
        };
        c.handlers.insert(name.clone(), h);
    }
    Ok(())
}

/// CRI-O's configuration on the node; `None` when it has neither file nor directory.
pub(crate) fn read(files: &Files) -> Result<Option<CriConfig>> {
    let mut walk = files.walk("CRI-O's configuration", BUDGET);
    let mut c = CriConfig { runtime: RUNTIME.to_string(), ..Default::default() };
    let main = files.kind(MAIN)?.map(|kind| Entry {
        name: "crio.conf".to_string(),
        path: FilePath::node(MAIN),
        kind: Some(kind),
        link: false,
    });
    let drop_ins = match walk.tree(&FilePath::node(DROP_IN_DIR)) {
        Ok(t) => t,
        Err(e) => {
            c.files.extend(main.map(|m| m.path.to_string()));
            c.broken = Some(format!("{e:#}"));
            return Ok(Some(c));
        }
    };
    if main.is_none() && drop_ins.is_none() {
        return Ok(None);
    }
    let mut tables: HashMap<FileId, toml::Table> = HashMap::new();
    for e in main.into_iter().chain(drop_ins.unwrap_or_default()) {
        let p = e.path.to_string();
        c.files.push(p.clone());
        let problem = if e.link && e.kind == Some(Kind::Dir) {
            Some(format!(
                "{p} is a symlink to a directory: CRI-O reads every entry of {DROP_IN_DIR} that is not a directory \
                 as a file (Go's filepath.Walk does not follow symlinks) and fails to load its configuration"
            ))
        } else {
            match walk.read(&e.path, MAX_FILE) {
                Ok(Some(Visit::Read(id, bytes))) => match String::from_utf8(bytes) {
                    Ok(text) => match toml::from_str::<toml::Table>(&text) {
                        Ok(t) => {
                            let r = apply(&mut c, &p, &t).err();
                            tables.insert(id, t);
                            r
                        }
                        Err(e) => Some(format!("{p} is not valid TOML: {}", e.message())),
                    },
                    Err(_) => Some(format!("{p} is not UTF-8 text")),
                },
                Ok(Some(Visit::Again(id))) => tables.get(&id).and_then(|t| apply(&mut c, &p, t).err()),
                Ok(None) => Some(format!("{p} cannot be read (a dangling symlink)")),
                Err(e) => Some(format!("{e:#}")),
            }
        };
        if let Some(why) = problem {
            c.broken = Some(why);
            break;
        }
    }
    Ok(Some(c))
}
