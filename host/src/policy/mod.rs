//! The policy sandbox: loads a policy component, refuses any component that imports
//! anything, and runs its three functions under a wall-clock deadline and a memory cap,
//! with a fresh instance per call. Nothing else in the runner touches wasmtime.
//!
//! Rooms: [`component`] (a loaded component and its calls), [`sandbox`] (engine, limits,
//! deadline), [`cache`] (compiled components on disk), [`checks`] (re-validation of every
//! answer), [`bindings`] (the WIT types and enum names) and [`error`].

mod bindings;
mod cache;
mod checks;
mod component;
mod error;
mod sandbox;

pub use bindings::{
    Artifact, ArtifactKind, DropIn, EffectiveKey, ExtensionImage, Filesystem, ImageSource, InstalledFile, KeyValue,
    LayoutRef, NodeOptions, Plan, Provider, RegistryRef, RuntimeConfigFacts, VerityParams, VeritySource, Violation,
    ViolationCode,
};
pub use cache::LoadedFrom;
pub use checks::{is_clean_abs_path, is_plain_file_name, path_only_facts};
pub use component::{Policy, PolicyOptions, default_cache_dir};
pub use error::{PolicyError, format_violations};
