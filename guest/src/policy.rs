//! ConfigMap data / `ADDON_*` env -> one normalised configuration -> env list or plan.
//!
//! Both entry points share [`resolve`]: the only difference is how keys are named.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::checks::{check_path, show, violation};
use crate::keys::{Given, Key, Kind, Naming, Values, listed};
use crate::measured::Verity;
use crate::providers;
use crate::reference;
use crate::wit::*;

/// The validated, defaulted configuration both entry points produce.
struct Config {
    /// Every key's value as the env list carries it (normalised or trimmed).
    values: Values,
    /// The image reference, normalised.
    image: String,
    /// The image reference, parsed.
    source: ImageSource,
    provider: Provider,
    version: String,
    /// RuntimeClass handlers, in order, each once; empty: the standard configurations.
    runtime_classes: Vec<String>,
    /// dm-verity parameters of the image and the extension.
    verity: Verity,
    /// `kataVersion`, parsed.
    kata_version: Option<KataVersion>,
    /// `seHostKeyDocuments`, each once, in order.
    se_host_key_documents: Vec<String>,
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

/// Validates and defaults an input list named with `naming`; collects every violation.
fn resolve(input: &[KeyValue], naming: Naming) -> Result<Config, Vec<Violation>> {
    let mut errs = Vec::new();
    let g = Given::read(input, naming, &mut errs);
    let parsed = image(&g, &mut errs);
    let provider = provider(&g, &mut errs);
    let version = version(&g, parsed.as_ref(), &mut errs);
    boot_artifacts(&g, provider, &mut errs);
    let verity = crate::measured::resolve(&g, provider, &mut errs);
    artifact_presence(&g, &mut errs);
    let runtime_classes = match g.value(Key::RuntimeClass) {
        Some(v) => crate::runtime_class::parse(g.name(Key::RuntimeClass), v, &mut errs),
        None => Vec::new(),
    };
    let kata_version =
        g.value(Key::KataVersion).and_then(|v| crate::kata_version::parse(g.name(Key::KataVersion), v, &mut errs));
    let se_host_key_documents = host_key_documents(&g, provider, &mut errs);
    let (true, Some(r), Some(provider), Some(version)) = (errs.is_empty(), parsed, provider, version) else {
        return Err(errs);
    };
    let values = Values::from_fn(|k| match k {
        Key::AddonImage => Some(r.normalised.clone()),
        Key::Provider => Some(String::from(provider.wit_name())),
        Key::Version => Some(version.clone()),
        Key::RuntimeClass => (!runtime_classes.is_empty()).then(|| runtime_classes.join(",")),
        Key::SeHostKeyDocuments => (!se_host_key_documents.is_empty()).then(|| se_host_key_documents.join(",")),
        _ => g.value(k).map(String::from),
    });
    Ok(Config {
        values,
        image: r.normalised,
        source: r.source,
        provider,
        version,
        runtime_classes,
        verity,
        kata_version,
        se_host_key_documents,
    })
}

/// `addonImage`: required, one reference.
fn image(g: &Given<'_>, errs: &mut Vec<Violation>) -> Option<reference::Parsed> {
    let key = g.name(Key::AddonImage);
    match g.value(Key::AddonImage) {
        None if !g.dup(Key::AddonImage) => {
            errs.push(violation(
                key,
                ViolationCode::Missing,
                String::from(
                    "the addon image is required: `registry/repository[:tag][@sha256:<hex>]` or `oci:/path/to/layout[:tag]`",
                ),
            ));
            None
        }
        None => None,
        Some(v) => match reference::parse(v) {
            Ok(r) => Some(r),
            Err(problems) => {
                errs.extend(problems.into_iter().map(|p| violation(key, ViolationCode::InvalidReference, p)));
                None
            }
        },
    }
}

/// `provider`: one of the known providers, `se` when absent.
fn provider(g: &Given<'_>, errs: &mut Vec<Violation>) -> Option<Provider> {
    match g.value(Key::Provider) {
        None => Some(Provider::Se),
        Some(name) if Provider::from_wit_name(name).is_some() => Provider::from_wit_name(name),
        Some(other) => {
            let names: Vec<&str> = Provider::ALL.iter().map(|p| p.wit_name()).collect();
            errs.push(violation(
                g.name(Key::Provider),
                ViolationCode::InvalidProvider,
                format!("unknown provider {}: accepted values are {} (lowercase)", show(other), listed(&names, "and")),
            ));
            None
        }
    }
}

/// `version`: given, or derived from the reference.
fn version(g: &Given<'_>, parsed: Option<&reference::Parsed>, errs: &mut Vec<Violation>) -> Option<String> {
    if g.value(Key::Version).is_some() {
        return g.checked(Key::Version, errs).map(String::from);
    }
    let r = parsed.filter(|_| !g.dup(Key::Version))?;
    let derived = default_version(&r.source);
    if kata_addons_facts::is_version(&derived) {
        return Some(derived);
    }
    errs.push(violation(
        g.name(Key::Version),
        ViolationCode::InvalidVersion,
        format!(
            "the default version {} (from the image tag) is not a valid version: set `{}` explicitly",
            show(&derived),
            g.name(Key::Version)
        ),
    ));
    None
}

/// The kernel, initrd and image keys: paths, the provider's consent, checksums beside
/// their artifact (the extension's keys are `measured.rs`'s).
fn boot_artifacts(g: &Given<'_>, provider: Option<Provider>, errs: &mut Vec<Violation>) {
    for kind in [ArtifactKind::Kernel, ArtifactKind::Initrd, ArtifactKind::Image] {
        let (Some(path), Some(sha)) = (Key::of(kind, Kind::Path), Key::of(kind, Kind::Sha256)) else { continue };
        if g.value(path).is_some() {
            g.checked(path, errs);
            if let Some(pr) = provider
                && !providers::allowed(pr).contains(&kind)
            {
                let others: Vec<&str> = Provider::ALL
                    .iter()
                    .filter(|p| providers::allowed(**p).contains(&kind))
                    .map(|p| p.wit_name())
                    .collect();
                errs.push(violation(
                    g.name(path),
                    ViolationCode::NotAllowed,
                    format!(
                        "provider `{}` boots a kernel only: remove `{}` (use provider {} for an initrd or image)",
                        pr.wit_name(),
                        g.name(path),
                        listed(&others, "or")
                    ),
                ));
            }
        }
        if g.value(sha).is_some() {
            g.checked(sha, errs);
            if !g.given(path) {
                errs.push(violation(
                    g.name(sha),
                    ViolationCode::Inconsistent,
                    format!("`{}` is set but `{}` is not: a checksum needs its artifact", g.name(sha), g.name(path)),
                ));
            }
        }
    }
}

/// `seHostKeyDocuments`: node paths, for provider `se` only (the documents name IBM Z
/// machines; no other provider has SE key slots).
fn host_key_documents(g: &Given<'_>, provider: Option<Provider>, errs: &mut Vec<Violation>) -> Vec<String> {
    let key = g.name(Key::SeHostKeyDocuments);
    let Some(v) = g.value(Key::SeHostKeyDocuments) else { return Vec::new() };
    if let Some(p) = provider.filter(|p| *p != Provider::Se) {
        errs.push(violation(
            key,
            ViolationCode::NotAllowed,
            format!(
                "`{key}` names IBM Secure Execution host key documents, but the provider is `{}`: remove `{key}` or use \
                 provider `se`",
                p.wit_name()
            ),
        ));
        return Vec::new();
    }
    crate::node_paths::parse(key, v, errs)
}

/// At least one artifact, and never both an initrd and an image.
fn artifact_presence(g: &Given<'_>, errs: &mut Vec<Violation>) {
    let paths: Vec<Key> = Key::ALL.into_iter().filter(|k| k.kind() == Kind::Path).collect();
    if let Some((first, rest)) = paths.split_first()
        && !paths.iter().any(|k| g.given(*k))
    {
        let rest: Vec<&str> = rest.iter().map(|k| g.name(*k)).collect();
        errs.push(violation(
            g.name(*first),
            ViolationCode::Missing,
            format!(
                "no artifact: set `{}` (and, for providers that allow it, {})",
                g.name(*first),
                listed(&rest, "or")
            ),
        ));
    }
    if g.given(Key::InitrdPath) && g.given(Key::ImagePath) {
        errs.push(violation(
            g.name(Key::ImagePath),
            ViolationCode::Conflict,
            format!(
                "`{}` and `{}` are exclusive: a guest boots either an initrd or an image",
                g.name(Key::InitrdPath),
                g.name(Key::ImagePath)
            ),
        ));
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
    Ok(c.values.into_env())
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
    // One artifact per path key given, in table order (kernel, initrd, image, extension).
    let value = |kind: ArtifactKind, of: Kind| Key::of(kind, of).and_then(|k| c.values.get(k)).map(String::from);
    let artifacts = Key::ALL
        .into_iter()
        .filter(|k| k.kind() == Kind::Path)
        .filter_map(|k| {
            let kind = k.artifact()?;
            Some(Artifact {
                kind,
                source: String::from(c.values.get(k)?),
                file_name: String::from(kind.wit_name()),
                sha256: value(kind, Kind::Sha256),
                verity: c.verity.of(kind),
                name: value(kind, Kind::Name),
            })
        })
        .collect();
    Ok(Plan {
        image: c.image,
        source: c.source,
        provider: c.provider,
        version: c.version,
        runtime_configs: providers::runtime_configs(c.provider, &node.kata_prefix),
        runtime_classes: c.runtime_classes,
        artifacts,
        kata_version: c.kata_version,
        se_host_key_documents: c.se_host_key_documents,
    })
}
