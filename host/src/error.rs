//! The one error model: how a failure is classified into the exit codes of
//! docs/design.md#exit-codes, for `main` and the daemon alike, and how it is reported on
//! stderr.
//!
//! Errors travel as `anyhow::Error`; what decides the class is a marker somewhere in the
//! chain: [`ConfigError`] or a policy rejection is invalid configuration (exit 2),
//! [`UsageError`] a bad flag value (exit 64), anything else an operational failure (exit 1).
//! A policy that times out, traps or answers badly is operational: the same input may
//! succeed with another limit or component, and the daemon retries it.

use crate::policy::{PolicyError, Violation};

/// The configuration itself is invalid (unparsable, wrong kind, over a limit): exit 2.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// A command-line flag has a value outside what it accepts: exit 64, like clap's own errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub String);

/// An invalid-configuration error with this message.
pub(crate) fn invalid(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(ConfigError(msg.into()))
}

/// A usage error with this message.
pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Registry, auth, trust, network, extraction, I/O, node state, policy engine: exit 1.
    Operational,
    /// Anything wrong with the ConfigMap or `ADDON_*` input: exit 2. Retrying cannot help.
    InvalidConfig,
    /// A flag value the command line does not accept: exit 64.
    Usage,
}

/// `EX_USAGE` from sysexits.h: the command line itself is wrong.
pub const EX_USAGE: u8 = 64;

impl Class {
    /// The process exit code of this class.
    pub fn exit_code(self) -> u8 {
        match self {
            Class::Operational => 1,
            Class::InvalidConfig => 2,
            Class::Usage => EX_USAGE,
        }
    }
}

/// The class of an error, from the markers in its chain.
pub fn classify(err: &anyhow::Error) -> Class {
    if err.chain().any(|e| e.is::<UsageError>()) {
        return Class::Usage;
    }
    if err.chain().any(|e| e.is::<ConfigError>() || rejection(e).is_some()) {
        return Class::InvalidConfig;
    }
    Class::Operational
}

/// Whether an error (anywhere in its chain) means invalid configuration (exit 2).
pub fn is_invalid_config(err: &anyhow::Error) -> bool {
    classify(err) == Class::InvalidConfig
}

fn rejection<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a [Violation]> {
    match e.downcast_ref::<PolicyError>() {
        Some(PolicyError::Rejected(v)) => Some(v),
        _ => None,
    }
}

/// A message as it is printed: what [`kata_addons_facts::is_unsafe_char`] names escaped
/// except the message's own line breaks, so no text from outside that a message carries
/// (a file's name, an image's annotation) reaches the terminal raw, however it got in.
pub fn printable(msg: &str) -> String {
    msg.split('\n').map(|line| kata_addons_facts::Escaped(line).to_string()).collect::<Vec<_>>().join("\n")
}

/// Prints an error on stderr (a policy rejection as one line per problem) and returns
/// its exit code.
pub fn report(err: &anyhow::Error) -> u8 {
    if let Some(violations) = err.chain().find_map(rejection) {
        eprintln!(
            "error: invalid configuration ({} problem{}):",
            violations.len(),
            if violations.len() == 1 { "" } else { "s" }
        );
        for v in violations {
            eprintln!("  {}: {} [{}]", printable(&v.key), printable(&v.message), v.code);
        }
        return Class::InvalidConfig.exit_code();
    }
    eprintln!("error: {}", printable(&format!("{err:#}")));
    classify(err).exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn classes() {
        assert_eq!(classify(&anyhow::anyhow!("registry down")), Class::Operational);
        assert_eq!(classify(&invalid("bad").context("reading ConfigMap x")), Class::InvalidConfig);
        assert_eq!(classify(&usage("--timeout must be at least 1 second")), Class::Usage);
        let rejected = anyhow::Error::new(PolicyError::Rejected(vec![])).context("planning");
        assert_eq!(classify(&rejected), Class::InvalidConfig);
        // A policy that did not answer is operational: main exits 1 and the daemon retries.
        let slow = anyhow::Error::new(PolicyError::Timeout { func: "plan", limit: Duration::from_secs(1) });
        assert_eq!(classify(&slow), Class::Operational);
        let trap = anyhow::Error::new(PolicyError::Trap { func: "env", detail: "unreachable".into() });
        assert_eq!(classify(&trap), Class::Operational);
    }
}
