//! Which filesystem a data partition holds, from its superblock magic: ext4 (also ext2/3,
//! which the guest's ext4 driver mounts), xfs and erofs, the `rootfs_type` values Kata knows.

/// Bytes of a partition's start that hold every superblock looked at.
pub(crate) const PROBE_BYTES: usize = 2048;

/// A filesystem Kata can boot from or mount as an extension: the WIT `filesystem`, whose
/// name is Kata's `rootfs_type` value.
pub use crate::policy::Filesystem;

/// ext2/3/4: `s_magic` (le16 0xEF53) at byte 56 of the superblock at offset 1024.
fn is_ext4(b: &[u8]) -> bool {
    b[1024 + 56..1024 + 58] == [0x53, 0xef]
}

/// XFS: `sb_magicnum` "XFSB" at offset 0.
fn is_xfs(b: &[u8]) -> bool {
    &b[0..4] == b"XFSB"
}

/// EROFS: `magic` (le32 0xE0F5E1E2) at the superblock's offset 1024.
fn is_erofs(b: &[u8]) -> bool {
    b[1024..1028] == [0xe2, 0xe1, 0xf5, 0xe0]
}

/// The filesystem whose superblock starts the partition (its first [`PROBE_BYTES`],
/// zero-padded when the partition is shorter); an error when none or several match.
pub(crate) fn detect(start: &[u8]) -> Result<Filesystem, String> {
    let mut b = [0u8; PROBE_BYTES];
    let n = start.len().min(PROBE_BYTES);
    b[..n].copy_from_slice(&start[..n]);
    let found: Vec<Filesystem> =
        [(Filesystem::Ext4, is_ext4(&b)), (Filesystem::Xfs, is_xfs(&b)), (Filesystem::Erofs, is_erofs(&b))]
            .into_iter()
            .filter_map(|(f, hit)| hit.then_some(f))
            .collect();
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err("holds no ext4, xfs or erofs superblock (the filesystems Kata boots with rootfs_type)".to_string()),
        many => Err(format!(
            "carries the superblock magic of several filesystems ({}): which one the guest would mount is unclear",
            many.iter().map(|f| f.wit_name()).collect::<Vec<_>>().join(", ")
        )),
    }
}
