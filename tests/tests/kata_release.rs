//! The node's Kata release read from RPM databases built by Debian's rpm 4.18, compared
//! case for case with `rpm --root ROOT --dbpath DIR -q --qf '%{EPOCH}:%{VERSION}-%{RELEASE}'
//! kata-containers` (docs/design.md#node-kata-release). Packages are built by `rpmbuild`
//! from no-file specs and installed `--justdb --nodeps` into SQLite databases laid out as
//! RHCOS lays them out (`/usr/share/rpm/rpmdb.sqlite`, `/var/lib/rpm` a link to it). Every
//! case also checks that reading left the node root byte-identical.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kata_addons::kata_release::rpm_query;
use kata_addons_tests::rpmdb::{Builder, Pkg, have_rpm, install, rhcos_root, rpm};

/// What rpm says: `Ok(Some(line))` for one package, `Ok(None)` for not installed,
/// `Err(text)` for anything else (two lines, an error).
fn oracle(root: &Path, dbpath: &str) -> Result<Option<String>, String> {
    let out = rpm(root, dbpath, &["-q", "--qf", "%{EPOCH}:%{VERSION}-%{RELEASE}\\n", "kata-containers"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    if out.status.success() && lines.len() == 1 && !stderr.contains("error") {
        return Ok(Some(lines[0].to_string()));
    }
    if stdout.contains("is not installed") && !stderr.contains("error") {
        return Ok(None);
    }
    Err(format!("exit {:?}: {stdout}{stderr}", out.status.code()).replace('\n', " "))
}

/// Every file under `dir` (symlinks as their target text) with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.insert(p.clone(), std::fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes());
            } else if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            } else {
                out.insert(p.clone(), b"<special>".to_vec());
            }
        }
    }
    out
}

/// Runs python3's sqlite3 on the database `db` with `script` (`db` is bound as `c`, a
/// connection); `exit_without_close` leaves a WAL behind as a killed writer does.
fn python_sqlite(db: &Path, script: &str, exit_without_close: bool) {
    let tail = if exit_without_close { "import os; os._exit(0)" } else { "c.commit(); c.close()" };
    let code = format!("import sqlite3\nc = sqlite3.connect({:?})\n{script}\n{tail}\n", db.to_str().unwrap());
    let out = Command::new("python3").arg("-c").arg(&code).output().unwrap();
    assert!(out.status.success(), "python3 sqlite3: {}", String::from_utf8_lossy(&out.stderr));
}

/// The header blob of kata-containers rewritten by a Python expression over `b` (bytes).
fn mutate_kata_blob(db: &Path, expr: &str) {
    python_sqlite(
        db,
        &format!(
            "h, b = c.execute(\"SELECT hnum, blob FROM Packages\").fetchall()[0]\nb = bytearray(b)\n{expr}\nc.execute('UPDATE Packages SET blob = ? WHERE hnum = ?', (bytes(b), h))"
        ),
        false,
    );
}

/// What a case expects of us beside rpm.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    /// The same answer as rpm (a value, or not installed).
    Same,
    /// We refuse (an error naming why); rpm gives no single value (an error, two lines, or
    /// not installed after skipping a bad header).
    Refuse(&'static str),
    /// Not installed, whatever rpm would read outside the root.
    NotInstalled,
    /// We refuse; rpm is not asked (a database format or file type Debian's rpm is not
    /// built for, or one it would block on).
    RefuseAlone(&'static str),
}

/// One case's result line for the table.
struct Row {
    name: &'static str,
    rpm: String,
    ours: String,
    ok: bool,
}

const K25: Pkg = Pkg("kata-containers", None, "3.25.0", "6.el9");
const K26: Pkg = Pkg("kata-containers", None, "3.26.0", "1.el9");

#[test]
fn rpm_databases_case_for_case() {
    if !have_rpm() {
        panic!("Debian's rpm and rpmbuild are needed (tests/run installs the `rpm` package)");
    }
    let work = tempfile::tempdir().unwrap();
    let mut b = Builder::new(work.path());
    let mut rows: Vec<Row> = Vec::new();
    let mut n = 0;
    let mut case =
        |name: &'static str, expect: Expect, setup: &mut dyn FnMut(&Path, &mut Builder) -> (PathBuf, String)| {
            n += 1;
            let dir = work.path().join(format!("case-{n}"));
            std::fs::create_dir_all(&dir).unwrap();
            let (root, dbpath) = setup(&dir, &mut b);
            let before = snapshot(&root);
            let started = std::time::Instant::now();
            let ours = rpm_query(&root).map_err(|e| format!("{e:#}"));
            assert!(started.elapsed().as_secs() < 60, "{name}: a read took {:?}", started.elapsed());
            assert!(snapshot(&root) == before, "{name}: reading changed the node root");
            let theirs = match expect {
                Expect::RefuseAlone(_) => Err("(not asked)".to_string()),
                _ => oracle(&root, &dbpath),
            };
            let ok = match (expect, &ours, &theirs) {
                (Expect::Same, Ok(a), Ok(b)) => a == b,
                (Expect::Refuse(why), Err(e), Ok(None) | Err(_)) => e.contains(why),
                (Expect::NotInstalled, Ok(None), _) => true,
                (Expect::RefuseAlone(why), Err(e), _) => e.contains(why),
                _ => false,
            };
            rows.push(Row { name, rpm: format!("{theirs:?}"), ours: format!("{ours:?}"), ok });
        };
    let rhcos = |pkgs: Vec<Pkg>, upgrade: bool| {
        move |dir: &Path, b: &mut Builder| {
            let root = rhcos_root(dir);
            let files: Vec<PathBuf> = pkgs.iter().map(|p| b.rpm(*p)).collect();
            install(&root, "/usr/share/rpm", &files, upgrade);
            (root, "/usr/share/rpm".to_string())
        }
    };
    let others = || {
        vec![
            Pkg("bash", None, "5.1.8", "9.el9"),
            Pkg("kata-containers-debug", None, "9.9.9", "1"),
            Pkg("kernel", Some(1), "5.14.0", "427.el9"),
        ]
    };

    case("one package", Expect::Same, &mut rhcos(vec![K25], false));
    case("epoch 2", Expect::Same, &mut rhcos(vec![Pkg("kata-containers", Some(2), "3.25.0", "6.el9")], false));
    case("epoch 0", Expect::Same, &mut rhcos(vec![Pkg("kata-containers", Some(0), "3.25.0", "6.el9")], false));
    case(
        "tilde pre-release",
        Expect::Same,
        &mut rhcos(vec![Pkg("kata-containers", None, "3.25.0~rc1", "1.el9")], false),
    );
    case(
        "caret snapshot",
        Expect::Same,
        &mut rhcos(vec![Pkg("kata-containers", None, "3.25.0^20260101git1", "1")], false),
    );
    case(
        "z-stream release",
        Expect::Same,
        &mut rhcos(vec![Pkg("kata-containers", None, "3.17.0", "6.el9_4.2")], false),
    );
    let mut with_others = others();
    with_others.push(K25);
    case("among other packages", Expect::Same, &mut rhcos(with_others, false));
    case("only other packages", Expect::Same, &mut rhcos(others(), false));
    case("empty database", Expect::Same, &mut rhcos(vec![], false));
    case("two versions installed", Expect::Refuse("ambiguous"), &mut rhcos(vec![K25, K26], false));
    case("upgraded", Expect::Same, &mut rhcos(vec![K25, K26], true));
    case("erased", Expect::Same, &mut |dir: &Path, b: &mut Builder| {
        let root = rhcos_root(dir);
        install(&root, "/usr/share/rpm", &[b.rpm(K25)], false);
        let out = rpm(&root, "/usr/share/rpm", &["-e", "--justdb", "--nodeps", "--noscripts", "kata-containers"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (root, "/usr/share/rpm".to_string())
    });
    case("live WAL (upgrade not checkpointed)", Expect::Same, &mut |dir: &Path, b: &mut Builder| {
        let root = rhcos_root(dir);
        install(&root, "/usr/share/rpm", &[b.rpm(K25)], false);
        let other = dir.join("other");
        std::fs::create_dir_all(&other).unwrap();
        install(&other, "/db", &[b.rpm(K26)], false);
        let db = root.join("usr/share/rpm/rpmdb.sqlite");
        python_sqlite(
            &db,
            &format!(
                "c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0')\nnew = sqlite3.connect({:?}).execute('SELECT blob FROM Packages').fetchone()[0]\nc.execute('UPDATE Packages SET blob = ?', (new,)); c.commit()",
                other.join("db/rpmdb.sqlite").to_str().unwrap()
            ),
            true,
        );
        let wal = std::fs::metadata(root.join("usr/share/rpm/rpmdb.sqlite-wal")).map(|m| m.len()).unwrap_or(0);
        assert!(wal > 0, "the WAL holds the update");
        (root, "/usr/share/rpm".to_string())
    });
    case("no WAL beside the database", Expect::Same, &mut |dir: &Path, b: &mut Builder| {
        let (root, db) = rhcos(vec![K26], false)(dir, b);
        for side in ["rpmdb.sqlite-wal", "rpmdb.sqlite-shm"] {
            let _ = std::fs::remove_file(root.join("usr/share/rpm").join(side));
        }
        (root, db)
    });
    case("truncated database", Expect::Refuse("RPM database"), &mut |dir: &Path, b: &mut Builder| {
        let (root, db) = rhcos(vec![bash(), K25], false)(dir, b);
        let f = root.join("usr/share/rpm/rpmdb.sqlite");
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len / 3).unwrap();
        (root, db)
    });
    case("corrupt pages", Expect::Refuse("RPM database"), &mut |dir: &Path, b: &mut Builder| {
        let (root, db) = rhcos(vec![bash(), K25], false)(dir, b);
        let f = root.join("usr/share/rpm/rpmdb.sqlite");
        let mut bytes = std::fs::read(&f).unwrap();
        for (i, byte) in bytes.iter_mut().enumerate().skip(100) {
            *byte ^= (i as u8).wrapping_mul(31) | 1;
        }
        std::fs::write(&f, bytes).unwrap();
        (root, db)
    });
    case("hostile index count", Expect::Refuse("index of"), &mut |dir: &Path, b: &mut Builder| {
        let (root, db) = rhcos(vec![K25], false)(dir, b);
        mutate_kata_blob(&root.join("usr/share/rpm/rpmdb.sqlite"), "b[0:4] = (0xffffffff).to_bytes(4, 'big')");
        (root, db)
    });
    case("hostile data length", Expect::Refuse("data bytes"), &mut |dir: &Path, b: &mut Builder| {
        let (root, db) = rhcos(vec![K25], false)(dir, b);
        mutate_kata_blob(&root.join("usr/share/rpm/rpmdb.sqlite"), "b[4:8] = (0x7fffffff).to_bytes(4, 'big')");
        (root, db)
    });
    case("hostile offsets", Expect::Refuse("offset"), &mut |dir: &Path, b: &mut Builder| {
        let (root, db) = rhcos(vec![K25], false)(dir, b);
        // Every entry's offset negative (rpm reads it as a signed 32-bit number).
        mutate_kata_blob(
            &root.join("usr/share/rpm/rpmdb.sqlite"),
            "il = int.from_bytes(b[0:4], 'big')\nfor i in range(il):\n    o = 8 + 16 * i + 8\n    b[o:o+4] = (0x80000000 + i).to_bytes(4, 'big')",
        );
        (root, db)
    });
    case(
        "hostile header in another package (skipped, as rpm does)",
        Expect::Same,
        &mut |dir: &Path, b: &mut Builder| {
            let (root, db) = rhcos(vec![bash(), K25], false)(dir, b);
            python_sqlite(
                &root.join("usr/share/rpm/rpmdb.sqlite"),
                "h = c.execute(\"SELECT hnum FROM Name WHERE key = 'bash'\").fetchone()[0]\nc.execute('UPDATE Packages SET blob = ? WHERE hnum = ?', (b'\\xff' * 64, h))",
                false,
            );
            (root, db)
        },
    );
    case("truncated header blob", Expect::Refuse("need"), &mut |dir: &Path, b: &mut Builder| {
        let (root, db) = rhcos(vec![K25], false)(dir, b);
        mutate_kata_blob(&root.join("usr/share/rpm/rpmdb.sqlite"), "del b[len(b)//2:]");
        (root, db)
    });
    case("Fedora layout (/usr/lib/sysimage/rpm)", Expect::Same, &mut |dir: &Path, b: &mut Builder| {
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("usr/lib/sysimage/rpm")).unwrap();
        std::fs::create_dir_all(root.join("var/lib")).unwrap();
        std::os::unix::fs::symlink("../../usr/lib/sysimage/rpm", root.join("var/lib/rpm")).unwrap();
        install(&root, "/usr/lib/sysimage/rpm", &[b.rpm(K26)], false);
        (root, "/usr/lib/sysimage/rpm".to_string())
    });
    case("absolute /var/lib/rpm link, read inside the root", Expect::Same, &mut |dir: &Path, b: &mut Builder| {
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("srv/rpmdb")).unwrap();
        std::fs::create_dir_all(root.join("var/lib")).unwrap();
        std::os::unix::fs::symlink("/srv/rpmdb", root.join("var/lib/rpm")).unwrap();
        install(&root, "/srv/rpmdb", &[b.rpm(K25)], false);
        (root, "/srv/rpmdb".to_string())
    });
    case(
        "/var/lib/rpm linked outside the root (absolute)",
        Expect::NotInstalled,
        &mut |dir: &Path, b: &mut Builder| {
            let decoy = dir.join("decoy");
            install(&decoy, "/db", &[b.rpm(Pkg("kata-containers", None, "6.6.6", "evil"))], false);
            let root = dir.join("root");
            std::fs::create_dir_all(root.join("var/lib")).unwrap();
            std::os::unix::fs::symlink(decoy.join("db"), root.join("var/lib/rpm")).unwrap();
            (root, "/var/lib/rpm".to_string())
        },
    );
    case(
        "/var/lib/rpm linked outside the root (../ climb)",
        Expect::NotInstalled,
        &mut |dir: &Path, b: &mut Builder| {
            let decoy = dir.join("decoy");
            install(&decoy, "/db", &[b.rpm(Pkg("kata-containers", None, "6.6.6", "evil"))], false);
            let root = dir.join("root");
            std::fs::create_dir_all(root.join("var/lib")).unwrap();
            let climb = format!("../../../../../../../../../../../..{}", decoy.join("db").display());
            std::os::unix::fs::symlink(climb, root.join("var/lib/rpm")).unwrap();
            (root, "/var/lib/rpm".to_string())
        },
    );
    case("Berkeley DB database", Expect::RefuseAlone("Berkeley DB"), &mut |dir: &Path, _b: &mut Builder| {
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("var/lib/rpm")).unwrap();
        std::fs::write(root.join("var/lib/rpm/Packages"), [0u8; 4096]).unwrap();
        (root, "/var/lib/rpm".to_string())
    });
    case("NDB database", Expect::RefuseAlone("NDB"), &mut |dir: &Path, _b: &mut Builder| {
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("var/lib/rpm")).unwrap();
        std::fs::write(root.join("var/lib/rpm/Packages.db"), [0u8; 4096]).unwrap();
        (root, "/var/lib/rpm".to_string())
    });
    case(
        "FIFO in place of the database",
        Expect::RefuseAlone("not a regular file"),
        &mut |dir: &Path, _b: &mut Builder| {
            let root = rhcos_root(dir);
            let fifo = root.join("usr/share/rpm/rpmdb.sqlite");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            (root, "/usr/share/rpm".to_string())
        },
    );

    println!("| case | rpm | kata-addons | agree |\n| --- | --- | --- | --- |");
    for r in &rows {
        println!("| {} | {} | {} | {} |", r.name, r.rpm, r.ours, if r.ok { "yes" } else { "NO" });
    }
    let bad: Vec<&str> = rows.iter().filter(|r| !r.ok).map(|r| r.name).collect();
    assert!(rows.len() >= 20, "{} cases", rows.len());
    assert!(bad.is_empty(), "cases that disagree: {bad:?}");
}

/// A package that is not Kata.
fn bash() -> Pkg {
    Pkg("bash", None, "5.1.8", "9.el9")
}
