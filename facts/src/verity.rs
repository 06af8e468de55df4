//! dm-verity parameters in Kata's `kernel_verity_params` form (docs/design.md#measured-guests):
//! `root_hash=<hex>,salt=<hex>,data_blocks=<n>,data_block_size=<n>,hash_block_size=<n>`.
//!
//! Accepted is what Kata's `parse_kernel_verity_params` (kata-types, and the Go runtime's
//! `ParseKernelVerityParams`) accepts AND what the guest can use: exactly these five keys,
//! each once (Kata keeps the last duplicate, the guest's mount script the first), no
//! unknown key, no empty field and no white space (the value lands on the kernel command
//! line); `root_hash` 64 lowercase hex (sha256); `salt` non-empty, even-length lowercase
//! hex; block sizes powers of two from 512 to 4096 (dm-verity in the guest needs at most
//! its page size; Kata requires multiples of 512); `data_blocks` at least 1, decimal
//! without sign or leading zero, and the data area (`data_blocks` × `data_block_size`)
//! must fit in 64 bits.

use alloc::string::String;
use core::fmt;

use crate::grammar::{is_lower_hex, is_sha256_hex, show};

/// The five keys, in Kata's canonical order.
pub const KEYS: [&str; 5] = ["root_hash", "salt", "data_blocks", "data_block_size", "hash_block_size"];
/// Smallest accepted block size, in bytes (Kata's `VERITY_BLOCK_SIZE_BYTES`).
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Largest accepted block size, in bytes (the guest's page size).
pub const MAX_BLOCK_SIZE: u32 = 4096;
/// Longest accepted parameter string, in bytes.
pub const MAX_LEN: usize = 1024;

/// Parsed, checked dm-verity parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VerityParams {
    /// Root hash: 64 lowercase hex (sha256).
    pub root_hash: String,
    /// Salt: non-empty, even-length lowercase hex.
    pub salt: String,
    /// Number of data blocks (at least 1).
    pub data_blocks: u64,
    /// Data block size in bytes: a power of two, 512..=4096.
    pub data_block_size: u32,
    /// Hash block size in bytes: a power of two, 512..=4096.
    pub hash_block_size: u32,
}

impl VerityParams {
    /// Bytes of data the hash tree covers (`data_blocks` × `data_block_size`).
    pub fn data_bytes(&self) -> u64 {
        self.data_blocks.saturating_mul(u64::from(self.data_block_size))
    }
}

/// The canonical `kernel_verity_params` text (keys in [`KEYS`] order).
impl fmt::Display for VerityParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "root_hash={},salt={},data_blocks={},data_block_size={},hash_block_size={}",
            self.root_hash, self.salt, self.data_blocks, self.data_block_size, self.hash_block_size
        )
    }
}

/// Why a parameter string is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerityError {
    /// Empty (or only white space).
    Empty,
    /// Longer than [`MAX_LEN`] bytes (the length).
    TooLong(usize),
    /// Contains white space or a control character.
    Space,
    /// An empty field (`,,`, or a leading or trailing `,`).
    EmptyField,
    /// A field without `=` (the field).
    NoValue(String),
    /// A key that is not one of [`KEYS`] (the key).
    Unknown(String),
    /// A key given more than once (the key).
    Duplicate(&'static str),
    /// A key not given (the key).
    Missing(&'static str),
    /// `root_hash` is not 64 lowercase hex (the value).
    RootHash(String),
    /// `salt` is not non-empty, even-length lowercase hex (the value).
    Salt(String),
    /// A number that is not plain decimal in range (the key, the value).
    Number(&'static str, String),
    /// A block size that is not a power of two from 512 to 4096 (the key, the value).
    BlockSize(&'static str, u64),
    /// `data_blocks` is 0.
    NoDataBlocks,
    /// `data_blocks` × `data_block_size` does not fit in 64 bits.
    TooLarge,
}

impl fmt::Display for VerityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FORM: &str = "root_hash=<64 hex>,salt=<hex>,data_blocks=<n>,data_block_size=<n>,hash_block_size=<n>";
        match self {
            VerityError::Empty => write!(f, "the dm-verity parameters are empty: give `{FORM}`"),
            VerityError::TooLong(n) => {
                write!(f, "the dm-verity parameters are {n} bytes long: at most {MAX_LEN} are accepted")
            }
            VerityError::Space => {
                write!(
                    f,
                    "the dm-verity parameters contain white space or control characters: give `{FORM}` as one word"
                )
            }
            VerityError::EmptyField => {
                write!(f, "the dm-verity parameters have an empty field (`,,` or a `,` at either end): give `{FORM}`")
            }
            VerityError::NoValue(field) => {
                write!(f, "dm-verity field {} has no `=<value>`: give `{FORM}`", show(field))
            }
            VerityError::Unknown(k) => write!(f, "unknown dm-verity key {}: the keys are {}", show(k), KEYS.join(", ")),
            VerityError::Duplicate(k) => {
                write!(f, "dm-verity key `{k}` is given more than once: give each key exactly once")
            }
            VerityError::Missing(k) => write!(f, "dm-verity key `{k}` is missing: give all of {}", KEYS.join(", ")),
            VerityError::RootHash(v) => {
                write!(f, "dm-verity root_hash {} is invalid: exactly 64 lowercase hex characters (sha256)", show(v))
            }
            VerityError::Salt(v) => {
                write!(f, "dm-verity salt {} is invalid: a non-empty, even number of lowercase hex characters", show(v))
            }
            VerityError::Number(k, v) => {
                write!(f, "dm-verity {k} {} is not a number: decimal digits, no sign or leading zero", show(v))
            }
            VerityError::BlockSize(k, v) => write!(
                f,
                "dm-verity {k} {v} is not accepted: a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE} (the guest's page size)"
            ),
            VerityError::NoDataBlocks => {
                f.write_str("dm-verity data_blocks is 0: the data area has at least one block")
            }
            VerityError::TooLarge => f.write_str("dm-verity data_blocks × data_block_size does not fit in 64 bits"),
        }
    }
}

/// Plain decimal: digits only, no sign, no leading zero (a shell reads `0512` as octal).
fn decimal(key: &'static str, v: &str) -> Result<u64, VerityError> {
    let plain = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && (v == "0" || !v.starts_with('0'));
    match v.parse::<u64>() {
        Ok(n) if plain => Ok(n),
        _ => Err(VerityError::Number(key, String::from(v))),
    }
}

fn block_size(key: &'static str, v: &str) -> Result<u32, VerityError> {
    let n = decimal(key, v)?;
    match u32::try_from(n) {
        Ok(s) if s.is_power_of_two() && (MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&s) => Ok(s),
        _ => Err(VerityError::BlockSize(key, n)),
    }
}

/// Parses and checks a `kernel_verity_params` string (see the module documentation).
pub fn parse(s: &str) -> Result<VerityParams, VerityError> {
    if s.len() > MAX_LEN {
        return Err(VerityError::TooLong(s.len()));
    }
    if s.trim().is_empty() {
        return Err(VerityError::Empty);
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(VerityError::Space);
    }
    let mut values: [Option<&str>; 5] = [None; 5];
    for field in s.split(',') {
        if field.is_empty() {
            return Err(VerityError::EmptyField);
        }
        let Some((key, value)) = field.split_once('=') else {
            return Err(VerityError::NoValue(String::from(field)));
        };
        let Some(i) = KEYS.iter().position(|k| *k == key) else {
            return Err(VerityError::Unknown(String::from(key)));
        };
        if values[i].replace(value).is_some() {
            return Err(VerityError::Duplicate(KEYS[i]));
        }
    }
    let get = |i: usize| values[i].ok_or(VerityError::Missing(KEYS[i]));
    let (root_hash, salt) = (get(0)?, get(1)?);
    if !is_sha256_hex(root_hash) {
        return Err(VerityError::RootHash(String::from(root_hash)));
    }
    if salt.is_empty() || !salt.len().is_multiple_of(2) || !is_lower_hex(salt) {
        return Err(VerityError::Salt(String::from(salt)));
    }
    let data_blocks = decimal(KEYS[2], get(2)?)?;
    let data_block_size = block_size(KEYS[3], get(3)?)?;
    let hash_block_size = block_size(KEYS[4], get(4)?)?;
    if data_blocks == 0 {
        return Err(VerityError::NoDataBlocks);
    }
    if data_blocks.checked_mul(u64::from(data_block_size)).is_none() {
        return Err(VerityError::TooLarge);
    }
    Ok(VerityParams {
        root_hash: String::from(root_hash),
        salt: String::from(salt),
        data_blocks,
        data_block_size,
        hash_block_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn good() -> String {
        format!("root_hash={H},salt=00ff,data_blocks=1024,data_block_size=4096,hash_block_size=4096")
    }

    #[test]
    fn the_canonical_form_round_trips() {
        let p = parse(&good()).expect("good");
        assert_eq!(p.data_blocks, 1024);
        assert_eq!(p.to_string(), good());
        let shuffled = format!("salt=00ff,hash_block_size=512,root_hash={H},data_block_size=512,data_blocks=1");
        let q = parse(&shuffled).expect("any order");
        assert_eq!(parse(&q.to_string()), Ok(q));
    }

    #[test]
    fn everything_kata_or_the_guest_would_not_take_is_refused() {
        let with = |from: &str, to: &str| good().replacen(from, to, 1);
        let cases: [(String, VerityError); 19] = [
            (String::new(), VerityError::Empty),
            (format!("{},", good()), VerityError::EmptyField),
            (format!("{} ", good()), VerityError::Space),
            (format!("{},salt=00", good()), VerityError::Duplicate("salt")),
            (format!("{},root_hash={H}", good()), VerityError::Duplicate("root_hash")),
            (format!("{},hash_algorithm=sha256", good()), VerityError::Unknown("hash_algorithm".into())),
            (format!("{},x", good()), VerityError::NoValue("x".into())),
            (with(",salt=00ff", ""), VerityError::Missing("salt")),
            (with("root_hash=0", "root_hash=A"), VerityError::RootHash(format!("A{}", &H[1..]))),
            (with("salt=00ff", "salt=0ff"), VerityError::Salt("0ff".into())),
            (with("salt=00ff", "salt="), VerityError::Salt(String::new())),
            (with("salt=00ff", "salt=00FF"), VerityError::Salt("00FF".into())),
            (with("data_blocks=1024", "data_blocks=0"), VerityError::NoDataBlocks),
            (with("data_blocks=1024", "data_blocks=+1"), VerityError::Number("data_blocks", "+1".into())),
            (with("data_blocks=1024", "data_blocks=01"), VerityError::Number("data_blocks", "01".into())),
            (with("data_block_size=4096", "data_block_size=8192"), VerityError::BlockSize("data_block_size", 8192)),
            (with("hash_block_size=4096", "hash_block_size=1536"), VerityError::BlockSize("hash_block_size", 1536)),
            (with("hash_block_size=4096", "hash_block_size=256"), VerityError::BlockSize("hash_block_size", 256)),
            (with("data_blocks=1024", "data_blocks=18446744073709551615"), VerityError::TooLarge),
        ];
        for (s, want) in cases {
            assert_eq!(parse(&s), Err(want), "{s}");
        }
        assert_eq!(parse(&"x".repeat(MAX_LEN + 1)), Err(VerityError::TooLong(MAX_LEN + 1)));
    }
}
