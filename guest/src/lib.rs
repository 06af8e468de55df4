//! kata-addons policy: every decision about ConfigMap keys, defaults, validation,
//! providers and the drop-in TOML, as plain Rust.
//!
//! The same code is compiled natively (unit tests, fuzzing, the host's benchmarks) and
//! to `wasm32-wasip2` as a WebAssembly component that imports nothing (see
//! [`component`](crate) on wasm32). It performs no I/O and reads no clock. The types are
//! the WIT types, generated on every target ([`wit`]).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

pub mod wit;

mod checks;
mod kata_version;
mod keys;
mod measured;
mod node_paths;
mod policy;
mod providers;
mod reference;
mod render;
mod runtime_class;

pub use keys::{Key, Kind};
pub use policy::{MAX_VIOLATIONS, env, plan};
pub use render::render;
pub use wit::*;

#[cfg(test)]
mod tests;

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod rt;
