//! ConfigMap data / `ADDON_*` env -> one normalised configuration -> env list or plan.
//!
//! Both entry points share [`resolve`]: the only difference is how keys are named.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use kata_addons_facts::trimmed;

use crate::checks::{check_path, is_sha256_hex, is_version, show, suggest};
use crate::providers::{self, KINDS};
use crate::reference;
use crate::wit::*;

const IMAGE: usize = 0;
const PROVIDER: usize = 1;
const VERSION: usize = 2;
/// Index of the first artifact path; kernel, initrd, image follow in that order.
const PATHS: usize = 3;
/// Index of the first artifact sha256; kernel, initrd, image follow in that order.
const SHAS: usize = 6;
const RUNTIME_CLASS: usize = 9;
/// Index of the first measured-guest key (`imageVerityParams` .. `extensionSha256`, see
/// [`crate::measured`]).
const MEASURED: usize = 10;
const FIELDS: usize = 17;

/// Key names per field (in the fixed env order): ConfigMap key, env var.
const KEYS: [(&str, &str); FIELDS] = [
    ("addonImage", "ADDON_IMAGE"),
    ("provider", "ADDON_PROVIDER"),
    ("version", "ADDON_VERSION"),
    ("kernelPath", "ADDON_KERNEL_PATH"),
    ("initrdPath", "ADDON_INITRD_PATH"),
    ("imagePath", "ADDON_IMAGE_PATH"),
    ("kernelSha256", "ADDON_KERNEL_SHA256"),
    ("initrdSha256", "ADDON_INITRD_SHA256"),
    ("imageSha256", "ADDON_IMAGE_SHA256"),
    ("runtimeClass", "ADDON_RUNTIME_CLASS"),
    ("imageVerityParams", "ADDON_IMAGE_VERITY_PARAMS"),
    ("imageVerityPath", "ADDON_IMAGE_VERITY_PATH"),
    ("extensionPath", "ADDON_EXTENSION_PATH"),
    ("extensionName", "ADDON_EXTENSION_NAME"),
    ("extensionVerityParams", "ADDON_EXTENSION_VERITY_PARAMS"),
    ("extensionVerityPath", "ADDON_EXTENSION_VERITY_PATH"),
    ("extensionSha256", "ADDON_EXTENSION_SHA256"),
];

/// Which of the two key namings an input uses.
#[derive(Clone, Copy)]
enum Naming {
    /// ConfigMap `data` keys (`addonImage`, …).
    Data,
    /// Environment variables (`ADDON_IMAGE`, …).
    Env,
}

impl Naming {
    fn key(self, field: usize) -> &'static str {
        match self {
            Naming::Data => KEYS[field].0,
            Naming::Env => KEYS[field].1,
        }
    }

    fn all(self) -> [&'static str; FIELDS] {
        core::array::from_fn(|i| self.key(i))
    }
}

/// The validated, defaulted configuration both entry points produce.
struct Config {
    image: String,
    source: ImageSource,
    provider: Provider,
    version: String,
    /// In-image paths of kernel, initrd, image.
    paths: [Option<String>; 3],
    /// Expected sha256 of kernel, initrd, image.
    shas: [Option<String>; 3],
    /// RuntimeClass handlers, in order, each once; empty: the standard configurations.
    runtime_classes: Vec<String>,
    /// dm-verity parameters of the image, and the extension.
    measured: crate::measured::Measured,
    /// The measured-guest values as given (trimmed), in key order, for `env`.
    measured_raw: [Option<String>; 7],
}

/// Most violations one call returns; the last one then says how many were left out.
pub const MAX_VIOLATIONS: usize = 64;

/// Caps a violation list at [`MAX_VIOLATIONS`]: the first `MAX_VIOLATIONS - 1` are kept and
/// one more says how many were left out, so the runner always gets a bounded, readable list.
pub(crate) fn capped(mut errs: Vec<Violation>) -> Vec<Violation> {
    if errs.len() <= MAX_VIOLATIONS {
        return errs;
    }
    let more = errs.len() - (MAX_VIOLATIONS - 1);
    let code = errs[MAX_VIOLATIONS - 1].code;
    errs.truncate(MAX_VIOLATIONS - 1);
    errs.push(violation(
        "(more)",
        code,
        format!("\u{2026} and {more} more (at most {MAX_VIOLATIONS} problems are listed: fix these and run again)"),
    ));
    errs
}

fn violation(key: &str, code: ViolationCode, message: String) -> Violation {
    Violation { key: String::from(key), code, message }
}

/// Validates and defaults an input list named with `naming`; collects every violation.
fn resolve(input: &[KeyValue], naming: Naming) -> Result<Config, Vec<Violation>> {
    let mut errs = Vec::new();
    let known = naming.all();
    let mut values: [Option<&str>; FIELDS] = [None; FIELDS];
    let mut seen = [false; FIELDS];
    // A duplicated key is reported as such, not also as a problem with one of its values.
    let mut dup = [false; FIELDS];
    let mut unknown_seen: Vec<&str> = Vec::new();

    for kv in input {
        match known.iter().position(|k| *k == kv.name) {
            Some(i) => {
                if seen[i] {
                    values[i] = None;
                    if dup[i] {
                        continue;
                    }
                    dup[i] = true;
                    errs.push(violation(
                        &kv.name,
                        ViolationCode::Conflict,
                        format!("{} is given more than once: give each key exactly once", show(&kv.name)),
                    ));
                    continue;
                }
                seen[i] = true;
                values[i] = trimmed(&kv.value);
            }
            None => {
                if unknown_seen.contains(&kv.name.as_str()) {
                    continue;
                }
                unknown_seen.push(&kv.name);
                let message = match suggest(&kv.name, &known) {
                    Some(s) => format!("unknown key {}: did you mean `{s}`?", show(&kv.name)),
                    None => format!("unknown key {}: known keys are {}", show(&kv.name), known.join(", ")),
                };
                errs.push(violation(&kv.name, ViolationCode::UnknownKey, message));
            }
        }
    }

    // Image reference.
    let mut parsed = None;
    match values[IMAGE] {
        None if !dup[IMAGE] => errs.push(violation(
            naming.key(IMAGE),
            ViolationCode::Missing,
            String::from(
                "the addon image is required: `registry/repository[:tag][@sha256:<hex>]` or `oci:/path/to/layout[:tag]`",
            ),
        )),
        None => {}
        Some(v) => match reference::parse(v) {
            Ok(r) => parsed = Some(r),
            Err(problems) => {
                for p in problems {
                    errs.push(violation(naming.key(IMAGE), ViolationCode::InvalidReference, p));
                }
            }
        },
    }

    // Provider.
    let provider = match values[PROVIDER] {
        None => Some(Provider::Se),
        Some(name) if providers::named(name).is_some() => providers::named(name),
        Some(other) => {
            errs.push(violation(
                naming.key(PROVIDER),
                ViolationCode::InvalidProvider,
                format!("unknown provider {}: accepted values are `se`, `tdx` and `snp` (lowercase)", show(other)),
            ));
            None
        }
    };

    // Version: given, or derived from the reference.
    let mut version = None;
    match values[VERSION] {
        Some(v) if is_version(v) => version = Some(String::from(v)),
        Some(v) => errs.push(violation(
            naming.key(VERSION),
            ViolationCode::InvalidVersion,
            format!(
                "version {} is invalid: 1-128 characters from `A-Za-z0-9._+-`, starting with a letter or digit",
                show(v)
            ),
        )),
        None if dup[VERSION] => {}
        None => {
            if let Some(r) = &parsed {
                let derived = default_version(&r.source);
                if is_version(&derived) {
                    version = Some(derived);
                } else {
                    errs.push(violation(
                        naming.key(VERSION),
                        ViolationCode::InvalidVersion,
                        format!(
                            "the default version {} (from the image tag) is not a valid version: set `{}` explicitly",
                            show(&derived),
                            naming.key(VERSION)
                        ),
                    ));
                }
            }
        }
    }

    // Artifact paths and checksums.
    let mut paths: [Option<String>; 3] = [None, None, None];
    let mut shas: [Option<String>; 3] = [None, None, None];
    for a in 0..3 {
        let present = values[PATHS + a].is_some() || dup[PATHS + a];
        if let Some(p) = values[PATHS + a] {
            match check_path(p) {
                Ok(()) => paths[a] = Some(String::from(p)),
                Err(e) => errs.push(violation(naming.key(PATHS + a), ViolationCode::InvalidPath, e)),
            }
            if let Some(pr) = provider
                && !providers::allowed(pr).contains(&KINDS[a])
            {
                errs.push(violation(
                    naming.key(PATHS + a),
                    ViolationCode::NotAllowed,
                    format!(
                        "provider `{}` boots a kernel only: remove `{}` (use provider `tdx` or `snp` for an initrd or image)",
                        pr.wit_name(),
                        naming.key(PATHS + a)
                    ),
                ));
            }
        }
        if let Some(h) = values[SHAS + a] {
            if is_sha256_hex(h) {
                shas[a] = Some(String::from(h));
            } else {
                errs.push(violation(
                    naming.key(SHAS + a),
                    ViolationCode::InvalidSha256,
                    format!(
                        "sha256 {} is invalid: exactly 64 lowercase hex characters (0-9, a-f) are accepted",
                        show(h)
                    ),
                ));
            }
            if !present {
                errs.push(violation(
                    naming.key(SHAS + a),
                    ViolationCode::Inconsistent,
                    format!(
                        "`{}` is set but `{}` is not: a checksum needs its artifact",
                        naming.key(SHAS + a),
                        naming.key(PATHS + a)
                    ),
                ));
            }
        }
    }
    let present = |a: usize| values[PATHS + a].is_some() || dup[PATHS + a];
    let measured = crate::measured::resolve(
        &crate::measured::Inputs {
            values: core::array::from_fn(|i| (naming.key(MEASURED + i), values[MEASURED + i])),
            dup: core::array::from_fn(|i| dup[MEASURED + i]),
            image: (naming.key(PATHS + 2), present(2)),
            provider,
        },
        &mut errs,
    );
    let measured_raw: [Option<String>; 7] = core::array::from_fn(|i| values[MEASURED + i].map(String::from));
    let extension_given = values[MEASURED + 2].is_some() || dup[MEASURED + 2];
    if !(0..3).any(present) && !extension_given {
        errs.push(violation(
            naming.key(PATHS),
            ViolationCode::Missing,
            format!(
                "no artifact: set `{}` (and, for providers that allow it, `{}`, `{}` or `{}`)",
                naming.key(PATHS),
                naming.key(PATHS + 1),
                naming.key(PATHS + 2),
                naming.key(MEASURED + 2)
            ),
        ));
    }
    if present(1) && present(2) {
        errs.push(violation(
            naming.key(PATHS + 2),
            ViolationCode::Conflict,
            format!(
                "`{}` and `{}` are exclusive: a guest boots either an initrd or an image",
                naming.key(PATHS + 1),
                naming.key(PATHS + 2)
            ),
        ));
    }

    let runtime_classes = match values[RUNTIME_CLASS] {
        Some(v) => crate::runtime_class::parse(naming.key(RUNTIME_CLASS), v, &mut errs),
        None => Vec::new(),
    };

    match (errs.is_empty(), parsed, provider, version) {
        (true, Some(r), Some(provider), Some(version)) => Ok(Config {
            image: r.normalised,
            source: r.source,
            provider,
            version,
            paths,
            shas,
            runtime_classes,
            measured,
            measured_raw,
        }),
        _ => Err(errs),
    }
}

/// The default version: the tag, else `sha256-` + 12 hex of the digest, else `latest`.
fn default_version(source: &ImageSource) -> String {
    let (tag, digest) = match source {
        ImageSource::Registry(r) => (r.tag.as_deref(), r.digest.as_deref()),
        ImageSource::Layout(l) => (l.tag.as_deref(), None),
    };
    match (tag, digest) {
        (Some(t), _) => String::from(t),
        (None, Some(d)) => {
            let hex = d.strip_prefix("sha256:").unwrap_or(d);
            format!("sha256-{}", hex.get(..12).unwrap_or(hex))
        }
        (None, None) => String::from("latest"),
    }
}

/// ConfigMap data -> fully resolved `ADDON_*` env list (defaults applied, fixed order).
pub fn env(data: &[KeyValue]) -> Result<Vec<KeyValue>, Vec<Violation>> {
    let c = resolve(data, Naming::Data).map_err(capped)?;
    let key = |i: usize| Naming::Env.key(i);
    let mut out = alloc::vec![
        KeyValue::new(key(IMAGE), c.image),
        KeyValue::new(key(PROVIDER), c.provider.wit_name()),
        KeyValue::new(key(VERSION), c.version),
    ];
    for (a, p) in c.paths.into_iter().enumerate() {
        if let Some(p) = p {
            out.push(KeyValue::new(key(PATHS + a), p));
        }
    }
    for (a, h) in c.shas.into_iter().enumerate() {
        if let Some(h) = h {
            out.push(KeyValue::new(key(SHAS + a), h));
        }
    }
    if !c.runtime_classes.is_empty() {
        out.push(KeyValue::new(key(RUNTIME_CLASS), c.runtime_classes.join(",")));
    }
    for (i, v) in c.measured_raw.into_iter().enumerate() {
        if let Some(v) = v {
            out.push(KeyValue::new(key(MEASURED + i), v));
        }
    }
    Ok(out)
}

/// `ADDON_*` env list + node facts -> install plan.
pub fn plan(env: &[KeyValue], node: &NodeOptions) -> Result<Plan, Vec<Violation>> {
    let prefix_ok = check_path(&node.kata_prefix)
        .map_err(|e| violation("--kata-prefix", ViolationCode::InvalidPath, format!("kata-deploy prefix: {e}")));
    let c = match (resolve(env, Naming::Env), prefix_ok) {
        (Ok(c), Ok(())) => c,
        (Err(mut errs), Err(p)) => {
            errs.push(p);
            return Err(capped(errs));
        }
        (Err(errs), Ok(())) => return Err(capped(errs)),
        (Ok(_), Err(p)) => return Err(alloc::vec![p]),
    };
    let mut artifacts = Vec::new();
    for (a, (p, h)) in c.paths.into_iter().zip(c.shas).enumerate() {
        if let Some(source) = p {
            artifacts.push(Artifact {
                kind: KINDS[a],
                source,
                file_name: String::from(KINDS[a].wit_name()),
                sha256: h,
                verity: if KINDS[a] == ArtifactKind::Image { c.measured.image_verity.clone() } else { None },
                name: None,
            });
        }
    }
    if let Some((source, name, sha256, verity)) = c.measured.extension {
        artifacts.push(Artifact {
            kind: ArtifactKind::Extension,
            source,
            file_name: String::from(ArtifactKind::Extension.wit_name()),
            sha256,
            verity,
            name: Some(name),
        });
    }
    Ok(Plan {
        image: c.image,
        source: c.source,
        provider: c.provider,
        version: c.version,
        runtime_classes: c.runtime_classes,
        runtime_configs: providers::runtime_configs(c.provider, &node.kata_prefix),
        artifacts,
    })
}
