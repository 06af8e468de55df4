//! Keys naming files on the node (not in the image): `seHostKeyDocuments` /
//! `ADDON_SE_HOST_KEY_DOCUMENTS` (docs/attestation.md#host-key-documents), comma-separated
//! clean absolute node paths. Entries are trimmed, duplicates collapsed (first kept, order
//! kept). The runner reads them beneath `--root`; this module only checks the grammar.

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::checks::{check_path, violation};
use crate::wit::{Violation, ViolationCode};

/// Most distinct paths one key names (an SE image has at most a few host key slots;
/// a fleet names one document per machine model).
pub(crate) const MAX_PATHS: usize = 16;

/// The paths of a (trimmed) comma-separated value of `key`, each once, in order.
pub(crate) fn parse(key: &str, value: &str, errs: &mut Vec<Violation>) -> Vec<String> {
    let entries = value.bytes().filter(|b| *b == b',').count().saturating_add(1);
    if entries > 2 * MAX_PATHS {
        errs.push(violation(
            key,
            ViolationCode::InvalidPath,
            format!("`{key}` has {entries} comma-separated entries: at most {MAX_PATHS} node paths are accepted"),
        ));
        return Vec::new();
    }
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for (i, entry) in value.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            errs.push(violation(
                key,
                ViolationCode::InvalidPath,
                format!(
                    "`{key}` entry {} is empty: give comma-separated absolute node paths, e.g. \
                     `/etc/kata-containers/hkd/HKD-3931-0123456.crt`",
                    i + 1
                ),
            ));
        } else if let Err(e) = check_path(entry) {
            errs.push(violation(key, ViolationCode::InvalidPath, format!("`{key}` entry {}: {e}", i + 1)));
        } else if seen.insert(entry) {
            out.push(String::from(entry));
        }
    }
    if out.len() > MAX_PATHS {
        errs.push(violation(
            key,
            ViolationCode::InvalidPath,
            format!("`{key}` names {} files: at most {MAX_PATHS}", out.len()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_trimmed_deduplicated_and_checked() {
        let mut errs = Vec::new();
        assert_eq!(parse("k", "/a/b.crt, /c.crt ,/a/b.crt", &mut errs), ["/a/b.crt", "/c.crt"]);
        assert!(errs.is_empty());
        for bad in ["a.crt", "/a/../b", "/a,,/b", "/"] {
            let mut errs = Vec::new();
            parse("k", bad, &mut errs);
            assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
            assert_eq!(errs[0].key, "k");
        }
        let many: Vec<String> = (0..17).map(|i| format!("/h{i}")).collect();
        let mut errs = Vec::new();
        parse("k", &many.join(","), &mut errs);
        assert_eq!(errs.len(), 1);
    }
}
