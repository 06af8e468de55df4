//! Admission warnings: the preview of a valid ConfigMap (image, provider and runtime,
//! version, files, drop-in keys) as printable one-liners within the API server's limits.

use crate::policy::Provider;
use crate::preview::Preview;

/// Kubernetes recommends at most 120 characters per admission warning.
pub(crate) const MAX_WARNING_CHARS: usize = 120;
/// Most warnings in one response. The API server keeps at most 4096 characters of
/// warnings per request from all sources (beyond that it cuts each to 256); 16 × 120
/// stays under half of that.
pub(crate) const MAX_WARNINGS: usize = 16;

/// One warning as the API server accepts it: printable (control characters would make
/// it drop the warning), at most [`MAX_WARNING_CHARS`] characters (cut with `…`).
pub(crate) fn warning(text: &str) -> String {
    let clean: String =
        text.chars().map(|c| if kata_addons_facts::is_unsafe_char(c) { '\u{fffd}' } else { c }).collect();
    if clean.chars().count() <= MAX_WARNING_CHARS {
        return clean;
    }
    let mut out: String = clean.chars().take(MAX_WARNING_CHARS - 1).collect();
    out.push('…');
    out
}

/// The Kata runtime a provider selects, named without a node path (the path depends on
/// each node's Kata layout).
fn runtime_name(p: Provider) -> &'static str {
    match p {
        Provider::Se => "the Kata runtime for IBM Secure Execution",
        Provider::Tdx => "the Kata runtime for Intel TDX",
        Provider::Snp => "the Kata runtime for AMD SEV-SNP",
    }
}

/// `key = value` lines of a TOML table, dotted, in document order of the serializer.
fn toml_assignments(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
    for (k, v) in table {
        let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(t) => toml_assignments(&name, t, out),
            other => out.push(format!("{name} = {other}")),
        }
    }
}

/// The preview as admission warnings: image, provider and runtime, version, each file,
/// and each key the drop-in sets. Unique, printable, cut to the API server's limits.
pub(crate) fn preview_warnings(p: &Preview) -> Vec<String> {
    let plan = &p.plan;
    let mut lines = vec![
        format!("kata-addons: image {}", plan.image),
        format!(
            "kata-addons: provider {}: {} boots it (drop-in in [{}])",
            plan.provider,
            runtime_name(plan.provider),
            kata_addons_facts::HYPERVISOR_TABLE
        ),
        format!("kata-addons: version {}", plan.version),
    ];
    for a in &plan.artifacts {
        let sha = a.sha256.as_deref().map(|s| format!(", sha256 {s}")).unwrap_or_default();
        lines.push(format!("kata-addons: {} {} from the image{sha}", a.kind, a.source));
    }
    let mut sets = Vec::new();
    // Every runtime configuration gets the same text: the first one shows what is set.
    if let Some(Ok(table)) = p.drop_ins.first().map(|d| toml::from_str::<toml::Table>(&d.contents)) {
        toml_assignments("", &table, &mut sets);
    }
    for s in sets {
        lines.push(format!("kata-addons: drop-in sets {s}"));
    }
    if crate::kata_release::wanted(plan).is_some() {
        lines.push(format!("kata-addons: {}", p.kata_check));
    }
    if let Some(l) = crate::attest::invalidates::line(plan) {
        lines.push(format!("kata-addons: {l}"));
    }
    if crate::layout::pinned_digest(plan).is_none() {
        lines.push(format!(
            "kata-addons: {} = first 12 hex digits of the manifest digest, known after the pull",
            crate::layout::UNKNOWN_DIGEST
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for l in lines.iter().map(|l| warning(l)) {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    if out.len() > MAX_WARNINGS {
        let more = out.len() - (MAX_WARNINGS - 1);
        out.truncate(MAX_WARNINGS - 1);
        out.push(format!("kata-addons: … and {more} more (run `kata-addons preview` for all)"));
    }
    out
}

/// A ConfigMap's `data` as the webhook reads it.
type Data<'a> = std::collections::BTreeMap<std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>>;

/// An UPDATE that changes `kataVersion` without `addonImage`, or `addonImage` without a
/// set `kataVersion`: an addon is built for one Kata release (docs/configuration.md#kataversion),
/// so one without the other is likely a mistake. Values compared as the runner reads them
/// (trimmed, empty = absent).
pub(crate) fn kata_version_pairing(old: Option<&Data<'_>>, new: Option<&Data<'_>>) -> Vec<String> {
    let get = |d: Option<&Data<'_>>, k: &str| {
        d.and_then(|d| d.get(k)).and_then(|v| kata_addons_facts::trimmed(v)).map(str::to_string)
    };
    let (image_old, image_new) = (get(old, "addonImage"), get(new, "addonImage"));
    let (kata_old, kata_new) = (get(old, "kataVersion"), get(new, "kataVersion"));
    let mut out = Vec::new();
    if kata_old != kata_new && image_old == image_new {
        out.push(warning(&format!(
            "kata-addons: kataVersion changed ({} -> {}) but addonImage did not: is the image built for that Kata?",
            kata_old.as_deref().unwrap_or("unset"),
            kata_new.as_deref().unwrap_or("unset")
        )));
    }
    if image_old != image_new && kata_old == kata_new && kata_new.is_some() {
        out.push(warning(&format!(
            "kata-addons: addonImage changed but kataVersion did not ({}): is the new image built for it?",
            kata_new.as_deref().unwrap_or_default()
        )));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_cut_and_printable() {
        let w = warning(&format!("a\nb{}", "x".repeat(300)));
        assert_eq!(w.chars().count(), MAX_WARNING_CHARS);
        assert!(!w.chars().any(char::is_control));
        assert!(w.ends_with('…'));
        assert_eq!(warning("short"), "short");
    }

    #[test]
    fn kata_version_and_image_change_together() {
        let d = |pairs: &[(&'static str, &'static str)]| -> Data<'static> {
            pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        let base = d(&[("addonImage", "q/a:1"), ("kataVersion", "3.25.0")]);
        let both = d(&[("addonImage", "q/a:2"), ("kataVersion", "3.26.0")]);
        let kata_only = d(&[("addonImage", "q/a:1"), ("kataVersion", "3.26.0")]);
        let image_only = d(&[("addonImage", "q/a:2"), ("kataVersion", " 3.25.0 ")]);
        assert!(kata_version_pairing(Some(&base), Some(&both)).is_empty());
        assert!(kata_version_pairing(Some(&base), Some(&base)).is_empty());
        assert!(kata_version_pairing(Some(&base), Some(&kata_only))[0].contains("addonImage did not"));
        assert!(kata_version_pairing(Some(&base), Some(&image_only))[0].contains("kataVersion did not"));
        let unset = d(&[("addonImage", "q/a:1")]);
        assert!(kata_version_pairing(Some(&unset), Some(&d(&[("addonImage", "q/a:2")]))).is_empty());
        assert!(kata_version_pairing(Some(&unset), Some(&base))[0].contains("unset -> 3.25.0"));
    }
}
