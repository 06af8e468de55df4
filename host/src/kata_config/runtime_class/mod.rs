//! RuntimeClass handlers resolved the way the node's container runtime resolves them
//! (docs/design.md#runtimeclass): CRI-O's and containerd's own configuration say which Kata
//! `configuration*.toml` a handler runs, and that file is checked to be a Kata
//! configuration of the provider's TEE. Facts only, every file read beneath `--root`
//! through the runner's node-file reader (`nodefs`).
//!
//! Refusals (an unknown handler, a missing or dangling config path, a runtime that is not
//! Kata, another TEE, a runtime configuration Kata cannot load) name the handler and every
//! CRI file read; one bad handler refuses the whole list.

mod containerd;
mod crio;
mod files;
mod tee;

use std::collections::BTreeMap;

use anyhow::{Result, bail};

use crate::kata_config::files::{self as runtime, RuntimeConfig, Selection};
use crate::node::{self, Root};
use crate::policy::Provider;

/// What a container runtime's configuration says about one handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handler {
    /// `runtime_type` (CRI-O `vm`/`oci`, containerd `io.containerd.<name>.v2`).
    pub runtime_type: Option<String>,
    /// `runtime_path`: the shim or OCI runtime binary.
    pub runtime_path: Option<String>,
    /// The Kata configuration: CRI-O `runtime_config_path`, containerd `options.ConfigPath`.
    pub config_path: Option<String>,
    /// containerd `options.BinaryName` (the OCI runtime of a runc-type shim).
    pub binary_name: Option<String>,
    /// Node path of the file that defined the handler last.
    pub defined_in: String,
}

impl Handler {
    /// The handler's runtime settings, as a message shows them.
    fn describe(&self) -> String {
        let show = |k: &str, v: &Option<String>| v.as_ref().map(|v| format!("{k} = {v:?}"));
        let parts: Vec<String> = [
            show("runtime_type", &self.runtime_type),
            show("runtime_path", &self.runtime_path),
            show("BinaryName", &self.binary_name),
            show("config path", &self.config_path),
        ]
        .into_iter()
        .flatten()
        .collect();
        if parts.is_empty() { "no settings".to_string() } else { parts.join(", ") }
    }
}

/// One container runtime's configuration as found on the node.
#[derive(Debug, Clone, Default)]
pub(crate) struct CriConfig {
    /// Which runtime and distribution (`CRI-O`, `containerd`, `k3s containerd`, ...).
    pub runtime: String,
    /// Node paths of every file read, in the order the runtime reads them.
    pub files: Vec<String>,
    /// The handlers it defines.
    pub handlers: BTreeMap<String, Handler>,
    /// Handlers whose definition depends on something the files do not say (why).
    pub disputed: BTreeMap<String, String>,
    /// Why the runtime itself cannot load this configuration, if it cannot.
    pub broken: Option<String>,
    /// containerd: the CRI plugin's registry settings (`None` for CRI-O).
    pub registry: Option<CriRegistry>,
}

/// What containerd's CRI plugin says about registries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CriRegistry {
    /// `registry.config_path` as containerd uses it (its default filled in; empty: none).
    pub config_path: String,
    /// The file that set `config_path`, or where the default comes from.
    pub config_path_from: String,
    /// The old inline keys (`registry.mirrors`, `registry.configs`) and the file setting them.
    pub inline: Vec<(String, String)>,
    /// Why the files do not say which setting containerd uses (1.x and 2.x read them differently).
    pub disputed: Option<String>,
}

/// Whether the configuration's runtime (`CRI-O` or a containerd) defines a Kata handler.
fn has_kata_handler(c: &CriConfig) -> bool {
    c.handlers
        .iter()
        .any(|(name, h)| if c.runtime == crio::RUNTIME { crio::is_kata(name, h) } else { containerd::is_kata(h) })
}

/// The containerd hosts directories a node pulls through, when containerd serves its Kata
/// handlers (docs/registries-and-trust.md#registry-configuration-on-containerd-nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerdHostsDirs {
    /// The directories of the CRI plugin's `registry.config_path`, in order (none: every
    /// registry is its own default host).
    pub roots: Vec<String>,
    /// Where `config_path` was set (a file, or containerd's default).
    pub from: String,
    /// Why containerd's configuration applies and not CRI-O's.
    pub why: String,
}

/// Which runtime's registry configuration applies: `Some` when containerd serves the
/// node's Kata handlers and CRI-O's configuration defines none, `None` for CRI-O's
/// registries.conf and certs.d. Never both: the two are not merged. A containerd
/// configuration that cannot be used (broken, disputed, the old inline registry form) is
/// refused naming the file.
pub(crate) fn containerd_registry(root: &Root) -> Result<Option<ContainerdHostsDirs>> {
    let configs = match read_cri_configs(root) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("reading the container runtime configuration: {e:#}; registries.conf and certs.d are used");
            return Ok(None);
        }
    };
    let crio: Vec<&CriConfig> = configs.iter().filter(|c| c.runtime == crio::RUNTIME).collect();
    let ctd: Vec<&CriConfig> = configs.iter().filter(|c| c.registry.is_some()).collect();
    let crio_kata = crio.iter().any(|c| has_kata_handler(c));
    let kata_handlers = |c: &CriConfig| -> String {
        let names: Vec<&str> =
            c.handlers.iter().filter(|(_, h)| containerd::is_kata(h)).map(|(n, _)| n.as_str()).collect();
        names.join(", ")
    };
    let (c, why) = match (crio_kata, ctd.iter().find(|c| has_kata_handler(c))) {
        (false, Some(c)) => (
            *c,
            format!(
                "{} ({}) serves the Kata handlers ({}){}",
                c.runtime,
                c.files.first().map(String::as_str).unwrap_or_default(),
                kata_handlers(c),
                if crio.is_empty() { "" } else { "; CRI-O's configuration defines none" }
            ),
        ),
        (true, Some(c)) => {
            tracing::info!(
                "both CRI-O and {} define Kata handlers: CRI-O's registries.conf and certs.d are used, {}'s hosts.toml \
                 is not",
                c.runtime,
                c.runtime
            );
            return Ok(None);
        }
        _ => return Ok(None),
    };
    if let Some(b) = &c.broken {
        bail!("{} cannot load its configuration, so its registry settings are unknown: {b}", c.runtime);
    }
    let reg = c.registry.clone().unwrap_or_default();
    if let Some(d) = &reg.disputed {
        // 1.x: no hosts directory; 2.x: its default directories. The same when none exists.
        let files = files::Files::open(root)?;
        let mut differs = reg.config_path != containerd::V2_DEFAULT_CONFIG_PATH;
        for dir in containerd::V2_DEFAULT_CONFIG_PATH.split(':') {
            differs |= files.kind(dir)?.is_some();
        }
        if differs {
            bail!("{}: {d}", c.runtime);
        }
        return Ok(Some(ContainerdHostsDirs {
            roots: Vec::new(),
            from: "containerd default (no hosts directory on the node)".to_string(),
            why,
        }));
    }
    if let Some((key, file)) = reg.inline.first() {
        bail!(
            "{file}: the CRI plugin's `registry.{key}` (containerd's old inline registry form) is not read by \
             kata-addons; move it to hosts.toml files in a `registry.config_path` directory (`registry.mirrors.\"HOST\"` \
             endpoints become `[host.\"URL\"]` entries of `certs.d/HOST/hosts.toml`, `registry.configs.\"HOST\".tls` \
             becomes `ca`, `client`, `skip_verify` there; docs/registries-and-trust.md#registry-configuration-on-containerd-nodes)"
        );
    }
    let roots = reg.config_path.split(':').filter(|p| !p.is_empty()).map(str::to_string).collect();
    Ok(Some(ContainerdHostsDirs { roots, from: reg.config_path_from, why }))
}

/// Every container runtime configuration present on the node (CRI-O, then each
/// distribution's containerd).
pub(crate) fn read_cri_configs(root: &Root) -> Result<Vec<CriConfig>> {
    let files = files::Files::open(root)?;
    let mut out = Vec::new();
    if let Some(c) = crio::read(&files)? {
        out.push(c);
    }
    out.extend(containerd::read_all(&files)?);
    Ok(out)
}

/// Node directories whose changes can change what a handler resolves to: every directory
/// of a CRI file read, and the places the runtimes look for their configuration.
pub(crate) fn watched_dirs(configs: &[CriConfig]) -> Vec<String> {
    let mut dirs: Vec<String> = crio::DIRS.iter().chain(containerd::DIRS).map(|d| d.to_string()).collect();
    for c in configs {
        for f in &c.files {
            if let Some((d, _)) = f.rsplit_once('/') {
                dirs.push(if d.is_empty() { "/".to_string() } else { d.to_string() });
            }
        }
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The config path of every Kata handler the node's CRI configurations define (node
/// paths as written, each once): where kata-addons may have written a drop-in.
pub fn config_paths(root: &Root) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for c in read_cri_configs(root)? {
        for (name, h) in &c.handlers {
            let kata = if c.runtime == crio::RUNTIME { crio::is_kata(name, h) } else { containerd::is_kata(h) };
            if let Some(p) = h.config_path.as_ref().filter(|p| kata && kata_addons_facts::is_clean_path(p))
                && !out.contains(p)
            {
                out.push(p.clone());
            }
        }
    }
    Ok(out)
}

/// One handler resolved to the Kata runtime configuration it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The RuntimeClass handler.
    pub handler: String,
    /// The container runtime that defines it (`CRI-O`, `containerd`, ...).
    pub runtime: String,
    /// The config path as the CRI configuration names it, resolved on the node.
    pub config: RuntimeConfig,
}

/// What one handler resolves to, or why it cannot be used.
fn resolve_one(root: &Root, configs: &[CriConfig], handler: &str, tee: Provider) -> Result<Target, String> {
    let mut found: Vec<(&CriConfig, &Handler)> = Vec::new();
    for c in configs {
        if let Some(why) = c.disputed.get(handler) {
            return Err(format!("{}: {why}", c.runtime));
        }
        if let Some(h) = c.handlers.get(handler) {
            found.push((c, h));
        }
    }
    if found.is_empty() {
        if let Some(c) = configs.iter().find(|c| c.broken.is_some()) {
            return Err(format!(
                "no container runtime on the node defines it, and {} cannot load its configuration: {}",
                c.runtime,
                c.broken.as_deref().unwrap_or_default()
            ));
        }
        if crio::is_builtin(handler) && configs.iter().any(|c| c.runtime == crio::RUNTIME) {
            return Err(format!("it is CRI-O's built-in `{handler}` runtime, not Kata Containers"));
        }
        return Err(if configs.is_empty() {
            "no container runtime configuration was found on the node (CRI-O or containerd)".to_string()
        } else {
            "no container runtime on the node defines this handler".to_string()
        });
    }
    let (a, ha) = found[0];
    if let Some((b, hb)) = found.iter().find(|(_, h)| h.config_path != ha.config_path) {
        return Err(format!(
            "{} ({}) and {} ({}) define it differently: {} vs {}",
            a.runtime,
            ha.defined_in,
            b.runtime,
            hb.defined_in,
            ha.describe(),
            hb.describe()
        ));
    }
    let (cri, h) = found[0];
    if let Some(broken) = &cri.broken {
        return Err(format!("{} cannot load its configuration: {broken}", cri.runtime));
    }
    let is_kata = if cri.runtime == crio::RUNTIME { crio::is_kata(handler, h) } else { containerd::is_kata(h) };
    if !is_kata {
        return Err(format!(
            "{} defines it ({}) as a runtime that is not Kata Containers: {}",
            cri.runtime,
            h.defined_in,
            h.describe()
        ));
    }
    let Some(config_path) = h.config_path.as_deref().filter(|p| !p.is_empty()) else {
        return Err(format!(
            "{} defines it ({}) without a Kata configuration path ({}): Kata would pick a default configuration \
             kata-addons cannot tell",
            cri.runtime,
            h.defined_in,
            if cri.runtime == crio::RUNTIME { "runtime_config_path" } else { "options.ConfigPath" }
        ));
    };
    if !kata_addons_facts::is_clean_path(config_path) {
        return Err(format!(
            "{} names the Kata configuration {config_path:?} ({}), which is not a clean absolute path",
            cri.runtime, h.defined_in
        ));
    }
    let config = match runtime::resolve_file(root, config_path) {
        Ok(Some(rc)) => rc,
        Ok(None) => {
            return Err(format!(
                "its Kata configuration {config_path} (named by {}) does not exist on the node (missing, or a \
                 dangling symlink)",
                h.defined_in
            ));
        }
        Err(e) => return Err(format!("its Kata configuration {config_path} (named by {}): {e:#}", h.defined_in)),
    };
    tee::check(root, &config, tee).map_err(|why| format!("{}: {why}", config.resolved))?;
    Ok(Target { handler: handler.to_string(), runtime: cri.runtime.clone(), config })
}

/// Resolves every handler (in the given order) to its Kata runtime configuration and
/// checks each is one of `tee`. Any problem with any handler refuses the whole list: the
/// error names each bad handler, why, and every CRI file read.
pub fn resolve(root: &Root, handlers: &[String], tee: Provider) -> Result<Vec<Target>> {
    let configs = read_cri_configs(root)?;
    resolve_in(root, &configs, handlers, tee)
}

/// [`resolve`] with the CRI configurations already read.
pub(crate) fn resolve_in(
    root: &Root,
    configs: &[CriConfig],
    handlers: &[String],
    tee: Provider,
) -> Result<Vec<Target>> {
    let mut targets = Vec::new();
    let mut problems = Vec::new();
    for h in handlers {
        match resolve_one(root, configs, h, tee) {
            Ok(t) => targets.push(t),
            Err(why) => problems.push(format!("runtimeClass handler `{h}`: {why}")),
        }
    }
    if !problems.is_empty() {
        let files: Vec<&str> = configs.iter().flat_map(|c| c.files.iter().map(String::as_str)).collect();
        bail!(
            "refusing the RuntimeClass handlers (nothing was changed):\n  {}\nCRI configuration files read: {}",
            problems.join("\n  "),
            if files.is_empty() { "none found".to_string() } else { files.join(", ") }
        );
    }
    Ok(targets)
}

/// A runtime configuration a plan installs for, and the handler that named it (`None`: one
/// of the provider's standard configurations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// The resolved configuration.
    pub config: RuntimeConfig,
    /// The RuntimeClass handler, if the configuration was reached through one.
    pub handler: Option<String>,
}

/// The runtime configurations to install for: without handlers, the provider's standard
/// set ([`runtime::discover`]); with handlers, what they resolve to ([`resolve`]), one per
/// file (the first handler naming it), restricted by `--runtime-config`, and never a
/// `config.d` other configurations also read unless that is explicitly allowed.
pub fn discover(
    root: &Root,
    handlers: &[String],
    tee: Provider,
    candidates: &[String],
    sel: &Selection,
) -> Result<Vec<Chosen>> {
    if handlers.is_empty() {
        return Ok(runtime::discover(root, candidates, sel)?
            .into_iter()
            .map(|config| Chosen { config, handler: None })
            .collect());
    }
    let mut chosen: Vec<Chosen> = Vec::new();
    for t in resolve(root, handlers, tee)? {
        if !chosen.iter().any(|c| c.config.config_d_rel() == t.config.config_d_rel()) {
            chosen.push(Chosen { config: t.config, handler: Some(t.handler) });
        }
    }
    if !sel.only.is_empty() {
        for want in &sel.only {
            let rel = runtime::resolve_file(root, want)?.map(|w| w.rel);
            if !chosen.iter().any(|c| c.config.named == *want || Some(&c.config.rel) == rel.as_ref()) {
                bail!(
                    "--runtime-config {want} is not what the RuntimeClass handlers resolve to ({})",
                    chosen
                        .iter()
                        .map(|c| format!("{} -> {}", c.handler.as_deref().unwrap_or_default(), c.config.resolved))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        chosen.retain(|c| {
            sel.only.iter().any(|w| {
                *w == c.config.named
                    || runtime::resolve_file(root, w).ok().flatten().is_some_and(|r| r.rel == c.config.rel)
            })
        });
    }
    if !sel.allow_shared_config_d {
        for c in &chosen {
            let others = runtime::sharing_config_d(root, &c.config)?;
            if !others.is_empty() {
                bail!(
                    "refusing to write into {}: RuntimeClass handler `{}` runs {}, but {} also read that config.d, so \
                     the addon would change them too; pass --allow-shared-config-d to accept that",
                    node::node_path(&c.config.config_d_rel()),
                    c.handler.as_deref().unwrap_or_default(),
                    c.config.resolved,
                    others.join(", ")
                );
            }
        }
    }
    Ok(chosen)
}

/// What changed for recorded handlers since install: one line per handler that no longer
/// resolves, or now runs another configuration than the one its drop-in was written for
/// (`recorded`: handler and the node path of that configuration).
pub fn drift(root: &Root, recorded: &[(String, String)], tee: Provider) -> Result<Vec<String>> {
    if recorded.is_empty() {
        return Ok(Vec::new());
    }
    let configs = read_cri_configs(root)?;
    let mut out = Vec::new();
    for (handler, was) in recorded {
        match resolve_one(root, &configs, handler, tee) {
            Ok(t) if &t.config.resolved == was => {}
            Ok(t) => out.push(format!(
                "RuntimeClass handler `{handler}` now runs {} ({} changed), not {was} which the drop-in was written for",
                t.config.resolved, t.runtime
            )),
            Err(why) => out.push(format!("RuntimeClass handler `{handler}` no longer resolves: {why}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
