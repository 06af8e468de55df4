//! Facts of kata-addons that both halves must agree on, each defined once: where things
//! live on a node ([`layout`]), the grammars of what the ConfigMap and node files say
//! ([`reference`], [`grammar`], [`verity`]) and the names of the WIT enums ([`names`]).
//! `no_std` with `alloc`: the policy component links it and still imports nothing.

#![no_std]

extern crate alloc;

pub mod grammar;
pub mod layout;
pub mod names;
pub mod reference;
pub mod verity;

pub use grammar::*;
pub use layout::*;
