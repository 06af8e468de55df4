//! Measured guests (docs/design.md#measured-guests): the dm-verity keys of the guest
//! image, the guest extension image keys, and what the drop-in sets for them.
//!
//! Validation here, for [`crate::policy`]: verity keys only beside their artifact,
//! `*VerityParams` and `*VerityPath` never together, parameters through the one shared
//! parser (`kata_addons_facts::verity`), extension names as Kata's loader requires and
//! short enough that `extension-<name>` fits the 20-byte virtio-blk ID (the guest's mount
//! script finds the disk by that serial: `checks::check_name`), and IBM SE refusing all of
//! it (its command line is sealed into the SE image). The keys are rows of `keys.rs`.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::checks::violation;
use crate::keys::{Given, Key, Kind};
use crate::wit::*;

/// The dm-verity parameters of the measured artifacts, validated.
#[derive(Debug, Clone, Default)]
pub(crate) struct Verity {
    /// The guest image's.
    pub image: Option<VeritySource>,
    /// The extension's.
    pub extension: Option<VeritySource>,
}

impl Verity {
    /// The parameters of an artifact of `kind`, if it has any.
    pub(crate) fn of(&self, kind: ArtifactKind) -> Option<VeritySource> {
        match kind {
            ArtifactKind::Image => self.image.clone(),
            ArtifactKind::Extension => self.extension.clone(),
            ArtifactKind::Kernel | ArtifactKind::Initrd => None,
        }
    }
}

/// Whether only a measured guest uses `key`: the dm-verity keys and the extension's.
fn is_measured(key: Key) -> bool {
    matches!(key.kind(), Kind::VerityParams | Kind::VerityPath) || key.artifact() == Some(ArtifactKind::Extension)
}

/// A `*VerityParams` / `*VerityPath` pair -> where the parameters come from.
fn verity_source(g: &Given<'_>, params: Key, path: Key, errs: &mut Vec<Violation>) -> Option<VeritySource> {
    match (g.value(params), g.value(path)) {
        (Some(_), Some(_)) => {
            errs.push(violation(
                g.name(path),
                ViolationCode::Conflict,
                format!(
                    "`{}` and `{}` are exclusive: give the parameters or the in-image file holding them",
                    g.name(params),
                    g.name(path)
                ),
            ));
            None
        }
        (Some(v), None) => match kata_addons_facts::verity::parse(v) {
            Ok(p) => Some(VeritySource::Params(p.into())),
            Err(e) => {
                errs.push(violation(g.name(params), ViolationCode::InvalidVerity, format!("{e}")));
                None
            }
        },
        (None, Some(_)) => g.checked(path, errs).map(|p| VeritySource::File(String::from(p))),
        (None, None) => None,
    }
}

/// Validates the measured-guest keys; every violation goes to `errs`.
pub(crate) fn resolve(g: &Given<'_>, provider: Option<Provider>, errs: &mut Vec<Violation>) -> Verity {
    if provider == Some(Provider::Se) {
        for k in Key::ALL.into_iter().filter(|k| is_measured(*k) && g.given(*k)) {
            errs.push(violation(
                g.name(k),
                ViolationCode::NotAllowed,
                format!(
                    "provider `se` boots one sealed SE image (its kernel command line is inside it): no image, \
                     dm-verity or extension addon; remove `{}`",
                    g.name(k)
                ),
            ));
        }
        return Verity::default();
    }
    let mut out = Verity::default();
    let (params, path) = (Key::ImageVerityParams, Key::ImageVerityPath);
    if (g.given(params) || g.given(path)) && !g.given(Key::ImagePath) {
        let k = if g.given(params) { g.name(params) } else { g.name(path) };
        errs.push(violation(
            k,
            ViolationCode::Inconsistent,
            format!(
                "`{k}` is set but `{}` is not: dm-verity parameters need their guest image",
                g.name(Key::ImagePath)
            ),
        ));
    } else {
        out.image = verity_source(g, params, path, errs);
    }

    let has_ext = g.given(Key::ExtensionPath);
    let describing = Key::ALL.into_iter().filter(|k| k.artifact() == Some(ArtifactKind::Extension));
    for k in describing.filter(|k| *k != Key::ExtensionPath && g.given(*k) && !has_ext) {
        errs.push(violation(
            g.name(k),
            ViolationCode::Inconsistent,
            format!(
                "`{}` is set but `{}` is not: it describes the extension image",
                g.name(k),
                g.name(Key::ExtensionPath)
            ),
        ));
    }
    if !has_ext {
        return out;
    }
    g.checked(Key::ExtensionPath, errs);
    if g.given(Key::ExtensionName) {
        g.checked(Key::ExtensionName, errs);
    } else {
        errs.push(violation(
            g.name(Key::ExtensionName),
            ViolationCode::Missing,
            format!(
                "`{}` requires `{}`: the extension's name (e.g. `coco`), which Kata uses in its virtio-blk serial",
                g.name(Key::ExtensionPath),
                g.name(Key::ExtensionName)
            ),
        ));
    }
    g.checked(Key::ExtensionSha256, errs);
    out.extension = verity_source(g, Key::ExtensionVerityParams, Key::ExtensionVerityPath, errs);
    out
}

/// One `guest_extension_images` entry of the drop-in.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Entry {
    pub name: String,
    pub path: String,
    pub verity_params: String,
}

/// The boot keys the drop-in sets for a measured image or an extension, for one runtime
/// configuration given its facts; node refusals go to `errs`.
pub(crate) struct Boot {
    pub kernel_verity_params: Option<String>,
    pub rootfs_type: Option<&'static str>,
    pub extensions: Option<Vec<Entry>>,
}

/// What the drop-in sets beside `image`/`initrd` for `rc`: for an installed image its
/// dm-verity parameters (`""` when unmeasured: a base's parameters must not stay with
/// another image) and `rootfs_type`; for an extension the whole array, ours replacing an
/// entry of the same name in place, else appended.
pub(crate) fn boot(
    plan: &Plan,
    image: Option<&InstalledFile>,
    extension: Option<&InstalledFile>,
    rc: &RuntimeConfigFacts,
    errs: &mut Vec<Violation>,
) -> Boot {
    let mut b = Boot { kernel_verity_params: None, rootfs_type: None, extensions: None };
    let from_file =
        |k: ArtifactKind| plan.artifacts.iter().any(|a| a.kind == k && matches!(a.verity, Some(VeritySource::File(_))));
    if let Some(img) = image {
        match &img.verity {
            Some(v) => b.kernel_verity_params = Some(v.to_string()),
            None if from_file(ArtifactKind::Image) => {}
            None => {
                if let Some(k) = rc.keys.iter().find(|k| k.key == "kernel_verity_params" && !k.value.trim().is_empty())
                {
                    errs.push(violation(
                        &k.from,
                        ViolationCode::NodeRefuses,
                        format!(
                            "{} measures its guest image (kernel_verity_params is set in {}): an unmeasured addon image \
                             is refused; give imageVerityParams or imageVerityPath",
                            rc.path, k.from
                        ),
                    ));
                }
                b.kernel_verity_params = Some(String::new());
            }
        }
        b.rootfs_type = img.filesystem.map(Filesystem::wit_name);
    }
    if let Some(ext) = extension {
        let name = plan
            .artifacts
            .iter()
            .find(|a| a.kind == ArtifactKind::Extension)
            .and_then(|a| a.name.clone())
            .unwrap_or_default();
        let ours = Entry {
            name: name.clone(),
            path: ext.path.clone(),
            verity_params: ext.verity.as_ref().map(ToString::to_string).unwrap_or_default(),
        };
        let mut entries: Vec<Entry> = rc
            .extensions
            .iter()
            .map(|e| Entry { name: e.name.clone(), path: e.path.clone(), verity_params: e.verity_params.clone() })
            .collect();
        match entries.iter_mut().find(|e| e.name == name) {
            Some(e) => *e = ours,
            None => entries.push(ours),
        }
        b.extensions = Some(entries);
    }
    b
}

/// Checks that the installed image/extension was verified as the plan says.
pub(crate) fn check_installed(plan: &Plan, f: &InstalledFile, errs: &mut Vec<Violation>) {
    let Some(a) = plan.artifacts.iter().find(|a| a.kind == f.kind) else { return };
    let name = f.kind.wit_name();
    match (&a.verity, &f.verity) {
        (None, Some(_)) => errs.push(violation(
            "installed",
            ViolationCode::Inconsistent,
            format!("the {name} carries dm-verity parameters but the plan has none"),
        )),
        // Parameters from an in-image file are known only once it is fetched (`preview`
        // shows the drop-in before): they are then left out (image) or empty (extension).
        (Some(VeritySource::Params(_)), None) => errs.push(violation(
            "installed",
            ViolationCode::Inconsistent,
            format!("the plan's {name} is measured but the installed file carries no verified parameters"),
        )),
        (Some(VeritySource::Params(p)), Some(got)) if p != got => errs.push(violation(
            "installed",
            ViolationCode::Inconsistent,
            format!("the {name} was verified against other dm-verity parameters than the plan's"),
        )),
        _ => {}
    }
    if matches!(f.kind, ArtifactKind::Kernel | ArtifactKind::Initrd) && (f.filesystem.is_some() || f.verity.is_some()) {
        errs.push(violation(
            "installed",
            ViolationCode::Inconsistent,
            format!("the {name} carries a filesystem or dm-verity parameters"),
        ));
    }
    if f.kind == ArtifactKind::Extension && f.filesystem.is_some_and(|fs| fs != Filesystem::Erofs) {
        errs.push(violation(
            "installed",
            ViolationCode::Inconsistent,
            String::from("the extension is not erofs: the guest mounts extensions as erofs only"),
        ));
    }
}

#[cfg(test)]
#[path = "measured_tests.rs"]
mod tests;
