//! `runtimeClass` / `ADDON_RUNTIME_CLASS` (docs/design.md#configmap-keys): comma-separated
//! RuntimeClass handler names whose Kata configuration gets the addon. Each entry is
//! trimmed, duplicates are collapsed (first occurrence kept, order kept), and each must be
//! a handler Kubernetes accepts: a DNS-1123 label (`RuntimeClass.handler`).

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use kata_addons_facts::{is_dns_label, show};

use crate::wit::{Violation, ViolationCode};

/// Most handlers one addon targets (the runner's cap on runtime configurations).
pub(crate) const MAX_HANDLERS: usize = 32;

/// Most comma-separated entries read, duplicates included, counted before anything else is
/// looked at: twice [`MAX_HANDLERS`]. kata-deploy defines about twenty Kata handlers per
/// install, so no real list comes near it, and it keeps the policy's work on this key
/// bounded (one violation instead of one per entry of a huge list).
pub(crate) const MAX_ENTRIES: usize = 2 * MAX_HANDLERS;

/// The handlers of a `runtimeClass` value (already trimmed), in order, each once; every
/// entry that is not a valid handler is a violation of `key` naming it.
pub(crate) fn parse(key: &str, value: &str, errs: &mut Vec<Violation>) -> Vec<String> {
    let entries = value.bytes().filter(|b| *b == b',').count().saturating_add(1);
    if entries > MAX_ENTRIES {
        errs.push(Violation {
            key: String::from(key),
            code: ViolationCode::InvalidName,
            message: format!(
                "`{key}` has {entries} comma-separated entries: at most {MAX_ENTRIES} (and at most {MAX_HANDLERS} \
                 distinct handlers)"
            ),
        });
        return Vec::new();
    }
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut out: Vec<String> = Vec::new();
    let mut bad = false;
    for (i, entry) in value.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            bad = true;
            errs.push(Violation {
                key: String::from(key),
                code: ViolationCode::InvalidName,
                message: format!(
                    "`{key}` entry {} is empty: give comma-separated RuntimeClass handler names, e.g. \
                     `kata-qemu-nvidia-gpu-snp,kata-qemu-snp`",
                    i + 1
                ),
            });
        } else if !is_dns_label(entry) {
            bad = true;
            errs.push(Violation {
                key: String::from(key),
                code: ViolationCode::InvalidName,
                message: format!(
                    "RuntimeClass handler {} is not a valid handler name: a DNS-1123 label (lowercase letters, digits \
                     and `-`, starting and ending with a letter or digit, at most 63 characters), as Kubernetes requires \
                     of `RuntimeClass.handler`",
                    show(entry)
                ),
            });
        } else if seen.insert(entry) {
            out.push(String::from(entry));
        }
    }
    if !bad && out.len() > MAX_HANDLERS {
        errs.push(Violation {
            key: String::from(key),
            code: ViolationCode::InvalidName,
            message: format!("`{key}` names {} handlers: at most {MAX_HANDLERS}", out.len()),
        });
    }
    out
}
