//! The node's record of what kata-addons installed:
//! `/etc/kata-containers/addons/state.json`.

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};

use crate::node;

pub mod validate;

/// File name of the state record inside the install directory.
pub const STATE_FILE: &str = "state.json";

/// Current schema version of [`State`].
pub const SCHEMA: u32 = 1;

/// One installed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileRecord {
    /// `kernel`, `initrd` or `image`.
    pub kind: String,
    /// Path inside the image it came from.
    pub source: String,
    /// Node path of the installed file.
    pub path: String,
    /// sha256 (hex) of its contents.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

/// The installed drop-in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DropInRecord {
    /// Node path (inside the resolved runtime config directory's `config.d`).
    pub path: String,
    /// sha256 (hex) of its contents.
    pub sha256: String,
}

/// What is installed on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// Schema version ([`SCHEMA`]).
    pub schema: u32,
    /// Image reference as configured.
    pub image: String,
    /// Manifest digest that was installed (`sha256:…`).
    pub manifest_digest: String,
    /// Addon version label.
    pub version: String,
    /// Provider (`se`, `tdx`, `snp`).
    pub provider: String,
    /// Name of the version directory inside the install directory.
    pub version_dir: String,
    /// The installed files.
    pub files: Vec<FileRecord>,
    /// The drop-in.
    pub drop_in: DropInRecord,
    /// Version directories of earlier installs still to be removed (crash recovery).
    #[serde(default)]
    pub previous_dirs: Vec<String>,
    /// Drop-ins of earlier installs (other provider) still to be removed (crash recovery).
    #[serde(default)]
    pub previous_drop_ins: Vec<String>,
}

/// Reads the state from the install directory; `None` when nothing is installed.
pub fn read(dir: &Dir) -> Result<Option<State>> {
    let Some(text) = validate::read_capped(dir, STATE_FILE)? else { return Ok(None) };
    let state: State = serde_json::from_str(&text).context(
        "the state file /etc/kata-containers/addons/state.json is corrupt; inspect it or remove it to start over",
    )?;
    if state.schema != SCHEMA {
        bail!("state file schema {} is not supported by this kata-addons (expects {SCHEMA})", state.schema);
    }
    state.validate()?;
    Ok(Some(state))
}

impl State {
    /// Checks every path field against the layout contract (see [`validate`]); the error
    /// names the first field that fails. Nothing may act on a state that fails.
    pub fn validate(&self) -> Result<()> {
        use validate::{check_drop_in_path, check_file_path, check_version_dir};
        check_version_dir("versionDir", &self.version_dir)?;
        for (i, d) in self.previous_dirs.iter().enumerate() {
            check_version_dir(&format!("previousDirs[{i}]"), d)?;
        }
        for (i, f) in self.files.iter().enumerate() {
            check_file_path(&format!("files[{i}].path"), &f.path, &self.version_dir)?;
        }
        check_drop_in_path("dropIn.path", &self.drop_in.path)?;
        for (i, p) in self.previous_drop_ins.iter().enumerate() {
            check_drop_in_path(&format!("previousDropIns[{i}]"), p)?;
        }
        Ok(())
    }
}

/// Writes the state atomically.
pub fn write(dir: &Dir, state: &State) -> Result<()> {
    let mut text = serde_json::to_string_pretty(state).context("serialising the state")?;
    text.push('\n');
    node::write_atomic(dir, STATE_FILE, text.as_bytes()).context("writing the state file")
}
