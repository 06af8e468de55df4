//! CRI-O's runtime handlers, read as CRI-O reads them (cri-o `pkg/config/config.go`,
//! `UpdateFromFile` then `UpdateFromPath`): `/etc/crio/crio.conf`, then every file under
//! `/etc/crio/crio.conf.d/` whatever its name (kata-deploy writes `99-kata-deploy`), walked
//! as Go's `filepath.Walk` walks (lexical order, depth first; a symlink to a directory,
//! which CRI-O fails to read, is walked into here). Each file is decoded over the previous result; a handler table
//! `[crio.runtime.runtimes.<handler>]` in a later file replaces the whole earlier entry
//! (BurntSushi/toml decodes each map value afresh), so the later file wins.

use anyhow::Result;

use super::files::{self, Files, Kind};
use super::{CriConfig, Handler};

/// The runtime's name in messages.
pub(crate) const RUNTIME: &str = "CRI-O";
/// CRI-O's main configuration file.
const MAIN: &str = "/etc/crio/crio.conf";
/// CRI-O's drop-in directory.
const DROP_IN_DIR: &str = "/etc/crio/crio.conf.d";
/// Directories to watch for changes of CRI-O's handlers.
pub(crate) const DIRS: &[&str] = &["/etc/crio", DROP_IN_DIR];
/// Most files read from the drop-in directory.
const MAX_FILES: usize = 256;
/// Deepest directory level walked below the drop-in directory.
const MAX_DEPTH: usize = 8;

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

/// Every file CRI-O reads under `dir` (node path), in its order.
fn walk(files: &Files, dir: &str, depth: usize, out: &mut Vec<String>) -> Result<()> {
    let Some(entries) = files.list(dir)? else { return Ok(()) };
    for (name, is_dir) in entries {
        let path = files::join(dir, &name);
        if is_dir {
            if depth < MAX_DEPTH {
                walk(files, &path, depth + 1, out)?;
            }
        } else if out.len() < MAX_FILES {
            out.push(path);
        }
    }
    Ok(())
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
    let mut paths = Vec::new();
    if files.kind(MAIN)?.is_some() {
        paths.push(MAIN.to_string());
    }
    let has_dir = files.kind(DROP_IN_DIR)? == Some(Kind::Dir);
    walk(files, DROP_IN_DIR, 0, &mut paths)?;
    if paths.is_empty() && !has_dir {
        return Ok(None);
    }
    let mut c = CriConfig { runtime: RUNTIME.to_string(), ..Default::default() };
    for p in paths {
        c.files.push(p.clone());
        let problem = match files.read(&p) {
            Ok(Some(text)) => match toml::from_str::<toml::Table>(&text) {
                Ok(t) => apply(&mut c, &p, &t).err(),
                Err(e) => Some(format!("{p} is not valid TOML: {}", e.message())),
            },
            Ok(None) => Some(format!("{p} cannot be read (a dangling symlink)")),
            Err(e) => Some(format!("{e:#}")),
        };
        if let Some(why) = problem {
            c.broken = Some(why);
            break;
        }
    }
    Ok(Some(c))
}
