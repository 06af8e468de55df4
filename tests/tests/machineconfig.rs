//! MachineConfig mode (`host/deploy/machineconfig/`): the systemd unit passes
//! `systemd-analyze verify`, and the Butane source and the rendered MachineConfig both
//! deliver exactly that unit and the configuration file beside it, which the runner accepts.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use kata_addons_tests::{kata_addons_bin, show};

const UNIT: &str = "kata-addons-install.service";
const CONFIG_PATH: &str = "/etc/kata-addons/kata-addon-artifacts.yaml";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/deploy/machineconfig")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn yaml(name: &str) -> serde_json::Value {
    serde_norway::from_str(&read(name)).unwrap_or_else(|e| panic!("{name} is not YAML: {e}"))
}

/// The `ExecStart=` line of the unit.
fn exec_start(unit: &str) -> &str {
    unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("the unit has ExecStart=")
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let unit = read(UNIT);
    assert!(unit.contains("\nType=oneshot\n") && unit.contains("\nRemainAfterExit=yes\n"), "{unit}");
    assert!(unit.contains("\nBefore=crio.service kubelet.service\n"), "runs before CRI-O: {unit}");
    assert!(unit.contains(&format!("\nConditionPathExists={CONFIG_PATH}\n")), "{unit}");
    let exec = exec_start(&unit);
    assert!(
        exec.ends_with(&format!("install --root /host --configmap {CONFIG_PATH}")),
        "the unit runs `kata-addons install --configmap {CONFIG_PATH}`: {exec}"
    );
    assert!(!exec.contains(":latest"), "the runner image is pinned by version: {exec}");
    // The cluster proxy as the machine-config operator writes it for CRI-O (optional file),
    // passed on by podman (its default --http-proxy=true) to the runner, which reads it.
    assert!(unit.contains("\nEnvironmentFile=-/etc/mco/proxy.env\n"), "{unit}");
    assert!(!exec.contains("--http-proxy=false"), "{exec}");
    let image = exec.split_whitespace().find(|w| w.starts_with("quay.io/")).expect("runner image");
    let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
    assert!(tag.split('.').count() == 3 && tag.split('.').all(|p| p.parse::<u32>().is_ok()), "version tag: {image}");

    // podman is not on the test machine: verify the unit with ExecStart pointing at an
    // executable the test provides (systemd-analyze checks that it exists and is executable).
    let tmp = tempfile::tempdir().expect("tmp");
    let stub = tmp.path().join("podman");
    std::fs::write(&stub, "#!/bin/sh\nexit 0\n").expect("stub");
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = tmp.path().join(UNIT);
    std::fs::write(&path, unit.replace("ExecStart=/usr/bin/podman ", &format!("ExecStart={} ", stub.display())))
        .expect("unit copy");
    let o = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("run systemd-analyze");
    assert!(o.status.success() && o.stderr.is_empty(), "systemd-analyze verify: {}", show(&o));

    // The check can fail: a unit with a missing ExecStart binary is refused.
    std::fs::write(&path, unit.replace("/usr/bin/podman", "/nonexistent/podman")).expect("unit copy");
    let o = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("run systemd-analyze");
    assert!(!o.status.success() || !o.stderr.is_empty(), "a missing binary must be reported: {}", show(&o));
}

#[test]
fn machineconfig_delivers_the_unit_and_the_configuration() {
    let mc = yaml("99-worker-kata-addons.yaml");
    assert_eq!(mc["apiVersion"], "machineconfiguration.openshift.io/v1");
    assert_eq!(mc["kind"], "MachineConfig");
    assert_eq!(mc["metadata"]["labels"]["machineconfiguration.openshift.io/role"], "worker");
    let cfg = &mc["spec"]["config"];
    let version = cfg["ignition"]["version"].as_str().expect("ignition version");
    assert!(version.starts_with("3."), "Ignition spec 3: {version}");

    let files = cfg["storage"]["files"].as_array().expect("storage.files");
    assert_eq!(files.len(), 1);
    assert_eq!(files[0]["path"], CONFIG_PATH);
    assert_eq!(files[0]["mode"], 0o644);
    let source = files[0]["contents"]["source"].as_str().expect("contents.source");
    let b64 = source.strip_prefix("data:text/plain;charset=utf-8;base64,").expect("a base64 data URL");
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    assert_eq!(String::from_utf8(decoded).expect("utf-8"), read("kata-addon-artifacts.yaml"));

    let units = cfg["systemd"]["units"].as_array().expect("systemd.units");
    assert_eq!(units.len(), 1);
    assert_eq!(units[0]["name"], UNIT);
    assert_eq!(units[0]["enabled"], true);
    assert_eq!(units[0]["contents"], read(UNIT));
}

#[test]
fn butane_source_matches_the_machineconfig() {
    let bu = yaml("99-worker-kata-addons.bu");
    let mc = yaml("99-worker-kata-addons.yaml");
    assert_eq!(bu["variant"], "openshift");
    assert_eq!(bu["metadata"]["name"], mc["metadata"]["name"]);
    assert_eq!(bu["metadata"]["labels"], mc["metadata"]["labels"]);
    let f = &bu["storage"]["files"][0];
    assert_eq!(f["path"], CONFIG_PATH);
    assert_eq!(f["mode"], 0o644);
    assert_eq!(f["contents"]["inline"], read("kata-addon-artifacts.yaml"));
    let u = &bu["systemd"]["units"][0];
    assert_eq!(u["name"], UNIT);
    assert_eq!(u["enabled"], true);
    assert_eq!(u["contents"], read(UNIT));
}

#[test]
fn the_delivered_configuration_is_accepted_by_the_runner() {
    let cm = dir().join("kata-addon-artifacts.yaml");
    let o = Command::new(kata_addons_bin())
        .args(["preview", "--output", "json", "--root", "/nonexistent", "--configmap"])
        .arg(&cm)
        .env("HOME", tempfile::tempdir().expect("home").path())
        .output()
        .expect("run kata-addons");
    assert!(o.status.success(), "{}", show(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(doc["plan"]["provider"], "se");
}

/// Seconds of a systemd time span such as `15min`, `900`, `1h 30s` (the units the unit uses).
fn systemd_seconds(v: &str) -> u64 {
    let mut total = 0;
    for part in v.split_whitespace() {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        let n: u64 = digits.parse().unwrap_or_else(|_| panic!("time span {v:?}"));
        total += n * match &part[digits.len()..] {
            "" | "s" | "sec" => 1,
            "m" | "min" => 60,
            "h" => 3600,
            other => panic!("unit {other:?} in {v:?}"),
        };
    }
    total
}

#[test]
fn the_pull_deadline_sits_below_the_units_start_timeout() {
    use clap::Parser as _;
    let unit = read(UNIT);
    let start = unit.lines().find_map(|l| l.strip_prefix("TimeoutStartSec=")).expect("TimeoutStartSec=");
    let start = systemd_seconds(start.trim());
    // The runner's arguments: everything after the image in `podman run … IMAGE args`.
    let words: Vec<&str> = exec_start(&unit).split_whitespace().collect();
    let image = words.iter().position(|w| w.starts_with("quay.io/")).expect("the image in ExecStart");
    let argv: Vec<&str> = std::iter::once("kata-addons").chain(words[image + 1..].iter().copied()).collect();
    let cli = kata_addons::cli::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let kata_addons::cli::Command::Install { registry, .. } = cli.command else { panic!("the unit runs install") };
    // The pull deadline bounds every registry request, retry and wait of the install;
    // podman pulling the runner image needs the rest of the start timeout.
    assert!(
        registry.pull_deadline + 120 <= start,
        "--pull-deadline {} s leaves less than 2 min of TimeoutStartSec={start} s",
        registry.pull_deadline
    );
}
