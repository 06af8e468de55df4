//! Measured guests (docs/design.md#measured-guests): the dm-verity keys of the guest
//! image, the guest extension image keys, and what the drop-in sets for them.
//!
//! Validation here, for [`crate::policy`]: verity keys only beside their artifact,
//! `*VerityParams` and `*VerityPath` never together, parameters through the one shared
//! parser (`kata_addons_facts::verity`), extension names as Kata's loader requires and
//! short enough that `extension-<name>` fits the 20-byte virtio-blk ID (the guest's mount
//! script finds the disk by that serial), and IBM SE refusing all of it (its command line
//! is sealed into the SE image).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::checks::{check_path, is_sha256_hex, show};
use crate::wit::*;

/// Bytes of a virtio-blk device ID (`VIRTIO_BLK_ID_BYTES` in the virtio specification and
/// Linux' `drivers/block/virtio_blk.c`): the serial the guest reads is at most this long.
pub(crate) const VIRTIO_BLK_ID_BYTES: usize = 20;
/// Prefix of an extension's virtio-blk serial (Kata's `extension-<name>`).
pub(crate) const SERIAL_PREFIX: &str = "extension-";
/// Longest extension name: `extension-<name>` must fit [`VIRTIO_BLK_ID_BYTES`].
pub(crate) const MAX_NAME: usize = VIRTIO_BLK_ID_BYTES - SERIAL_PREFIX.len();

/// The measured-guest inputs, as named by the caller (ConfigMap keys or env vars).
pub(crate) struct Inputs<'a> {
    /// (key, value) of imageVerityParams, imageVerityPath, extensionPath, extensionName,
    /// extensionVerityParams, extensionVerityPath, extensionSha256.
    pub values: [(&'static str, Option<&'a str>); 7],
    /// Whether each was given more than once (already reported).
    pub dup: [bool; 7],
    /// The `imagePath` key and whether an image is configured.
    pub image: (&'static str, bool),
    /// The provider, when valid.
    pub provider: Option<Provider>,
}

const IMAGE_PARAMS: usize = 0;
const IMAGE_PATH: usize = 1;
const EXT_PATH: usize = 2;
const EXT_NAME: usize = 3;
const EXT_PARAMS: usize = 4;
const EXT_VPATH: usize = 5;
const EXT_SHA: usize = 6;

/// The validated measured-guest configuration.
#[derive(Debug, Clone, Default)]
pub(crate) struct Measured {
    /// The guest image's dm-verity parameters.
    pub image_verity: Option<VeritySource>,
    /// The extension: in-image path, name, sha256, dm-verity parameters.
    pub extension: Option<(String, String, Option<String>, Option<VeritySource>)>,
}

fn violation(key: &str, code: ViolationCode, message: String) -> Violation {
    Violation { key: String::from(key), code, message }
}

/// A `*VerityParams` / `*VerityPath` pair -> where the parameters come from.
fn verity_source(
    params: (&'static str, Option<&str>),
    path: (&'static str, Option<&str>),
    errs: &mut Vec<Violation>,
) -> Option<VeritySource> {
    match (params.1, path.1) {
        (Some(_), Some(_)) => {
            errs.push(violation(
                path.0,
                ViolationCode::Conflict,
                format!(
                    "`{}` and `{}` are exclusive: give the parameters or the in-image file holding them",
                    params.0, path.0
                ),
            ));
            None
        }
        (Some(v), None) => match kata_addons_facts::verity::parse(v) {
            Ok(p) => Some(VeritySource::Params(VerityParams {
                root_hash: p.root_hash,
                salt: p.salt,
                data_blocks: p.data_blocks,
                data_block_size: p.data_block_size,
                hash_block_size: p.hash_block_size,
            })),
            Err(e) => {
                errs.push(violation(params.0, ViolationCode::InvalidVerity, format!("{e}")));
                None
            }
        },
        (None, Some(p)) => match check_path(p) {
            Ok(()) => Some(VeritySource::File(String::from(p))),
            Err(e) => {
                errs.push(violation(path.0, ViolationCode::InvalidPath, e));
                None
            }
        },
        (None, None) => None,
    }
}

/// Checks an extension name as Kata's loader does and against the virtio-blk ID size.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!(
            "extension name {} is invalid: only ASCII letters, digits, `-` and `_` (Kata puts it in the virtio-blk \
             serial and in `kata.extension.<name>.verity_params` on the guest command line)",
            show(name)
        ));
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "extension name {} is {} bytes: the guest finds the disk by its serial `{SERIAL_PREFIX}<name>` and a \
             virtio-blk ID holds {VIRTIO_BLK_ID_BYTES} bytes, so at most {MAX_NAME} are accepted",
            show(name),
            name.len()
        ));
    }
    Ok(())
}

/// Validates the measured-guest keys; every violation goes to `errs`.
pub(crate) fn resolve(inp: &Inputs<'_>, errs: &mut Vec<Violation>) -> Measured {
    let v = |i: usize| inp.values[i];
    let given = |i: usize| inp.values[i].1.is_some() || inp.dup[i];
    if inp.provider == Some(Provider::Se) {
        for i in 0..7 {
            if given(i) {
                errs.push(violation(
                    v(i).0,
                    ViolationCode::NotAllowed,
                    format!(
                        "provider `se` boots one sealed SE image (its kernel command line is inside it): no image, \
                         dm-verity or extension addon; remove `{}`",
                        v(i).0
                    ),
                ));
            }
        }
        return Measured::default();
    }
    let mut out = Measured::default();
    if (given(IMAGE_PARAMS) || given(IMAGE_PATH)) && !inp.image.1 {
        let k = if given(IMAGE_PARAMS) { v(IMAGE_PARAMS).0 } else { v(IMAGE_PATH).0 };
        errs.push(violation(
            k,
            ViolationCode::Inconsistent,
            format!("`{k}` is set but `{}` is not: dm-verity parameters need their guest image", inp.image.0),
        ));
    } else {
        out.image_verity = verity_source(v(IMAGE_PARAMS), v(IMAGE_PATH), errs);
    }

    let has_ext = given(EXT_PATH);
    for i in [EXT_NAME, EXT_PARAMS, EXT_VPATH, EXT_SHA] {
        if given(i) && !has_ext {
            errs.push(violation(
                v(i).0,
                ViolationCode::Inconsistent,
                format!("`{}` is set but `{}` is not: it describes the extension image", v(i).0, v(EXT_PATH).0),
            ));
        }
    }
    if !has_ext {
        return out;
    }
    let path = match v(EXT_PATH).1.map(|p| (p, check_path(p))) {
        Some((p, Ok(()))) => Some(String::from(p)),
        Some((_, Err(e))) => {
            errs.push(violation(v(EXT_PATH).0, ViolationCode::InvalidPath, e));
            None
        }
        None => None,
    };
    let name = match v(EXT_NAME).1 {
        None if !inp.dup[EXT_NAME] => {
            errs.push(violation(
                v(EXT_NAME).0,
                ViolationCode::Missing,
                format!(
                    "`{}` requires `{}`: the extension's name (e.g. `coco`), which Kata uses in its virtio-blk serial",
                    v(EXT_PATH).0,
                    v(EXT_NAME).0
                ),
            ));
            None
        }
        None => None,
        Some(n) => match check_name(n) {
            Ok(()) => Some(String::from(n)),
            Err(e) => {
                errs.push(violation(v(EXT_NAME).0, ViolationCode::InvalidName, e));
                None
            }
        },
    };
    let sha = match v(EXT_SHA).1 {
        Some(h) if is_sha256_hex(h) => Some(String::from(h)),
        Some(h) => {
            errs.push(violation(
                v(EXT_SHA).0,
                ViolationCode::InvalidSha256,
                format!("sha256 {} is invalid: exactly 64 lowercase hex characters (0-9, a-f) are accepted", show(h)),
            ));
            None
        }
        None => None,
    };
    let verity = verity_source(v(EXT_PARAMS), v(EXT_VPATH), errs);
    if let (Some(path), Some(name)) = (path, name) {
        out.extension = Some((path, name, sha, verity));
    }
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

fn fs_name(f: Filesystem) -> &'static str {
    match f {
        Filesystem::Ext4 => "ext4",
        Filesystem::Xfs => "xfs",
        Filesystem::Erofs => "erofs",
    }
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
            Some(v) => b.kernel_verity_params = Some(v.to_kata()),
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
        b.rootfs_type = img.filesystem.map(fs_name);
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
            verity_params: ext.verity.as_ref().map(VerityParams::to_kata).unwrap_or_default(),
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

impl VerityParams {
    /// Kata's `kernel_verity_params` text.
    pub fn to_kata(&self) -> String {
        format!(
            "root_hash={},salt={},data_blocks={},data_block_size={},hash_block_size={}",
            self.root_hash, self.salt, self.data_blocks, self.data_block_size, self.hash_block_size
        )
    }
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
