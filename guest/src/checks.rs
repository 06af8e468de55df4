//! The policy's view of the shared grammars (paths, versions, sha256 values, message
//! quoting: `kata-addons-facts`), extension names, the one violation constructor, and
//! "did you mean" suggestions for unknown keys.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

pub(crate) use kata_addons_facts::{is_sha256_hex, is_version, show};

use crate::wit::{Violation, ViolationCode};

/// Bytes of a virtio-blk device ID (`VIRTIO_BLK_ID_BYTES` in the virtio specification and
/// Linux' `drivers/block/virtio_blk.c`): the serial the guest reads is at most this long.
pub(crate) const VIRTIO_BLK_ID_BYTES: usize = 20;
/// Prefix of an extension's virtio-blk serial (Kata's `extension-<name>`).
pub(crate) const SERIAL_PREFIX: &str = "extension-";
/// Longest extension name: `extension-<name>` must fit [`VIRTIO_BLK_ID_BYTES`].
pub(crate) const MAX_NAME: usize = VIRTIO_BLK_ID_BYTES - SERIAL_PREFIX.len();

/// One problem with the input, naming the key (or input) at fault.
pub(crate) fn violation(key: &str, code: ViolationCode, message: String) -> Violation {
    Violation { key: String::from(key), code, message }
}

/// Checks an extension name as Kata's loader does and against the virtio-blk ID size.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!(
            "extension name {} is invalid: only ASCII letters, digits, `-` and `_` (Kata puts it in the virtio-blk \
             serial and in `kata.extension.<name>.verity_params` on the guest command line)",
            show(name)
        ));
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "extension name {} is {} bytes: the guest finds the disk by its serial `{SERIAL_PREFIX}<name>` and a \
             virtio-blk ID holds {VIRTIO_BLK_ID_BYTES} bytes, so at most {MAX_NAME} are accepted",
            show(name),
            name.len()
        ));
    }
    Ok(())
}

/// Checks a clean absolute path (the shared grammar); `Err` explains what is accepted.
pub(crate) fn check_path(p: &str) -> Result<(), String> {
    kata_addons_facts::check_path(p).map_err(|e| e.to_string())
}

/// Levenshtein distance over chars.
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur: Vec<usize> = Vec::with_capacity(b.len() + 1);
    for (i, ca) in a.chars().enumerate() {
        cur.clear();
        cur.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            let del = prev[j + 1] + 1;
            let ins = cur[j] + 1;
            cur.push(sub.min(del).min(ins));
        }
        core::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Folds a key for comparison: lowercase, no `_`/`-`, no leading `addon`.
fn fold(key: &str) -> String {
    let s: String = key.chars().filter(|c| *c != '_' && *c != '-').flat_map(char::to_lowercase).collect();
    match s.strip_prefix("addon") {
        Some(rest) if !rest.is_empty() => String::from(rest),
        _ => s,
    }
}

/// The known key closest to `key` (case-insensitive, ignoring `_`, `-` and an
/// `ADDON_`/`addon` prefix), if it is close enough to be a likely typo.
pub(crate) fn suggest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    if key.chars().count() > 64 {
        return None;
    }
    let k = fold(key);
    let mut best: Option<(usize, &'a str)> = None;
    for cand in known {
        let c = fold(cand);
        let d = distance(&k, &c);
        let limit = core::cmp::max(2, c.chars().count() / 3);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, cand));
        }
    }
    best.map(|(_, c)| c)
}
