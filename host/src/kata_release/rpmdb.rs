//! The `kata-containers` package in the node's RPM database (RHCOS 9, RHEL 9, Fedora):
//! SQLite, found beneath `--root` as the node resolves it, read without writing a byte on
//! the node. See docs/design.md#node-kata-release.
//!
//! The database and what SQLite keeps beside it (`-wal`, `-journal`) are opened through the
//! root's directory handle, each read once, size-capped, into a private directory of the
//! runner, and SQLite opens that copy: a live WAL is read as rpm reads it (its committed
//! transactions count), none is required, nothing is created or locked on the node, and a
//! symlinked `/var/lib/rpm` is followed inside the root, never out of it.

use std::io::{Read, Write};

use anyhow::{Context, Result, bail};
use rusqlite::{Connection, OpenFlags};

use super::header::{self, Nevr};
use crate::nodefs::{FilePath, Kind, NodeFs};

/// Where RPM databases are, in the order looked at: RHCOS keeps the booted deployment's
/// under `/usr/share/rpm` (with `/var/lib/rpm` a link to it), RHEL 9 under `/var/lib/rpm`,
/// Fedora 36 and later under `/usr/lib/sysimage/rpm` (`/var/lib/rpm` again a link).
pub(crate) const DB_DIRS: [&str; 3] = ["/usr/share/rpm", "/var/lib/rpm", "/usr/lib/sysimage/rpm"];
/// The SQLite database's file name (rpm's `sqlite` backend).
const SQLITE: &str = "rpmdb.sqlite";
/// Most bytes of the database file read (an RHCOS database is tens of MiB).
const MAX_DB: u64 = 512 << 20;
/// Most bytes of a WAL or rollback journal read beside it.
const MAX_SIDE: u64 = 128 << 20;
/// Most packages (rows of `Packages`) looked at.
const MAX_PACKAGES: usize = 100_000;
/// The package whose release is the node's Kata release.
pub(crate) const PACKAGE: &str = "kata-containers";

/// What the node's RPM database says about `kata-containers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// No RPM database in any of [`DB_DIRS`].
    NoDatabase,
    /// A database at `db`, without the package.
    NotInstalled {
        /// The database's node path.
        db: String,
    },
    /// The package, from the database at `db`.
    Installed {
        /// Its name, epoch, version and release.
        nevr: Nevr,
        /// The database's node path.
        db: String,
    },
}

/// Reads the node's RPM database for `kata-containers`. Errors name the file: a Berkeley
/// DB or NDB database, an unreadable or corrupt one, a hostile header, the package twice.
pub(crate) fn find(fs: &NodeFs) -> Result<Found> {
    for dir in DB_DIRS {
        let d = FilePath::node(dir);
        if fs.kind(&d)? != Some(Kind::Dir) {
            continue;
        }
        let sqlite = d.join(SQLITE);
        match fs.kind(&sqlite)? {
            Some(Kind::File) => return read(fs, &sqlite).map(|(nevr, db)| found(nevr, db)),
            Some(_) => bail!("the RPM database {sqlite} is not a regular file"),
            None => {}
        }
        for (file, what) in [("Packages", "Berkeley DB (RHEL 8 and older)"), ("Packages.db", "NDB (SUSE)")] {
            let other = d.join(file);
            if fs.kind(&other)?.is_some() {
                bail!(
                    "the node's RPM database {other} is {what}: kata-addons reads the node's Kata release only from SQLite RPM databases ({dir}/{SQLITE}: RHCOS 9, RHEL 9, Fedora)"
                );
            }
        }
    }
    Ok(Found::NoDatabase)
}

/// [`Found`] of a read.
fn found(nevr: Option<Nevr>, db: String) -> Found {
    match nevr {
        Some(nevr) => Found::Installed { nevr, db },
        None => Found::NotInstalled { db },
    }
}

/// Copies the node file `path` (and its `-wal` and `-journal` when present) into `dir`,
/// each capped.
fn copy_in(fs: &NodeFs, path: &FilePath, dir: &std::path::Path) -> Result<()> {
    for (suffix, cap, required) in [("", MAX_DB, true), ("-wal", MAX_SIDE, false), ("-journal", MAX_SIDE, false)] {
        let from = match path {
            FilePath::Node(p) => FilePath::Node(format!("{p}{suffix}")),
            FilePath::Local(p) => FilePath::Local(format!("{}{suffix}", p.display()).into()),
        };
        let Some(file) = fs.open_file(&from)? else {
            if required {
                bail!("the RPM database {from} went away while it was read");
            }
            continue;
        };
        let to = dir.join(format!("{SQLITE}{suffix}"));
        let mut out = std::fs::File::create(&to).with_context(|| format!("creating {}", to.display()))?;
        let copied = std::io::copy(&mut file.take(cap + 1), &mut out).with_context(|| format!("reading {from}"))?;
        if copied > cap {
            bail!("{from} is larger than {cap} bytes, the most kata-addons reads of an RPM database");
        }
        out.flush().with_context(|| format!("writing {}", to.display()))?;
    }
    Ok(())
}

/// Reads `kata-containers` from the SQLite database at `path`: its NEVR (`None`: not
/// installed) and the database's node path.
fn read(fs: &NodeFs, path: &FilePath) -> Result<(Option<Nevr>, String)> {
    let private = tempfile::Builder::new()
        .prefix("kata-addons-rpmdb-")
        .tempdir()
        .context("creating a private directory for a copy of the node's RPM database")?;
    copy_in(fs, path, private.path())?;
    let copy = private.path().join(SQLITE);
    // The private copy is opened read-write so that SQLite can replay a copied WAL into it;
    // nothing on the node is opened by SQLite.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&copy, flags).with_context(|| format!("opening the RPM database {path}"))?;
    let nevr = query(&conn).with_context(|| format!("reading the RPM database {path}"))?;
    Ok((nevr, path.to_string()))
}

/// Scans `Packages` for the one `kata-containers`. A header that cannot be read is
/// skipped, as rpm skips it; when `kata-containers` is not among the rest, the first such
/// header is the error (it may have been the package).
fn query(conn: &Connection) -> Result<Option<Nevr>> {
    let mut stmt = conn.prepare("SELECT hnum, blob FROM Packages ORDER BY hnum")?;
    let mut rows = stmt.query([])?;
    let mut hit: Option<(i64, Nevr)> = None;
    let mut skipped: Vec<String> = Vec::new();
    let mut n = 0usize;
    while let Some(row) = rows.next()? {
        n += 1;
        if n > MAX_PACKAGES {
            bail!("more than {MAX_PACKAGES} packages, the most kata-addons looks at");
        }
        let hnum: i64 = row.get(0)?;
        let Ok(blob) = row.get_ref(1)?.as_blob() else {
            skipped.push(format!("package {hnum} is not a blob"));
            continue;
        };
        let name = match header::name(blob) {
            Ok(name) => name,
            Err(e) => {
                skipped.push(format!("package {hnum}: {e}"));
                continue;
            }
        };
        if name != PACKAGE {
            continue;
        }
        let nevr = match header::nevr(blob) {
            Ok(nevr) => nevr,
            Err(e) => {
                skipped.push(format!("package {hnum} ({PACKAGE}): {e}"));
                continue;
            }
        };
        if let Some((_, first)) = &hit {
            bail!(
                "two {PACKAGE} packages are installed ({} and {}): the node's Kata release is ambiguous",
                display_evr(first),
                display_evr(&nevr)
            );
        }
        hit = Some((hnum, nevr));
    }
    match (hit, skipped.first()) {
        (Some((hnum, nevr)), first) => {
            if let Some(first) = first {
                tracing::warn!(package = hnum, skipped = skipped.len(), "RPM database headers skipped: {first}");
            }
            Ok(Some(nevr))
        }
        (None, Some(first)) => bail!(
            "{} package header(s) unreadable and {PACKAGE} not among the others (the first: {first})",
            skipped.len()
        ),
        (None, None) => Ok(None),
    }
}

/// `EPOCH:VERSION-RELEASE`, the epoch left out when there is none (rpm's `%{EVR}`).
pub(crate) fn display_evr(n: &Nevr) -> String {
    match n.epoch {
        Some(e) => format!("{e}:{}-{}", n.version, n.release),
        None => format!("{}-{}", n.version, n.release),
    }
}
