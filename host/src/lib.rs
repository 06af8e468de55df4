//! kata-addons: the native runner. It alone performs side effects; every decision about
//! keys, defaults, validation and TOML is made by the policy guest (`guest/`).

pub mod cli;

/// The embedded policy component, built from `guest/` by `build.rs`.
pub const GUEST_WASM: &[u8] = include_bytes!(env!("KATA_ADDONS_GUEST_WASM"));
