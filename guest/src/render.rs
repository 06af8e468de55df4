//! Plan + installed node paths -> drop-in TOML text, produced by the `toml` serializer.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use kata_addons_facts::{HEADER, HYPERVISOR_TABLE, INSTALL_DIR, drop_in_path, file_name, is_configuration_file_name};

use crate::checks::{check_path, show, violation};
use crate::providers;
use crate::wit::*;

/// The keys the drop-in sets, in a fixed order.
#[derive(Serialize)]
struct Keys<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    initrd: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_verity_params: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rootfs_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    guest_extension_images: Option<Vec<crate::measured::Entry>>,
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

/// Checks that a plan is one `plan` could have produced, as far as the drop-in depends on it.
fn check_plan(plan: &Plan, errs: &mut Vec<Violation>) {
    let provider = plan.provider;
    if plan.runtime_configs.first().map(String::as_str) != Some(provider.layout().openshift_config) {
        errs.push(violation(
            "plan",
            ViolationCode::Inconsistent,
            format!("the runtime configs do not belong to provider `{provider}`"),
        ));
    }
    if plan.artifacts.is_empty() {
        errs.push(violation("plan", ViolationCode::Missing, String::from("the plan has no artifact")));
    }
    for (i, a) in plan.artifacts.iter().enumerate() {
        if plan.artifacts[..i].iter().any(|b| b.kind == a.kind) {
            errs.push(violation(
                "plan",
                ViolationCode::Inconsistent,
                format!("the plan lists the {} twice", a.kind.wit_name()),
            ));
        }
        if a.file_name != a.kind.wit_name() {
            errs.push(violation(
                "plan",
                ViolationCode::Inconsistent,
                format!("the {} file name is {}, not `{}`", a.kind.wit_name(), show(&a.file_name), a.kind.wit_name()),
            ));
        }
        if !providers::allowed(provider).contains(&a.kind) {
            errs.push(violation(
                "plan",
                ViolationCode::NotAllowed,
                format!("provider `{provider}` does not accept an {}", a.kind.wit_name()),
            ));
        }
    }
    let has = |k: ArtifactKind| plan.artifacts.iter().any(|a| a.kind == k);
    if has(ArtifactKind::Initrd) && has(ArtifactKind::Image) {
        errs.push(violation("plan", ViolationCode::Conflict, String::from("the plan has both an initrd and an image")));
    }
}

/// Checks the resolved runtime configurations the runner found: clean node paths of
/// `configuration*.toml` files, at least one, each directory (and so `config.d`) once.
fn check_runtime_configs(found: &[RuntimeConfigFacts], errs: &mut Vec<Violation>) {
    if found.is_empty() {
        errs.push(violation(
            "runtime-configs",
            ViolationCode::Missing,
            String::from("no runtime configuration was given"),
        ));
    }
    for (i, rc) in found.iter().enumerate() {
        let rc = &rc.path;
        if let Err(e) = check_path(rc) {
            errs.push(violation("runtime-configs", ViolationCode::InvalidPath, e));
            continue;
        }
        if !is_configuration_file_name(file_name(rc)) {
            errs.push(violation(
                "runtime-configs",
                ViolationCode::InvalidPath,
                format!("{} is not a Kata `configuration*.toml` file", show(rc)),
            ));
        }
        if found[..i].iter().any(|o| drop_in_path(&o.path) == drop_in_path(rc)) {
            errs.push(violation(
                "runtime-configs",
                ViolationCode::Conflict,
                format!("{} shares its directory (and `config.d`) with another runtime configuration", show(rc)),
            ));
        }
    }
}

/// Checks the installed files against the plan: each planned artifact installed once, at
/// `<INSTALL_DIR>/<one version dir>/<kind>`, verified as planned; the files that pass.
fn check_installed<'a>(
    plan: &Plan,
    installed: &'a [InstalledFile],
    errs: &mut Vec<Violation>,
) -> Vec<&'a InstalledFile> {
    let prefix = format!("{INSTALL_DIR}/");
    let mut ok: Vec<&InstalledFile> = Vec::new();
    let mut version_dir: Option<&str> = None;
    for f in installed {
        let name = f.kind.wit_name();
        if !plan.artifacts.iter().any(|a| a.kind == f.kind) {
            errs.push(violation(
                "installed",
                ViolationCode::Inconsistent,
                format!("the {name} was installed but the plan has no {name}"),
            ));
            continue;
        }
        if ok.iter().any(|o| o.kind == f.kind) {
            errs.push(violation(
                "installed",
                ViolationCode::Inconsistent,
                format!("the {name} is listed more than once"),
            ));
            continue;
        }
        if let Err(e) = check_path(&f.path) {
            errs.push(violation("installed", ViolationCode::InvalidPath, format!("{name}: {e}")));
            continue;
        }
        let rest = f.path.strip_prefix(prefix.as_str()).unwrap_or("");
        let Some((dir, file)) = rest.split_once('/').filter(|(_, file)| !file.contains('/')) else {
            errs.push(violation(
                "installed",
                ViolationCode::InvalidPath,
                format!("{name} path {} is not `{}<version dir>/{name}`", show(&f.path), prefix),
            ));
            continue;
        };
        if file != name {
            errs.push(violation(
                "installed",
                ViolationCode::Inconsistent,
                format!("{name} path {} does not end in `/{name}`", show(&f.path)),
            ));
            continue;
        }
        match version_dir {
            Some(d) if d != dir => errs.push(violation(
                "installed",
                ViolationCode::Inconsistent,
                format!("{name} path {} is in another version directory than {}", show(&f.path), show(d)),
            )),
            _ => version_dir = Some(dir),
        }
        crate::measured::check_installed(plan, f, errs);
        ok.push(f);
    }
    for a in &plan.artifacts {
        if installed.iter().all(|f| f.kind != a.kind) {
            errs.push(violation(
                "installed",
                ViolationCode::Inconsistent,
                format!("the plan's {} was not installed", a.kind.wit_name()),
            ));
        }
    }
    ok
}

/// Plan + installed node paths + resolved runtime configurations -> one drop-in each.
pub fn render(
    plan: &Plan,
    installed: &[InstalledFile],
    runtime_configs: &[RuntimeConfigFacts],
) -> Result<Vec<DropIn>, Vec<Violation>> {
    let mut errs = Vec::new();
    check_plan(plan, &mut errs);
    check_runtime_configs(runtime_configs, &mut errs);
    let ok = check_installed(plan, installed, &mut errs);
    if !errs.is_empty() {
        return Err(crate::policy::capped(errs));
    }
    let find = |k: ArtifactKind| ok.iter().copied().find(|f| f.kind == k);
    let path = |k: ArtifactKind| find(k).map(|f| f.path.as_str());
    let (kernel, initrd, image) = (path(ArtifactKind::Kernel), path(ArtifactKind::Initrd), path(ArtifactKind::Image));
    let table: Vec<&str> = HYPERVISOR_TABLE.split('.').collect();
    let mut out = Vec::new();
    for rc in runtime_configs {
        let boot = crate::measured::boot(plan, find(ArtifactKind::Image), find(ArtifactKind::Extension), rc, &mut errs);
        // `image` and `initrd` are exclusive at runtime, and a drop-in cannot delete keys:
        // installing one clears the other.
        let keys = Keys {
            kernel,
            initrd: initrd.or(image.map(|_| "")),
            image: image.or(initrd.map(|_| "")),
            kernel_verity_params: boot.kernel_verity_params,
            rootfs_type: boot.rootfs_type,
            guest_extension_images: boot.extensions,
        };
        let body = toml::to_string(&Nested { path: &table, leaf: &keys }).map_err(|e| {
            alloc::vec![violation("plan", ViolationCode::Inconsistent, format!("cannot serialise the drop-in: {e}"))]
        })?;
        out.push(DropIn {
            runtime_config: rc.path.clone(),
            path: drop_in_path(&rc.path),
            contents: format!("{HEADER}{body}"),
        });
    }
    if !errs.is_empty() {
        return Err(crate::policy::capped(errs));
    }
    Ok(out)
}
