//! One owner per node root (docs/daemon.md#ownership): the daemon that reconciles a root
//! holds `flock` on `<root>/run/kata-addons.owner.lock` for its whole life, and records who
//! it is in `/etc/kata-containers/addons/owner.json` (written under the node lock). The
//! lock is the proof of life: the kernel releases it when the owner dies, whatever its pid
//! namespace (each DaemonSet pod has its own), so a record whose lock is free belongs to a
//! dead owner (a kill, or another boot) and is taken over. The record only names the owner.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt};
use rustix::fs::{FlockOperation, flock};
use serde::{Deserialize, Serialize};

use kata_addons_facts::INSTALL_DIR;

use crate::lock::LOCK_DIR;
use crate::node::{self, Root};

/// Name of the owner record in the install directory.
pub const OWNER_FILE: &str = "owner.json";
/// Lock file held by the owning daemon, in [`LOCK_DIR`].
pub const OWNER_LOCK_FILE: &str = "kata-addons.owner.lock";
/// Largest owner record read.
const MAX_OWNER_BYTES: u64 = 4096;

/// Who owns a node root: the daemon holding the owner lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRecord {
    /// Process id in the owner's pid namespace.
    pub pid: u32,
    /// Host (pod) name of the owner.
    #[serde(default)]
    pub host: String,
    /// The kernel's boot id when the owner started.
    #[serde(default)]
    pub boot_id: String,
    /// When the owner started, in seconds since the Unix epoch.
    #[serde(default)]
    pub started: u64,
    /// sha256 of the configuration the owner applies (`sha256:<hex>`).
    #[serde(default)]
    pub input: String,
}

impl OwnerRecord {
    /// This process, applying the configuration whose digest is `input`.
    pub fn this_process(input: &str) -> OwnerRecord {
        let host = proc_line("/proc/sys/kernel/hostname");
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        OwnerRecord { pid: std::process::id(), host, boot_id: boot_id(), started, input: input.to_string() }
    }

    /// One line naming the owner, for logs and errors.
    pub fn describe(&self) -> String {
        let started = std::time::UNIX_EPOCH + std::time::Duration::from_secs(self.started);
        format!(
            "pid {} on {} (boot {}), started {}, input {}",
            self.pid,
            if self.host.is_empty() { "?" } else { &self.host },
            if self.boot_id.is_empty() { "?" } else { &self.boot_id },
            httpdate::fmt_http_date(started),
            if self.input.is_empty() { "?" } else { &self.input }
        )
    }
}

/// The kernel's boot id (changes at every boot); empty when unreadable.
pub fn boot_id() -> String {
    proc_line("/proc/sys/kernel/random/boot_id")
}

/// The first line of a small /proc file (at most 256 bytes); empty when unreadable.
fn proc_line(path: &str) -> String {
    let mut s = String::new();
    let _ = std::fs::File::open(path).and_then(|f| f.take(256).read_to_string(&mut s));
    s.lines().next().unwrap_or_default().trim().to_string()
}

/// The owner lock, held: this process owns the node root until it is dropped (or dies).
#[derive(Debug)]
pub struct OwnerLock {
    _file: File,
}

/// What holds a node root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No live daemon; the record a dead one left, if any.
    Free(Option<OwnerRecord>),
    /// A live daemon holds the owner lock; its record (`None` when missing or unreadable).
    Live(Option<OwnerRecord>),
}

/// Tries to take the owner lock without waiting: `None` when a live daemon holds it.
pub fn try_hold(root: &Root) -> Result<Option<OwnerLock>> {
    let dir = root.create_dir_all(Path::new(LOCK_DIR))?;
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(true).mode(0o600);
    let file = dir.open_with(OWNER_LOCK_FILE, &opts).context("opening the owner lock /run/kata-addons.owner.lock")?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(OwnerLock { _file: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e).context("locking /run/kata-addons.owner.lock"),
    }
}

/// Whether a live daemon holds the owner lock, without creating anything: a daemon creates
/// the lock file and holds it for its whole life, so a missing file (or `/run`) means none.
/// A free lock is released again at once.
fn is_held(root: &Root) -> Result<bool> {
    let dir = match root.dir().open_dir(LOCK_DIR) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("opening /{LOCK_DIR} under the node root")),
    };
    let file = match dir.open_with(OWNER_LOCK_FILE, OpenOptions::new().read(true)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).context("opening the owner lock /run/kata-addons.owner.lock"),
    };
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(false),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(e).context("locking /run/kata-addons.owner.lock"),
    }
}

/// Who owns the root now; looks without creating the lock file (`uninstall` and `status`
/// leave the node as they found it).
pub fn owner(root: &Root) -> Result<Owner> {
    let live = is_held(root)?;
    let record = match super::discovery::open_addons(root)? {
        Some(addons) => read(&addons).unwrap_or_else(|e| {
            tracing::warn!("the owner record {INSTALL_DIR}/{OWNER_FILE} is unreadable: {e:#}");
            None
        }),
        None => None,
    };
    Ok(if live { Owner::Live(record) } else { Owner::Free(record) })
}

/// Reads the owner record; `None` when there is none.
pub fn read(addons: &Dir) -> Result<Option<OwnerRecord>> {
    let f = match crate::node::open_regular(addons, Path::new(OWNER_FILE)) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) => return Err(e.context(format!("opening {INSTALL_DIR}/{OWNER_FILE}"))),
    };
    let mut text = String::new();
    f.take(MAX_OWNER_BYTES + 1).read_to_string(&mut text).context(format!("reading {INSTALL_DIR}/{OWNER_FILE}"))?;
    if text.len() as u64 > MAX_OWNER_BYTES {
        anyhow::bail!("{INSTALL_DIR}/{OWNER_FILE} is larger than {MAX_OWNER_BYTES} bytes");
    }
    serde_json::from_str(&text).with_context(|| format!("parsing {INSTALL_DIR}/{OWNER_FILE}")).map(Some)
}

/// Writes the owner record (the caller holds the node lock and the owner lock).
pub fn write(root: &Root, record: &OwnerRecord) -> Result<()> {
    let addons = root.create_dir_all(&node::rel_path(INSTALL_DIR))?;
    let mut text = serde_json::to_string_pretty(record).context("serializing the owner record")?;
    text.push('\n');
    node::write_atomic(&addons, OWNER_FILE, text.as_bytes())
}

/// Removes the owner record if there is one.
pub fn remove(addons: &Dir) -> Result<bool> {
    match addons.remove_file(OWNER_FILE) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).context(format!("removing {INSTALL_DIR}/{OWNER_FILE}")),
    }
}

/// The error for an action refused because a live daemon owns the root.
/// Refuses `what` (`install`, `uninstall`) on a root a live daemon owns, unless `force`
/// (then it warns): the daemon would undo it. Whether a live daemon owns the root.
pub fn refuse_if_owned(root: &Root, force: bool, what: &str) -> Result<bool> {
    match owner(root)? {
        Owner::Live(rec) if !force => Err(owned_error(rec.as_ref(), what)),
        Owner::Live(rec) => {
            let who = rec.as_ref().map_or_else(|| "an unidentified daemon".to_string(), |r| r.describe());
            tracing::warn!(
                "--force: {what} although the kata-addons daemon {who} owns this node root; it will put back its own addon unless it is stopped"
            );
            Ok(true)
        }
        Owner::Free(_) => Ok(false),
    }
}

fn owned_error(record: Option<&OwnerRecord>, what: &str) -> anyhow::Error {
    let who = record.map_or_else(
        || "a kata-addons daemon whose record is missing (it holds /run/kata-addons.owner.lock)".to_string(),
        |r| format!("the kata-addons daemon {}", r.describe()),
    );
    anyhow::anyhow!(
        "{what} refused: this node root is owned by {who}; it would put back its own addon. Stop it first \
         (delete the kata-addons DaemonSet), or pass --force"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_tells_a_live_owner_from_a_dead_one() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = Root::open(tmp.path()).expect("root");
        assert_eq!(owner(&root).expect("owner"), Owner::Free(None));
        let held = try_hold(&root).expect("hold").expect("free");
        let rec = OwnerRecord::this_process("sha256:00");
        write(&root, &rec).expect("write");
        assert!(try_hold(&root).expect("hold").is_none(), "a second holder");
        assert_eq!(owner(&root).expect("owner"), Owner::Live(Some(rec.clone())));
        drop(held);
        assert_eq!(owner(&root).expect("owner"), Owner::Free(Some(rec)));
    }

    #[test]
    fn records_are_bounded_and_parsed_strictly() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).expect("open");
        dir.write(OWNER_FILE, vec![b' '; 5000]).expect("write");
        assert!(read(&dir).is_err());
        dir.write(OWNER_FILE, b"{\"pid\": \"x\"}").expect("write");
        assert!(read(&dir).is_err());
        dir.write(OWNER_FILE, b"{\"pid\": 7}").expect("write");
        assert_eq!(read(&dir).expect("read").map(|r| r.pid), Some(7));
    }
}
