//! The one YAML reader (ConfigMaps, registries.d): serde_norway, after a nesting-depth
//! check made while parsing, by the same parser.
//!
//! libyaml's scanner does work proportional to the open flow collections (`[`, `{`) for
//! every token, so a document of 1 MiB nested 500,000 levels deep costs hours before
//! serde_norway's recursion limit is reached (it applies it after the whole document is
//! parsed). [`check_depth`] drives the same parser (unsafe-libyaml-norway, the libyaml
//! port serde_norway uses) event by event and stops at the first collection deeper than
//! [`MAX_DEPTH`]: what it sees is exactly what the parse will see, and it stops while
//! the scanner holds at most [`MAX_DEPTH`] collections plus its bounded look-ahead, so the
//! check and the parse after it are linear in the input.

use std::mem::MaybeUninit;

use anyhow::{Result, bail};
use kata_addons_facts::show;
use serde::de::DeserializeOwned;
use unsafe_libyaml_norway as unsafe_yaml;

/// Deepest nesting of collections accepted (a ConfigMap is 2 deep, its `managedFields`
/// about 8; registries.d files 3). serde_norway's own recursion limit is 128.
pub(crate) const MAX_DEPTH: usize = 64;

/// Parses a YAML (or JSON) document into `T`, refusing one nested deeper than [`MAX_DEPTH`].
pub(crate) fn from_str<T: DeserializeOwned>(text: &str) -> Result<T> {
    check_depth(text)?;
    Ok(serde_norway::from_str(text)?)
}

/// One open collection while checking.
struct Frame {
    /// A mapping (whose scalars alternate key, value) rather than a sequence.
    mapping: bool,
    /// Events seen directly in this mapping (even: the next one is a key).
    items: usize,
    /// The last key seen in this mapping.
    key: Option<String>,
}

/// The libyaml parser, deleted when dropped.
struct Parser(Box<MaybeUninit<unsafe_yaml::yaml_parser_t>>);

impl Drop for Parser {
    fn drop(&mut self) {
        // SAFETY: the parser was initialised by `yaml_parser_initialize` (`Parser` exists
        // only then) and is deleted once, here.
        unsafe { unsafe_yaml::yaml_parser_delete(self.0.as_mut_ptr()) }
    }
}

/// Refuses a document with a collection nested deeper than [`MAX_DEPTH`], naming where
/// (the keys leading to it, line and column). A syntax error is left for the parse to report.
pub(crate) fn check_depth(text: &str) -> Result<()> {
    let mut raw = Box::new(MaybeUninit::<unsafe_yaml::yaml_parser_t>::uninit());
    // SAFETY: `raw` is a writable allocation of the parser type; initialising it is what
    // `yaml_parser_initialize` is for.
    if unsafe { unsafe_yaml::yaml_parser_initialize(raw.as_mut_ptr()) }.fail {
        bail!("the YAML parser could not be set up");
    }
    let mut parser = Parser(raw);
    let p = parser.0.as_mut_ptr();
    // SAFETY: `p` is an initialised parser; `text` outlives it (it is dropped at the end of
    // this function, before `text` can go), and libyaml only reads the input.
    unsafe {
        unsafe_yaml::yaml_parser_set_encoding(p, unsafe_yaml::YAML_UTF8_ENCODING);
        unsafe_yaml::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
    }
    let mut frames: Vec<Frame> = Vec::new();
    loop {
        let mut event = MaybeUninit::<unsafe_yaml::yaml_event_t>::uninit();
        // SAFETY: `p` is an initialised parser, `event` a writable event that
        // `yaml_parser_parse` fills in when it succeeds.
        if unsafe { unsafe_yaml::yaml_parser_parse(p, event.as_mut_ptr()) }.fail {
            return Ok(()); // a syntax error: serde_norway reports it, with its position
        }
        // SAFETY: the parse succeeded, so the event is initialised.
        let ev = unsafe { event.assume_init_mut() };
        let kind = ev.type_;
        let at = (ev.start_mark.line + 1, ev.start_mark.column + 1);
        let scalar = (kind == unsafe_yaml::YAML_SCALAR_EVENT).then(|| {
            // SAFETY: a scalar event's `data.scalar` holds `length` bytes at `value`.
            unsafe {
                let s = ev.data.scalar;
                String::from_utf8_lossy(std::slice::from_raw_parts(s.value, s.length as usize)).into_owned()
            }
        });
        // SAFETY: an event filled in by `yaml_parser_parse`, deleted once.
        unsafe { unsafe_yaml::yaml_event_delete(ev) };
        let opens = kind == unsafe_yaml::YAML_SEQUENCE_START_EVENT || kind == unsafe_yaml::YAML_MAPPING_START_EVENT;
        let node = opens || kind == unsafe_yaml::YAML_SCALAR_EVENT || kind == unsafe_yaml::YAML_ALIAS_EVENT;
        if node && let Some(f) = frames.last_mut() {
            if f.mapping && f.items.is_multiple_of(2) {
                f.key = Some(scalar.clone().unwrap_or_else(|| "(a complex key)".to_string()));
            }
            f.items += 1;
        }
        if opens {
            if frames.len() >= MAX_DEPTH {
                let keys: Vec<&str> = frames.iter().filter_map(|f| f.key.as_deref()).take(4).collect();
                let under = if keys.is_empty() { String::new() } else { format!(" under {}", show(&keys.join("."))) };
                bail!(
                    "collections are nested more than {MAX_DEPTH} deep{under} (line {}, column {}): at most \
                     {MAX_DEPTH} levels are read",
                    at.0,
                    at.1
                );
            }
            frames.push(Frame { mapping: kind == unsafe_yaml::YAML_MAPPING_START_EVENT, items: 0, key: None });
        } else if kind == unsafe_yaml::YAML_SEQUENCE_END_EVENT || kind == unsafe_yaml::YAML_MAPPING_END_EVENT {
            frames.pop();
        } else if kind == unsafe_yaml::YAML_STREAM_END_EVENT {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_checked_while_parsing() {
        let ok = format!("a: {}{}\n", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        check_depth(&ok).expect("64 levels");
        let deep = format!("addonImage: {}{}\n", "[".repeat(520_000), "]".repeat(520_000));
        let started = std::time::Instant::now();
        let e = format!("{:#}", check_depth(&deep).expect_err("too deep"));
        assert!(e.contains("more than 64 deep under `addonImage` (line 1, column"), "{e}");
        let e = format!("{:#}", from_str::<serde_norway::Value>(&deep).expect_err("too deep"));
        assert!(e.contains("nested more than 64"), "{e}");
        let block = format!("data:\n  k:\n  {}x\n", "- ".repeat(100_000));
        let e = format!("{:#}", check_depth(&block).expect_err("too deep"));
        assert!(e.contains("under `data.k`"), "{e}");
        let unclosed = format!("a: {}", "{b: ".repeat(520_000));
        assert!(check_depth(&unclosed).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
        check_depth("a: [").expect("a syntax error is the parser's to report");
        assert!(from_str::<serde_norway::Value>("a: [").is_err());
    }
}
