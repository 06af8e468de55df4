//! The node's Kata release, found beneath `--root` without running a node binary, and the
//! rule that keeps an addon built for one Kata release off a node running another
//! (docs/design.md#node-kata-release, docs/configuration.md#kataversion).
//!
//! Rooms: [`rpmdb`] (the `kata-containers` package of an RPM node's SQLite database),
//! [`header`] (the tags read from its header blob), [`kata_deploy`] (why a kata-deploy
//! node's release is not known).

mod header;
mod kata_deploy;
mod rpmdb;

use std::fmt;
use std::path::Path;

use anyhow::Result;

use crate::nodefs::NodeFs;
use crate::policy::Plan;

/// Where the node's Kata came from and which release it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeRelease {
    /// The `kata-containers` package of the node's RPM database.
    Rpm {
        /// Its epoch, version and release.
        epoch: Option<u32>,
        /// `VERSION`.
        version: String,
        /// `RELEASE`.
        release: String,
        /// The database's node path.
        db: String,
    },
    /// kata-deploy's installation under `prefix`, which names no release.
    KataDeploy {
        /// The installation prefix (`--kata-prefix`).
        prefix: String,
    },
    /// Neither: why (no RPM database, no package in it, no kata-deploy installation).
    Unknown {
        /// What was looked at.
        why: String,
    },
}

impl NodeRelease {
    /// `VERSION-RELEASE` (epoch first when there is one) of an RPM node, else `None`.
    pub(crate) fn evr(&self) -> Option<String> {
        match self {
            NodeRelease::Rpm { epoch, version, release, .. } => Some(match epoch {
                Some(e) => format!("{e}:{version}-{release}"),
                None => format!("{version}-{release}"),
            }),
            _ => None,
        }
    }

    /// Where the release was read (a file), or what was looked at.
    pub(crate) fn source(&self) -> String {
        match self {
            NodeRelease::Rpm { db, .. } => format!("RPM database {db}"),
            NodeRelease::KataDeploy { prefix } => format!("kata-deploy under {prefix}"),
            NodeRelease::Unknown { why } => why.clone(),
        }
    }
}

impl fmt::Display for NodeRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.evr()) {
            (_, Some(evr)) => write!(f, "{} {evr} ({})", rpmdb::PACKAGE, self.source()),
            (NodeRelease::KataDeploy { prefix }, None) => {
                write!(f, "unknown (kata-deploy under {prefix} records no release)")
            }
            (_, None) => write!(f, "unknown ({})", self.source()),
        }
    }
}

/// The node's Kata release beneath `root`: the RPM database first (an RPM node may also
/// have a stray `/opt/kata`), then kata-deploy's installation under `kata_prefix`.
pub(crate) fn detect(fs: &NodeFs, kata_prefix: &str) -> Result<NodeRelease> {
    let rpm = rpmdb::find(fs)?;
    if let rpmdb::Found::Installed { nevr, db } = rpm {
        return Ok(NodeRelease::Rpm { epoch: nevr.epoch, version: nevr.version, release: nevr.release, db });
    }
    if kata_deploy::present(fs, kata_prefix)? {
        return Ok(NodeRelease::KataDeploy { prefix: kata_prefix.to_string() });
    }
    let why = match rpm {
        rpmdb::Found::NotInstalled { db } => {
            format!("no {} package in the RPM database {db}, no kata-deploy under {kata_prefix}", rpmdb::PACKAGE)
        }
        _ => format!("no RPM database in {}, no kata-deploy under {kata_prefix}", rpmdb::DB_DIRS.join(", ")),
    };
    Ok(NodeRelease::Unknown { why })
}

/// [`detect`] on the node at `root`, the error as one line: what `status` and the install
/// summary print, and what [`check`] takes.
pub(crate) fn observe(root: &Path, kata_prefix: &str) -> Result<NodeRelease, String> {
    NodeFs::open(root).and_then(|fs| detect(&fs, kata_prefix)).map_err(|e| format!("{e:#}"))
}

/// A `kataVersion` refused on this node (the one-line reason): the install leaves the
/// node as it is, the daemon is not ready while it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub(crate) String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The reason of a [`Refused`] anywhere in `err`'s chain.
pub(crate) fn refused(err: &anyhow::Error) -> Option<String> {
    err.chain().find_map(|e| e.downcast_ref::<Refused>()).map(|r| r.0.clone())
}

/// The Kata release an addon was built for (`kataVersion`): a version, and a release when
/// the key has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// `EPOCH`, when given (then it must match; a package without one has epoch 0).
    pub(crate) epoch: Option<u32>,
    /// `VERSION` (`3.25.0`).
    pub(crate) version: String,
    /// `RELEASE` (`6.el9`), when given.
    pub(crate) release: Option<String>,
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = self.epoch {
            write!(f, "{e}:")?;
        }
        match &self.release {
            Some(r) => write!(f, "{}-{r}", self.version),
            None => f.write_str(&self.version),
        }
    }
}

/// The plan's `kataVersion`, if any.
pub(crate) fn wanted(plan: &Plan) -> Option<Wanted> {
    plan.kata_version.as_ref().map(|k| Wanted {
        epoch: k.epoch,
        version: k.version.clone(),
        release: k.release.clone(),
    })
}

/// What `preview` says about the check: what `kataVersion` requires, and, with a node
/// root, what the node has and whether install would go ahead.
pub(crate) fn preview_line(plan: &Plan, node: Option<&Result<NodeRelease, String>>) -> String {
    let rule = match wanted(plan) {
        None => "no kataVersion: the node's Kata release is not checked".to_string(),
        Some(w @ Wanted { release: None, .. }) => {
            format!("kataVersion {w}: the node's {} package must be version {w} (any release)", rpmdb::PACKAGE)
        }
        Some(w) => format!("kataVersion {w}: the node's {} package must be {w}", rpmdb::PACKAGE),
    };
    let Some(node) = node else { return rule };
    let now = match node {
        Ok(n) => n.to_string(),
        Err(e) => format!("unreadable ({e})"),
    };
    match wanted(plan).map(|w| check(&w, node)) {
        None => format!("{rule}; the node has {now}"),
        Some(Ok(())) => format!("{rule}; the node has {now}: matches"),
        Some(Err(why)) => format!("{rule}; install would be refused: {why}"),
    }
}

/// The rule: with a release both version and release must match, with a version only the
/// version, with an epoch the epoch too (a package without one has epoch 0); a node whose release is unknown or unreadable refuses any `kataVersion`. The
/// error is one line naming both values and where each came from.
pub(crate) fn check(wanted: &Wanted, node: &Result<NodeRelease, String>) -> Result<(), String> {
    let head = format!("kataVersion {wanted} (the addon's configuration)");
    match node {
        Err(e) => Err(format!("{head} cannot be checked: the node's Kata release is unreadable: {e}")),
        Ok(NodeRelease::KataDeploy { prefix }) => Err(format!(
            "{head} cannot be checked on a kata-deploy node ({prefix}): {}; remove kataVersion on such nodes",
            kata_deploy::NOT_RECORDED
        )),
        Ok(n @ NodeRelease::Unknown { .. }) => Err(format!("{head} cannot be checked: the node's Kata release is {n}")),
        Ok(n @ NodeRelease::Rpm { epoch, version, release, .. }) => {
            let matches = *version == wanted.version
                && wanted.release.as_ref().is_none_or(|r| r == release)
                && wanted.epoch.is_none_or(|e| e == epoch.unwrap_or(0));
            if matches { Ok(()) } else { Err(format!("{head} does not match the node's Kata release {n}")) }
        }
    }
}

/// What `rpm --root ROOT -q --qf '%{EPOCH}:%{VERSION}-%{RELEASE}' kata-containers` prints
/// for the node at `root` (`(none)` for no epoch; `None`: not installed, or no database),
/// read as kata-addons reads it; for the differential tests against rpm.
pub fn rpm_query(root: &Path) -> Result<Option<String>> {
    let fs = NodeFs::open(root)?;
    Ok(match rpmdb::find(&fs)? {
        rpmdb::Found::Installed { nevr, .. } => Some(format!(
            "{}:{}-{}",
            nevr.epoch.map_or_else(|| "(none)".to_string(), |e| e.to_string()),
            nevr.version,
            nevr.release
        )),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpm(version: &str, release: &str) -> Result<NodeRelease, String> {
        Ok(NodeRelease::Rpm {
            epoch: None,
            version: version.into(),
            release: release.into(),
            db: "/usr/share/rpm/rpmdb.sqlite".into(),
        })
    }

    #[test]
    fn version_alone_or_with_release() {
        let v = |version: &str, release: Option<&str>| Wanted {
            epoch: None,
            version: version.into(),
            release: release.map(Into::into),
        };
        assert!(check(&v("3.25.0", None), &rpm("3.25.0", "6.el9")).is_ok());
        assert!(check(&v("3.25.0", Some("6.el9")), &rpm("3.25.0", "6.el9")).is_ok());
        let e = check(&v("3.25.0", Some("5.el9")), &rpm("3.25.0", "6.el9")).unwrap_err();
        assert!(
            e.contains("3.25.0-5.el9") && e.contains("3.25.0-6.el9") && e.contains("/usr/share/rpm/rpmdb.sqlite"),
            "{e}"
        );
        assert!(check(&v("3.26.0", None), &rpm("3.25.0", "6.el9")).is_err());
        let epoch = |e| Wanted { epoch: Some(e), ..v("3.25.0", None) };
        assert!(check(&epoch(0), &rpm("3.25.0", "6.el9")).is_ok(), "no epoch is epoch 0");
        assert!(check(&epoch(1), &rpm("3.25.0", "6.el9")).unwrap_err().contains("1:3.25.0"));
        let kd = Ok(NodeRelease::KataDeploy { prefix: "/opt/kata".into() });
        assert!(check(&v("3.25.0", None), &kd).unwrap_err().contains("kata-deploy"));
        assert!(check(&v("3.25.0", None), &Err("corrupt".into())).is_err());
    }
}
