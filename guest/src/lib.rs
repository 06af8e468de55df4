//! kata-addons policy: every decision about ConfigMap keys, defaults, validation,
//! providers and the drop-in TOML, as plain Rust.
//!
//! The same code is compiled natively (unit tests, fuzzing, the host's benchmarks) and
//! to `wasm32-wasip2` as a WebAssembly component that imports nothing (see
//! [`component`](crate) on wasm32). It performs no I/O and reads no clock.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

pub mod types;

mod checks;
mod policy;
mod reference;
mod render;

pub use policy::{DEFAULT_KATA_PREFIX, MAX_VIOLATIONS, env, known_runtime_configs, plan, trimmed};
pub use render::{HEADER, render};

#[cfg(test)]
mod tests;
pub use types::*;

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod rt;
