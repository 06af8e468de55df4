//! Small validators shared by the policy: paths, tags, versions, sha256 values,
//! message quoting and "did you mean" suggestions.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// Longest accepted path, in bytes.
pub(crate) const MAX_PATH: usize = 4096;

/// Quotes a value for a message: backticks, control characters escaped, long values cut.
pub(crate) fn show(s: &str) -> String {
    const MAX_CHARS: usize = 80;
    let mut out = String::from("`");
    for (i, c) in s.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('`');
    out
}

/// Checks an absolute, normalised, clean path; `Err` explains what is accepted.
pub(crate) fn check_path(p: &str) -> Result<(), String> {
    if p.len() > MAX_PATH {
        return Err(format!("path is {} bytes long: at most {MAX_PATH} bytes are accepted", p.len()));
    }
    if let Some(c) = p.chars().find(|c| c.is_control()) {
        return Err(format!(
            "path {} contains the control character {}: paths must be plain text",
            show(p),
            c.escape_default()
        ));
    }
    if !p.starts_with('/') {
        return Err(format!("path {} is not absolute: it must start with `/` (e.g. `/boot/vmlinuz`)", show(p)));
    }
    if p == "/" {
        return Err(String::from("path `/` names a directory: give the path of a file (e.g. `/boot/vmlinuz`)"));
    }
    if p.ends_with('/') {
        return Err(format!("path {} ends with `/`: give the path of a file, without a trailing `/`", show(p)));
    }
    if p.contains("//") {
        return Err(format!("path {} is not normalised: it contains `//`", show(p)));
    }
    if p.split('/').any(|c| c == "." || c == "..") {
        return Err(format!("path {} is not normalised: `.` and `..` components are not accepted", show(p)));
    }
    Ok(())
}

/// Tag grammar: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub(crate) fn is_tag(t: &str) -> bool {
    let b = t.as_bytes();
    match b.split_first() {
        Some((first, rest)) => {
            (first.is_ascii_alphanumeric() || *first == b'_')
                && rest.len() <= 127
                && rest.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        }
        None => false,
    }
}

/// Version grammar: `[A-Za-z0-9][A-Za-z0-9._+-]{0,127}`.
pub(crate) fn is_version(v: &str) -> bool {
    let b = v.as_bytes();
    match b.split_first() {
        Some((first, rest)) => {
            first.is_ascii_alphanumeric()
                && rest.len() <= 127
                && rest.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'+' | b'-'))
        }
        None => false,
    }
}

/// Exactly 64 lowercase hex characters.
pub(crate) fn is_sha256_hex(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
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
