//! The node's record of what kata-addons installed:
//! `/etc/kata-containers/addons/state.json`.

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};

use crate::node;
use crate::policy::{ArtifactKind, Provider};

pub(crate) mod validate;

/// File name of the state record inside the install directory.
pub(crate) use kata_addons_facts::STATE_FILE;

/// Current schema version of [`State`].
pub(crate) const SCHEMA: u32 = 2;

/// The schema before multi-layout support (one `dropIn`); still read and migrated.
const SCHEMA_V1: u32 = 1;

/// One installed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileRecord {
    /// `kernel`, `initrd` or `image`.
    pub kind: ArtifactKind,
    /// Path inside the image it came from.
    pub source: String,
    /// Node path of the installed file.
    pub path: String,
    /// sha256 (hex) of its contents; absent for a measured file whose sha256 was not pinned,
    /// whose record is then its dm-verity tree ([`VerityRecord::outside_sha256`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// Filesystem found in the data partition (image, extension): `ext4`, `xfs` or `erofs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<String>,
    /// The dm-verity parameters the file was verified against before the commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verity: Option<VerityRecord>,
}

/// dm-verity parameters a measured file was verified against (the tree computed over
/// partition 1 gave `root_hash` and equalled the hash area on partition 2).
/// The state file's own schema of the parameters (camelCase, with `outsideSha256`), kept
/// apart from the WIT record so the on-disk format does not change with the contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VerityRecord {
    /// Root hash (64 hex).
    pub root_hash: String,
    /// Salt (hex).
    pub salt: String,
    /// Data blocks.
    pub data_blocks: u64,
    /// Data block size.
    pub data_block_size: u32,
    /// Hash block size.
    pub hash_block_size: u32,
    /// sha256 (hex) of the file's bytes outside the data blocks (partition table, slack,
    /// partition 2), in file order: with the tree, it covers every byte of the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside_sha256: Option<String>,
}

/// A file kata-addons wrote beside the installed files for attestation (its reference
/// values, the SE header): verified like every installed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PublishedRecord {
    /// Node path (inside the version directory).
    pub path: String,
    /// sha256 (hex) of its contents.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// One line saying what it holds (the reference values computed and those not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// An IBM SE host key document the published reference values were computed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DocumentRecord {
    /// Node path (as `seHostKeyDocuments` names it).
    pub path: String,
    /// sha256 (hex) of its contents when the values were computed.
    pub sha256: String,
}

/// One installed drop-in: one per runtime configuration the addon was installed for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DropInRecord {
    /// Node path of the resolved `configuration*.toml` the drop-in belongs to.
    pub runtime_config: String,
    /// Node path (inside the resolved runtime config directory's `config.d`).
    pub path: String,
    /// sha256 (hex) of its contents.
    pub sha256: String,
    /// The RuntimeClass handler whose configuration this is (`runtimeClass`); none for
    /// the provider's standard configurations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
}

/// What is installed on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct State {
    /// Schema version ([`SCHEMA`]).
    pub schema: u32,
    /// Image reference as configured.
    pub image: String,
    /// Manifest digest that was installed (`sha256:…`).
    pub manifest_digest: String,
    /// Addon version label.
    pub version: String,
    /// Provider (`se`, `tdx`, `snp`).
    pub provider: Provider,
    /// Name of the version directory inside the install directory.
    pub version_dir: String,
    /// The installed files.
    pub files: Vec<FileRecord>,
    /// The drop-ins, one per runtime configuration, in the order they were committed.
    pub drop_ins: Vec<DropInRecord>,
    /// Version directories of earlier installs still to be removed (crash recovery).
    #[serde(default)]
    pub previous_dirs: Vec<String>,
    /// Drop-in node paths of earlier installs (other provider or runtime configuration)
    /// still to be removed (crash recovery).
    #[serde(default)]
    pub previous_drop_ins: Vec<String>,
    /// The image trust decision (policy.json) that admitted the installed image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<TrustRecord>,
    /// The RuntimeClass handlers the addon was installed for (`runtimeClass`), in order;
    /// empty for the provider's standard configurations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_classes: Vec<String>,
    /// Files published for attestation in the version directory (`reference-values.json`,
    /// `se-header.bin`; see `docs/attestation.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<PublishedRecord>,
    /// The node's Kata release when the addon was installed, and the `kataVersion` checked
    /// against it (docs/design.md#node-kata-release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kata: Option<KataRecord>,
    /// The IBM SE host key documents (`seHostKeyDocuments`) the published values were
    /// computed with: another list, or another document content, republishes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_key_documents: Vec<DocumentRecord>,
}

/// The node's Kata release an install saw and the `kataVersion` it checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KataRecord {
    /// The node's Kata release as printed (`kata-containers 3.25.0-6.el9 (RPM database …)`).
    pub node: String,
    /// `kataVersion`'s epoch, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u32>,
    /// `kataVersion`'s version, when the key was set (and so checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `kataVersion`'s release, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
}

impl KataRecord {
    /// The `kataVersion` that was checked, if any.
    pub(crate) fn wanted(&self) -> Option<crate::kata_release::Wanted> {
        Some(crate::kata_release::Wanted {
            epoch: self.epoch,
            version: self.version.clone()?,
            release: self.release.clone(),
        })
    }
}

/// What the image trust policy decided about an installed image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum TrustDecision {
    /// The policy accepted the image.
    Accepted,
    /// No policy file on the node: signatures were not checked.
    Unchecked,
}

impl std::fmt::Display for TrustDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TrustDecision::Accepted => "accepted",
            TrustDecision::Unchecked => "unchecked",
        })
    }
}

/// The trust decision recorded in the state, `status` and the logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TrustRecord {
    /// What the policy decided.
    pub decision: TrustDecision,
    /// The policy file that decided.
    pub policy_file: String,
    /// The scope that decided (`transports.docker."quay.io/org"`, `default`).
    pub scope: String,
    /// The requirement types of that scope, `+`-joined (`signedBy`, `insecureAcceptAnything`).
    pub requirement: String,
    /// The identity a verified signature claims, if a signature was required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The key that made it (OpenPGP fingerprint, or sha256 of the sigstore public key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl TrustRecord {
    /// One line for `status` and logs.
    pub(crate) fn summary(&self) -> String {
        let mut s = format!("{} by {} ({}: {})", self.decision, self.policy_file, self.scope, self.requirement);
        if let Some(i) = &self.identity {
            s.push_str(&format!(", identity {i}"));
        }
        if let Some(k) = &self.key {
            s.push_str(&format!(", key {k}"));
        }
        s
    }
}

/// Reads the state from the install directory; `None` when nothing is installed.
pub(crate) fn read(dir: &Dir) -> Result<Option<State>> {
    let Some(text) = validate::read_capped(dir, STATE_FILE)? else { return Ok(None) };
    let state = parse(&text)?;
    state.validate()?;
    Ok(Some(state))
}

/// Parses a state record, migrating schema 1 (one `dropIn`) to the current schema.
pub(crate) fn parse(text: &str) -> Result<State> {
    let corrupt = || {
        format!(
            "the state file /etc/kata-containers/addons/state.json is corrupt; nothing was changed ({})",
            validate::START_OVER
        )
    };
    #[derive(Deserialize)]
    struct Schema {
        schema: u32,
    }
    let schema = serde_json::from_str::<Schema>(text).with_context(corrupt)?.schema;
    match schema {
        SCHEMA => serde_json::from_str(text).with_context(corrupt),
        SCHEMA_V1 => Ok(serde_json::from_str::<StateV1>(text).with_context(corrupt)?.migrate()),
        other => bail!(
            "the state file /etc/kata-containers/addons/state.json has schema {other}, which this kata-addons does \
             not read (it writes {SCHEMA}, reads {SCHEMA_V1} and {SCHEMA}): a newer kata-addons wrote it, so run that \
             one; nothing was changed (or {})",
            validate::START_OVER
        ),
    }
}

/// Schema 1: the single-layout record written by kata-addons before schema 2.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateV1 {
    image: String,
    manifest_digest: String,
    version: String,
    provider: Provider,
    version_dir: String,
    files: Vec<FileRecord>,
    drop_in: DropInV1,
    #[serde(default)]
    previous_dirs: Vec<String>,
    #[serde(default)]
    previous_drop_ins: Vec<String>,
}

/// Schema 1's drop-in: no runtime configuration recorded.
#[derive(Deserialize)]
struct DropInV1 {
    path: String,
    sha256: String,
}

impl StateV1 {
    /// Schema 1 only knew `<dir>/config.d/<name>` beside `<dir>/configuration.toml`
    /// (the OpenShift layout), so the runtime configuration is derived from the drop-in path.
    fn migrate(self) -> State {
        let config_d = self.drop_in.path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        let dir = config_d.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        State {
            schema: SCHEMA,
            image: self.image,
            manifest_digest: self.manifest_digest,
            version: self.version,
            provider: self.provider,
            version_dir: self.version_dir,
            files: self.files,
            drop_ins: vec![DropInRecord {
                runtime_config: format!("{dir}/configuration.toml"),
                path: self.drop_in.path,
                sha256: self.drop_in.sha256,
                handler: None,
            }],
            previous_dirs: self.previous_dirs,
            previous_drop_ins: self.previous_drop_ins,
            trust: None,
            runtime_classes: Vec::new(),
            published: Vec::new(),
            kata: None,
            host_key_documents: Vec::new(),
        }
    }
}

impl State {
    /// Checks every path field against the layout contract (see [`validate`]); the error
    /// names the first field that fails. Nothing may act on a state that fails.
    pub(crate) fn validate(&self) -> Result<()> {
        use validate::{check_drop_in_path, check_file_path, check_runtime_config, check_version_dir};
        check_version_dir("versionDir", &self.version_dir)?;
        if let Some(k) = &self.kata {
            validate::check_kata(k)?;
        }
        for (i, d) in self.previous_dirs.iter().enumerate() {
            check_version_dir(&format!("previousDirs[{i}]"), d)?;
        }
        for (i, f) in self.files.iter().enumerate() {
            check_file_path(&format!("files[{i}].path"), &f.path, &self.version_dir)?;
            if let Some(v) = &f.verity {
                // The parameters a drift check verifies the file with: as bounded as the
                // policy's (block sizes 512..=4096), through the one parser of the format.
                let text = kata_addons_facts::verity::VerityParams {
                    root_hash: v.root_hash.clone(),
                    salt: v.salt.clone(),
                    data_blocks: v.data_blocks,
                    data_block_size: v.data_block_size,
                    hash_block_size: v.hash_block_size,
                }
                .to_string();
                if let Err(e) = kata_addons_facts::verity::parse(&text) {
                    bail!("files[{i}].verity is not usable dm-verity parameters: {e}");
                }
            }
            if f.sha256.is_none() && f.verity.as_ref().is_none_or(|v| v.outside_sha256.is_none()) {
                bail!("files[{i}] has neither a sha256 nor a verity.outsideSha256: nothing to verify it by");
            }
        }
        for (i, p) in self.published.iter().enumerate() {
            check_file_path(&format!("published[{i}].path"), &p.path, &self.version_dir)?;
        }
        for (i, d) in self.drop_ins.iter().enumerate() {
            check_drop_in_path(&format!("dropIns[{i}].path"), &d.path)?;
            check_runtime_config(&format!("dropIns[{i}].runtimeConfig"), &d.runtime_config, &d.path)?;
        }
        for (i, p) in self.previous_drop_ins.iter().enumerate() {
            check_drop_in_path(&format!("previousDropIns[{i}]"), p)?;
        }
        Ok(())
    }
}

/// Writes the state atomically.
pub(crate) fn write(dir: &Dir, state: &State) -> Result<()> {
    let mut text = serde_json::to_string_pretty(state).context("serialising the state")?;
    text.push('\n');
    node::write_atomic(dir, STATE_FILE, text.as_bytes()).context("writing the state file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_1_is_migrated_on_read() {
        let v1 = r#"{"schema": 1, "image": "quay.io/x/y:v1", "manifestDigest": "sha256:00",
            "version": "v1", "provider": "se", "versionDir": "v1-00",
            "files": [{"kind": "kernel", "source": "/k", "path": "/etc/kata-containers/addons/v1-00/kernel",
                       "sha256": "ab", "size": 3}],
            "dropIn": {"path": "/etc/kata-containers/kata-se/config.d/50-kata-addons.toml", "sha256": "cd"},
            "previousDirs": ["v0-11"]}"#;
        let st = parse(v1).expect("schema 1 parses");
        assert_eq!(st.schema, SCHEMA);
        assert_eq!(
            st.drop_ins,
            vec![DropInRecord {
                runtime_config: "/etc/kata-containers/kata-se/configuration.toml".into(),
                path: "/etc/kata-containers/kata-se/config.d/50-kata-addons.toml".into(),
                sha256: "cd".into(),
                handler: None,
            }]
        );
        assert_eq!(st.previous_dirs, vec!["v0-11".to_string()]);
        // Written back as schema 2, read back unchanged.
        let text = serde_json::to_string(&st).expect("serialise");
        assert!(text.contains("\"dropIns\"") && !text.contains("\"dropIn\""), "{text}");
        assert_eq!(parse(&text).expect("schema 2 parses"), st);
    }

    #[test]
    fn unknown_schema_is_refused() {
        let err = parse(r#"{"schema": 3}"#).expect_err("schema 3");
        assert!(format!("{err:#}").contains("schema 3"), "{err:#}");
        assert!(format!("{err:#}").contains("a newer kata-addons wrote it"), "{err:#}");
        assert!(format!("{err:#}").contains("kata-addons uninstall"), "{err:#}");
        assert!(parse("{").is_err());
    }

    #[test]
    fn a_measured_file_needs_usable_parameters_and_something_to_verify_it_by() {
        let state = |file: &str| {
            format!(
                r#"{{"schema": 2, "image": "quay.io/x/y:v1", "manifestDigest": "sha256:00", "version": "v1",
                "provider": "snp", "versionDir": "v1-00", "files": [{file}],
                "dropIns": [{{"runtimeConfig": "/opt/kata/share/defaults/kata-containers/configuration-qemu-snp.toml",
                  "path": "/opt/kata/share/defaults/kata-containers/config.d/50-kata-addons.toml", "sha256": "cd"}}]}}"#
            )
        };
        let file = |verity: &str| {
            format!(
                r#"{{"kind": "image", "source": "/i", "path": "/etc/kata-containers/addons/v1-00/image", "size": 3,
                "verity": {verity}}}"#
            )
        };
        let root = "ab".repeat(32);
        let verity = |hash_block_size: u64, outside: bool| {
            let outside = if outside { format!(r#", "outsideSha256": "{root}""#) } else { String::new() };
            format!(
                r#"{{"rootHash": "{root}", "salt": "aa", "dataBlocks": 8, "dataBlockSize": 4096,
                "hashBlockSize": {hash_block_size}{outside}}}"#
            )
        };
        let st = parse(&state(&file(&verity(4096, true)))).expect("parses");
        st.validate().expect("a measured file recorded by its tree is valid");
        let err = parse(&state(&file(&verity(1 << 31, true)))).expect("parses").validate().expect_err("refused");
        assert!(format!("{err:#}").contains("files[0].verity is not usable"), "{err:#}");
        let err = parse(&state(&file(&verity(4096, false)))).expect("parses").validate().expect_err("refused");
        assert!(format!("{err:#}").contains("neither a sha256 nor"), "{err:#}");
    }
}
