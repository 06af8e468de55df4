//! `kata-addons preview`: runs the policy only and prints env, plan and drop-in.

use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::json;

use crate::cli::PreviewFormat;
use crate::configmap::Input;
use crate::layout;
use crate::policy::{ArtifactKind, ImageSource, InstalledFile, KeyValue, Plan, Policy, PolicyError, Provider};

/// What `install` would do, computed without network or writes.
#[derive(Debug, Clone)]
pub struct Preview {
    /// The resolved `ADDON_*` env.
    pub env: Vec<KeyValue>,
    /// The plan.
    pub plan: Plan,
    /// Node paths the artifacts would be installed at.
    pub installed: Vec<InstalledFile>,
    /// Node path of the drop-in.
    pub drop_in_path: String,
    /// Drop-in text.
    pub drop_in: String,
}

/// Runs the policy on the configuration: ConfigMap -> env (`env`) -> plan (`plan`).
/// `ADDON_*` environment input goes straight to `plan`.
pub fn plan(policy: &Policy, input: &Input) -> Result<(Vec<KeyValue>, Plan), PolicyError> {
    let env = match input {
        Input::ConfigMap { data, .. } => policy.env(data)?,
        Input::Env(env) => env.clone(),
    };
    let plan = policy.plan(&env)?;
    Ok((env, plan))
}

/// Runs `env` (for ConfigMap input), `plan` and `render`.
pub fn compute(policy: &Policy, input: &Input) -> Result<Preview, PolicyError> {
    let (env, plan) = plan(policy, input)?;
    let dir = layout::version_dir_name(&plan.version, layout::pinned_digest(&plan));
    let installed = layout::installed_files(&plan, &dir);
    let drop_in = policy.render(&plan, &installed)?;
    Ok(Preview { env, drop_in_path: plan.drop_in_path.clone(), plan, installed, drop_in })
}

/// WIT name of an artifact kind.
pub fn kind_name(k: ArtifactKind) -> &'static str {
    match k {
        ArtifactKind::Kernel => "kernel",
        ArtifactKind::Initrd => "initrd",
        ArtifactKind::Image => "image",
    }
}

/// WIT name of a provider.
pub fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Se => "se",
        Provider::Tdx => "tdx",
        Provider::Snp => "snp",
    }
}

/// The plan as JSON (camelCase keys).
pub fn plan_json(plan: &Plan) -> serde_json::Value {
    let source = match &plan.source {
        ImageSource::Registry(r) => json!({
            "type": "registry", "registry": r.registry, "repository": r.repository, "tag": r.tag, "digest": r.digest,
        }),
        ImageSource::Layout(l) => json!({ "type": "layout", "path": l.path, "tag": l.tag }),
    };
    json!({
        "image": plan.image,
        "source": source,
        "provider": provider_name(plan.provider),
        "version": plan.version,
        "runtimeConfig": plan.runtime_config,
        "hypervisorTable": plan.hypervisor_table,
        "installDir": plan.install_dir,
        "dropInPath": plan.drop_in_path,
        "artifacts": artifacts_json(plan),
    })
}

fn artifacts_json(plan: &Plan) -> serde_json::Value {
    plan.artifacts
        .iter()
        .map(|a| json!({ "kind": kind_name(a.kind), "source": a.source, "fileName": a.file_name, "sha256": a.sha256 }))
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
pub fn print(p: &Preview, format: PreviewFormat, out: &mut dyn Write) -> Result<()> {
    match format {
        PreviewFormat::Json => {
            let doc = json!({
                "env": env_json(&p.env),
                "artifacts": artifacts_json(&p.plan),
                "dropIns": [{ "path": p.drop_in_path, "contents": p.drop_in }],
                "plan": plan_json(&p.plan),
            });
            serde_json::to_writer_pretty(&mut *out, &doc).context("writing JSON")?;
            writeln!(out)?;
        }
        PreviewFormat::Env => {
            for kv in &p.env {
                let quoted =
                    shlex::try_quote(&kv.value).with_context(|| format!("{} cannot be shell-quoted", kv.name))?;
                writeln!(out, "{}={}", kv.name, quoted)?;
            }
        }
        PreviewFormat::Yaml => {
            let list = EnvList { env: p.env.iter().map(|kv| EnvVar { name: &kv.name, value: &kv.value }).collect() };
            let text = serde_norway::to_string(&list).context("writing YAML")?;
            out.write_all(text.as_bytes())?;
        }
        PreviewFormat::Text => {
            writeln!(out, "Environment:")?;
            for kv in &p.env {
                writeln!(out, "  {}={}", kv.name, kv.value)?;
            }
            writeln!(out, "\nPlan:")?;
            writeln!(out, "  image:    {}", p.plan.image)?;
            writeln!(out, "  provider: {} ({})", provider_name(p.plan.provider), p.plan.runtime_config)?;
            writeln!(out, "  version:  {}", p.plan.version)?;
            for (a, f) in p.plan.artifacts.iter().zip(&p.installed) {
                writeln!(out, "  {:<7} {} -> {}", kind_name(a.kind), a.source, f.path)?;
                if let Some(s) = &a.sha256 {
                    writeln!(out, "          sha256 {s}")?;
                }
            }
            writeln!(out, "\nDrop-in {}:", p.drop_in_path)?;
            for line in p.drop_in.lines() {
                writeln!(out, "  {line}")?;
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
