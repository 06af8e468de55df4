//! kata-addons: the native runner. It alone performs side effects; every decision about
//! keys, defaults, validation and TOML is made by the policy guest (`guest/`).

pub mod cli;
pub mod configmap;
pub mod daemon;
pub mod error;
pub mod extract;
pub mod fetch;
pub mod install;
pub mod kata_load;
pub mod layout;
pub mod lock;
pub mod logging;
pub mod measured;
pub mod node;
pub mod nodefs;
pub mod policy;
pub mod preview;
pub mod progress;
pub mod runtime;
pub mod runtime_class;
pub mod runtime_facts;
pub mod source;
pub mod state;
pub mod trust;
pub mod verity;
pub mod webhook;

/// The embedded policy component, built from `guest/` by `build.rs`.
pub const GUEST_WASM: &[u8] = include_bytes!(env!("KATA_ADDONS_GUEST_WASM"));

pub use cli::run;
