//! Where a plan's files and drop-ins go on this node: the install directory and, per
//! runtime configuration found, its directory (drop-ins are staged there) and `config.d`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cap_std::fs::Dir;
use kata_addons_facts::{DROP_IN_NAME, INSTALL_DIR};

use crate::kata_config::{self, Found, Selection};
use crate::node::{self, Created, Root};
use crate::policy::{Plan, RuntimeConfigFacts};

/// One runtime configuration's side of an install.
pub(super) struct ConfigTarget {
    /// Node path of the resolved `configuration*.toml`.
    pub(super) runtime_config: String,
    /// The directory holding it (drop-ins are staged here, beside `config.d`).
    pub(super) config_dir: Dir,
    /// `config.d` beside it, when it exists (an install creates it at its commit point).
    pub(super) config_d: Option<Dir>,
    /// Root-relative path of that `config.d`.
    pub(super) config_d_rel: PathBuf,
    /// Node path of the drop-in.
    pub(super) drop_in_node_path: String,
    /// Root-relative path of the resolved `configuration*.toml`.
    pub(super) rel: PathBuf,
    /// The RuntimeClass handler that resolved to it (`runtimeClass`), if any.
    pub(super) handler: Option<String>,
}

impl ConfigTarget {
    /// The directory a drop-in is committed into: `config.d`, where it exists, else the
    /// configuration's directory it will be created in (for the read-only check).
    pub(super) fn commit_dir(&self) -> &Dir {
        self.config_d.as_ref().unwrap_or(&self.config_dir)
    }
}

/// The node-side places of a plan.
pub(super) struct Target {
    /// The install directory (`/etc/kata-containers/addons`).
    pub(super) addons: Dir,
    /// Every runtime configuration that gets the drop-in, in discovery order.
    pub(super) configs: Vec<ConfigTarget>,
    /// What `render` is told of each (same order): its effective boot keys and extension
    /// images without kata-addons' drop-in, and the handler that named it.
    pub(super) facts: Vec<RuntimeConfigFacts>,
}

impl Target {
    /// The facts of each resolved runtime configuration, as `render` takes them.
    pub(super) fn runtime_configs(&self) -> Vec<RuntimeConfigFacts> {
        self.facts.clone()
    }
}

/// The RuntimeClass handlers a plan names (`runtimeClass`); empty: the provider's standard
/// configurations.
pub(crate) fn plan_runtime_classes(plan: &Plan) -> &[String] {
    &plan.runtime_classes
}

/// Resolves where a plan's files and drop-ins go: the configurations the plan's RuntimeClass
/// handlers run, else the provider's standard ones. Only the install directory is created
/// (recorded in `created`, so a refused install removes it again); each `config.d` is
/// opened if it exists and created at the commit.
pub(super) fn target(root: &Root, plan: &Plan, selection: &Selection, created: &mut Created) -> Result<Target> {
    let provider = plan.provider;
    let handlers = plan_runtime_classes(plan);
    let found = kata_config::found(root, plan, selection).with_context(|| {
        if handlers.is_empty() {
            format!("finding the Kata runtime configurations of provider `{provider}`")
        } else {
            format!("resolving the RuntimeClass handlers {} for provider `{provider}`", handlers.join(", "))
        }
    })?;
    let mut configs = Vec::new();
    let mut facts = Vec::new();
    for Found { config: rc, handler, facts: f } in found {
        facts.push(f);
        let dir_rel = rc.dir_rel();
        let config_dir = root
            .dir()
            .open_dir(if dir_rel.as_os_str().is_empty() { Path::new(".") } else { &dir_rel })
            .with_context(|| format!("opening {}", node::node_path(&dir_rel)))?;
        let config_d_rel = rc.config_d_rel();
        let config_d = match root.dir().open_dir(&config_d_rel) {
            Ok(d) => Some(d),
            Err(e) if node::is_absent(&e) => None,
            Err(e) => return Err(e).with_context(|| node::refused_or(&config_d_rel, "opening")),
        };
        configs.push(ConfigTarget {
            drop_in_node_path: node::node_path(&config_d_rel.join(DROP_IN_NAME)),
            runtime_config: rc.resolved,
            config_dir,
            config_d,
            config_d_rel,
            rel: rc.rel,
            handler,
        });
    }
    let addons = created.dir_all(&node::rel_path(INSTALL_DIR))?;
    Ok(Target { addons, configs, facts })
}
