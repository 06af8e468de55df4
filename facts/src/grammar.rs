//! Small grammars of the contract (docs/design.md#configmap-keys): how a value is read,
//! clean absolute paths, versions, tags, sha256 values and Kata configuration file names.
//! Each is defined here once; the policy guest turns a refusal into a violation, the runner
//! into an error.

use alloc::string::String;
use core::fmt;

/// Longest accepted path (in-image or node), in bytes: Linux's `PATH_MAX`.
pub const MAX_PATH: usize = 4096;
/// Longest accepted file name (one path component), in bytes: Linux's `NAME_MAX`.
pub const MAX_FILE_NAME: usize = 255;
/// Longest accepted tag or version, in characters.
pub const MAX_LABEL: usize = 128;

/// A value as the contract reads it: trimmed; `None` when empty after trimming (= absent).
pub fn trimmed(value: &str) -> Option<&str> {
    let v = value.trim();
    if v.is_empty() { None } else { Some(v) }
}

/// Whether a character must not reach a message, a log line or a terminal as it is: a
/// control character (C0, DEL, C1), or an invisible one that reorders or breaks the text
/// around it (the bidirectional marks, embeddings, overrides and isolates U+061C, U+200E,
/// U+200F, U+202A-U+202E, U+2066-U+2069; the line and paragraph separators U+2028, U+2029).
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Text from outside (a file, a ConfigMap, an image) as a message shows it: every
/// [`is_unsafe_char`] escaped (`\n`, `\u{202e}`), everything else as it is. Every message
/// that echoes input text formats it through this (or [`show`]).
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        for c in self.0.chars() {
            if is_unsafe_char(c) {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// A value quoted for a message: backticks, [`is_unsafe_char`] characters escaped, long
/// values cut.
pub fn show(s: &str) -> String {
    const MAX_CHARS: usize = 80;
    let mut out = String::from("`");
    for (i, c) in s.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        if is_unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('`');
    out
}

/// Why a path is not a clean absolute path of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// Longer than [`MAX_PATH`] bytes (the length).
    TooLong(usize),
    /// Contains a control character (the path, the character).
    Control(String, char),
    /// Does not start with `/`.
    Relative(String),
    /// Is `/` itself.
    Root,
    /// Ends with `/`.
    TrailingSlash(String),
    /// Contains `//`.
    DoubleSlash(String),
    /// Has a `.` or `..` component.
    DotComponent(String),
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathError::TooLong(n) => write!(f, "path is {n} bytes long: at most {MAX_PATH} bytes are accepted"),
            PathError::Control(p, c) => write!(
                f,
                "path {} contains the control character {}: paths must be plain text",
                show(p),
                c.escape_default()
            ),
            PathError::Relative(p) => {
                write!(f, "path {} is not absolute: it must start with `/` (e.g. `/boot/vmlinuz`)", show(p))
            }
            PathError::Root => {
                f.write_str("path `/` names a directory: give the path of a file (e.g. `/boot/vmlinuz`)")
            }
            PathError::TrailingSlash(p) => {
                write!(f, "path {} ends with `/`: give the path of a file, without a trailing `/`", show(p))
            }
            PathError::DoubleSlash(p) => write!(f, "path {} is not normalised: it contains `//`", show(p)),
            PathError::DotComponent(p) => {
                write!(f, "path {} is not normalised: `.` and `..` components are not accepted", show(p))
            }
        }
    }
}

/// Checks a clean absolute path of a file: starts with `/`, not `/` itself, no `//`, `.`
/// or `..` component, no trailing `/`, no control character, at most [`MAX_PATH`] bytes.
pub fn check_path(p: &str) -> Result<(), PathError> {
    if p.len() > MAX_PATH {
        return Err(PathError::TooLong(p.len()));
    }
    if let Some(c) = p.chars().find(|c| c.is_control()) {
        return Err(PathError::Control(String::from(p), c));
    }
    if !p.starts_with('/') {
        return Err(PathError::Relative(String::from(p)));
    }
    if p == "/" {
        return Err(PathError::Root);
    }
    if p.ends_with('/') {
        return Err(PathError::TrailingSlash(String::from(p)));
    }
    if p.contains("//") {
        return Err(PathError::DoubleSlash(String::from(p)));
    }
    if p.split('/').any(|c| c == "." || c == "..") {
        return Err(PathError::DotComponent(String::from(p)));
    }
    Ok(())
}

/// Whether `p` passes [`check_path`].
pub fn is_clean_path(p: &str) -> bool {
    check_path(p).is_ok()
}

/// One plain path component: not empty, `.` or `..`, no `/`, no control character, at
/// most [`MAX_FILE_NAME`] bytes.
pub fn is_plain_file_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_FILE_NAME
        && n != "."
        && n != ".."
        && !n.contains('/')
        && !n.chars().any(char::is_control)
}

/// A Kata runtime configuration file name: `configuration*.toml`.
pub fn is_configuration_file_name(name: &str) -> bool {
    name.starts_with("configuration") && name.ends_with(".toml")
}

/// The file name of a path (after the last `/`).
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Tag grammar: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn is_tag(t: &str) -> bool {
    label(
        t,
        |c| c.is_ascii_alphanumeric() || c == b'_',
        |c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'),
    )
}

/// A character of the version grammar: `[A-Za-z0-9._+-]`.
pub fn is_version_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'+' | b'-')
}

/// Version grammar: `[A-Za-z0-9][A-Za-z0-9._+-]{0,127}` (it may appear in node paths).
pub fn is_version(v: &str) -> bool {
    label(v, |c| c.is_ascii_alphanumeric(), is_version_char)
}

/// `first` then at most `MAX_LABEL - 1` bytes of `rest`.
fn label(s: &str, first: impl Fn(u8) -> bool, rest: impl Fn(u8) -> bool) -> bool {
    match s.as_bytes().split_first() {
        Some((f, r)) => first(*f) && r.len() < MAX_LABEL && r.iter().all(|c| rest(*c)),
        None => false,
    }
}

/// Longest DNS-1123 label, in characters.
pub const MAX_DNS_LABEL: usize = 63;

/// A DNS-1123 label (Kubernetes `IsDNS1123Label`, what `RuntimeClass.handler` must be):
/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most [`MAX_DNS_LABEL`] characters.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            b.len() <= MAX_DNS_LABEL
                && *f != b'-'
                && *l != b'-'
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        }
        _ => false,
    }
}

/// Exactly 64 lowercase hex characters (a sha256 value).
pub fn is_sha256_hex(h: &str) -> bool {
    h.len() == 64 && is_lower_hex(h)
}

/// Only `0-9a-f` (empty is true).
pub fn is_lower_hex(h: &str) -> bool {
    h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// `sha256:` followed by 64 lowercase hex characters (a content digest).
pub fn is_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(is_sha256_hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert!(is_clean_path("/etc/kata-containers/addons"));
        for bad in ["", "etc", "/", "/a/", "/a//b", "/a/./b", "/a/../b", "/..", "/a\n"] {
            assert!(!is_clean_path(bad), "{bad:?}");
        }
        let long = alloc::format!("/{}", "a".repeat(MAX_PATH - 1));
        assert!(is_clean_path(&long));
        assert_eq!(check_path(&alloc::format!("{long}b")), Err(PathError::TooLong(MAX_PATH + 1)));
        assert!(is_plain_file_name("kernel") && !is_plain_file_name("..") && !is_plain_file_name("a/b"));
        assert!(is_configuration_file_name("configuration-qemu-tdx.toml"));
        assert!(!is_configuration_file_name("shadow"));
        assert_eq!(file_name("/a/b/configuration.toml"), "configuration.toml");
    }

    #[test]
    fn labels() {
        assert!(is_tag("_t") && is_tag(&"t".repeat(128)) && !is_tag(&"t".repeat(129)));
        assert!(!is_tag(".v1") && !is_tag("-v1") && !is_tag("") && !is_tag("v 1"));
        assert!(is_version("2.0+x") && !is_version("_v") && !is_version(&"v".repeat(129)));
        assert!(is_sha256_digest(&alloc::format!("sha256:{}", "a".repeat(64))));
        assert!(!is_sha256_hex(&"A".repeat(64)) && !is_sha256_hex("abc"));
    }

    #[test]
    fn values_are_trimmed_and_blank_is_absent() {
        assert_eq!(trimmed("  a b \n"), Some("a b"));
        assert_eq!(trimmed(" \t\n"), None);
        assert_eq!(trimmed(""), None);
        assert_eq!(show("a\nb"), "`a\\nb`");
        assert_eq!(show("a\u{202e}b\u{2066}\u{85}"), "`a\\u{202e}b\\u{2066}\\u{85}`");
        assert_eq!(alloc::format!("{}", Escaped("vmlinuz\u{202e}zg.\x1b[2J")), "vmlinuz\\u{202e}zg.\\u{1b}[2J");
        assert_eq!(alloc::format!("{}", Escaped("plain/ü")), "plain/ü");
    }
}
