//! Checks a guest image or guest extension image the way the guest will use it, before
//! the commit point (docs/design.md#measured-guests): the partition table gives partitions
//! 1 and 2, partition 1 holds ext4, xfs or erofs, and with dm-verity parameters the tree
//! computed over `data_blocks` blocks of partition 1 gives `root_hash` and equals the hash
//! area at the start of partition 2 — the decision `veritysetup verify --no-superblock`
//! makes on the same two partitions. Extensions follow the guest mount script's integrity
//! table.

mod partition;
mod stream;
mod superblock;
mod tree;

use std::fs::File;
use std::os::unix::fs::FileExt;

pub use stream::{Stream, Streamed};
pub use superblock::Filesystem;

use partition::{Part, Table};
use tree::TreeBuilder;

/// dm-verity parameters, decoded (format 1, sha256): the bytes the tree is computed with.
/// Not another spelling of the parameters (those are the shared parser's and the WIT's):
/// decoded once from them, so the hash loop never decodes hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Expected root hash.
    pub root_hash: [u8; 32],
    /// Salt.
    pub salt: Vec<u8>,
    /// Data blocks covered, from the start of partition 1.
    pub data_blocks: u64,
    /// Data block size in bytes.
    pub data_block_size: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
}

impl Params {
    /// Decodes parameters already checked by the policy or the shared parser (hex strings).
    pub fn from_hex(
        root_hash: &str,
        salt: &str,
        data_blocks: u64,
        data_block_size: u32,
        hash_block_size: u32,
    ) -> Result<Params, String> {
        let root: [u8; 32] = hex::decode(root_hash)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| format!("root_hash {root_hash:?} is not 64 hex digits"))?;
        let salt = hex::decode(salt).map_err(|_| format!("salt {salt:?} is not hex"))?;
        Ok(Params { root_hash: root, salt, data_blocks, data_block_size, hash_block_size })
    }
}

/// What the file is to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The guest's root image (`image`): booted from partition 1, through dm-verity with
    /// partition 2 when measured.
    Image,
    /// A guest extension image: EROFS, mounted by `kata-extension-mount.sh`.
    Extension,
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Filesystem of the data (partition 1, or the whole unpartitioned extension).
    pub filesystem: Filesystem,
    /// `gpt`, `mbr`, or `None` for an unpartitioned extension.
    pub table: Option<&'static str>,
    /// The root hash the tree gave (64 hex), when measured.
    pub root_hash: Option<String>,
    /// When measured, the sha256 (64 hex) of every byte of the file outside the data
    /// blocks (partition table, slack, partition 2), in file order: with the tree it
    /// covers the whole file, so it is the integrity record of a measured file.
    pub outside_sha256: Option<String>,
}

/// A file the guest could not use as configured: exit 1, naming the file and what differs.
#[derive(Debug, thiserror::Error)]
#[error("refusing {file}: {what}")]
pub struct Refused {
    /// The file (as named in the image, or its node path).
    pub file: String,
    /// What differs from what the guest needs.
    pub what: String,
}

fn refuse(file: &str, what: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Refused { file: file.to_string(), what: what.into() })
}

/// Reads exactly `buf.len()` bytes at `off`.
fn read_at(f: &File, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
    f.read_exact_at(buf, off)
}

/// The filesystem starting at byte `start` of the file (at most `len` bytes of it).
fn filesystem(f: &File, start: u64, len: u64) -> std::io::Result<Result<Filesystem, String>> {
    let n = len.min(superblock::PROBE_BYTES as u64) as usize;
    let mut b = vec![0u8; n];
    read_at(f, start, &mut b)?;
    Ok(superblock::detect(&b))
}

/// Checks `file` (named `name` in messages) for `role`, measured with `params` or not.
/// `streamed` is the tree computed while the file was written ([`Stream`]), used when it
/// covers the same partition with the same parameters.
pub fn check(
    f: &File,
    name: &str,
    role: Role,
    params: Option<&Params>,
    streamed: Option<Streamed>,
) -> anyhow::Result<Verified> {
    use anyhow::Context;
    let len = f.metadata().with_context(|| format!("inspecting {name}"))?.len();
    let mut reader = f;
    let table = partition::read(&mut reader, len).map_err(|e| refuse(name, e))?;
    let io = |e: std::io::Error| anyhow::Error::new(e).context(format!("reading {name}"));
    let what = match role {
        Role::Image => "the guest image",
        Role::Extension => "the guest extension image",
    };
    match (role, params, table) {
        (Role::Image, _, None) => Err(refuse(
            name,
            format!(
                "{what} has no partition table (MBR or GPT): Kata boots it from partition 1 (root=/dev/vda1, or dm-verity over vda1 and vda2)"
            ),
        )),
        (Role::Extension, None, None) => {
            // No partition: the guest mounts the whole disk as EROFS.
            let fs = filesystem(f, 0, len)
                .map_err(io)?
                .map_err(|e| refuse(name, format!("{what} (no partition table) {e}")))?;
            erofs_only(name, fs)?;
            Ok(Verified { filesystem: fs, table: None, root_hash: None, outside_sha256: None })
        }
        (Role::Extension, Some(_), None) => Err(refuse(
            name,
            format!(
                "{what} has dm-verity parameters but no partition table, so no hash partition 2: the guest refuses to mount it"
            ),
        )),
        (_, _, Some(t)) => {
            let p1 = t.p1.ok_or_else(|| {
                refuse(
                    name,
                    format!(
                        "{what}'s {} partition table has no partition 1 (the data partition)",
                        t.kind.as_str().to_uppercase()
                    ),
                )
            })?;
            let fs = filesystem(f, p1.start, p1.size)
                .map_err(io)?
                .map_err(|e| refuse(name, format!("partition 1 of {what} {e}")))?;
            if role == Role::Extension {
                erofs_only(name, fs)?;
            }
            let (root_hash, outside_sha256) = match params {
                None => {
                    if role == Role::Extension && t.p2.is_some() {
                        return Err(refuse(
                            name,
                            "the extension has a dm-verity hash partition 2 but no verity parameters were given: the guest \
                             refuses to mount it unverified (give extensionVerityParams or extensionVerityPath)",
                        ));
                    }
                    (None, None)
                }
                Some(p) => {
                    let (root, data_bytes) = verify_tree(f, name, &t, p1, p, streamed)?;
                    (Some(root), Some(outside_sha256(f, len, p1.start, data_bytes).map_err(io)?))
                }
            };
            Ok(Verified { filesystem: fs, table: Some(t.kind.as_str()), root_hash, outside_sha256 })
        }
    }
}

fn erofs_only(name: &str, fs: Filesystem) -> anyhow::Result<()> {
    if fs != Filesystem::Erofs {
        return Err(refuse(
            name,
            format!("the extension holds {}, but the guest mounts extensions as erofs only", fs.wit_name()),
        ));
    }
    Ok(())
}

/// Verifies the tree over partition 1 against `p` and the hash area on partition 2: the
/// root hash and the bytes of data the tree covers.
fn verify_tree(
    f: &File,
    name: &str,
    t: &Table,
    p1: Part,
    p: &Params,
    streamed: Option<Streamed>,
) -> anyhow::Result<(String, u64)> {
    let Some(p2) = t.p2 else {
        return Err(refuse(
            name,
            format!(
                "the {} partition table has no partition 2, where the dm-verity hash tree must be",
                t.kind.as_str().to_uppercase()
            ),
        ));
    };
    let data_bytes = p
        .data_blocks
        .checked_mul(u64::from(p.data_block_size))
        .ok_or_else(|| refuse(name, "data_blocks × data_block_size overflows"))?;
    if data_bytes > p1.size {
        return Err(refuse(
            name,
            format!(
                "data_blocks={} × data_block_size={} = {data_bytes} bytes, more than partition 1 holds ({} bytes)",
                p.data_blocks, p.data_block_size, p1.size
            ),
        ));
    }
    let tree = match streamed {
        Some(s) if s.p1 == p1 && s.tree.computed_with(p) => s.tree,
        _ => {
            let mut b = TreeBuilder::new(p).map_err(|e| refuse(name, e))?;
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            while off < data_bytes {
                let n = (data_bytes - off).min(buf.len() as u64) as usize;
                read_at(f, p1.start + off, &mut buf[..n])
                    .map_err(|e| anyhow::Error::new(e).context(format!("reading {name}")))?;
                b.update(&buf[..n]);
                off += n as u64;
            }
            b.finish().map_err(|missing| refuse(name, format!("partition 1 ended {missing} bytes early")))?
        }
    };
    let hash_bytes = tree.hash_area_bytes();
    if hash_bytes > p2.size {
        return Err(refuse(
            name,
            format!(
                "partition 2 holds {} bytes, but the dm-verity hash tree of {} data blocks with hash_block_size={} needs {hash_bytes}",
                p2.size, p.data_blocks, p.hash_block_size
            ),
        ));
    }
    let computed = hex::encode(tree.root);
    if tree.root != p.root_hash {
        return Err(refuse(
            name,
            format!(
                "the dm-verity tree of partition 1 gives root hash {computed}, not the configured root_hash {} (salt, block sizes, data_blocks or the data differ)",
                hex::encode(p.root_hash)
            ),
        ));
    }
    let diff = tree
        .compare(|off, buf| read_at(f, p2.start + off, buf))
        .map_err(|e| anyhow::Error::new(e).context(format!("reading {name}")))?;
    if let Some(d) = diff {
        return Err(refuse(name, d));
    }
    Ok((computed, data_bytes))
}

/// The sha256 (64 hex) of the bytes of a measured file (`len` bytes) outside its data
/// blocks: before partition 1 (`data_start`), then from the end of the verified
/// `data_bytes` to the end of the file. The tree covers the data blocks and this the rest, so a
/// measured file's bytes are each hashed once at install (the blob's SHA-256 aside) and
/// any edit is found later. Only the small outside ranges are read.
fn outside_sha256(f: &File, len: u64, data_start: u64, data_bytes: u64) -> std::io::Result<String> {
    let data_end = data_start.saturating_add(data_bytes).min(len);
    let mut h = crate::hash::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for (mut off, end) in [(0, data_start.min(len)), (data_end, len)] {
        while off < end {
            let n = (end - off).min(buf.len() as u64) as usize;
            read_at(f, off, &mut buf[..n])?;
            h.update(&buf[..n]);
            off += n as u64;
        }
    }
    Ok(h.finish_hex())
}
