//! The readiness file (`--ready-file`): present while the daemon is ready, absent while it
//! is not (before its first action succeeded, or while another daemon with other input
//! owns the node root). Its first line is `ready`; the lines after it say what the daemon
//! is waiting for (a retry's next attempt time, a standby's owner), for `status
//! --ready-file` and for people. Written atomically (temporary name, rename).

use std::path::Path;

use std::io::Read;

use anyhow::{Context, Result, bail};

/// A line of the readiness file that makes the daemon not ready although it runs the
/// addon: the node's Kata release no longer matches `kataVersion`
/// (docs/configuration.md#kataversion). `status --ready-file` fails with the reason.
pub(crate) const NOT_READY: &str = "not ready: ";

/// Largest readiness file read back.
const MAX_READY_BYTES: u64 = 64 << 10;

/// Writes the readiness file: `ready`, then `lines`.
pub(super) fn write(path: &Path, lines: &[String]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut text = String::from("ready\n");
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, text.as_bytes())
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing the readiness file {}", path.display()))
}

/// Removes the readiness file (not ready); a missing one is fine.
pub(super) fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing the readiness file {}", path.display())),
    }
}

/// What a daemon's readiness file says after its `ready` line; `None` when it is absent
/// (the daemon is not ready). Anything else than a file starting with `ready` is refused.
pub fn read(path: &Path) -> Result<Option<Vec<String>>> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("opening the readiness file {}", path.display())),
    };
    let mut text = String::new();
    f.take(MAX_READY_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading the readiness file {}", path.display()))?;
    let mut lines = text.lines();
    if text.len() as u64 > MAX_READY_BYTES || lines.next() != Some("ready") {
        bail!("{} is not a kata-addons readiness file (its first line is not `ready`)", path.display());
    }
    Ok(Some(lines.map(str::to_string).collect()))
}
