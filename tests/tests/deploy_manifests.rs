//! The Kubernetes deployment under `host/deploy/`: every manifest parses into its typed
//! `k8s-openapi` object and survives a round trip unchanged (so a misspelt field, which the
//! typed objects would silently drop, is caught), the DaemonSets have the shape the runner
//! needs, and every flag, subcommand and env var they use exists in the runner's CLI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser, ValueEnum};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, ServiceAccount, Volume};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kata_addons::cli::{Action, Cli, Command};
use serde::Serialize;
use serde::de::{Deserialize, DeserializeOwned};
use serde_json::Value;

const NAMESPACE: &str = "openshift-sandboxed-containers-operator";
const PULL_SECRET: &str = "kata-addons-pull-secret";

/// The one env var the runner itself reads (`daemon --action`).
const RUNNER_ENV: &[&str] = &["ADDON_ACTION"];
/// The `ADDON_*` names the policy accepts (the ConfigMap keys as env).
const POLICY_ENV: &[&str] = &[
    "ADDON_IMAGE",
    "ADDON_PROVIDER",
    "ADDON_VERSION",
    "ADDON_KERNEL_PATH",
    "ADDON_INITRD_PATH",
    "ADDON_IMAGE_PATH",
    "ADDON_KERNEL_SHA256",
    "ADDON_INITRD_SHA256",
    "ADDON_IMAGE_SHA256",
];
/// Standard variables the runner honours (log filter, auth-file search, cache location).
const STANDARD_ENV: &[&str] = &["RUST_LOG", "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "HOME"];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every non-empty YAML document of a file, as JSON values.
fn documents(path: &Path) -> Vec<Value> {
    let text = read(path);
    let mut out = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(&text).enumerate() {
        let v = Value::deserialize(doc).unwrap_or_else(|e| panic!("{} document {i}: not YAML: {e}", path.display()));
        if !v.is_null() {
            out.push(v);
        }
    }
    out
}

/// The first place where two JSON values differ, as a path (`None`: equal).
fn first_difference(path: &str, want: &Value, got: &Value) -> Option<String> {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = format!("{path}.{k}");
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => {
                        if let Some(d) = first_difference(&p, x, y) {
                            return Some(d);
                        }
                    }
                    (Some(x), None) => {
                        return Some(format!("{p}: {x} is dropped by the typed object (unknown field?)"));
                    }
                    (None, Some(y)) => return Some(format!("{p}: {y} appears only after the round trip")),
                    (None, None) => unreachable!(),
                }
            }
            None
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Some(format!("{path}: {} items became {}", a.len(), b.len()));
            }
            a.iter().zip(b).enumerate().find_map(|(i, (x, y))| first_difference(&format!("{path}[{i}]"), x, y))
        }
        _ if want == got => None,
        _ => Some(format!("{path}: {want} became {got}")),
    }
}

/// Parses a document as `T` and checks that serialising it gives the document back.
fn typed<T: DeserializeOwned + Serialize>(what: &str, doc: &Value) -> T {
    let obj: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&obj).expect("serialises");
    if let Some(d) = first_difference("", doc, &back) {
        panic!("{what}: the manifest does not round-trip through its typed object: {d}");
    }
    obj
}

/// All manifests, typed.
#[derive(Default)]
struct Manifests {
    config_maps: Vec<(PathBuf, ConfigMap)>,
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    daemon_sets: Vec<(PathBuf, DaemonSet)>,
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).expect("deploy dir").map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for p in entries {
        // The webhook has its own base and overlays (patches are partial objects): the
        // `webhook_*` tests below check them.
        if p == deploy_dir().join("webhook") {
            continue;
        }
        // MachineConfig mode (no Kubernetes workload): tests/tests/machineconfig.rs checks it.
        if p == deploy_dir().join("machineconfig") {
            continue;
        }
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
}

fn is_kustomization(p: &Path) -> bool {
    p.file_name().is_some_and(|n| n == "kustomization.yaml" || n == "kustomization.yml")
}

fn load_all() -> Manifests {
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    let mut m = Manifests::default();
    for file in files.iter().filter(|p| !is_kustomization(p)) {
        for (i, doc) in documents(file).iter().enumerate() {
            let what = format!("{} document {i}", file.display());
            let api = doc["apiVersion"].as_str().unwrap_or_else(|| panic!("{what}: no apiVersion"));
            let kind = doc["kind"].as_str().unwrap_or_else(|| panic!("{what}: no kind"));
            match (api, kind) {
                ("v1", "ConfigMap") => m.config_maps.push((file.clone(), typed(&what, doc))),
                ("v1", "ServiceAccount") => m.service_accounts.push(typed(&what, doc)),
                ("rbac.authorization.k8s.io/v1", "Role") => m.roles.push(typed(&what, doc)),
                ("rbac.authorization.k8s.io/v1", "RoleBinding") => m.role_bindings.push(typed(&what, doc)),
                ("apps/v1", "DaemonSet") => m.daemon_sets.push((file.clone(), typed(&what, doc))),
                _ => panic!("{what}: {api} {kind} is not a kind these tests know; add it"),
            }
        }
    }
    m
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec.template.spec.as_ref().expect("pod template has a spec")
}

fn name(ds: &DaemonSet) -> &str {
    ds.metadata.name.as_deref().expect("DaemonSet has a name")
}

/// The runner container of a DaemonSet (the only container).
fn runner(ds: &DaemonSet) -> &Container {
    let spec = pod_spec(ds);
    assert_eq!(spec.containers.len(), 1, "{}: one container", name(ds));
    assert!(spec.init_containers.is_none(), "{}: no init containers", name(ds));
    &spec.containers[0]
}

/// `command` + `args` of a container.
fn argv(c: &Container) -> Vec<String> {
    let mut v = c.command.clone().unwrap_or_default();
    v.extend(c.args.clone().unwrap_or_default());
    v
}

/// The value of `--flag VALUE` or `--flag=VALUE` in an argument list.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(
        |(i, a)| {
            if a == flag { args.get(i + 1).map(String::as_str) } else { a.strip_prefix(&eq) }
        },
    )
}

fn env_map(c: &Container) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_else(|| panic!("env {} has a literal value", e.name))))
        .collect()
}

fn volume<'a>(spec: &'a PodSpec, name: &str) -> &'a Volume {
    spec.volumes.iter().flatten().find(|v| v.name == name).unwrap_or_else(|| panic!("no volume {name}"))
}

/// The volume mounted at `path` in the container.
fn volume_at<'a>(spec: &'a PodSpec, c: &Container, path: &str) -> &'a Volume {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == path)
        .unwrap_or_else(|| panic!("nothing mounted at {path}"));
    volume(spec, &m.name)
}

/// The volume whose mount contains `path` (longest mount path wins), and whether read-only.
fn volume_containing<'a>(spec: &'a PodSpec, c: &Container, path: &str) -> (&'a Volume, bool) {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path == m.mount_path || path.starts_with(&format!("{}/", m.mount_path.trim_end_matches('/'))))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("{path} is on no volume"));
    (volume(spec, &m.name), m.read_only == Some(true))
}

/// Checks a kata-addons command line against the CLI: the subcommand exists, every
/// `--flag` is one that subcommand accepts (its own or a global one), and clap parses it.
fn check_cli(what: &str, argv: &[String]) -> Cli {
    assert_eq!(argv.first().map(String::as_str), Some("kata-addons"), "{what}: runs kata-addons");
    let mut cmd = Cli::command();
    cmd.build();
    let sub_name = argv.get(1).unwrap_or_else(|| panic!("{what}: no subcommand"));
    let sub = cmd.find_subcommand(sub_name).unwrap_or_else(|| panic!("{what}: no subcommand {sub_name:?}"));
    let accepted: BTreeSet<&str> = sub
        .get_arguments()
        .chain(cmd.get_arguments().filter(|a| a.is_global_set()))
        .filter_map(|a| a.get_long())
        .collect();
    for a in &argv[2..] {
        if let Some(flag) = a.strip_prefix("--") {
            let flag = flag.split_once('=').map_or(flag, |(f, _)| f);
            assert!(accepted.contains(flag), "{what}: `kata-addons {sub_name}` has no --{flag} (it has {accepted:?})");
        }
    }
    Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{what}: {argv:?} does not parse: {e}"))
}

fn check_env_names(what: &str, c: &Container) {
    for name in env_map(c).keys() {
        assert!(
            RUNNER_ENV.contains(&name.as_str())
                || POLICY_ENV.contains(&name.as_str())
                || STANDARD_ENV.contains(&name.as_str()),
            "{what}: env {name} is read by neither the runner nor the policy"
        );
    }
    assert!(c.env_from.is_none(), "{what}: envFrom would pass names nobody checked");
}

fn the_config_map(m: &Manifests) -> &ConfigMap {
    let cms: Vec<_> = m.config_maps.iter().filter(|(p, _)| p.ends_with("configmap.yaml")).collect();
    assert_eq!(cms.len(), 1, "configmap.yaml holds one ConfigMap");
    &cms[0].1
}

fn daemon_set<'a>(m: &'a Manifests, file: &str) -> &'a DaemonSet {
    let v: Vec<_> = m.daemon_sets.iter().filter(|(p, _)| p.ends_with(file)).collect();
    assert_eq!(v.len(), 1, "{file} holds one DaemonSet");
    &v[0].1
}

#[test]
fn every_manifest_parses_typed_and_round_trips() {
    let m = load_all();
    assert_eq!(m.config_maps.len(), 1);
    assert_eq!(m.service_accounts.len(), 1);
    assert_eq!(m.daemon_sets.len(), 2);
    let namespaces = m
        .config_maps
        .iter()
        .map(|(_, o)| &o.metadata)
        .chain(m.service_accounts.iter().map(|o| &o.metadata))
        .chain(m.roles.iter().map(|o| &o.metadata))
        .chain(m.role_bindings.iter().map(|o| &o.metadata))
        .chain(m.daemon_sets.iter().map(|(_, o)| &o.metadata));
    for meta in namespaces {
        assert_eq!(meta.namespace.as_deref(), Some(NAMESPACE), "{:?}", meta.name);
    }
}

#[test]
fn the_round_trip_catches_a_misspelt_field() {
    let path = deploy_dir().join("daemonset.yaml");
    let mut doc = documents(&path).remove(0);
    doc["spec"]["template"]["spec"]["nodeSelektor"] = doc["spec"]["template"]["spec"]["nodeSelector"].take();
    let r = std::panic::catch_unwind(|| typed::<DaemonSet>("misspelt", &doc));
    assert!(r.is_err(), "a misspelt field must not pass");
}

#[test]
fn configmap_is_the_example_and_parses() {
    let m = load_all();
    let cm = the_config_map(&m);
    assert_eq!(cm.metadata.name.as_deref(), Some("kata-addon-artifacts"));
    let text = read(&deploy_dir().join("configmap.yaml"));
    let kv = kata_addons::configmap::parse_configmap(&text).expect("the runner reads configmap.yaml");
    let keys: BTreeSet<&str> = kv.iter().map(|k| k.name.as_str()).collect();
    assert!(keys.contains("addonImage") && keys.contains("kernelPath"), "{keys:?}");
    // The same data as the documented example.
    let example = read(&deploy_dir().join("../../examples/kata-addon-artifacts.yaml"));
    let example = kata_addons::configmap::parse_configmap(&example).expect("example parses");
    assert_eq!(kv, example, "configmap.yaml and examples/kata-addon-artifacts.yaml disagree");
}

#[test]
fn service_account_and_scc_binding() {
    let m = load_all();
    let sa = &m.service_accounts[0];
    let sa_name = sa.metadata.name.as_deref().expect("name");
    assert_eq!(sa.automount_service_account_token, Some(false));
    for rb in &m.role_bindings {
        let role = m.roles.iter().find(|r| r.metadata.name.as_deref() == Some(&rb.role_ref.name));
        assert!(rb.role_ref.kind == "Role" && role.is_some(), "RoleBinding refers to a Role in rbac.yaml");
        let subjects = rb.subjects.as_deref().unwrap_or_default();
        assert!(subjects.iter().all(|s| s.kind == "ServiceAccount" && s.name == sa_name));
    }
    for (_, ds) in &m.daemon_sets {
        let spec = pod_spec(ds);
        assert_eq!(spec.service_account_name.as_deref(), Some(sa_name), "{}", name(ds));
        assert_eq!(spec.automount_service_account_token, Some(false), "{}", name(ds));
    }
}

#[test]
fn daemon_sets_are_privileged_on_the_host_root() {
    let m = load_all();
    let mut selectors = BTreeSet::new();
    for (_, ds) in &m.daemon_sets {
        let n = name(ds);
        let spec = pod_spec(ds);
        let c = runner(ds);
        let sc = c.security_context.as_ref().expect("securityContext");
        assert_eq!(sc.privileged, Some(true), "{n}: privileged");
        let root = volume_at(spec, c, "/host");
        let hp = root.host_path.as_ref().unwrap_or_else(|| panic!("{n}: /host is a hostPath"));
        assert_eq!(hp.path, "/", "{n}: the node's / at /host");
        let args = argv(c);
        assert_eq!(flag_value(&args, "--root"), Some("/host"), "{n}: --root /host");
        assert_eq!(args.get(1).map(String::as_str), Some("daemon"), "{n}: runs `kata-addons daemon`");
        // Every mount refers to a volume; every volume is mounted.
        let mounted: BTreeSet<&str> = c.volume_mounts.iter().flatten().map(|m| m.name.as_str()).collect();
        let volumes: BTreeSet<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(mounted, volumes, "{n}: mounts and volumes");
        // Every mount other than the host root is read-only, except scratch emptyDirs.
        for vm in c.volume_mounts.iter().flatten() {
            let v = volume(spec, &vm.name);
            if vm.mount_path != "/host" && v.empty_dir.is_none() {
                assert_eq!(vm.read_only, Some(true), "{n}: {} read-only", vm.mount_path);
            }
        }
        let tol = spec.tolerations.as_deref().unwrap_or_default();
        assert!(tol.iter().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()), "{n}: all taints");
        assert_eq!(spec.termination_grace_period_seconds, Some(30), "{n}");
        let us = ds.spec.update_strategy.as_ref().expect("updateStrategy");
        assert_eq!(us.type_.as_deref(), Some("RollingUpdate"));
        let max = us.rolling_update.as_ref().and_then(|r| r.max_unavailable.as_ref());
        assert_eq!(max, Some(&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)), "{n}");
        let res = c.resources.as_ref().expect("resources");
        assert!(res.requests.as_ref().is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")), "{n}");
        assert!(res.limits.as_ref().is_some_and(|l| l.contains_key("memory")), "{n}");
        assert!(c.readiness_probe.as_ref().and_then(|p| p.exec.as_ref()).is_some(), "{n}: exec readiness probe");
        // The pod selector matches the template's labels.
        let labels = ds.spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        for (k, v) in ds.spec.selector.match_labels.iter().flatten() {
            assert_eq!(labels.get(k), Some(v), "{n}: selector {k}");
        }
        selectors.insert(format!("{:?}", spec.node_selector.as_ref().expect("nodeSelector")));
    }
    assert_eq!(selectors.len(), 1, "install and uninstall select the same nodes: {selectors:?}");
}

#[test]
fn install_daemon_set() {
    let m = load_all();
    let ds = daemon_set(&m, "daemonset.yaml");
    let spec = pod_spec(ds);
    let c = runner(ds);
    let args = argv(c);
    let env = env_map(c);
    assert_eq!(env.get("ADDON_ACTION").map(String::as_str), Some("install"));
    assert_eq!(flag_value(&args, "--log-format"), Some("json"));
    // A rollout spreads its first pulls (issue 13): an explicit start-up jitter, not 0.
    let jitter: f64 = flag_value(&args, "--start-jitter").expect("--start-jitter").parse().expect("seconds");
    assert!(jitter > 0.0 && jitter <= 60.0, "--start-jitter {jitter}");

    // The ConfigMap of configmap.yaml, mounted where --configmap-dir points.
    let dir = flag_value(&args, "--configmap-dir").expect("--configmap-dir");
    let cm_vol = volume_at(spec, c, dir).config_map.as_ref().expect("--configmap-dir is a ConfigMap volume");
    assert_eq!(Some(cm_vol.name.as_str()), the_config_map(&m).metadata.name.as_deref());
    assert_ne!(cm_vol.optional, Some(true), "without the ConfigMap there is nothing to install");

    // The optional pull secret as config.json, found through REGISTRY_AUTH_FILE (or --auth-file).
    let auth =
        flag_value(&args, "--auth-file").or(env.get("REGISTRY_AUTH_FILE").map(String::as_str)).expect("auth file");
    let (dir, file) = auth.rsplit_once('/').expect("absolute");
    let secret = volume_at(spec, c, dir).secret.as_ref().expect("the auth file is on a Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some(PULL_SECRET));
    assert_eq!(secret.optional, Some(true), "public images need no pull secret");
    let items = secret.items.as_deref().unwrap_or_default();
    assert!(items.iter().any(|i| i.key == ".dockerconfigjson" && i.path == file), "{items:?}");

    // The node's registry configuration (registries.conf(.d), certs.d, CA bundle, kubelet
    // pull secret) is read beneath --root, the node's root filesystem: no flag overrides it
    // and no extra mount carries it.
    assert_eq!(flag_value(&args, "--root"), Some("/host"));
    let root = volume_at(spec, c, "/host");
    assert!(root.host_path.as_ref().is_some_and(|h| h.path == "/"), "--root is the node's root filesystem");
    for flag in ["--registries-conf", "--registries-conf-dir", "--cert-dir", "--auth-file"] {
        assert!(flag_value(&args, flag).is_none(), "{flag} would replace the node's own files");
    }
    for v in spec.volumes.as_deref().unwrap_or_default() {
        if let Some(h) = &v.host_path {
            assert_eq!(h.path, "/", "volume {}: node files come through --root, not extra mounts", v.name);
        }
    }

    // The policy cache on an emptyDir.
    let cache = flag_value(&args, "--cache-dir").expect("--cache-dir");
    assert!(volume_at(spec, c, cache).empty_dir.is_some(), "--cache-dir is an emptyDir");

    // Ready = `status` says installed and not drifted.
    let probe =
        c.readiness_probe.as_ref().and_then(|p| p.exec.as_ref()).and_then(|e| e.command.clone()).expect("probe");
    assert_eq!(&probe[..4], ["kata-addons", "status", "--root", "/host"]);
    let timeout = c.readiness_probe.as_ref().and_then(|p| p.timeout_seconds).unwrap_or(1);
    let lock: i32 = flag_value(&probe, "--lock-timeout").expect("probe bounds its lock wait").parse().expect("number");
    assert!(lock < timeout, "the probe's --lock-timeout {lock} is below its timeoutSeconds {timeout}");
}

#[test]
fn uninstall_daemon_set() {
    let m = load_all();
    let ds = daemon_set(&m, "uninstall/daemonset-uninstall.yaml");
    let install = daemon_set(&m, "daemonset.yaml");
    assert_ne!(name(ds), name(install));
    assert_ne!(ds.spec.selector, install.spec.selector, "the two DaemonSets must not select each other's pods");
    let c = runner(ds);
    assert_eq!(env_map(c).get("ADDON_ACTION").map(String::as_str), Some("uninstall"));
    assert_eq!(c.image, runner(install).image);
    // Ready = the ready file exists (`status` exits 3 when nothing is installed).
    let args = argv(c);
    let ready = flag_value(&args, "--ready-file").expect("--ready-file");
    let probe =
        c.readiness_probe.as_ref().and_then(|p| p.exec.as_ref()).and_then(|e| e.command.clone()).expect("probe");
    assert_eq!(probe, ["test", "-f", ready]);
}

#[test]
fn every_flag_and_env_var_exists_in_the_cli() {
    let m = load_all();
    for (path, ds) in &m.daemon_sets {
        let what = format!("{} container", path.display());
        let c = runner(ds);
        let cli = check_cli(&what, &argv(c));
        let Command::Daemon { node, .. } = &cli.command else { panic!("{what}: not `daemon`") };
        assert_eq!(node.root, Path::new("/host"));
        check_env_names(&what, c);
        // ADDON_ACTION feeds `daemon --action`: its value must be one of the actions.
        if let Some(action) = env_map(c).get("ADDON_ACTION") {
            Action::from_str(action, false).unwrap_or_else(|e| panic!("{what}: ADDON_ACTION={action}: {e}"));
        }
        for (kind, probe) in
            [("readiness", &c.readiness_probe), ("liveness", &c.liveness_probe), ("startup", &c.startup_probe)]
        {
            if let Some(cmd) = probe.as_ref().and_then(|p| p.exec.as_ref()).and_then(|e| e.command.as_ref())
                && cmd.first().map(String::as_str) == Some("kata-addons")
            {
                check_cli(&format!("{what} {kind} probe"), cmd);
            }
        }
    }
}

#[test]
fn containerfile_default_command_parses() {
    let text = read(&deploy_dir().join("Containerfile"));
    let exec_form = |instr: &str| -> Vec<String> {
        let line = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(&format!("{instr} ")))
            .unwrap_or_else(|| panic!("Containerfile has no {instr}"));
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{instr} is not exec form: {e}"))
    };
    let mut argv = exec_form("ENTRYPOINT");
    assert_eq!(argv, ["kata-addons"]);
    argv.extend(exec_form("CMD"));
    let cli = check_cli("Containerfile CMD", &argv);
    assert!(matches!(cli.command, Command::Daemon { .. }));
    assert!(text.contains("wasm32-wasip2") && text.contains("-p kata-addons"));
}

#[test]
fn kustomizations_list_existing_files_and_every_manifest() {
    let m = load_all();
    let images: BTreeSet<String> = m
        .daemon_sets
        .iter()
        .map(|(_, ds)| runner(ds).image.clone().expect("image"))
        .map(|i| i.rsplit_once(':').map_or(i.clone(), |(n, _)| n.to_string()))
        .collect();
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    let kustomizations: Vec<&PathBuf> = files.iter().filter(|p| is_kustomization(p)).collect();
    assert_eq!(kustomizations.len(), 2, "install and uninstall");
    let mut listed = BTreeSet::new();
    for k in kustomizations {
        let dir = k.parent().expect("dir");
        let doc = documents(k).remove(0);
        assert_eq!(doc["kind"], "Kustomization");
        assert_eq!(doc["namespace"], NAMESPACE);
        for field in ["resources", "components"] {
            for r in doc[field].as_array().into_iter().flatten() {
                let r = r.as_str().expect("path");
                assert!(
                    !r.starts_with(".."),
                    "{}: {r}: kustomize loads nothing from outside its directory",
                    k.display()
                );
                let p = dir.join(r);
                assert!(p.exists(), "{}: {r} does not exist", k.display());
                listed.insert(p.canonicalize().expect("canonical"));
            }
        }
        for i in doc["images"].as_array().into_iter().flatten() {
            let n = i["name"].as_str().expect("image name");
            assert!(images.contains(n), "{}: image {n} is not used by the DaemonSets ({images:?})", k.display());
        }
    }
    for f in files.iter().filter(|p| !is_kustomization(p)) {
        assert!(listed.contains(&f.canonicalize().expect("canonical")), "{} is in no kustomization", f.display());
    }
}

#[test]
fn readme_commands_parse() {
    let text = read(&deploy_dir().join("README.md"));
    let mut seen = 0;
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("kata-addons ") else { continue };
        let argv: Vec<String> =
            std::iter::once("kata-addons").chain(rest.split_whitespace()).map(String::from).collect();
        check_cli("README", &argv);
        seen += 1;
    }
    assert!(seen >= 2, "README shows the preview commands");
    let cli = check_cli(
        "README",
        &["kata-addons", "preview", "--configmap", "cm.yaml", "--output", "yaml"].map(String::from),
    );
    assert!(matches!(cli.command, Command::Preview { output: kata_addons::cli::PreviewFormat::Yaml, .. }));
    assert!(text.contains("preview --configmap cm.yaml --output yaml"));
    for name in POLICY_ENV.iter().chain(RUNNER_ENV) {
        assert!(text.contains(name), "README names {name}");
    }
}

// ---------------------------------------------------------------------------------------
// The admission webhook: host/deploy/webhook/{base,openshift,cert-manager}.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const TLS_SECRET: &str = "kata-addons-webhook-tls";

fn webhook_dir() -> PathBuf {
    deploy_dir().join("webhook")
}

/// The webhook base, typed.
struct WebhookBase {
    sa: ServiceAccount,
    deployment: Deployment,
    service: Service,
    pdb: PodDisruptionBudget,
    vwc: ValidatingWebhookConfiguration,
}

/// Parses one document of a known kind, typed and round-tripped; `None` for other kinds.
fn webhook_doc(what: &str, doc: &Value, base: &mut Vec<(String, Value)>) {
    let kind = doc["kind"].as_str().unwrap_or_else(|| panic!("{what}: no kind")).to_string();
    match (doc["apiVersion"].as_str().unwrap_or_default(), kind.as_str()) {
        ("v1", "ServiceAccount") => drop(typed::<ServiceAccount>(what, doc)),
        ("apps/v1", "Deployment") => drop(typed::<Deployment>(what, doc)),
        ("v1", "Service") => drop(typed::<Service>(what, doc)),
        ("policy/v1", "PodDisruptionBudget") => drop(typed::<PodDisruptionBudget>(what, doc)),
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            drop(typed::<ValidatingWebhookConfiguration>(what, doc))
        }
        // cert-manager's CRDs are not in k8s-openapi: checked field by field below.
        ("cert-manager.io/v1", "Issuer" | "Certificate") => {}
        (api, kind) => panic!("{what}: {api} {kind} is not a kind these tests know; add it"),
    }
    base.push((kind, doc.clone()));
}

fn load_webhook_base() -> WebhookBase {
    let dir = webhook_dir().join("base");
    let k = documents(&dir.join("kustomization.yaml")).remove(0);
    assert_eq!(k["namespace"], NAMESPACE);
    let mut docs = Vec::new();
    let mut listed = BTreeSet::new();
    for r in k["resources"].as_array().expect("resources") {
        let r = r.as_str().expect("path");
        assert!(!r.starts_with(".."), "the base loads nothing from outside");
        listed.insert(r.to_string());
        for (i, doc) in documents(&dir.join(r)).iter().enumerate() {
            webhook_doc(&format!("webhook/base/{r} document {i}"), doc, &mut docs);
        }
    }
    let mut files = Vec::new();
    yaml_files_all(&dir, &mut files);
    for f in files.iter().filter(|p| !is_kustomization(p)) {
        let name = f.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(listed.contains(name), "webhook/base/{name} is not in the base kustomization");
    }
    let one = |kind: &str| -> Value {
        let v: Vec<&Value> = docs.iter().filter(|(k, _)| k == kind).map(|(_, d)| d).collect();
        assert_eq!(v.len(), 1, "the webhook base has one {kind}");
        v[0].clone()
    };
    WebhookBase {
        sa: typed("sa", &one("ServiceAccount")),
        deployment: typed("deployment", &one("Deployment")),
        service: typed("service", &one("Service")),
        pdb: typed("pdb", &one("PodDisruptionBudget")),
        vwc: typed("vwc", &one("ValidatingWebhookConfiguration")),
    }
}

fn yaml_files_all(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            yaml_files_all(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
}

fn seconds_flag(args: &[String], flag: &str) -> f64 {
    flag_value(args, flag).unwrap_or_else(|| panic!("webhook passes {flag}")).parse().expect("number")
}

#[test]
fn webhook_deployment_is_unprivileged_and_its_flags_exist() {
    let b = load_webhook_base();
    let d = &b.deployment;
    let spec = &d.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), b.sa.metadata.name.as_deref());
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(b.sa.automount_service_account_token, Some(false));
    assert!(pod.host_network.is_none() && pod.host_pid.is_none());
    assert_eq!(pod.security_context.as_ref().and_then(|s| s.run_as_non_root), Some(true));
    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_string()]));
    // The same runner image as the DaemonSet.
    let m = load_all();
    assert_eq!(c.image, runner(daemon_set(&m, "daemonset.yaml")).image);
    // Every flag exists and parses.
    let args = argv(c);
    let cli = check_cli("webhook container", &args);
    let Command::Webhook(w) = &cli.command else { panic!("the container runs `kata-addons webhook`") };
    check_env_names("webhook container", c);
    // The port it listens on is the container port the probes and the Service use.
    let port = c.ports.as_ref().and_then(|p| p.iter().find(|p| p.name.as_deref() == Some("https"))).expect("port");
    assert_eq!(i32::from(w.listen.port()), port.container_port);
    for (what, probe, path) in [
        ("startup", &c.startup_probe, "/healthz"),
        ("readiness", &c.readiness_probe, "/readyz"),
        ("liveness", &c.liveness_probe, "/healthz"),
    ] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("{what} probe"));
        assert_eq!(get.path.as_deref(), Some(path), "{what}");
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"), "{what}");
        assert_eq!(get.port, IntOrString::String("https".into()), "{what}");
    }
    // TLS files come from the Secret the overlays fill; the cache is a writable emptyDir.
    let (tls, ro) = volume_containing(pod, c, w.tls_cert.to_str().expect("utf-8"));
    assert!(ro, "TLS mount is read-only");
    assert_eq!(tls.secret.as_ref().and_then(|s| s.secret_name.as_deref()), Some(TLS_SECRET));
    let (tls_key, _) = volume_containing(pod, c, w.tls_key.to_str().expect("utf-8"));
    assert_eq!(tls_key.name, tls.name);
    let cache = cli.global.cache_dir.as_ref().expect("--cache-dir (the root filesystem is read-only)");
    let (cache_vol, ro) = volume_containing(pod, c, cache.to_str().expect("utf-8"));
    assert!(cache_vol.empty_dir.is_some() && !ro);
    // Shutdown fits in the grace period; a review gives up before the API server does.
    let delay = seconds_flag(&args, "--shutdown-delay");
    let grace = pod.termination_grace_period_seconds.expect("grace period") as f64;
    assert!(delay + w.shutdown_timeout < grace, "{delay} + {} < {grace}", w.shutdown_timeout);
    let timeout = b.vwc.webhooks.as_ref().expect("webhooks")[0].timeout_seconds.expect("timeoutSeconds");
    assert!(w.review_timeout < f64::from(timeout), "--review-timeout below timeoutSeconds");
    // Two replicas, one kept through disruptions, rollouts never go below two.
    let pdb = b.pdb.spec.as_ref().expect("pdb spec");
    assert_eq!(pdb.min_available, Some(IntOrString::Int(1)));
    assert_eq!(pdb.selector.as_ref().and_then(|s| s.match_labels.clone()), spec.selector.match_labels.clone());
    let ru = spec.strategy.as_ref().and_then(|s| s.rolling_update.as_ref()).expect("rollingUpdate");
    assert_eq!(ru.max_unavailable, Some(IntOrString::Int(0)));
}

#[test]
fn webhook_configuration_is_scoped_to_the_one_configmap() {
    let b = load_webhook_base();
    assert!(b.vwc.metadata.namespace.is_none(), "cluster-scoped");
    let hooks = b.vwc.webhooks.as_ref().expect("webhooks");
    assert_eq!(hooks.len(), 1);
    let h = &hooks[0];
    assert_eq!(h.admission_review_versions, ["v1"]);
    assert_eq!(h.side_effects, "None");
    assert!(h.timeout_seconds.is_some_and(|t| (1..=10).contains(&t)), "small timeoutSeconds");
    assert!(matches!(h.failure_policy.as_deref(), Some("Fail" | "Ignore")), "failurePolicy is explicit");
    let text = read(&webhook_dir().join("base/validatingwebhookconfiguration.yaml"));
    assert!(text.contains("failurePolicy: Fail") && text.contains("Ignore would"), "and justified");
    // Only configmaps in the core group.
    let rules = h.rules.as_ref().expect("rules");
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    assert_eq!(r.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(r.resources.as_deref(), Some(&["configmaps".to_string()][..]));
    let ops: BTreeSet<&str> = r.operations.iter().flatten().map(String::as_str).collect();
    assert_eq!(ops, BTreeSet::from(["CREATE", "UPDATE", "DELETE"]));
    // Only the operator namespace.
    let ns = h.namespace_selector.as_ref().and_then(|s| s.match_labels.as_ref()).expect("namespaceSelector");
    assert_eq!(ns.get("kubernetes.io/metadata.name").map(String::as_str), Some(NAMESPACE));
    // Only the one name, through `request.name` (set for DELETE, where `object` is null).
    let mc = h.match_conditions.as_ref().expect("matchConditions");
    assert_eq!(mc.len(), 1);
    assert_eq!(mc[0].expression, format!("request.name == \"{}\"", kata_addons::webhook::CONFIGMAP_NAME));
    // The Service and path the binary serves.
    let svc = h.client_config.service.as_ref().expect("service");
    assert_eq!(Some(svc.name.as_str()), b.service.metadata.name.as_deref());
    assert_eq!(svc.namespace, NAMESPACE);
    assert_eq!(svc.path.as_deref(), Some("/validate"));
    let sport = &b.service.spec.as_ref().expect("spec").ports.as_ref().expect("ports")[0];
    assert_eq!(svc.port, Some(sport.port));
    assert_eq!(sport.target_port, Some(IntOrString::String("https".into())));
    assert!(h.client_config.ca_bundle.is_none(), "the overlays inject the CA bundle");
    let labels = b.deployment.spec.template.metadata.as_ref().and_then(|m| m.labels.clone());
    assert_eq!(b.service.spec.as_ref().and_then(|s| s.selector.clone()), labels);
}

/// An overlay's kustomization and patches (typed, as partial objects).
fn overlay(name: &str) -> (Value, Vec<Value>) {
    let dir = webhook_dir().join(name);
    let k = documents(&dir.join("kustomization.yaml")).remove(0);
    let resources: Vec<&str> = k["resources"].as_array().expect("resources").iter().filter_map(Value::as_str).collect();
    assert_eq!(resources[0], "../base", "{name}: an overlay of the sibling base");
    let mut listed = BTreeSet::new();
    let mut extra = Vec::new();
    for r in &resources[1..] {
        listed.insert(r.to_string());
        extra.extend(documents(&dir.join(r)));
    }
    let mut patches = Vec::new();
    for p in k["patches"].as_array().expect("patches") {
        let path = p["path"].as_str().expect("patch file");
        listed.insert(path.to_string());
        let doc = documents(&dir.join(path)).remove(0);
        partial(&format!("webhook/{name}/{path}"), &doc);
        patches.push(doc);
    }
    let mut files = Vec::new();
    yaml_files_all(&dir, &mut files);
    for f in files.iter().filter(|p| !is_kustomization(p)) {
        let n = f.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(listed.contains(n), "webhook/{name}/{n} is in no kustomization");
    }
    patches.extend(extra);
    (k, patches)
}

/// A patch (partial object) parses as its typed object and keeps every field it sets
/// (the typed object adds defaults for the required fields a patch leaves out).
fn partial(what: &str, doc: &Value) {
    fn subset(path: &str, want: &Value, got: &Value) -> Option<String> {
        match (want, got) {
            (Value::Object(a), Value::Object(b)) => a.iter().find_map(|(k, x)| match b.get(k) {
                Some(y) => subset(&format!("{path}.{k}"), x, y),
                None => Some(format!("{path}.{k} is dropped by the typed object (unknown field?)")),
            }),
            _ if want == got => None,
            _ => Some(format!("{path}: {want} became {got}")),
        }
    }
    let back = match (doc["apiVersion"].as_str().unwrap_or_default(), doc["kind"].as_str().unwrap_or_default()) {
        ("v1", "Service") => serde_json::to_value(serde_json::from_value::<Service>(doc.clone()).expect(what)),
        ("apps/v1", "Deployment") => {
            serde_json::to_value(serde_json::from_value::<Deployment>(doc.clone()).expect(what))
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            serde_json::to_value(serde_json::from_value::<ValidatingWebhookConfiguration>(doc.clone()).expect(what))
        }
        (api, kind) => panic!("{what}: a patch of {api} {kind}; add it"),
    }
    .expect("serialises");
    if let Some(d) = subset("", doc, &back) {
        panic!("{what}: {d}");
    }
}

fn annotation<'a>(docs: &'a [Value], kind: &str, key: &str) -> Option<&'a str> {
    docs.iter().find(|d| d["kind"] == kind).and_then(|d| d["metadata"]["annotations"][key].as_str())
}

#[test]
fn webhook_overlays_supply_the_certificate() {
    let b = load_webhook_base();
    let svc = b.service.metadata.name.clone().expect("service name");
    let (_, os) = overlay("openshift");
    assert_eq!(annotation(&os, "Service", "service.beta.openshift.io/serving-cert-secret-name"), Some(TLS_SECRET));
    assert_eq!(
        annotation(&os, "ValidatingWebhookConfiguration", "service.beta.openshift.io/inject-cabundle"),
        Some("true")
    );
    let (_, cm) = overlay("cert-manager");
    let cert = cm.iter().find(|d| d["kind"] == "Certificate").expect("Certificate");
    assert_eq!(cert["spec"]["secretName"], TLS_SECRET);
    let dns: Vec<&str> =
        cert["spec"]["dnsNames"].as_array().expect("dnsNames").iter().filter_map(Value::as_str).collect();
    assert!(dns.contains(&format!("{svc}.{NAMESPACE}.svc").as_str()), "{dns:?}");
    let issuer = cert["spec"]["issuerRef"]["name"].as_str().expect("issuerRef");
    assert!(cm.iter().any(|d| d["kind"] == "Issuer" && d["metadata"]["name"] == issuer), "the Issuer exists");
    let cert_name = cert["metadata"]["name"].as_str().expect("name");
    assert_eq!(
        annotation(&cm, "ValidatingWebhookConfiguration", "cert-manager.io/inject-ca-from"),
        Some(format!("{NAMESPACE}/{cert_name}").as_str())
    );
    // Upstream has no SCC: the overlay gives the non-root user.
    let user = cm.iter().find(|d| d["kind"] == "Deployment").expect("Deployment patch")["spec"]["template"]["spec"]
        ["securityContext"]["runAsUser"]
        .as_i64();
    assert!(user.is_some_and(|u| u > 0));
}

/// With kubectl on PATH, every overlay renders and the result parses typed.
#[test]
fn webhook_overlays_render_with_kubectl_kustomize() {
    if std::process::Command::new("kubectl").arg("version").arg("--client").output().is_err() {
        eprintln!("kubectl not installed: rendering not checked (the other webhook_* tests still are)");
        return;
    }
    for name in ["openshift", "cert-manager"] {
        let out = std::process::Command::new("kubectl")
            .args(["kustomize"])
            .arg(webhook_dir().join(name))
            .output()
            .expect("kubectl kustomize");
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let mut docs = Vec::new();
        for (i, d) in serde_norway::Deserializer::from_str(&text).enumerate() {
            let v = Value::deserialize(d).expect("YAML");
            webhook_doc(&format!("rendered {name} document {i}"), &v, &mut docs);
        }
        let kinds: BTreeSet<&str> = docs.iter().map(|(k, _)| k.as_str()).collect();
        for k in ["ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "ValidatingWebhookConfiguration"] {
            assert!(kinds.contains(k), "{name}: renders a {k}");
        }
        let vals: Vec<Value> = docs.into_iter().map(|(_, v)| v).collect();
        let key = if name == "openshift" {
            "service.beta.openshift.io/inject-cabundle"
        } else {
            "cert-manager.io/inject-ca-from"
        };
        assert!(annotation(&vals, "ValidatingWebhookConfiguration", key).is_some(), "{name}: {key}");
    }
}
