//! Kata runtime configurations on a node, read as Kata reads them: which
//! `configuration*.toml` files exist and what they resolve to (`files`), their `config.d`
//! fragments merged into effective values (`files`), what `render` is told of each
//! (`facts`), the RuntimeClass handlers CRI-O and containerd resolve to one (`runtime_class`),
//! and the check that Kata loads a configuration with a drop-in (`load`).

pub(crate) mod facts;
pub mod files;
pub(crate) mod load;
pub mod runtime_class;
