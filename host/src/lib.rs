//! kata-addons: the native runner. It alone performs side effects; every decision about
//! keys, defaults, validation and TOML is made by the policy guest (`guest/`).
//!
//! Items are `pub(crate)` by default. What stays `pub` is the narrow surface that the binary
//! (`main.rs`: the command line, `run`, logging and exit codes) and the integration tests,
//! benches and examples use: the pure parts they check against real peers (ConfigMap
//! parsing, the policy component, references, the dm-verity check, extraction limits). The
//! modules only the commands reach (install, daemon, state, lock, ...) are private.

pub mod attest;
pub mod cli;
pub mod configmap;
mod daemon;
pub mod error;
pub mod extract;
pub mod fetch;
pub mod hash;
mod install;
pub mod kata_config;
pub mod kata_release;
pub mod layout;
mod lock;
pub mod logging;
mod measured;
mod metrics;
pub mod node;
mod nodefs;
mod plan;
pub mod policy;
pub mod preview;
mod progress;
pub mod source;
mod state;
pub mod trust;
pub mod verity;
pub mod webhook;
mod yaml;

/// The embedded policy component, built from `guest/` by `build.rs`.
pub const GUEST_WASM: &[u8] = include_bytes!(env!("KATA_ADDONS_GUEST_WASM"));

pub use cli::run;
