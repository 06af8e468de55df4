//! Why a policy call did not produce a usable answer, and how violations are printed.

use std::time::Duration;

use super::bindings::Violation;

/// Why a policy call did not produce a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The policy rejected the input (exit code 2).
    #[error("invalid configuration:\n{}", format_violations(.0))]
    Rejected(Vec<Violation>),
    /// `render` refused because of the node's own configuration: every violation has code
    /// `node-refuses` and names a node file (exit code 1: the ConfigMap is not at fault).
    #[error("the node's configuration refuses this addon:\n{}", format_violations(.0))]
    NodeRefuses(Vec<Violation>),
    /// The call ran past the deadline.
    #[error(
        "policy `{func}` did not finish within {limit:?} (raise --policy-timeout if the policy is legitimately slow)"
    )]
    Timeout {
        /// The function called.
        func: &'static str,
        /// The deadline.
        limit: Duration,
    },
    /// The instance tried to grow memory past the cap.
    #[error("policy `{func}` tried to use more than {limit} MiB of memory (--policy-memory)")]
    Memory {
        /// The function called.
        func: &'static str,
        /// The cap, in MiB.
        limit: usize,
    },
    /// The guest trapped (a panic in the guest ends in a trap).
    #[error("policy `{func}` crashed: {detail}")]
    Trap {
        /// The function called.
        func: &'static str,
        /// What the trap said.
        detail: String,
    },
    /// The guest answered, but the host refuses to act on the answer.
    #[error("policy `{func}` returned output the runner refuses: {detail}")]
    BadOutput {
        /// The function called.
        func: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

/// One line per violation: `key: message [code]`.
pub fn format_violations(v: &[Violation]) -> String {
    v.iter().map(|v| format!("  {}: {} [{}]", v.key, v.message, v.code)).collect::<Vec<_>>().join("\n")
}

pub(super) fn bad(func: &'static str, detail: String) -> PolicyError {
    PolicyError::BadOutput { func, detail }
}

pub(super) fn prefix(s: &str) -> &str {
    let mut end = s.len().min(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
