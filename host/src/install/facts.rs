//! What an install learns beyond its outcome, for the daemon (docs/daemon.md): the manifest
//! digest it resolved (also when it failed later, so a failed image is remembered), and
//! the metadata (size, inode, mtime, ctime) of each installed file it knows intact, so
//! that the next check re-hashes only a file whose metadata changed.

use std::collections::BTreeMap;

use cap_std::fs::{Metadata, MetadataExt};

/// Metadata of one file that changes whenever its content is written or replaced (ctime
/// cannot be set from user space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMeta {
    /// Device and inode.
    pub dev_ino: (u64, u64),
    /// Size in bytes.
    pub size: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// Status change time (seconds, nanoseconds).
    pub ctime: (i64, i64),
}

impl FileMeta {
    /// The facts of `m`.
    pub fn of(m: &Metadata) -> FileMeta {
        FileMeta {
            dev_ino: (m.dev(), m.ino()),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Installed files known intact, by node path, with the metadata they had when hashed.
pub type FileFacts = BTreeMap<String, FileMeta>;

/// Input and output of one install beyond its [`super::Outcome`].
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// In: files known intact; one whose metadata still matches is not hashed again.
    /// Out: the files known intact after this install (empty after a failure).
    pub facts: FileFacts,
    /// Out: the manifest digest this install resolved or used, if it got that far.
    pub digest: Option<String>,
    /// Out: installed files hashed to check them.
    pub hashed: usize,
    /// Out: where the reference values are and what they hold (`docs/attestation.md`),
    /// after a successful install.
    pub attest: Option<String>,
    /// Out: the node's Kata release as the install read it (docs/design.md#node-kata-release).
    pub kata_release: Option<String>,
}
