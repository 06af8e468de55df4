//! `kata-addons preview`: runs the policy only and prints env, plan and drop-in.

use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::json;

use crate::configmap::Input;
use crate::kata_config::Selection;
use crate::layout;
use crate::node::Root;
use crate::policy::{DropIn, InstalledFile, KeyValue, Plan, Policy, PolicyError, path_only_facts};

/// `preview` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Human-readable summary.
    Text,
    /// One JSON object: `env`, `artifacts`, `dropIns`, `plan`.
    Json,
    /// `NAME=value` lines, shell-quoted.
    Env,
    /// A Kubernetes `env:` list for a DaemonSet.
    Yaml,
}

/// What `install` would do, computed without network or writes.
#[derive(Debug, Clone)]
pub struct Preview {
    /// The resolved `ADDON_*` env.
    pub env: Vec<KeyValue>,
    /// The plan.
    pub plan: Plan,
    /// Node paths the artifacts would be installed at.
    pub installed: Vec<InstalledFile>,
    /// The drop-ins, one per runtime configuration found under the root.
    pub drop_ins: Vec<DropIn>,
    /// Why the drop-ins are not for configurations found on the node, if they are not.
    pub note: Option<String>,
    /// The Kata release check install makes (`kataVersion` against the node's release;
    /// docs/configuration.md#kataversion), with the node's release when a root was read.
    pub kata_check: String,
    /// The node's registry configuration for the image and its hosts in order (as `status`).
    pub registry: Vec<String>,
}

/// Runs `env` (for ConfigMap input), `plan` and `render` without looking at any node:
/// the drop-in is shown for the plan's first candidate (OpenShift's path).
pub fn compute(policy: &Policy, input: &Input) -> Result<Preview, PolicyError> {
    let (env, plan) = crate::plan::of_default_prefix(policy, input)?;
    let dir = layout::version_dir_name(&plan.version, layout::pinned_digest(&plan));
    let installed = crate::measured::installed(layout::installed_files(&plan, &dir), &crate::measured::preview(&plan));
    let first: Vec<_> = plan.runtime_configs.iter().take(1).map(|p| path_only_facts(p)).collect();
    let drop_ins = policy.render(&plan, &installed, &first)?;
    let kata_check = crate::kata_release::preview_line(&plan, None);
    Ok(Preview { env, plan, installed, drop_ins, note: None, kata_check, registry: Vec::new() })
}

/// Like [`compute`], for the runtime configurations found under `root` (read only); when
/// none is usable, for the plan's first candidate, with a note saying so.
pub(crate) fn compute_on(
    policy: &Policy,
    input: &Input,
    root: &std::path::Path,
    selection: &Selection,
) -> Result<Preview> {
    let (env, plan) = crate::plan::of(policy, input, &selection.kata_prefix)?;
    let dir = layout::version_dir_name(&plan.version, layout::pinned_digest(&plan));
    let installed = crate::measured::installed(layout::installed_files(&plan, &dir), &crate::measured::preview(&plan));
    let found = Root::open(root)
        .and_then(|r| crate::kata_config::found(&r, &plan, selection))
        .map(|found| found.into_iter().map(|f| f.facts).collect::<Vec<_>>());
    let (configs, note) = match found {
        Ok(found) => (found, None),
        Err(e) => (
            plan.runtime_configs.iter().take(1).map(|p| path_only_facts(p)).collect(),
            Some(format!("{e:#}; showing the drop-in for {}", plan.runtime_configs.first().map_or("", String::as_str))),
        ),
    };
    let drop_ins = policy.render(&plan, &installed, &configs)?;
    let note = match (note, crate::measured::preview_note(&plan)) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    let node = crate::kata_release::observe(root, &selection.kata_prefix);
    let kata_check = crate::kata_release::preview_line(&plan, Some(&node));
    let registry = crate::source::containerd_pull::status_lines(root, &plan.image);
    Ok(Preview { env, plan, installed, drop_ins, note, kata_check, registry })
}

/// The plan as JSON (camelCase keys).
pub(crate) fn plan_json(plan: &Plan) -> serde_json::Value {
    let source = crate::source::reference::source_json(&plan.source);
    json!({
        "image": plan.image,
        "source": source,
        "provider": plan.provider.wit_name(),
        "version": plan.version,
        "runtimeClasses": plan.runtime_classes,
        "runtimeConfigs": plan.runtime_configs,
        "artifacts": artifacts_json(plan),
    })
}

fn artifacts_json(plan: &Plan) -> serde_json::Value {
    plan.artifacts
        .iter()
        .map(|a| json!({ "kind": a.kind.wit_name(), "source": a.source, "fileName": a.file_name, "sha256": a.sha256 }))
        .collect()
}

fn env_json(env: &[KeyValue]) -> serde_json::Value {
    env.iter().map(|kv| json!({ "name": kv.name, "value": kv.value })).collect()
}

/// A Kubernetes container `env:` entry.
#[derive(Serialize)]
struct EnvVar<'a> {
    name: &'a str,
    value: &'a str,
}

/// A Kubernetes container `env:` list.
#[derive(Serialize)]
struct EnvList<'a> {
    env: Vec<EnvVar<'a>>,
}

/// Prints a preview in the chosen format.
pub(crate) fn print(p: &Preview, format: Format, out: &mut dyn Write) -> Result<()> {
    match format {
        Format::Json => {
            let doc = json!({
                "env": env_json(&p.env),
                "artifacts": artifacts_json(&p.plan),
                "dropIns": p.drop_ins.iter().map(|d| json!({
                    "runtimeConfig": d.runtime_config, "path": d.path, "contents": d.contents,
                })).collect::<Vec<_>>(),
                "note": p.note,
                "kataCheck": p.kata_check,
                "registry": p.registry,
                "invalidates": crate::attest::invalidates::names(&p.plan),
                "invalidatesOn": crate::attest::invalidates::targets(&p.plan),
                "plan": plan_json(&p.plan),
            });
            serde_json::to_writer_pretty(&mut *out, &doc).context("writing JSON")?;
            writeln!(out)?;
        }
        Format::Env => {
            for kv in &p.env {
                let quoted =
                    shlex::try_quote(&kv.value).with_context(|| format!("{} cannot be shell-quoted", kv.name))?;
                writeln!(out, "{}={}", kv.name, quoted)?;
            }
        }
        Format::Yaml => {
            let list = EnvList { env: p.env.iter().map(|kv| EnvVar { name: &kv.name, value: &kv.value }).collect() };
            let text = serde_norway::to_string(&list).context("writing YAML")?;
            out.write_all(text.as_bytes())?;
        }
        Format::Text => {
            writeln!(out, "Environment:")?;
            for kv in &p.env {
                writeln!(out, "  {}={}", kv.name, kv.value)?;
            }
            writeln!(out, "\nPlan:")?;
            writeln!(out, "  image:    {}", p.plan.image)?;
            writeln!(out, "  provider: {}", p.plan.provider.wit_name())?;
            writeln!(out, "  version:  {}", p.plan.version)?;
            for (a, f) in p.plan.artifacts.iter().zip(&p.installed) {
                writeln!(out, "  {:<7} {} -> {}", a.kind.wit_name(), a.source, f.path)?;
                if let Some(s) = &a.sha256 {
                    writeln!(out, "          sha256 {s}")?;
                }
            }
            for d in &p.drop_ins {
                writeln!(out, "\nDrop-in {} (for {}):", d.path, d.runtime_config)?;
                for line in d.contents.lines() {
                    writeln!(out, "  {line}")?;
                }
            }
            writeln!(out, "\nKata release: {}", p.kata_check)?;
            if !p.registry.is_empty() {
                writeln!(out, "\nRegistry:")?;
                for l in &p.registry {
                    writeln!(out, "  {l}")?;
                }
            }
            if let Some(l) = crate::attest::invalidates::line(&p.plan) {
                writeln!(out, "\nAttestation: {l}: register the new reference values (kata-addons reference-values)")?;
            }
            if let Some(n) = &p.note {
                writeln!(out, "\n({n})")?;
            }
            if layout::pinned_digest(&p.plan).is_none() {
                writeln!(
                    out,
                    "\n({} is the first 12 hex digits of the manifest digest, known after the pull.)",
                    layout::UNKNOWN_DIGEST
                )?;
            }
        }
    }
    Ok(())
}
