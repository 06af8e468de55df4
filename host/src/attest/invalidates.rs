//! Which reference values an install of a plan replaces (`preview`, the webhook): a pure
//! function of the plan's artifacts and provider, so an admin sees "this change invalidates
//! snp_launch_measurement on kata-snp" before it rolls out (`docs/attestation.md`). It
//! names what the guest measures, whether or not kata-addons computes the value.

use crate::policy::{ArtifactKind, Plan, Provider, VeritySource};

/// The names of the values the plan's artifacts change, in a fixed order.
pub(crate) fn names(plan: &Plan) -> Vec<String> {
    let has = |k: ArtifactKind| plan.artifacts.iter().any(|a| a.kind == k);
    let mut out: Vec<String> = Vec::new();
    let mut add = |n: &str| {
        if !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    };
    match plan.provider {
        Provider::Se if has(ArtifactKind::Kernel) => {
            // The SE image seals kernel, initrd and command line: its header changes.
            for n in ["se.version", "se.tag", "se.image_phkh"] {
                add(n);
            }
        }
        Provider::Snp if !plan.artifacts.is_empty() => add("snp_launch_measurement"),
        Provider::Tdx => {
            // TDVF measures the kernel into RTMR 1, the command line (with the dm-verity
            // parameters of image and extensions) and the initrd into RTMR 2.
            if has(ArtifactKind::Kernel) {
                add("rtmr_1");
            }
            if has(ArtifactKind::Initrd) || has(ArtifactKind::Image) || has(ArtifactKind::Extension) {
                add("rtmr_2");
            }
        }
        _ => {}
    }
    for a in &plan.artifacts {
        let measured = matches!(a.verity, Some(VeritySource::Params(_)));
        if !measured || a.sha256.is_some() {
            add(&format!("kata_addons.{}.sha256", a.kind));
        }
        if a.verity.is_some() {
            add(&format!("kata_addons.{}.root_hash", a.kind));
        }
    }
    out
}

/// Where the values change: each RuntimeClass handler, else the provider's standard runtime
/// (`kata-<provider>`).
pub(crate) fn targets(plan: &Plan) -> String {
    if plan.runtime_classes.is_empty() { format!("kata-{}", plan.provider) } else { plan.runtime_classes.join(", ") }
}

/// One line: "this change invalidates A, B on T".
pub(crate) fn line(plan: &Plan) -> Option<String> {
    let names = names(plan);
    (!names.is_empty()).then(|| format!("this change invalidates {} on {}", names.join(", "), targets(plan)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Artifact, ImageSource, LayoutRef};

    fn plan(provider: Provider, kinds: &[(ArtifactKind, bool)], classes: &[&str]) -> Plan {
        Plan {
            image: "oci:/l".into(),
            source: ImageSource::Layout(LayoutRef { path: "/l".into(), tag: None }),
            provider,
            version: "v1".into(),
            runtime_classes: classes.iter().map(|c| c.to_string()).collect(),
            runtime_configs: Vec::new(),
            artifacts: kinds
                .iter()
                .map(|(k, verity)| Artifact {
                    kind: *k,
                    source: "/f".into(),
                    file_name: k.to_string(),
                    sha256: None,
                    verity: verity.then(|| VeritySource::File("/v".into())),
                    name: None,
                })
                .collect(),
            kata_version: None,
            se_host_key_documents: Vec::new(),
        }
    }

    #[test]
    fn names_follow_what_the_guest_measures() {
        let se = plan(Provider::Se, &[(ArtifactKind::Kernel, false)], &[]);
        assert_eq!(
            line(&se).as_deref(),
            Some("this change invalidates se.version, se.tag, se.image_phkh, kata_addons.kernel.sha256 on kata-se")
        );
        let snp = plan(Provider::Snp, &[(ArtifactKind::Kernel, false), (ArtifactKind::Image, true)], &["kata-snp"]);
        assert_eq!(
            names(&snp),
            [
                "snp_launch_measurement",
                "kata_addons.kernel.sha256",
                "kata_addons.image.sha256",
                "kata_addons.image.root_hash"
            ]
        );
        assert!(line(&snp).is_some_and(|l| l.ends_with(" on kata-snp")));
        let tdx = plan(Provider::Tdx, &[(ArtifactKind::Extension, true)], &[]);
        assert_eq!(names(&tdx), ["rtmr_2", "kata_addons.extension.sha256", "kata_addons.extension.root_hash"]);
    }
}
