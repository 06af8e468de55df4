//! Kata runtime configurations on a node, read as Kata reads them: which
//! `configuration*.toml` files exist and what they resolve to (`files`), their `config.d`
//! fragments merged into effective values (`files`), what `render` is told of each
//! (`facts`), the RuntimeClass handlers CRI-O and containerd resolve to one (`runtime_class`),
//! and the check that Kata loads a configuration with a drop-in (`load`).
//!
//! The rest of the runner enters here only, through the items below; the submodules are
//! private.

mod facts;
mod files;
mod load;
mod runtime_class;

use anyhow::Result;

use crate::node::Root;
use crate::policy::{Plan, RuntimeConfigFacts};

pub(crate) use facts::{extensions, fragments_without, stale_extensions};
pub(crate) use files::{CONFIG_D, Fragment, Setting, effective, effective_value, fragments, leaves};
pub use files::{RuntimeConfig, Selection};
pub(crate) use load::check as check_loads;
pub use runtime_class::{Chosen, Target, config_paths, discover, drift, resolve};
pub(crate) use runtime_class::{containerd_registry, read_cri_configs, watched_dirs};

/// One runtime configuration a plan installs for, with what `render` is told of it.
pub(crate) struct Found {
    /// The resolved configuration.
    pub(crate) config: RuntimeConfig,
    /// The RuntimeClass handler that named it (`None`: a standard configuration).
    pub(crate) handler: Option<String>,
    /// Its effective boot keys and extension images without kata-addons' drop-in, the
    /// handler filled in.
    pub(crate) facts: RuntimeConfigFacts,
}

/// The runtime configurations `plan` installs for on this node (its RuntimeClass handlers'
/// configurations, else the provider's standard ones, narrowed by `selection`), each with
/// its facts for `render`.
pub(crate) fn found(root: &Root, plan: &Plan, selection: &Selection) -> Result<Vec<Found>> {
    let chosen = discover(root, &plan.runtime_classes, plan.provider, &plan.runtime_configs, selection)?;
    chosen
        .into_iter()
        .map(|Chosen { config, handler }| {
            let facts = facts::for_render(root, &config)?;
            Ok(Found { facts: RuntimeConfigFacts { handler: handler.clone(), ..facts }, config, handler })
        })
        .collect()
}
