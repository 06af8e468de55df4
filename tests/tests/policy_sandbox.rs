//! The policy sandbox against hostile guests (tests/guests/*), built from wit/ by the
//! test suite. Each test asserts the error kind and message, and that the runner stays
//! healthy: the next call (same `Policy` or a new one) still works.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kata_addons::policy::{KeyValue, LoadedFrom, Policy, PolicyError, PolicyOptions, path_only_facts};
use kata_addons_tests::guests::guest;
use kata_addons_tests::kata_addons_bin;

fn kv(name: &str, value: &str) -> KeyValue {
    KeyValue { name: name.into(), value: value.into() }
}

/// Options with no cache (each test compiles), a short deadline and a small memory cap.
fn opts() -> PolicyOptions {
    PolicyOptions { timeout: Duration::from_millis(300), memory_limit: 16 << 20, cache_dir: None }
}

fn load(name: &str) -> Policy {
    match Policy::from_file(&guest(name), opts()) {
        Ok(p) => p,
        Err(e) => panic!("loading {name}: {e:#}"),
    }
}

/// A benign call that every hostile test guest answers with `Ok`.
fn assert_healthy(p: &Policy) {
    let env = p.env(&[]);
    assert!(env.is_ok(), "the next call must work, got {env:?}");
}

/// A call the `alt` guest answers with `Ok`.
fn assert_healthy_alt(p: &Policy) {
    let env = p.env(&[kv("addonImage", "quay.io/a/b:c"), kv("kernelPath", "/k")]);
    assert!(env.is_ok(), "the alt policy must answer, got {env:?}");
}

fn env_err(p: &Policy, key: &str) -> PolicyError {
    match p.env(&[kv(key, "x")]) {
        Ok(v) => panic!("{key}: expected an error, got {v:?}"),
        Err(e) => e,
    }
}

#[test]
fn wasi_importer_is_refused_at_load_listing_its_imports() {
    let dir = tempfile::tempdir().unwrap();
    let options = PolicyOptions { cache_dir: Some(dir.path().to_path_buf()), ..opts() };
    let err = Policy::from_file(&guest("wasi-importer"), options).expect_err("a WASI-importing guest must be refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("must import nothing"), "{msg}");
    assert!(msg.contains("wasi:filesystem/"), "the refusal lists the imports: {msg}");
    assert!(msg.contains("wasi:cli/"), "the refusal lists every import: {msg}");
    assert_eq!(std::fs::read_dir(dir.path()).map(|d| d.count()).unwrap_or(0), 0, "a refused component is not cached");
    // The runner is fine: another component loads and runs.
    assert_healthy(&load("loop"));
}

#[test]
fn infinite_loop_traps_at_the_deadline() {
    let p = load("loop");
    let start = Instant::now();
    let err = env_err(&p, "spin");
    let elapsed = start.elapsed();
    assert!(
        matches!(err, PolicyError::Timeout { func: "env", limit } if limit == Duration::from_millis(300)),
        "{err:?}"
    );
    assert!(elapsed >= Duration::from_millis(300), "stopped early: {elapsed:?}");
    // A failure detector, not a benchmark: the loop never ends by itself, so any return
    // proves the deadline stopped it; how close to 300 ms it stops is in BENCHMARKS.md.
    assert!(elapsed < Duration::from_secs(60), "not stopped by the deadline: {elapsed:?}");
    let msg = err.to_string();
    assert!(msg.contains("did not finish within 300ms") && msg.contains("--policy-timeout"), "{msg}");
    assert_healthy(&p);
    // Again: each call gets its own deadline.
    assert!(matches!(env_err(&p, "spin"), PolicyError::Timeout { .. }));
    assert_healthy(&p);
}

#[test]
fn memory_hog_fails_at_the_cap() {
    let p = load("memhog");
    let err = env_err(&p, "hog");
    assert!(matches!(err, PolicyError::Memory { func: "env", limit: 16 }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("more than 16 MiB") && msg.contains("--policy-memory"), "{msg}");
    assert_healthy(&p);
}

#[test]
fn oversized_initial_memory_fails_at_instantiation() {
    let p = load("bigmem");
    let err = p.env(&[]).expect_err("a 256 MiB initial memory is over the 16 MiB cap");
    assert!(matches!(err, PolicyError::Memory { func: "env", limit: 16 }), "{err:?}");
    // The same component runs under a cap that fits it.
    let roomy = Policy::from_file(&guest("bigmem"), PolicyOptions { memory_limit: 300 << 20, ..opts() }).unwrap();
    assert!(roomy.env(&[]).is_ok());
}

#[test]
fn panic_is_a_clear_trap() {
    let p = load("panicker");
    let err = env_err(&p, "panic");
    match &err {
        PolicyError::Trap { func: "env", detail } => assert!(detail.contains("panic"), "{detail}"),
        other => panic!("expected a trap, got {other:?}"),
    }
    assert!(err.to_string().starts_with("policy `env` crashed: the guest aborted"), "{err}");
    assert_healthy(&p);
}

#[test]
fn unbounded_recursion_is_a_clear_stack_overflow() {
    let p = load("panicker");
    let err = env_err(&p, "recurse");
    match &err {
        PolicyError::Trap { func: "env", detail } => assert!(detail.contains("stack overflow"), "{detail}"),
        other => panic!("expected a stack-overflow trap, got {other:?}"),
    }
    assert_healthy(&p);
}

fn assert_bad_output(err: PolicyError, func: &str, fragment: &str) {
    match &err {
        PolicyError::BadOutput { func: f, detail } => {
            assert_eq!(*f, func);
            assert!(detail.contains(fragment), "expected {fragment:?} in {detail:?}");
        }
        other => panic!("expected BadOutput from {func} ({fragment}), got {other:?}"),
    }
    assert!(err.to_string().contains("returned output the runner refuses"), "{err}");
}

#[test]
fn bad_env_output_is_refused_by_the_host() {
    let p = load("badout");
    for (key, fragment) in [
        ("no-prefix", "\"LD_PRELOAD\" does not match ADDON_[A-Z0-9_]+"),
        ("lowercase", "\"ADDON_image\" does not match"),
        ("huge-value", "value of ADDON_IMAGE is longer than 8192 bytes"),
        ("many", "returned 1000 env entries, more than 64"),
        ("newline", "value of ADDON_IMAGE contains control characters"),
        ("many-violations", "returned 100000 violations, more than 256"),
        ("empty-violations", "without saying why"),
    ] {
        assert_bad_output(env_err(&p, key), "env", fragment);
        assert_healthy(&p);
    }
}

#[test]
fn bad_plan_output_is_refused_by_the_host() {
    let p = load("badout");
    for (mode, fragment) in [
        ("foreign-runtime-config", "runtime config \"/etc/shadow\" is not a Kata configuration*.toml"),
        ("relative-runtime-config", "is not a clean absolute path"),
        ("no-runtime-config", "plan names 0 runtime configs"),
        ("slash-file-name", "artifact file name \"../../../usr/bin/sudo\" is not a plain file name"),
        ("dotdot-file-name", "artifact file name \"..\" is not a plain file name"),
        ("relative-source", "artifact source \"vmlinuz\" is not a clean absolute path"),
        ("bad-version", "is not usable as a directory name"),
        ("relative-verity-file", "artifact verity file \"root_hash.txt\" is not a clean absolute path"),
        ("slash-name", "artifact name \"../x\" is not a plain name"),
        ("many-runtime-classes", "plan names 100 runtime classes, more than 32"),
        ("ipv6-registry", "registry host `[::1]:5000` is a bracketed IPv6 address"),
        ("unnormalised-docker-hub", "`docker.io/ubuntu` is not a normalised Docker Hub name"),
        ("newline-runtime-class", "runtime class \"kata\\n[x]\" is not a plain name"),
        ("many-artifacts", "plan has 100 artifacts"),
    ] {
        let err = p.plan(&[kv("ADDON_MODE", mode)]).expect_err(mode);
        assert_bad_output(err, "plan", fragment);
        assert!(p.plan(&[kv("ADDON_MODE", "ok")]).is_ok(), "a good plan after {mode}");
    }
}

#[test]
fn bad_render_output_is_refused_by_the_host() {
    let p = load("badout");
    let mut plan = p.plan(&[kv("ADDON_MODE", "ok")]).unwrap();
    let rcs = [
        path_only_facts("/etc/kata-containers/kata-tdx/configuration.toml"),
        path_only_facts("/opt/x/configuration-y.toml"),
    ];
    plan.version = "huge".into();
    assert_bad_output(p.render(&plan, &[], &rcs).unwrap_err(), "render", "more than 65536");
    plan.version = "badtoml".into();
    assert_bad_output(p.render(&plan, &[], &rcs).unwrap_err(), "render", "drop-in is not valid TOML");
    plan.version = "elsewhere".into();
    assert_bad_output(
        p.render(&plan, &[], &rcs).unwrap_err(),
        "render",
        "drop-in path \"/etc/cron.d/50-kata-addons.toml\" is not /etc/kata-containers/kata-tdx/config.d/50-kata-addons.toml",
    );
    plan.version = "fewer".into();
    assert_bad_output(p.render(&plan, &[], &rcs).unwrap_err(), "render", "returned 0 drop-ins for 2 runtime configs");
    plan.version = "v1".into();
    let d = p.render(&plan, &[], &rcs).unwrap();
    assert_eq!(d[1].path, "/opt/x/config.d/50-kata-addons.toml");
}

#[test]
fn render_refusals_of_the_node_are_told_apart_from_invalid_configuration() {
    let p = load("badout");
    let mut plan = p.plan(&[kv("ADDON_MODE", "ok")]).unwrap();
    let rcs = [path_only_facts("/etc/kata-containers/kata-tdx/configuration.toml")];
    plan.version = "node-refuses".into();
    match p.render(&plan, &[], &rcs).unwrap_err() {
        PolicyError::NodeRefuses(v) => {
            assert_eq!(v.len(), 1);
            assert_eq!(v[0].key, "/etc/kata-containers/kata-tdx/configuration.toml");
        }
        other => panic!("expected NodeRefuses, got {other:?}"),
    }
    // One invalid-configuration violation among them: the ConfigMap is at fault (exit 2).
    plan.version = "node-refuses-and-invalid".into();
    assert!(matches!(p.render(&plan, &[], &rcs).unwrap_err(), PolicyError::Rejected(v) if v.len() == 2));
}

#[test]
fn alternative_policy_runs_through_the_api() {
    let p = load("alt");
    let env = p.env(&[kv("addonImage", "quay.io/example/addon:v2"), kv("kernelPath", "/boot/vmlinuz")]).unwrap();
    assert_eq!(env[0], kv("ADDON_IMAGE", "quay.io/example/addon:v2"));
    let plan = p.plan(&env).unwrap();
    assert_eq!(plan.artifacts[0].file_name, "vmlinuz-alt");
    let err = p.env(&[kv("kernelpath", "/x")]).unwrap_err();
    assert!(matches!(&err, PolicyError::Rejected(v) if v.len() == 3), "{err:?}");
}

/// The `.cwasm` entry and its checksum file in a cache dir holding one entry.
fn entry_files(dir: &Path) -> (PathBuf, PathBuf) {
    let (mut cwasm, mut sum) = (None, None);
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".cwasm") {
            cwasm = Some(path);
        } else if name.ends_with(".cwasm.sha256") {
            sum = Some(path);
        }
    }
    (cwasm.expect("a .cwasm entry"), sum.expect("a checksum file"))
}

fn cached(dir: &Path, name: &str) -> Policy {
    Policy::from_file(&guest(name), PolicyOptions { cache_dir: Some(dir.to_path_buf()), ..opts() }).unwrap()
}

fn sha256_hex(data: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("blob");
    std::fs::write(&f, data).unwrap();
    let out = Command::new("sha256sum").arg(&f).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
}

#[test]
fn cache_is_used_and_bad_entries_are_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_eq!(cached(d, "alt").loaded_from(), LoadedFrom::Compiled);
    assert_eq!(cached(d, "alt").loaded_from(), LoadedFrom::Cache);
    let (cwasm, sum) = entry_files(d);
    let good = std::fs::read(&cwasm).unwrap();

    // One byte flipped in the middle.
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&cwasm, &bad).unwrap();
    let p = cached(d, "alt");
    assert_eq!(p.loaded_from(), LoadedFrom::Compiled, "a corrupt entry is recompiled");
    assert_healthy_alt(&p);
    assert_eq!(std::fs::read(&cwasm).unwrap(), good, "and rewritten");

    // Truncated.
    std::fs::write(&cwasm, &good[..good.len() / 3]).unwrap();
    assert_eq!(cached(d, "alt").loaded_from(), LoadedFrom::Compiled, "a truncated entry is recompiled");
    assert_eq!(cached(d, "alt").loaded_from(), LoadedFrom::Cache);

    // Checksum file garbage, then missing.
    std::fs::write(&sum, "garbage").unwrap();
    assert_eq!(cached(d, "alt").loaded_from(), LoadedFrom::Compiled);
    std::fs::remove_file(&sum).unwrap();
    assert_eq!(cached(d, "alt").loaded_from(), LoadedFrom::Compiled);
    assert_eq!(cached(d, "alt").loaded_from(), LoadedFrom::Cache);
}

#[test]
fn foreign_cache_entry_is_detected_even_with_a_fixed_up_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let (mine, other) = (dir.path().join("mine"), dir.path().join("other"));
    assert_eq!(cached(&mine, "alt").loaded_from(), LoadedFrom::Compiled);
    assert_eq!(cached(&other, "loop").loaded_from(), LoadedFrom::Compiled);
    let (my_cwasm, my_sum) = entry_files(&mine);
    let (other_cwasm, other_sum) = entry_files(&other);
    let foreign = std::fs::read(&other_cwasm).unwrap();

    // 1. The other component's entry, with its own (valid) checksum file.
    std::fs::write(&my_cwasm, &foreign).unwrap();
    std::fs::copy(&other_sum, &my_sum).unwrap();
    let p = cached(&mine, "alt");
    assert_eq!(p.loaded_from(), LoadedFrom::Compiled, "another component's entry is refused");
    assert_healthy_alt(&p);

    // 2. The foreign bytes under my checksum file with only the cwasm digest fixed up: the
    // manifest now names my component, but wasmtime's embedded version string does not.
    let manifest = std::fs::read_to_string(&my_sum).unwrap();
    let digest = sha256_hex(&foreign);
    let fixed: String = manifest
        .lines()
        .map(|l| if l.starts_with("cwasm-sha256 ") { format!("cwasm-sha256 {digest}\n") } else { format!("{l}\n") })
        .collect();
    assert_ne!(fixed, manifest);
    std::fs::write(&my_cwasm, &foreign).unwrap();
    std::fs::write(&my_sum, fixed).unwrap();
    let p = cached(&mine, "alt");
    assert_eq!(p.loaded_from(), LoadedFrom::Compiled, "a fixed-up checksum does not make a foreign entry trusted");
    assert_healthy_alt(&p);
    assert_eq!(cached(&mine, "alt").loaded_from(), LoadedFrom::Cache, "the rewritten entry is good again");
}

#[test]
fn unusable_cache_dir_falls_back_to_compiling() {
    let dir = tempfile::tempdir().unwrap();
    // A cache dir that cannot be created (its parent is a file).
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let p = cached(&file.join("cache"), "alt");
    assert_eq!(p.loaded_from(), LoadedFrom::Compiled);
    assert_healthy_alt(&p);
    assert_eq!(cached(&file.join("cache"), "alt").loaded_from(), LoadedFrom::Compiled);

    // A read-only cache dir (root can still write it; then this only shows it does no harm).
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let p = cached(&ro, "alt");
    assert_eq!(p.loaded_from(), LoadedFrom::Compiled);
    assert_healthy_alt(&p);
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn preview_runs_an_alternative_policy_end_to_end() {
    let bin = kata_addons_bin();
    assert!(bin.is_file(), "{} is missing: build it first (`cargo build -p kata-addons`)", bin.display());
    let dir = tempfile::tempdir().unwrap();
    let cm = dir.path().join("cm.yaml");
    std::fs::write(
        &cm,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kata-addon-artifacts\ndata:\n  \
         addonImage: quay.io/example/addon:v2\n  kernelPath: /boot/vmlinuz\n",
    )
    .unwrap();
    let run = |policy: &Path, extra: &[&str]| {
        Command::new(&bin)
            .arg("--policy-component")
            .arg(policy)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .arg("preview")
            .args(extra)
            .arg("--configmap")
            .arg(&cm)
            .output()
            .unwrap()
    };
    let out = run(&guest("alt"), &["--output", "json"]);
    assert!(out.status.success(), "preview failed: {}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["env"][1]["name"], "ADDON_PROVIDER");
    assert_eq!(doc["env"][1]["value"], "tdx");
    assert_eq!(doc["artifacts"][0]["kind"], "kernel");
    assert_eq!(doc["artifacts"][0]["source"], "/boot/vmlinuz");
    assert_eq!(doc["dropIns"][0]["path"], "/etc/kata-containers/kata-tdx/config.d/50-kata-addons.toml");
    let contents = doc["dropIns"][0]["contents"].as_str().unwrap();
    assert!(
        contents.starts_with(
            "# written by the alt test policy\n[hypervisor.qemu]\nkernel = \"/etc/kata-containers/addons/alt-1-"
        ),
        "{contents}"
    );
    // Second run: from the cache, same answer.
    let again = run(&guest("alt"), &["--output", "json"]);
    assert_eq!(again.stdout, out.stdout);

    // A hostile policy through the binary: a clear error, exit 1.
    let out = run(&guest("wasi-importer"), &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("must import nothing") && stderr.contains("wasi:filesystem"), "{stderr}");

    // The alt policy's rejection: exit 2.
    std::fs::write(&cm, "kernelpath: /x\n").unwrap();
    let out = run(&guest("alt"), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}
