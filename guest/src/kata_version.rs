//! `kataVersion` / `ADDON_KATA_VERSION` (docs/configuration.md#kataversion): the Kata
//! release the addon was built for, in RPM's `[epoch:]version[-release]` form
//! (`3.25.0`, `3.25.0-6.el9`, `1:3.25.0-6.el9`). The runner compares it with the node's
//! Kata release; this module only checks the grammar.
//!
//! Grammar, as rpm accepts a `Version:` and `Release:` tag (rpmbuild refuses `-` inside
//! either, see rpm's `build/parseSpec.c` `rpmCharCheck`): each part is 1-64 characters
//! from `A-Za-z0-9._+~^`, starting with a letter or digit; the epoch is a decimal
//! number up to `u32::MAX`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::checks::{show, violation};
use crate::wit::{KataVersion, Violation, ViolationCode};

/// Longest version or release, in bytes.
const MAX_PART: usize = 64;

/// Whether `s` is one RPM version or release part.
fn is_part(s: &str) -> bool {
    match s.as_bytes().split_first() {
        Some((f, rest)) => {
            f.is_ascii_alphanumeric()
                && rest.len() < MAX_PART
                && rest.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'+' | b'~' | b'^'))
        }
        None => false,
    }
}

/// Parses a (trimmed) `kataVersion` value given as `key`; a bad value is a violation.
pub(crate) fn parse(key: &str, value: &str, errs: &mut Vec<Violation>) -> Option<KataVersion> {
    let accepted = "accepted: an RPM `version` or `version-release`, optionally with an `epoch:` \
                    (e.g. `3.25.0`, `3.25.0-6.el9`, `1:3.25.0-6.el9`), each part 1-64 characters from \
                    `A-Za-z0-9._+~^` starting with a letter or digit";
    let (epoch, rest) = match value.split_once(':') {
        Some((e, rest)) => match e.parse::<u32>() {
            Ok(n) if e.bytes().all(|b| b.is_ascii_digit()) => (Some(n), rest),
            _ => {
                errs.push(violation(
                    key,
                    ViolationCode::InvalidVersion,
                    format!("Kata version {}: the epoch {} is not a decimal number; {accepted}", show(value), show(e)),
                ));
                return None;
            }
        },
        None => (None, value),
    };
    let (version, release) = match rest.split_once('-') {
        Some((v, r)) => (v, Some(r)),
        None => (rest, None),
    };
    let bad = [Some(version), release].into_iter().flatten().find(|p| !is_part(p));
    if let Some(part) = bad {
        errs.push(violation(
            key,
            ViolationCode::InvalidVersion,
            format!("Kata version {} is invalid at {}; {accepted}", show(value), show(part)),
        ));
        return None;
    }
    Some(KataVersion { epoch, version: String::from(version), release: release.map(String::from) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(v: &str) -> KataVersion {
        let mut errs = Vec::new();
        let r = parse("kataVersion", v, &mut errs);
        assert!(errs.is_empty(), "{v}: {errs:?}");
        r.unwrap_or_else(|| panic!("{v}"))
    }

    #[test]
    fn rpm_versions_and_releases_are_read() {
        let v = ok("3.25.0");
        assert_eq!((v.epoch, v.version.as_str(), v.release), (None, "3.25.0", None));
        let v = ok("3.25.0-6.el9");
        assert_eq!((v.version.as_str(), v.release.as_deref()), ("3.25.0", Some("6.el9")));
        let v = ok("1:3.25.0~rc1-6.el9_4");
        assert_eq!((v.epoch, v.version.as_str(), v.release.as_deref()), (Some(1), "3.25.0~rc1", Some("6.el9_4")));
    }

    #[test]
    fn anything_else_is_refused_naming_the_key() {
        for bad in
            ["-1", "3.25.0-", "3.25.0-6-el9", "x:3.25", ":3", "3 25", "3.25/0", ".3", "3.25.0-.el9", "99999999999:1"]
        {
            let mut errs = Vec::new();
            assert!(parse("kataVersion", bad, &mut errs).is_none(), "{bad}");
            assert_eq!(errs.len(), 1, "{bad}");
            assert_eq!(errs[0].key, "kataVersion");
            assert!(errs[0].message.contains("3.25.0-6.el9"), "{}", errs[0].message);
        }
        let mut errs = Vec::new();
        assert!(parse("k", &"1".repeat(65), &mut errs).is_none());
    }
}
