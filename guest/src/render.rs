//! Plan + installed node paths -> drop-in TOML text, produced by the `toml` serializer.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::checks::{check_path, show};
use crate::policy::{DROP_IN_NAME, HYPERVISOR_TABLE, drop_in_path, file_name, provider_info};
use crate::types::*;

/// First line of every drop-in. Constant: no value is ever formatted into a comment.
pub const HEADER: &str = "# Managed by kata-addons. Do not edit: run `kata-addons uninstall` to remove it.\n";

/// The keys the drop-in sets, in a fixed order.
#[derive(Serialize)]
struct Keys<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    initrd: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
}

/// `Keys` nested in the tables of a dotted path (`hypervisor.qemu`).
struct Nested<'a> {
    path: &'a [&'a str],
    leaf: &'a Keys<'a>,
}

impl Serialize for Nested<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.path.split_first() {
            None => self.leaf.serialize(s),
            Some((first, rest)) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry(first, &Nested { path: rest, leaf: self.leaf })?;
                m.end()
            }
        }
    }
}

fn violation(key: &str, code: Code, message: String) -> Violation {
    Violation { key: String::from(key), code, message }
}

/// Checks that a plan is one `plan` could have produced, as far as the drop-in depends on it.
fn check_plan(plan: &Plan, errs: &mut Vec<Violation>) {
    let info = provider_info(plan.provider);
    if plan.hypervisor_table != HYPERVISOR_TABLE {
        errs.push(violation(
            "plan",
            Code::Inconsistent,
            format!("hypervisor table {} is not `{HYPERVISOR_TABLE}`", show(&plan.hypervisor_table)),
        ));
    }
    if plan.runtime_configs.first().map(String::as_str) != Some(info.runtime_config)
        || plan.drop_in_name != DROP_IN_NAME
    {
        errs.push(violation(
            "plan",
            Code::Inconsistent,
            format!("runtime configs or drop-in name do not belong to provider `{}`", info.name),
        ));
    }
    if let Err(e) = check_path(&plan.install_dir) {
        errs.push(violation("plan", Code::InvalidPath, format!("install dir: {e}")));
    }
    if plan.artifacts.is_empty() {
        errs.push(violation("plan", Code::Missing, String::from("the plan has no artifact")));
    }
    for (i, a) in plan.artifacts.iter().enumerate() {
        if plan.artifacts[..i].iter().any(|b| b.kind == a.kind) {
            errs.push(violation("plan", Code::Inconsistent, format!("the plan lists the {} twice", file_name(a.kind))));
        }
        if a.file_name != file_name(a.kind) {
            errs.push(violation(
                "plan",
                Code::Inconsistent,
                format!("the {} file name is {}, not `{}`", file_name(a.kind), show(&a.file_name), file_name(a.kind)),
            ));
        }
        if !info.allowed.contains(&a.kind) {
            errs.push(violation(
                "plan",
                Code::NotAllowed,
                format!("provider `{}` does not accept an {}", info.name, file_name(a.kind)),
            ));
        }
    }
    let has = |k: ArtifactKind| plan.artifacts.iter().any(|a| a.kind == k);
    if has(ArtifactKind::Initrd) && has(ArtifactKind::Image) {
        errs.push(violation("plan", Code::Conflict, String::from("the plan has both an initrd and an image")));
    }
}

/// Checks the resolved runtime configurations the runner found: clean node paths of
/// `configuration*.toml` files, at least one, each directory (and so `config.d`) once.
fn check_runtime_configs(found: &[String], errs: &mut Vec<Violation>) {
    if found.is_empty() {
        errs.push(violation("runtime-configs", Code::Missing, String::from("no runtime configuration was given")));
    }
    for (i, rc) in found.iter().enumerate() {
        if let Err(e) = check_path(rc) {
            errs.push(violation("runtime-configs", Code::InvalidPath, e));
            continue;
        }
        let name = rc.rsplit('/').next().unwrap_or("");
        if !(name.starts_with("configuration") && name.ends_with(".toml")) {
            errs.push(violation(
                "runtime-configs",
                Code::InvalidPath,
                format!("{} is not a Kata `configuration*.toml` file", show(rc)),
            ));
        }
        if found[..i].iter().any(|o| drop_in_path(o) == drop_in_path(rc)) {
            errs.push(violation(
                "runtime-configs",
                Code::Conflict,
                format!("{} shares its directory (and `config.d`) with another runtime configuration", show(rc)),
            ));
        }
    }
}

/// Plan + installed node paths + resolved runtime configurations -> one drop-in each.
pub fn render(
    plan: &Plan,
    installed: &[InstalledFile],
    runtime_configs: &[String],
) -> Result<Vec<DropIn>, Vec<Violation>> {
    let mut errs = Vec::new();
    check_plan(plan, &mut errs);
    check_runtime_configs(runtime_configs, &mut errs);
    let prefix = format!("{}/", plan.install_dir);
    let mut paths: [Option<&str>; 3] = [None, None, None];
    let mut version_dir: Option<&str> = None;
    for f in installed {
        let name = file_name(f.kind);
        let slot = f.kind as usize;
        if !plan.artifacts.iter().any(|a| a.kind == f.kind) {
            errs.push(violation(
                "installed",
                Code::Inconsistent,
                format!("the {name} was installed but the plan has no {name}"),
            ));
            continue;
        }
        if paths[slot].is_some() {
            errs.push(violation("installed", Code::Inconsistent, format!("the {name} is listed more than once")));
            continue;
        }
        if let Err(e) = check_path(&f.path) {
            errs.push(violation("installed", Code::InvalidPath, format!("{name}: {e}")));
            continue;
        }
        let rest = f.path.strip_prefix(prefix.as_str()).unwrap_or("");
        let Some((dir, file)) = rest.split_once('/').filter(|(_, file)| !file.contains('/')) else {
            errs.push(violation(
                "installed",
                Code::InvalidPath,
                format!("{name} path {} is not `{}<version dir>/{name}`", show(&f.path), prefix),
            ));
            continue;
        };
        if file != name {
            errs.push(violation(
                "installed",
                Code::Inconsistent,
                format!("{name} path {} does not end in `/{name}`", show(&f.path)),
            ));
            continue;
        }
        match version_dir {
            Some(d) if d != dir => errs.push(violation(
                "installed",
                Code::Inconsistent,
                format!("{name} path {} is in another version directory than {}", show(&f.path), show(d)),
            )),
            _ => version_dir = Some(dir),
        }
        paths[slot] = Some(&f.path);
    }
    for a in &plan.artifacts {
        if installed.iter().all(|f| f.kind != a.kind) {
            errs.push(violation(
                "installed",
                Code::Inconsistent,
                format!("the plan's {} was not installed", file_name(a.kind)),
            ));
        }
    }
    if !errs.is_empty() {
        return Err(crate::policy::capped(errs));
    }
    let [kernel, initrd, image] = paths;
    // `image` and `initrd` are exclusive at runtime, and a drop-in cannot delete keys:
    // installing one clears the other.
    let keys = Keys { kernel, initrd: initrd.or(image.map(|_| "")), image: image.or(initrd.map(|_| "")) };
    let table: Vec<&str> = plan.hypervisor_table.split('.').collect();
    let body = toml::to_string(&Nested { path: &table, leaf: &keys }).map_err(|e| {
        alloc::vec![violation("plan", Code::Inconsistent, format!("cannot serialise the drop-in: {e}"))]
    })?;
    let contents = format!("{HEADER}{body}");
    Ok(runtime_configs
        .iter()
        .map(|rc| DropIn { runtime_config: rc.clone(), path: drop_in_path(rc), contents: contents.clone() })
        .collect())
}
