//! The ConfigMap keys: one table of named entries (ConfigMap key, env var, kind of value,
//! the artifact it describes) that drives reading the input ([`Given`]), the env list
//! (table order), the plan's artifacts and the README's key table (checked by a test).
//! Adding a key: a row here, its rule where its value is used (`policy.rs`, `measured.rs`
//! or the key's own module), its plan field in the WIT, and its line in the README
//! (docs/design.md#keys).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use kata_addons_facts::trimmed;

use crate::checks::{check_name, check_path, is_sha256_hex, is_version, show, suggest, violation};
use crate::wit::{ArtifactKind, KeyValue, Violation, ViolationCode};

/// What a key's value is, and so how it is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An image reference: `registry/repository[:tag][@digest]` or `oci:/layout[:tag]`
    /// (parsed by `reference.rs`).
    Reference,
    /// A provider name (parsed by `providers.rs`).
    Provider,
    /// A version label (`A-Za-z0-9._+-`, 1-128 characters).
    Version,
    /// A clean absolute path inside the image.
    Path,
    /// An expected sha256: 64 lowercase hex.
    Sha256,
    /// Comma-separated RuntimeClass handlers (parsed by `runtime_class.rs`).
    Handlers,
    /// dm-verity parameters in Kata's form (parsed by the shared parser in `measured.rs`).
    VerityParams,
    /// A clean absolute in-image path of a file holding dm-verity parameters.
    VerityPath,
    /// An extension name (`check_name`).
    Name,
    /// A Kata release in RPM's `[epoch:]version[-release]` form (parsed by `kata_version.rs`).
    KataVersion,
    /// Comma-separated clean absolute node paths (parsed by `node_paths.rs`).
    NodePaths,
}

impl Kind {
    /// Checks a (trimmed) value of a key of this kind named `key`; kinds whose value is
    /// parsed where it is used (reference, provider, handlers, dm-verity parameters) pass
    /// here and are judged by their parser, so nothing is parsed twice.
    pub(crate) fn check(self, key: &str, value: &str) -> Result<(), Violation> {
        let (code, message) = match self {
            Kind::Reference
            | Kind::Provider
            | Kind::Handlers
            | Kind::VerityParams
            | Kind::KataVersion
            | Kind::NodePaths => {
                return Ok(());
            }
            Kind::Version if is_version(value) => return Ok(()),
            Kind::Version => (
                ViolationCode::InvalidVersion,
                format!(
                    "version {} is invalid: 1-128 characters from `A-Za-z0-9._+-`, starting with a letter or digit",
                    show(value)
                ),
            ),
            Kind::Path | Kind::VerityPath => match check_path(value) {
                Ok(()) => return Ok(()),
                Err(e) => (ViolationCode::InvalidPath, e),
            },
            Kind::Sha256 if is_sha256_hex(value) => return Ok(()),
            Kind::Sha256 => (
                ViolationCode::InvalidSha256,
                format!(
                    "sha256 {} is invalid: exactly 64 lowercase hex characters (0-9, a-f) are accepted",
                    show(value)
                ),
            ),
            Kind::Name => match check_name(value) {
                Ok(()) => return Ok(()),
                Err(e) => (ViolationCode::InvalidName, e),
            },
        };
        Err(violation(key, code, message))
    }
}

/// One row of the key table.
struct Spec {
    /// ConfigMap `data` key.
    key: &'static str,
    /// Environment variable.
    env: &'static str,
    /// What the value is.
    kind: Kind,
    /// The artifact the key describes, if any.
    artifact: Option<ArtifactKind>,
}

/// Counts identifiers (for the table's length).
macro_rules! count {
    () => { 0 };
    ($head:ident $($tail:ident)*) => { 1 + count!($($tail)*) };
}

/// The key table: `Variant: "configMapKey", "ENV_VAR", Kind, artifact;`, in env order.
macro_rules! keys {
    ($($variant:ident: $key:literal, $env:literal, $kind:ident, $artifact:expr;)+) => {
        /// A ConfigMap key (with its env var); declared in env order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Key {
            $(
                #[doc = concat!("`", $key, "` / `", $env, "`.")]
                $variant,
            )+
        }

        impl Key {
            /// Number of keys.
            pub const COUNT: usize = count!($($variant)+);
            /// Every key, in env order.
            pub const ALL: [Key; Key::COUNT] = [$(Key::$variant),+];

            /// The key's row of the table.
            const fn spec(self) -> Spec {
                match self {
                    $(Key::$variant => Spec { key: $key, env: $env, kind: Kind::$kind, artifact: $artifact },)+
                }
            }
        }
    };
}

keys! {
    AddonImage: "addonImage", "ADDON_IMAGE", Reference, None;
    Provider: "provider", "ADDON_PROVIDER", Provider, None;
    Version: "version", "ADDON_VERSION", Version, None;
    KernelPath: "kernelPath", "ADDON_KERNEL_PATH", Path, Some(ArtifactKind::Kernel);
    InitrdPath: "initrdPath", "ADDON_INITRD_PATH", Path, Some(ArtifactKind::Initrd);
    ImagePath: "imagePath", "ADDON_IMAGE_PATH", Path, Some(ArtifactKind::Image);
    KernelSha256: "kernelSha256", "ADDON_KERNEL_SHA256", Sha256, Some(ArtifactKind::Kernel);
    InitrdSha256: "initrdSha256", "ADDON_INITRD_SHA256", Sha256, Some(ArtifactKind::Initrd);
    ImageSha256: "imageSha256", "ADDON_IMAGE_SHA256", Sha256, Some(ArtifactKind::Image);
    RuntimeClass: "runtimeClass", "ADDON_RUNTIME_CLASS", Handlers, None;
    ImageVerityParams: "imageVerityParams", "ADDON_IMAGE_VERITY_PARAMS", VerityParams, Some(ArtifactKind::Image);
    ImageVerityPath: "imageVerityPath", "ADDON_IMAGE_VERITY_PATH", VerityPath, Some(ArtifactKind::Image);
    ExtensionPath: "extensionPath", "ADDON_EXTENSION_PATH", Path, Some(ArtifactKind::Extension);
    ExtensionName: "extensionName", "ADDON_EXTENSION_NAME", Name, Some(ArtifactKind::Extension);
    ExtensionVerityParams: "extensionVerityParams", "ADDON_EXTENSION_VERITY_PARAMS", VerityParams, Some(ArtifactKind::Extension);
    ExtensionVerityPath: "extensionVerityPath", "ADDON_EXTENSION_VERITY_PATH", VerityPath, Some(ArtifactKind::Extension);
    ExtensionSha256: "extensionSha256", "ADDON_EXTENSION_SHA256", Sha256, Some(ArtifactKind::Extension);
    KataVersion: "kataVersion", "ADDON_KATA_VERSION", KataVersion, None;
    SeHostKeyDocuments: "seHostKeyDocuments", "ADDON_SE_HOST_KEY_DOCUMENTS", NodePaths, None;
}

impl Key {
    /// The ConfigMap `data` key (`addonImage`, ...).
    pub const fn name(self) -> &'static str {
        self.spec().key
    }

    /// The environment variable (`ADDON_IMAGE`, ...).
    pub const fn env(self) -> &'static str {
        self.spec().env
    }

    /// What the value is.
    pub const fn kind(self) -> Kind {
        self.spec().kind
    }

    /// The artifact the key describes, if any.
    pub const fn artifact(self) -> Option<ArtifactKind> {
        self.spec().artifact
    }

    /// The key of `kind` that describes `artifact`, if there is one.
    pub(crate) fn of(artifact: ArtifactKind, kind: Kind) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.artifact() == Some(artifact) && k.kind() == kind)
    }

    /// Position in [`Key::ALL`] (the slot of the key in per-key arrays).
    const fn slot(self) -> usize {
        self as usize
    }
}

/// Which of the two key namings an input uses.
#[derive(Clone, Copy)]
pub(crate) enum Naming {
    /// ConfigMap `data` keys (`addonImage`, ...).
    Data,
    /// Environment variables (`ADDON_IMAGE`, ...).
    Env,
}

impl Naming {
    /// The name of `key` in this naming.
    pub(crate) fn of(self, key: Key) -> &'static str {
        match self {
            Naming::Data => key.name(),
            Naming::Env => key.env(),
        }
    }

    /// Every key's name in this naming, in table order.
    fn all(self) -> [&'static str; Key::COUNT] {
        Key::ALL.map(|k| self.of(k))
    }
}

/// The input as given: each key's trimmed value (`None` when absent, empty or duplicated)
/// and whether it was given more than once (already reported).
pub(crate) struct Given<'a> {
    /// How the input names its keys.
    naming: Naming,
    values: [Option<&'a str>; Key::COUNT],
    dup: [bool; Key::COUNT],
}

impl<'a> Given<'a> {
    /// Reads an input list named with `naming`: duplicated keys are conflicts, unknown ones
    /// violations with a suggestion, both reported once.
    pub(crate) fn read(input: &'a [KeyValue], naming: Naming, errs: &mut Vec<Violation>) -> Given<'a> {
        let known = naming.all();
        let mut g = Given { naming, values: [None; Key::COUNT], dup: [false; Key::COUNT] };
        let mut seen = [false; Key::COUNT];
        let mut unknown_seen: Vec<&str> = Vec::new();
        for kv in input {
            match known.iter().position(|k| *k == kv.name) {
                Some(i) if seen[i] => {
                    g.values[i] = None;
                    if !g.dup[i] {
                        g.dup[i] = true;
                        errs.push(violation(
                            &kv.name,
                            ViolationCode::Conflict,
                            format!("{} is given more than once: give each key exactly once", show(&kv.name)),
                        ));
                    }
                }
                Some(i) => {
                    seen[i] = true;
                    g.values[i] = trimmed(&kv.value);
                }
                None if unknown_seen.contains(&kv.name.as_str()) => {}
                None => {
                    unknown_seen.push(&kv.name);
                    let message = match suggest(&kv.name, &known) {
                        Some(s) => format!("unknown key {}: did you mean `{s}`?", show(&kv.name)),
                        None => format!("unknown key {}: known keys are {}", show(&kv.name), known.join(", ")),
                    };
                    errs.push(violation(&kv.name, ViolationCode::UnknownKey, message));
                }
            }
        }
        g
    }

    /// The key's name in the input's naming.
    pub(crate) fn name(&self, key: Key) -> &'static str {
        self.naming.of(key)
    }

    /// The key's trimmed value, if given once and not empty.
    pub(crate) fn value(&self, key: Key) -> Option<&'a str> {
        self.values[key.slot()]
    }

    /// Whether the key was given more than once.
    pub(crate) fn dup(&self, key: Key) -> bool {
        self.dup[key.slot()]
    }

    /// Whether the key was given at all (once with a value, or more than once).
    pub(crate) fn given(&self, key: Key) -> bool {
        self.value(key).is_some() || self.dup(key)
    }

    /// The key's value if it passes its kind's check; a failure goes to `errs`.
    pub(crate) fn checked(&self, key: Key, errs: &mut Vec<Violation>) -> Option<&'a str> {
        let v = self.value(key)?;
        match key.kind().check(self.name(key), v) {
            Ok(()) => Some(v),
            Err(e) => {
                errs.push(e);
                None
            }
        }
    }
}

/// One value per key, in table order (the env list's values).
pub(crate) struct Values([Option<String>; Key::COUNT]);

impl Values {
    /// Each key's value from `f`.
    pub(crate) fn from_fn(f: impl Fn(Key) -> Option<String>) -> Values {
        Values(Key::ALL.map(f))
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: Key) -> Option<&str> {
        self.0[key.slot()].as_deref()
    }

    /// The values as an env list, in table order.
    pub(crate) fn into_env(self) -> Vec<KeyValue> {
        Key::ALL.into_iter().zip(self.0).filter_map(|(k, v)| v.map(|v| KeyValue::new(k.env(), v))).collect()
    }
}

/// `` `a`, `b` or `c` ``: keys named for a message.
pub(crate) fn listed(names: &[&str], last: &str) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((only, [])) => only.clone(),
        Some((tail, head)) => format!("{} {last} {tail}", head.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_and_env_var_is_unique_and_env_vars_follow_the_keys() {
        for (i, k) in Key::ALL.into_iter().enumerate() {
            assert_eq!(k.slot(), i);
            assert!(Key::ALL[..i].iter().all(|o| o.name() != k.name() && o.env() != k.env()), "{k:?}");
            let folded: String = k.name().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
            let env: String = k.env().trim_start_matches("ADDON_").chars().filter(|c| *c != '_').collect();
            let want = if k == Key::AddonImage { String::from("IMAGE") } else { folded.to_ascii_uppercase() };
            assert_eq!(env, want, "{k:?}");
        }
    }

    #[test]
    fn keys_are_listed_for_messages() {
        assert_eq!(listed(&["a"], "or"), "`a`");
        assert_eq!(listed(&["a", "b", "c"], "and"), "`a`, `b` and `c`");
    }
}
