//! The policy's view of the shared grammars (paths, versions, sha256 values, message
//! quoting: `kata-addons-facts`), and "did you mean" suggestions for unknown keys.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

pub(crate) use kata_addons_facts::{is_sha256_hex, is_version, show};

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
