//! Plain-Rust mirrors of the WIT types in `wit/kata-addons.wit`.

use alloc::string::String;
use alloc::vec::Vec;

/// One name/value pair: a ConfigMap `data` entry or an environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// Key or variable name.
    pub name: String,
    /// Value, untrimmed as given.
    pub value: String,
}

impl KeyValue {
    /// Builds a pair from anything string-like.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        KeyValue { name: name.into(), value: value.into() }
    }
}

/// What a violation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// A required key is absent or empty.
    Missing,
    /// A key (or env var) that the contract does not know.
    UnknownKey,
    /// `addonImage` is not a valid OCI reference.
    InvalidReference,
    /// An in-image or installed path is not absolute, normalised and clean.
    InvalidPath,
    /// `version` does not match the version grammar.
    InvalidVersion,
    /// `provider` is not a known provider.
    InvalidProvider,
    /// A sha256 value is not 64 lowercase hex characters.
    InvalidSha256,
    /// The provider does not accept this artifact.
    NotAllowed,
    /// Two keys that must not be used together.
    Conflict,
    /// A value inconsistent with the plan.
    Inconsistent,
}

/// One problem with the input, naming the offending key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The ConfigMap key or env var at fault.
    pub key: String,
    /// Machine-readable category.
    pub code: Code,
    /// Human-readable explanation, saying what would be accepted.
    pub message: String,
}

/// The kind of guest artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ArtifactKind {
    /// Guest kernel.
    Kernel,
    /// Initial ramdisk.
    Initrd,
    /// Guest rootfs image.
    Image,
}

/// Which Kata runtime the addon is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// IBM Secure Execution.
    Se,
    /// Intel TDX.
    Tdx,
    /// AMD SEV-SNP.
    Snp,
}

/// An image in a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRef {
    /// Registry host, with port if any.
    pub registry: String,
    /// Repository path.
    pub repository: String,
    /// Tag, if any.
    pub tag: Option<String>,
    /// Pinned manifest digest, if any.
    pub digest: Option<String>,
}

/// An image in a local OCI image layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRef {
    /// Absolute path of the layout directory.
    pub path: String,
    /// Tag, if any.
    pub tag: Option<String>,
}

/// Where the image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// A registry image.
    Registry(RegistryRef),
    /// A local OCI layout.
    Layout(LayoutRef),
}

/// One file to take out of the image and install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// What the file is for.
    pub kind: ArtifactKind,
    /// Absolute in-image path.
    pub source: String,
    /// Installed file name inside the version directory.
    pub file_name: String,
    /// Expected sha256, if pinned.
    pub sha256: Option<String>,
}

/// Everything the runner needs to fetch and install an addon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The image reference, normalised.
    pub image: String,
    /// The image reference, parsed.
    pub source: ImageSource,
    /// The runtime to point at.
    pub provider: Provider,
    /// The addon's version label.
    pub version: String,
    /// Candidate node paths of the provider's runtime configurations, in a fixed order.
    pub runtime_configs: Vec<String>,
    /// Dotted TOML table the drop-in sets keys in.
    pub hypervisor_table: String,
    /// Node directory under which version directories are created.
    pub install_dir: String,
    /// File name of the drop-in inside each runtime configuration's `config.d`.
    pub drop_in_name: String,
    /// Files to fetch, in order kernel, initrd, image.
    pub artifacts: Vec<Artifact>,
}

/// A file the runner installed, as the node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledFile {
    /// What the file is for.
    pub kind: ArtifactKind,
    /// Absolute node path.
    pub path: String,
}

/// Facts about the node the runner passes to `plan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOptions {
    /// kata-deploy's installation prefix.
    pub kata_prefix: String,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions { kata_prefix: String::from(crate::policy::DEFAULT_KATA_PREFIX) }
    }
}

/// One drop-in to write, for one runtime configuration found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropIn {
    /// Node path of the resolved `configuration*.toml`.
    pub runtime_config: String,
    /// Node path of the drop-in.
    pub path: String,
    /// The drop-in TOML text.
    pub contents: String,
}
