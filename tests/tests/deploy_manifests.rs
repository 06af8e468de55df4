//! The Kubernetes deployment under `host/deploy/`: `base/` with the sibling overlays
//! `openshift/` and `upstream/`, the `uninstall/` variant and the webhook. Each
//! kustomization is built here the way `kustomize build` builds it (resources, overlays of
//! `../base`, strategic-merge and JSON 6902 patches, `namespace`, `images`; no kustomize
//! binary needed), and every object of the RESULT parses into its typed `k8s-openapi`
//! object and survives a round trip unchanged (so a misspelt field, which the typed
//! objects would silently drop, is caught). The DaemonSets have the shape the runner
//! needs, every flag, subcommand and env var they use exists in the runner's CLI, and the
//! platform knobs are in place: `system-node-critical`, the pinned SCC, the cluster proxy
//! from an optional ConfigMap, the runner image pinned to the crate version, kata-deploy's
//! node label and layout for upstream Kata.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser, ValueEnum};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, PodSpec, ServiceAccount, Volume};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kata_addons::cli::{Action, Cli, Command};
use serde::Serialize;
use serde::de::{Deserialize, DeserializeOwned};
use serde_json::Value;

const NAMESPACE: &str = "openshift-sandboxed-containers-operator";
const PULL_SECRET: &str = "kata-addons-pull-secret";
const RUNNER_IMAGE: &str = "quay.io/openshift_sandboxed_containers/kata-addons";
/// The optional ConfigMap the install DaemonSet takes the cluster proxy env from.
const PROXY_CONFIGMAP: &str = "kata-addons-proxy";
/// The node label kata-deploy sets once Kata is installed (tools/packaging/kata-deploy,
/// `KATA_RUNTIME_LABEL`, value "true"; "false" while its install runs).
const KATA_DEPLOY_LABEL: (&str, &str) = ("katacontainers.io/kata-runtime", "true");
/// The role label of the nodes the OpenShift sandboxed containers operator installs on.
const KATA_OC_LABEL: (&str, &str) = ("node-role.kubernetes.io/kata-oc", "");
/// The install overlays and the uninstall variant, relative to host/deploy.
const WORKLOAD_KUSTOMIZATIONS: &[&str] = &["openshift", "upstream", "uninstall"];

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
/// The keys of the proxy ConfigMap: read by the runner (`source::proxy::ProxyEnv`).
const PROXY_ENV: &[&str] = &["HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/deploy")
}

/// The deployment guide (docs/deployment.md).
fn deployment_doc() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deployment.md")
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

// ---------------------------------------------------------------------------------------
// A kustomize build, for the features these kustomizations use. Anything else in a
// kustomization is refused, so a new feature cannot be silently ignored here.

/// Kinds without a namespace (kustomize's `namespace` leaves them alone).
const CLUSTER_SCOPED: &[&str] = &["Namespace", "ValidatingWebhookConfiguration"];
/// Lists merged by key in a strategic merge patch (Kubernetes' `patchMergeKey`), for the
/// fields these patches can reach; every other list is replaced, as strategic merge does.
const MERGE_KEYS: &[(&str, &str)] = &[
    ("containers", "name"),
    ("initContainers", "name"),
    ("volumes", "name"),
    ("volumeMounts", "mountPath"),
    ("env", "name"),
    ("ports", "containerPort"),
];

/// The result of building one kustomization, and every file it read.
struct Build {
    docs: Vec<Value>,
    files: BTreeSet<PathBuf>,
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `kustomize build DIR`.
fn build(dir: &Path) -> Build {
    let kfile = dir.join("kustomization.yaml");
    let what = kfile.display().to_string();
    let k = documents(&kfile).remove(0);
    assert_eq!(k["apiVersion"], "kustomize.config.k8s.io/v1beta1", "{what}");
    assert_eq!(k["kind"], "Kustomization", "{what}");
    for key in k.as_object().expect("a map").keys() {
        assert!(
            ["apiVersion", "kind", "namespace", "resources", "patches", "images"].contains(&key.as_str()),
            "{what}: `{key}` is not a kustomization field this build understands; teach it"
        );
    }
    let mut out = Build { docs: Vec::new(), files: BTreeSet::from([canonical(&kfile)]) };
    for r in k["resources"].as_array().into_iter().flatten() {
        let r = r.as_str().unwrap_or_else(|| panic!("{what}: a resource is not a path"));
        let p = dir.join(r);
        assert!(p.exists(), "{what}: resource {r} does not exist");
        if p.is_dir() {
            // An overlay: kustomize forbids it inside its own base.
            assert!(!canonical(dir).starts_with(canonical(&p)), "{what}: an overlay inside its base {r}");
            let sub = build(&p);
            out.docs.extend(sub.docs);
            out.files.extend(sub.files);
        } else {
            assert!(!r.contains(".."), "{what}: {r}: kustomize loads no file from outside its directory");
            out.docs.extend(documents(&p));
            out.files.insert(canonical(&p));
        }
    }
    for p in k["patches"].as_array().into_iter().flatten() {
        for key in p.as_object().expect("a patch entry is a map").keys() {
            assert!(["path", "target"].contains(&key.as_str()), "{what}: patch field `{key}`; teach the build");
        }
        let path = p["path"].as_str().unwrap_or_else(|| panic!("{what}: patches are files here"));
        let file = dir.join(path);
        out.files.insert(canonical(&file));
        let patch = documents(&file);
        assert_eq!(patch.len(), 1, "{what}: {path}: one patch per file");
        let patch = &patch[0];
        let pwhat = format!("{what}: patch {path}");
        if let Some(ops) = patch.as_array() {
            let t = &p["target"];
            assert!(t.is_object(), "{pwhat}: a JSON 6902 patch needs a target");
            let matches: Vec<&mut Value> = out
                .docs
                .iter_mut()
                .filter(|d| {
                    let (group, version) = match d["apiVersion"].as_str().unwrap_or_default().split_once('/') {
                        Some((g, v)) => (g.to_string(), v.to_string()),
                        None => (String::new(), d["apiVersion"].as_str().unwrap_or_default().to_string()),
                    };
                    t.as_object().expect("target").iter().all(|(k, v)| match k.as_str() {
                        "group" => v == group.as_str(),
                        "version" => v == version.as_str(),
                        "kind" => *v == d["kind"],
                        "name" => *v == d["metadata"]["name"],
                        other => panic!("{pwhat}: target field {other}; teach the build"),
                    })
                })
                .collect();
            assert_eq!(matches.len(), 1, "{pwhat}: the target matches one object");
            for d in matches {
                for op in ops {
                    json_patch(&pwhat, d, op);
                }
            }
        } else {
            assert!(p.get("target").is_none(), "{pwhat}: strategic merge patches name their object");
            let target: Vec<&mut Value> = out
                .docs
                .iter_mut()
                .filter(|d| {
                    d["apiVersion"] == patch["apiVersion"]
                        && d["kind"] == patch["kind"]
                        && d["metadata"]["name"] == patch["metadata"]["name"]
                })
                .collect();
            assert_eq!(target.len(), 1, "{pwhat}: patches exactly one object of the resources");
            for d in target {
                strategic_merge(&pwhat, d, patch);
            }
        }
    }
    if let Some(ns) = k["namespace"].as_str() {
        for d in &mut out.docs {
            if !CLUSTER_SCOPED.contains(&d["kind"].as_str().unwrap_or_default()) {
                d["metadata"]["namespace"] = Value::from(ns);
            }
        }
    }
    for i in k["images"].as_array().into_iter().flatten() {
        let name = i["name"].as_str().unwrap_or_else(|| panic!("{what}: image without name"));
        for key in i.as_object().expect("map").keys() {
            assert!(["name", "newName", "newTag"].contains(&key.as_str()), "{what}: images field {key}");
        }
        let mut used = false;
        for d in &mut out.docs {
            for c in pod_containers(d) {
                let image = c["image"].as_str().unwrap_or_default().to_string();
                let (n, tag) = split_image(&image);
                if n == name {
                    let n = i["newName"].as_str().unwrap_or(n);
                    let tag = i["newTag"].as_str().or(tag);
                    c["image"] = Value::from(tag.map_or(n.to_string(), |t| format!("{n}:{t}")));
                    used = true;
                }
            }
        }
        assert!(used, "{what}: image {name} is used by no container");
    }
    out
}

/// `name` and tag of `name[:tag]` (a `:` in the registry's port is not a tag).
fn split_image(image: &str) -> (&str, Option<&str>) {
    match image.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (image, None),
    }
}

/// The containers of a workload's pod template (mutable; other objects are not touched).
fn pod_containers(d: &mut Value) -> Vec<&mut Value> {
    let Some(spec) = d
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .and_then(|t| t.get_mut("spec"))
        .and_then(Value::as_object_mut)
    else {
        return Vec::new();
    };
    spec.iter_mut()
        .filter(|(k, _)| *k == "containers" || *k == "initContainers")
        .flat_map(|(_, list)| list.as_array_mut().into_iter().flatten())
        .collect()
}

/// A strategic merge patch: maps merge, `null` deletes, lists with a merge key merge item
/// by item, other lists and scalars are replaced. Directives (`$patch`, …) are refused.
fn strategic_merge(what: &str, base: &mut Value, patch: &Value) {
    let (Value::Object(b), Value::Object(p)) = (&mut *base, patch) else {
        *base = patch.clone();
        return;
    };
    for (k, v) in p {
        assert!(!k.starts_with('$'), "{what}: directive {k} is not supported here");
        if v.is_null() {
            b.remove(k);
            continue;
        }
        match (b.get_mut(k), v) {
            (Some(Value::Array(items)), Value::Array(new)) => {
                if let Some((_, key)) = MERGE_KEYS.iter().find(|(f, _)| f == k) {
                    for n in new {
                        match items.iter_mut().find(|i| i[key] == n[key]) {
                            Some(i) => strategic_merge(what, i, n),
                            None => items.push(n.clone()),
                        }
                    }
                } else {
                    *items = new.clone();
                }
            }
            (Some(old), _) => strategic_merge(what, old, v),
            (None, _) => {
                b.insert(k.clone(), v.clone());
            }
        }
    }
}

/// One RFC 6902 operation (`add`, `replace`, `remove`; `-` appends).
fn json_patch(what: &str, doc: &mut Value, op: &Value) {
    let path = op["path"].as_str().unwrap_or_else(|| panic!("{what}: op without path"));
    let parts: Vec<String> = path.split('/').skip(1).map(|p| p.replace("~1", "/").replace("~0", "~")).collect();
    let (last, parents) = parts.split_last().unwrap_or_else(|| panic!("{what}: empty path"));
    let mut at = &mut *doc;
    for p in parents {
        at = match at {
            Value::Object(m) => m.get_mut(p),
            Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .unwrap_or_else(|| panic!("{what}: {path}: no {p}"));
    }
    let value = || op["value"].clone();
    match (op["op"].as_str().unwrap_or_default(), at) {
        ("add", Value::Array(a)) if last == "-" => a.push(value()),
        ("add", Value::Array(a)) => {
            let i: usize = last.parse().unwrap_or_else(|_| panic!("{what}: {path}: index"));
            assert!(i <= a.len(), "{what}: {path}: index out of range");
            a.insert(i, value());
        }
        ("add" | "replace", Value::Object(m)) => {
            let old = m.insert(last.clone(), value());
            assert!(op["op"] == "add" || old.is_some(), "{what}: replace of a missing {path}");
        }
        ("replace", Value::Array(a)) => {
            let slot = last.parse::<usize>().ok().and_then(|i| a.get_mut(i));
            *slot.unwrap_or_else(|| panic!("{what}: {path}: index")) = value();
        }
        ("remove", Value::Object(m)) => assert!(m.remove(last).is_some(), "{what}: remove of a missing {path}"),
        ("remove", Value::Array(a)) => {
            let i: usize = last.parse().unwrap_or_else(|_| panic!("{what}: {path}: index"));
            assert!(i < a.len(), "{what}: {path}: index out of range");
            a.remove(i);
        }
        (o, _) => panic!("{what}: op {o} at {path} is not supported here"),
    }
}

// ---------------------------------------------------------------------------------------
// The built workloads, typed.

/// The objects of one built kustomization, typed.
#[derive(Default)]
struct Manifests {
    name: String,
    config_maps: Vec<ConfigMap>,
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    namespaces: Vec<Namespace>,
    daemon_sets: Vec<DaemonSet>,
    services: Vec<Service>,
    /// The Prometheus operator's objects (ServiceMonitor, PrometheusRule): not in
    /// k8s-openapi, checked field by field.
    monitoring: Vec<Value>,
}

/// Builds `host/deploy/<name>` and types every object of the result.
fn load(name: &str) -> Manifests {
    let b = build(&deploy_dir().join(name));
    let mut m = Manifests { name: name.to_string(), ..Manifests::default() };
    for (i, doc) in b.docs.iter().enumerate() {
        let what = format!("{name} (built) object {i}");
        let api = doc["apiVersion"].as_str().unwrap_or_else(|| panic!("{what}: no apiVersion"));
        let kind = doc["kind"].as_str().unwrap_or_else(|| panic!("{what}: no kind"));
        match (api, kind) {
            ("v1", "ConfigMap") => m.config_maps.push(typed(&what, doc)),
            ("v1", "ServiceAccount") => m.service_accounts.push(typed(&what, doc)),
            ("v1", "Namespace") => m.namespaces.push(typed(&what, doc)),
            ("rbac.authorization.k8s.io/v1", "Role") => m.roles.push(typed(&what, doc)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => m.role_bindings.push(typed(&what, doc)),
            ("apps/v1", "DaemonSet") => m.daemon_sets.push(typed(&what, doc)),
            ("v1", "Service") => m.services.push(typed(&what, doc)),
            ("monitoring.coreos.com/v1", "ServiceMonitor" | "PrometheusRule") => m.monitoring.push(doc.clone()),
            _ => panic!("{what}: {api} {kind} is not a kind these tests know; add it"),
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

/// Every env var is one the runner or the policy reads; `envFrom` only the optional proxy
/// ConfigMap (whose keys are in [`PROXY_ENV`]).
fn check_env_names(what: &str, c: &Container) {
    for name in env_map(c).keys() {
        assert!(
            RUNNER_ENV.contains(&name.as_str())
                || POLICY_ENV.contains(&name.as_str())
                || STANDARD_ENV.contains(&name.as_str()),
            "{what}: env {name} is read by neither the runner nor the policy"
        );
    }
    for from in c.env_from.iter().flatten() {
        let cm = from.config_map_ref.as_ref().unwrap_or_else(|| panic!("{what}: envFrom is a ConfigMap"));
        assert_eq!(cm.name, PROXY_CONFIGMAP, "{what}: envFrom would pass names nobody checked");
        assert_eq!(cm.optional, Some(true), "{what}: no proxy ConfigMap = direct connections");
        assert!(from.prefix.is_none() && from.secret_ref.is_none(), "{what}");
    }
}

fn the_config_map(m: &Manifests) -> &ConfigMap {
    assert_eq!(m.config_maps.len(), 1, "{}: one ConfigMap", m.name);
    &m.config_maps[0]
}

/// The one DaemonSet of a built kustomization.
fn the_daemon_set(m: &Manifests) -> &DaemonSet {
    assert_eq!(m.daemon_sets.len(), 1, "{}: one DaemonSet", m.name);
    &m.daemon_sets[0]
}

/// The install overlays.
fn installs() -> [Manifests; 2] {
    [load("openshift"), load("upstream")]
}

fn version() -> String {
    Cli::command().get_version().expect("the CLI has a version").to_string()
}

#[test]
fn every_overlay_builds_and_its_objects_round_trip_typed() {
    for name in WORKLOAD_KUSTOMIZATIONS {
        let m = load(name);
        let metas = m
            .config_maps
            .iter()
            .map(|o| &o.metadata)
            .chain(m.service_accounts.iter().map(|o| &o.metadata))
            .chain(m.roles.iter().map(|o| &o.metadata))
            .chain(m.role_bindings.iter().map(|o| &o.metadata))
            .chain(m.daemon_sets.iter().map(|o| &o.metadata))
            .chain(m.services.iter().map(|o| &o.metadata));
        for meta in metas {
            assert_eq!(meta.namespace.as_deref(), Some(NAMESPACE), "{name}: {:?}", meta.name);
        }
        assert_eq!(m.daemon_sets.len(), 1, "{name}");
    }
    let os = load("openshift");
    assert_eq!((os.config_maps.len(), os.service_accounts.len(), os.roles.len(), os.namespaces.len()), (1, 1, 2, 1));
    let up = load("upstream");
    assert_eq!((up.config_maps.len(), up.service_accounts.len(), up.roles.len(), up.namespaces.len()), (1, 1, 0, 1));
    let un = load("uninstall");
    assert!(un.config_maps.is_empty() && un.service_accounts.is_empty(), "uninstall keeps the others' objects");
    // The install overlays differ only where the platform needs it.
    assert_eq!(runner(the_daemon_set(&os)).volume_mounts, runner(the_daemon_set(&up)).volume_mounts);
    assert_eq!(pod_spec(the_daemon_set(&os)).volumes, pod_spec(the_daemon_set(&up)).volumes);
}

#[test]
fn the_round_trip_catches_a_misspelt_field() {
    let path = deploy_dir().join("base/daemonset.yaml");
    let mut doc = documents(&path).remove(0);
    doc["spec"]["template"]["spec"]["nodeSelektor"] = doc["spec"]["template"]["spec"]["nodeSelector"].take();
    let r = std::panic::catch_unwind(|| typed::<DaemonSet>("misspelt", &doc));
    assert!(r.is_err(), "a misspelt field must not pass");
}

#[test]
fn the_build_applies_patches_as_kustomize_does() {
    let mut base: Value = serde_json::json!({
        "metadata": {"name": "x", "labels": {"a": "1"}},
        "spec": {"containers": [{"name": "c", "image": "i", "args": ["daemon", "--root"]}, {"name": "d"}],
                 "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [{"operator": "Exists"}]}
    });
    let patch = serde_json::json!({
        "metadata": {"labels": {"b": "2", "a": null}},
        "spec": {"containers": [{"name": "c", "args": ["other"]}, {"name": "e"}],
                 "nodeSelector": {"k": ""}, "tolerations": [{"key": "t"}]}
    });
    strategic_merge("test", &mut base, &patch);
    assert_eq!(base["metadata"]["labels"], serde_json::json!({"b": "2"}), "maps merge, null deletes");
    let names: Vec<&str> =
        base["spec"]["containers"].as_array().expect("list").iter().map(|c| c["name"].as_str().unwrap_or("")).collect();
    assert_eq!(names, ["c", "d", "e"], "containers merge by name");
    assert_eq!(base["spec"]["containers"][0]["image"], "i");
    assert_eq!(base["spec"]["containers"][0]["args"], serde_json::json!(["other"]), "args are replaced");
    assert_eq!(base["spec"]["nodeSelector"], serde_json::json!({"kubernetes.io/os": "linux", "k": ""}));
    assert_eq!(
        base["spec"]["tolerations"],
        serde_json::json!([{"key": "t"}]),
        "lists without a merge key are replaced"
    );
    json_patch("test", &mut base, &serde_json::json!({"op": "add", "path": "/spec/containers/0/args/-", "value": "x"}));
    json_patch("test", &mut base, &serde_json::json!({"op": "add", "path": "/spec/containers/0/args/0", "value": "y"}));
    json_patch("test", &mut base, &serde_json::json!({"op": "replace", "path": "/metadata/name", "value": "z"}));
    json_patch("test", &mut base, &serde_json::json!({"op": "remove", "path": "/spec/containers/2"}));
    assert_eq!(base["spec"]["containers"][0]["args"], serde_json::json!(["y", "other", "x"]));
    assert_eq!(base["metadata"]["name"], "z");
    assert_eq!(base["spec"]["containers"].as_array().map(Vec::len), Some(2));
    for bad in [
        serde_json::json!({"op": "replace", "path": "/metadata/missing", "value": 1}),
        serde_json::json!({"op": "add", "path": "/nothing/here", "value": 1}),
        serde_json::json!({"op": "move", "from": "/a", "path": "/b"}),
    ] {
        let mut d = base.clone();
        assert!(std::panic::catch_unwind(move || json_patch("test", &mut d, &bad)).is_err());
    }
    let mut d = base.clone();
    let directive = serde_json::json!({"spec": {"$patch": "replace"}});
    assert!(std::panic::catch_unwind(move || strategic_merge("test", &mut d, &directive)).is_err());
    assert_eq!(split_image("reg:5000/a/b:1.0"), ("reg:5000/a/b", Some("1.0")));
    assert_eq!(split_image("reg:5000/a/b"), ("reg:5000/a/b", None));
}

#[test]
fn configmap_is_the_example_and_parses() {
    for m in installs() {
        assert_eq!(the_config_map(&m).metadata.name.as_deref(), Some("kata-addon-artifacts"), "{}", m.name);
    }
    let text = read(&deploy_dir().join("base/configmap.yaml"));
    let kv = kata_addons::configmap::parse_configmap(&text).expect("the runner reads base/configmap.yaml");
    let keys: BTreeSet<&str> = kv.iter().map(|k| k.name.as_str()).collect();
    assert!(keys.contains("addonImage") && keys.contains("kernelPath"), "{keys:?}");
    // The same data as the documented example.
    let example = read(&deploy_dir().join("../../examples/kata-addon-artifacts.yaml"));
    let example = kata_addons::configmap::parse_configmap(&example).expect("example parses");
    assert_eq!(kv, example, "base/configmap.yaml and examples/kata-addon-artifacts.yaml disagree");
}

#[test]
fn service_account_and_scc_binding() {
    let os = load("openshift");
    let sa = &os.service_accounts[0];
    let sa_name = sa.metadata.name.as_deref().expect("name");
    assert_eq!(sa.automount_service_account_token, Some(false));
    assert_eq!(os.role_bindings.len(), 2, "the SCC binding and the monitoring one");
    for rb in os.role_bindings.iter().filter(|rb| rb.role_ref.name == "kata-addons-privileged-scc") {
        let role = os.roles.iter().find(|r| r.metadata.name.as_deref() == Some(&rb.role_ref.name));
        assert!(rb.role_ref.kind == "Role" && role.is_some(), "RoleBinding refers to a Role in rbac.yaml");
        let subjects = rb.subjects.as_deref().unwrap_or_default();
        assert!(subjects.iter().all(|s| s.kind == "ServiceAccount" && s.name == sa_name));
        assert!(subjects.iter().all(|s| s.namespace.as_deref() == Some(NAMESPACE)));
        // The one rule: `use` of the privileged SCC, nothing else.
        let rules = role.and_then(|r| r.rules.clone()).unwrap_or_default();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].api_groups.as_deref(), Some(&["security.openshift.io".to_string()][..]));
        assert_eq!(rules[0].resources.as_deref(), Some(&["securitycontextconstraints".to_string()][..]));
        assert_eq!(rules[0].resource_names.as_deref(), Some(&["privileged".to_string()][..]));
        assert_eq!(rules[0].verbs, ["use"]);
    }
    for name in WORKLOAD_KUSTOMIZATIONS {
        let m = load(name);
        let ds = the_daemon_set(&m);
        let spec = pod_spec(ds);
        assert_eq!(spec.service_account_name.as_deref(), Some(sa_name), "{name}");
        assert_eq!(spec.automount_service_account_token, Some(false), "{name}");
    }
}

#[test]
fn daemon_sets_are_privileged_node_critical_on_the_host_root() {
    let mut install_selectors = Vec::new();
    for kname in WORKLOAD_KUSTOMIZATIONS {
        let m = load(kname);
        let ds = the_daemon_set(&m);
        let n = format!("{kname}: {}", name(ds));
        let spec = pod_spec(ds);
        let c = runner(ds);
        let sc = c.security_context.as_ref().expect("securityContext");
        assert_eq!(sc.privileged, Some(true), "{n}: privileged");
        assert_eq!(spec.priority_class_name.as_deref(), Some("system-node-critical"), "{n}: never evicted");
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
        let ds_spec = &ds.spec;
        let us = ds_spec.update_strategy.as_ref().expect("updateStrategy");
        assert_eq!(us.type_.as_deref(), Some("RollingUpdate"));
        let max = us.rolling_update.as_ref().and_then(|r| r.max_unavailable.as_ref());
        assert_eq!(max, Some(&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)), "{n}");
        let res = c.resources.as_ref().expect("resources");
        assert!(res.requests.as_ref().is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")), "{n}");
        assert!(res.limits.as_ref().is_some_and(|l| l.contains_key("memory")), "{n}");
        assert!(c.readiness_probe.as_ref().and_then(|p| p.exec.as_ref()).is_some(), "{n}: exec readiness probe");
        // The pod selector matches the template's labels.
        let labels = ds_spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        for (k, v) in ds_spec.selector.match_labels.iter().flatten() {
            assert_eq!(labels.get(k), Some(v), "{n}: selector {k}");
        }
        let selector = spec.node_selector.clone().expect("nodeSelector");
        assert_eq!(selector.get("kubernetes.io/os").map(String::as_str), Some("linux"), "{n}: Linux nodes");
        if *kname != "uninstall" {
            install_selectors.push(selector);
        } else {
            // The uninstall reaches every node an install reached (and nodes since
            // relabelled): its selector is a subset of each install's.
            for s in &install_selectors {
                assert!(selector.iter().all(|(k, v)| s.get(k) == Some(v)), "{n}: {selector:?} within {s:?}");
            }
        }
    }
}

#[test]
fn openshift_overlay_selects_kata_oc_nodes_under_the_privileged_scc() {
    let m = load("openshift");
    let ds = the_daemon_set(&m);
    let spec = pod_spec(ds);
    let selector = spec.node_selector.clone().expect("nodeSelector");
    assert_eq!(selector.get(KATA_OC_LABEL.0).map(String::as_str), Some(KATA_OC_LABEL.1), "{selector:?}");
    assert!(!selector.contains_key(KATA_DEPLOY_LABEL.0), "{selector:?}");
    for (what, ds) in [("install", ds), ("uninstall", the_daemon_set(&load("uninstall")))] {
        let ann = ds.spec.template.metadata.as_ref().and_then(|m| m.annotations.clone());
        assert_eq!(
            ann.unwrap_or_default().get("openshift.io/required-scc").map(String::as_str),
            Some("privileged"),
            "{what}: the pod pins the SCC it is granted"
        );
    }
    let role =
        m.roles.iter().find(|r| r.metadata.name.as_deref() == Some("kata-addons-privileged-scc")).expect("SCC role");
    assert!(role.rules.iter().flatten().any(|r| r.resource_names.iter().flatten().any(|n| n == "privileged")));
}

#[test]
fn upstream_overlay_selects_kata_deploy_nodes_and_its_layout() {
    let m = load("upstream");
    let ds = the_daemon_set(&m);
    let spec = pod_spec(ds);
    let selector = spec.node_selector.clone().expect("nodeSelector");
    assert_eq!(selector.get(KATA_DEPLOY_LABEL.0).map(String::as_str), Some(KATA_DEPLOY_LABEL.1), "{selector:?}");
    assert!(!selector.contains_key(KATA_OC_LABEL.0), "{selector:?}");
    let ann = ds.spec.template.metadata.as_ref().and_then(|m| m.annotations.clone());
    assert!(ann.unwrap_or_default().is_empty(), "no OpenShift annotations upstream");
    // kata-deploy's layout beneath /opt/kata, passed to the runner (the host's / is mounted).
    let args = argv(runner(ds));
    assert_eq!(flag_value(&args, "--kata-prefix"), Some("/opt/kata"), "{args:?}");
    let cli = check_cli("upstream install", &args);
    let Command::Daemon(daemon) = &cli.command else { panic!("daemon") };
    assert_eq!(daemon.layout.kata_prefix, "/opt/kata");
    // The namespace (absent upstream) admits privileged pods.
    assert_eq!(m.namespaces.len(), 1);
    let ns = &m.namespaces[0];
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    let labels = ns.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("privileged"));
    // The only difference from the OpenShift install: selection, annotation, arguments.
    let os = load("openshift");
    let mut a = serde_json::to_value(the_daemon_set(&os)).expect("json");
    let mut b = serde_json::to_value(ds).expect("json");
    for v in [&mut a, &mut b] {
        let t = &mut v["spec"]["template"];
        t["spec"]["nodeSelector"] = Value::Null;
        t["metadata"]["annotations"] = Value::Null;
        t["spec"]["containers"][0]["args"] = Value::Null;
    }
    assert_eq!(a, b, "openshift and upstream installs differ elsewhere");
}

#[test]
fn install_daemon_sets() {
    for m in installs() {
        let n = m.name.clone();
        let ds = the_daemon_set(&m);
        let spec = pod_spec(ds);
        let c = runner(ds);
        let args = argv(c);
        let env = env_map(c);
        assert_eq!(env.get("ADDON_ACTION").map(String::as_str), Some("install"), "{n}");
        assert_eq!(flag_value(&args, "--log-format"), Some("json"), "{n}");
        // A rollout spreads its first pulls: an explicit start-up jitter, not 0.
        let jitter: f64 = flag_value(&args, "--start-jitter").expect("--start-jitter").parse().expect("seconds");
        assert!(jitter > 0.0 && jitter <= 60.0, "{n}: --start-jitter {jitter}");
        // Drift repair: a periodic resync (not 0 = never).
        let resync: f64 = flag_value(&args, "--resync").expect("--resync").parse().expect("seconds");
        assert!(resync >= 60.0, "{n}: --resync {resync}");

        // The ConfigMap of base/configmap.yaml, mounted where --configmap-dir points.
        let dir = flag_value(&args, "--configmap-dir").expect("--configmap-dir");
        let cm_vol = volume_at(spec, c, dir).config_map.as_ref().expect("--configmap-dir is a ConfigMap volume");
        assert_eq!(Some(cm_vol.name.as_str()), the_config_map(&m).metadata.name.as_deref());
        assert_ne!(cm_vol.optional, Some(true), "without the ConfigMap there is nothing to install");

        // The optional pull secret as config.json, found through REGISTRY_AUTH_FILE.
        let auth =
            flag_value(&args, "--auth-file").or(env.get("REGISTRY_AUTH_FILE").map(String::as_str)).expect("auth file");
        let (dir, file) = auth.rsplit_once('/').expect("absolute");
        let secret = volume_at(spec, c, dir).secret.as_ref().expect("the auth file is on a Secret volume");
        assert_eq!(secret.secret_name.as_deref(), Some(PULL_SECRET));
        assert_eq!(secret.optional, Some(true), "public images need no pull secret");
        let items = secret.items.as_deref().unwrap_or_default();
        assert!(items.iter().any(|i| i.key == ".dockerconfigjson" && i.path == file), "{items:?}");

        // The node's registry configuration (registries.conf(.d), certs.d, CA bundle,
        // kubelet pull secret) is read beneath --root, the node's root filesystem: no flag
        // overrides it and no extra mount carries it.
        let root = volume_at(spec, c, "/host");
        assert!(root.host_path.as_ref().is_some_and(|h| h.path == "/"), "--root is the node's root filesystem");
        for flag in ["--registries-conf", "--registries-conf-dir", "--cert-dir", "--auth-file"] {
            assert!(flag_value(&args, flag).is_none(), "{n}: {flag} would replace the node's own files");
        }
        for v in spec.volumes.as_deref().unwrap_or_default() {
            if let Some(h) = &v.host_path {
                assert_eq!(h.path, "/", "{n}: volume {}: node files come through --root, not extra mounts", v.name);
            }
        }

        // The policy cache on an emptyDir.
        let cache = flag_value(&args, "--cache-dir").expect("--cache-dir");
        assert!(volume_at(spec, c, cache).empty_dir.is_some(), "--cache-dir is an emptyDir");

        // Ready = `status` says installed and not drifted.
        let probe =
            c.readiness_probe.as_ref().and_then(|p| p.exec.as_ref()).and_then(|e| e.command.clone()).expect("probe");
        assert_eq!(&probe[..4], ["kata-addons", "status", "--root", "/host"]);
        // …and the daemon's own readiness (a daemon refusing to act on a root another one
        // owns is not ready): the file its `--ready-file` (default) names.
        assert_eq!(
            flag_value(&probe, "--ready-file"),
            Some(flag_value(&args, "--ready-file").unwrap_or("/tmp/kata-addons-ready"))
        );
        // `status` never takes the node lock: a lock wait flag would be dead weight.
        assert!(flag_value(&probe, "--lock-timeout").is_none(), "the probe passes --lock-timeout: {probe:?}");
    }
}

#[test]
fn uninstall_daemon_set() {
    let m = load("uninstall");
    let ds = the_daemon_set(&m);
    for install in installs() {
        let install = the_daemon_set(&install);
        assert_ne!(name(ds), name(install));
        assert_ne!(ds.spec.selector, install.spec.selector, "the two DaemonSets must not select each other's pods");
        assert_eq!(runner(ds).image, runner(install).image);
    }
    let c = runner(ds);
    assert_eq!(env_map(c).get("ADDON_ACTION").map(String::as_str), Some("uninstall"));
    assert!(c.env_from.is_none(), "an uninstall reaches no registry: no proxy");
    // Ready = the ready file exists (`status` exits 3 when nothing is installed).
    let args = argv(c);
    let ready = flag_value(&args, "--ready-file").expect("--ready-file");
    let probe =
        c.readiness_probe.as_ref().and_then(|p| p.exec.as_ref()).and_then(|e| e.command.clone()).expect("probe");
    assert_eq!(probe, ["test", "-f", ready]);
}

#[test]
fn every_flag_and_env_var_exists_in_the_cli() {
    for kname in WORKLOAD_KUSTOMIZATIONS {
        let m = load(kname);
        let ds = the_daemon_set(&m);
        let what = format!("{kname} container");
        let c = runner(ds);
        let cli = check_cli(&what, &argv(c));
        let Command::Daemon(daemon) = &cli.command else { panic!("{what}: not `daemon`") };
        assert_eq!(daemon.node.root, Path::new("/host"));
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
fn cluster_proxy_comes_from_an_optional_configmap_the_runner_reads() {
    for m in installs() {
        let c = runner(the_daemon_set(&m));
        let from = c.env_from.as_deref().unwrap_or_default();
        assert_eq!(from.len(), 1, "{}: envFrom the proxy ConfigMap", m.name);
        let cm = from[0].config_map_ref.as_ref().expect("configMapRef");
        assert_eq!((cm.name.as_str(), cm.optional), (PROXY_CONFIGMAP, Some(true)), "{}", m.name);
        assert!(m.config_maps.iter().all(|c| c.metadata.name.as_deref() != Some(PROXY_CONFIGMAP)), "not shipped");
    }
    // The documented source: OpenShift's proxy/cluster status, one key per variable.
    let readme = read(&deployment_doc());
    for (key, field) in [("HTTP_PROXY", "httpProxy"), ("HTTPS_PROXY", "httpsProxy"), ("NO_PROXY", "noProxy")] {
        let line = format!("--from-literal={key}=\"$(oc get proxy/cluster -o jsonpath='{{.status.{field}}}')\"");
        assert!(readme.contains(&line), "docs/deployment.md fills {key} from proxy/cluster: {line}");
    }
    assert!(readme.contains(&format!("create configmap {PROXY_CONFIGMAP}")));
    assert!(readme.contains("rollout restart daemonset/kata-addons"), "env changes need a restart");
    // The runner reads exactly these keys, with OpenShift's values as proxy/cluster reports
    // them (noProxy: the cluster's networks, `.cluster.local`, `.svc`, localhost, ...).
    let vars: BTreeMap<&str, &str> = BTreeMap::from([
        ("HTTP_PROXY", "http://proxy.example.com:3128"),
        ("HTTPS_PROXY", "http://proxy.example.com:3128"),
        (
            "NO_PROXY",
            ".cluster.local,.svc,10.0.0.0/16,10.128.0.0/14,127.0.0.1,172.30.0.0/16,api-int.ocp.example.com,localhost,mirror.example.com",
        ),
    ]);
    assert_eq!(vars.keys().copied().collect::<Vec<_>>(), {
        let mut k = PROXY_ENV.to_vec();
        k.sort();
        k
    });
    let p = kata_addons::source::proxy::ProxyEnv::from_vars(&|n| vars.get(n).map(|v| v.to_string())).expect("valid");
    let via = |u: &str| p.proxy_for(&u.parse().expect("url")).map(|u| u.to_string());
    assert_eq!(via("https://quay.io/v2/").as_deref(), Some("http://proxy.example.com:3128/"));
    assert_eq!(via("https://image-registry.openshift-image-registry.svc:5000/v2/"), None);
    assert_eq!(via("https://mirror.example.com/v2/"), None, "a mirror listed in noProxy is reached directly");
    assert_eq!(via("http://127.0.0.1:5000/v2/"), None);
}

#[test]
fn runner_image_is_pinned_to_the_crate_version() {
    let version = version();
    let pinned = format!("{RUNNER_IMAGE}:{version}");
    // Every kustomization that names the image pins this version; never `latest`.
    let mut dirs = Vec::new();
    kustomization_dirs(&deploy_dir(), &mut dirs);
    for dir in &dirs {
        let k = documents(&dir.join("kustomization.yaml")).remove(0);
        for i in k["images"].as_array().into_iter().flatten() {
            assert_eq!(i["name"], RUNNER_IMAGE, "{}", dir.display());
            assert_eq!(i["newTag"].as_str(), Some(version.as_str()), "{}: newTag", dir.display());
        }
    }
    // The built containers, and the raw manifests (applied without kustomize too).
    for name in WORKLOAD_KUSTOMIZATIONS.iter().chain(&["webhook/openshift", "webhook/cert-manager"]) {
        let built = build(&deploy_dir().join(name));
        let k = documents(&deploy_dir().join(name).join("kustomization.yaml")).remove(0);
        let ks_images = k["images"].as_array().map(Vec::len).unwrap_or(0);
        assert!(ks_images == 1 || name.starts_with("webhook/"), "{name}: pins the image in its own `images`");
        let mut seen = 0;
        for mut d in built.docs {
            for c in pod_containers(&mut d) {
                assert_eq!(c["image"], pinned.as_str(), "{name}");
                assert_eq!(c["imagePullPolicy"], "IfNotPresent", "{name}: a pinned tag makes IfNotPresent safe");
                seen += 1;
            }
        }
        assert!(seen >= 1, "{name}");
    }
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    for f in files {
        for (i, line) in read(&f).lines().enumerate() {
            if let Some(image) = line.trim().strip_prefix("image: ") {
                assert_eq!(image, pinned, "{}:{}", f.display(), i + 1);
            }
        }
    }
    // The MachineConfig unit and the Containerfile's build command: the same tag.
    let unit = read(&deploy_dir().join("machineconfig/kata-addons-install.service"));
    assert!(unit.contains(&format!(" {pinned} ")), "the MachineConfig unit runs {pinned}");
    let containerfile = read(&deploy_dir().join("Containerfile"));
    assert!(containerfile.contains(&format!("-t {pinned} .")), "the Containerfile builds {pinned}");
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
    assert!(matches!(cli.command, Command::Daemon(_)));
    assert!(text.contains("wasm32-wasip2") && text.contains("-p kata-addons"));
    // The man pages generated from the command line (host/tests/man_pages.rs) are in the image.
    assert!(text.contains("COPY docs/man/ /usr/share/man/man1/"), "the image carries docs/man");
}

/// Every YAML file under `dir`, except the MachineConfig tree (no kustomization:
/// tests/tests/machineconfig.rs checks it).
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).expect("deploy dir").map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for p in entries {
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

/// Directories under `dir` holding a kustomization.
fn kustomization_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut files = Vec::new();
    yaml_files(dir, &mut files);
    out.extend(files.iter().filter(|p| is_kustomization(p)).filter_map(|p| p.parent().map(Path::to_path_buf)));
}

#[test]
fn kustomizations_use_every_manifest_and_overlays_are_siblings_of_their_base() {
    let mut dirs = Vec::new();
    kustomization_dirs(&deploy_dir(), &mut dirs);
    let rel: BTreeSet<String> =
        dirs.iter().map(|d| d.strip_prefix(deploy_dir()).expect("under deploy").display().to_string()).collect();
    let want: BTreeSet<String> =
        ["base", "openshift", "upstream", "uninstall", "webhook/base", "webhook/openshift", "webhook/cert-manager"]
            .map(String::from)
            .into();
    assert_eq!(rel, want, "the kustomizations under host/deploy");
    let mut used = BTreeSet::new();
    for d in &dirs {
        let b = build(d);
        for doc in &b.docs {
            if !CLUSTER_SCOPED.contains(&doc["kind"].as_str().unwrap_or_default()) {
                assert_eq!(doc["metadata"]["namespace"], NAMESPACE, "{}: {}", d.display(), doc["metadata"]["name"]);
            }
        }
        used.extend(b.files);
        let k = documents(&d.join("kustomization.yaml")).remove(0);
        for r in k["resources"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if d.join(r).is_dir() {
                assert_eq!(r, "../base", "{}: overlays build on their sibling base", d.display());
            }
        }
    }
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    for f in files {
        assert!(used.contains(&canonical(&f)), "{} is in no kustomization", f.display());
    }
}

#[test]
fn documented_commands_parse() {
    let text = read(&deployment_doc());
    let mut seen = 0;
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("kata-addons ") else { continue };
        let argv: Vec<String> =
            std::iter::once("kata-addons").chain(rest.split_whitespace()).map(String::from).collect();
        check_cli("docs/deployment.md", &argv);
        seen += 1;
    }
    assert!(seen >= 2, "docs/deployment.md shows the preview commands");
    let cli = check_cli(
        "docs/deployment.md",
        &["kata-addons", "preview", "--configmap", "cm.yaml", "--output", "yaml"].map(String::from),
    );
    assert!(matches!(cli.command, Command::Preview { output: kata_addons::cli::PreviewFormat::Yaml, .. }));
    assert!(text.contains("preview --configmap cm.yaml --output yaml"));
    for name in POLICY_ENV.iter().chain(RUNNER_ENV) {
        assert!(text.contains(name), "docs/deployment.md names {name}");
    }
    // Every `apply -k` / `delete -k` in the README, the deployment guide and host/deploy's
    // index names a kustomization, and each workload kustomization has its apply command.
    let top = read(&deploy_dir().join("../../README.md"));
    let index = read(&deploy_dir().join("README.md"));
    let mut applied = BTreeSet::new();
    for (file, t) in [("docs/deployment.md", &text), ("README.md", &top), ("host/deploy/README.md", &index)] {
        for w in t.split("-k ").skip(1) {
            let dir: String = w.chars().take_while(|c| !c.is_whitespace() && *c != '`' && *c != ')').collect();
            let Some(sub) = dir.strip_prefix("host/deploy/") else {
                panic!("{file}: `-k {dir}` is not a path under host/deploy")
            };
            let sub = sub.trim_end_matches('/');
            assert!(
                deploy_dir().join(sub).join("kustomization.yaml").is_file(),
                "{file}: -k {dir}: no kustomization there"
            );
            assert!(!sub.ends_with("base"), "{file}: a base is not applied alone: {dir}");
            applied.insert(sub.to_string());
        }
    }
    for k in WORKLOAD_KUSTOMIZATIONS {
        assert!(applied.contains(*k), "the docs show how to apply host/deploy/{k}");
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
        // The Prometheus operator's CRD: checked field by field (tests below).
        ("monitoring.coreos.com/v1", "ServiceMonitor") => {}
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
    assert_eq!(c.image, runner(the_daemon_set(&load("openshift"))).image);
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
        assert_eq!(get.scheme.as_deref(), Some("HTTP"), "{what}");
        assert_eq!(get.port, IntOrString::String("probes".into()), "{what}");
    }
    // The probes have a plain-HTTP listener of their own (a flood of the HTTPS port cannot
    // fail them); it is the container port they name, and the Service does not expose it.
    let probes = c.ports.as_ref().and_then(|p| p.iter().find(|p| p.name.as_deref() == Some("probes"))).expect("port");
    let probe_listen = w.probe_listen.expect("--probe-listen");
    assert_eq!(i32::from(probe_listen.port()), probes.container_port);
    assert_ne!(probe_listen.port(), w.listen.port());
    let svc_ports = b.service.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
    assert!(
        svc_ports.iter().all(|p| p.target_port != Some(IntOrString::String("probes".into()))),
        "the Service exposes only HTTPS"
    );
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

/// Every overlay renders with `kubectl kustomize` and the result parses typed.
#[test]
#[cfg_attr(no_kubectl, ignore = "needs kubectl on PATH")]
fn webhook_overlays_render_with_kubectl_kustomize() {
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

/// This file's build of every kustomization is what `kubectl kustomize` renders (objects
/// compared as sets, by kind and name).
#[test]
#[cfg_attr(no_kubectl, ignore = "needs kubectl on PATH")]
fn builds_match_kubectl_kustomize() {
    let mut dirs = Vec::new();
    kustomization_dirs(&deploy_dir(), &mut dirs);
    for dir in dirs {
        let out = std::process::Command::new("kubectl").arg("kustomize").arg(&dir).output().expect("kubectl kustomize");
        assert!(out.status.success(), "{}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let key = |v: &Value| format!("{}/{}/{}", v["apiVersion"], v["kind"], v["metadata"]["name"]);
        let theirs: BTreeMap<String, Value> = serde_norway::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).expect("YAML"))
            .filter(|v| !v.is_null())
            .map(|v| (key(&v), v))
            .collect();
        let ours: BTreeMap<String, Value> = build(&dir).docs.into_iter().map(|v| (key(&v), v)).collect();
        assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>(), "{}", dir.display());
        for (k, v) in &ours {
            if let Some(d) = first_difference(k, &theirs[k], v) {
                panic!("{}: this build differs from kubectl kustomize at {d}", dir.display());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Metrics (docs/metrics.md): the port, the Service and ServiceMonitor of each workload,
// the PrometheusRule, and OpenShift cluster monitoring.

/// The port of a `--metrics-address ADDR:PORT` argument.
fn metrics_port(what: &str, args: &[String]) -> i32 {
    let addr = flag_value(args, "--metrics-address").unwrap_or_else(|| panic!("{what} serves metrics"));
    addr.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{what}: port of {addr}"))
}

/// The `containerPort` of the port named `metrics`.
fn container_metrics_port(what: &str, c: &Container) -> i32 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .unwrap_or_else(|| panic!("{what}: a container port named metrics"))
        .container_port
}

/// A ServiceMonitor selecting `labels` (a Service's) and scraping its port `metrics`.
fn check_service_monitor(what: &str, sm: &Value, service_labels: &BTreeMap<String, String>) {
    let select = sm["spec"]["selector"]["matchLabels"].as_object().unwrap_or_else(|| panic!("{what}: matchLabels"));
    assert!(!select.is_empty(), "{what}");
    for (k, v) in select {
        assert_eq!(service_labels.get(k).map(String::as_str), v.as_str(), "{what}: selects the Service by {k}");
    }
    let endpoints = sm["spec"]["endpoints"].as_array().unwrap_or_else(|| panic!("{what}: endpoints"));
    assert_eq!(endpoints.len(), 1, "{what}");
    assert_eq!(endpoints[0]["port"], "metrics", "{what}");
    assert_eq!(endpoints[0]["path"], "/metrics", "{what}");
    assert_eq!(endpoints[0]["scheme"], "http", "{what}");
}

#[test]
fn every_install_overlay_serves_scrapes_and_alerts_on_the_daemon_metrics() {
    for m in installs() {
        let what = m.name.clone();
        let ds = the_daemon_set(&m);
        let c = runner(ds);
        let port = metrics_port(&what, &argv(c));
        assert_eq!(container_metrics_port(&what, c), port, "{what}: the container port is the listener's");
        let pod_labels = ds.spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        let svc = m
            .services
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some("kata-addons-metrics"))
            .unwrap_or_else(|| panic!("{what}: the Service kata-addons-metrics"));
        let spec = svc.spec.as_ref().expect("spec");
        for (k, v) in spec.selector.iter().flatten() {
            assert_eq!(pod_labels.get(k), Some(v), "{what}: the Service selects the DaemonSet's pods by {k}");
        }
        let sp = spec.ports.iter().flatten().find(|p| p.name.as_deref() == Some("metrics")).expect("port metrics");
        assert_eq!(sp.target_port, Some(IntOrString::String("metrics".into())), "{what}");
        let svc_labels = svc.metadata.labels.clone().unwrap_or_default();
        let sms: Vec<&Value> = m.monitoring.iter().filter(|o| o["kind"] == "ServiceMonitor").collect();
        assert_eq!(sms.len(), 1, "{what}: one ServiceMonitor");
        check_service_monitor(&what, sms[0], &svc_labels);
        let rules: Vec<&Value> = m.monitoring.iter().filter(|o| o["kind"] == "PrometheusRule").collect();
        assert_eq!(rules.len(), 1, "{what}: one PrometheusRule");
        let alerts: BTreeSet<&str> = rules[0]["spec"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .filter_map(|r| r["alert"].as_str())
            .collect();
        for a in [
            "KataAddonsReconcileFailing",
            "KataAddonsVersionSkew",
            "KataAddonsDaemonNotReady",
            "KataAddonsWebhookErrors",
            "KataAddonsWebhookDenying",
        ] {
            assert!(alerts.contains(a), "{what}: alert {a}");
        }
        for o in &m.monitoring {
            assert_eq!(o["metadata"]["namespace"], NAMESPACE, "{what}");
        }
    }
    let un = load("uninstall");
    assert!(un.monitoring.is_empty() && un.services.is_empty(), "uninstall keeps the install's objects");
}

#[test]
fn openshift_labels_the_namespace_for_cluster_monitoring_and_lets_prometheus_list_endpoints() {
    let m = load("openshift");
    assert_eq!(m.namespaces.len(), 1);
    let ns = &m.namespaces[0];
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    let labels = ns.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("openshift.io/cluster-monitoring").map(String::as_str), Some("true"));
    let rb = m
        .role_bindings
        .iter()
        .find(|rb| rb.role_ref.name == "kata-addons-prometheus")
        .expect("the monitoring RoleBinding");
    let subjects = rb.subjects.as_deref().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
        ("ServiceAccount", "prometheus-k8s", Some("openshift-monitoring"))
    );
    let role = m
        .roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some("kata-addons-prometheus"))
        .expect("the monitoring Role");
    let mut granted = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        assert_eq!(rule.verbs, ["get", "list", "watch"], "read-only");
        for r in rule.resources.iter().flatten() {
            granted.insert(r.as_str());
        }
    }
    for r in ["services", "endpoints", "pods"] {
        assert!(granted.contains(r), "prometheus-k8s may list {r}");
    }
    let up = load("upstream");
    let up_labels = up.namespaces[0].metadata.labels.clone().unwrap_or_default();
    assert!(!up_labels.contains_key("openshift.io/cluster-monitoring"), "upstream has no OpenShift monitoring");
}

#[test]
fn the_webhook_serves_metrics_on_its_service_with_a_service_monitor() {
    let b = load_webhook_base();
    let spec = b.deployment.spec.template.spec.as_ref().expect("pod spec");
    let c = &spec.containers[0];
    let port = metrics_port("webhook", &argv(c));
    assert_eq!(container_metrics_port("webhook", c), port);
    let sp = b.service.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
    let mp = sp.iter().find(|p| p.name.as_deref() == Some("metrics")).expect("Service port metrics");
    assert_eq!(mp.target_port, Some(IntOrString::String("metrics".into())));
    let svc_labels = b.service.metadata.labels.clone().unwrap_or_default();
    let sms: Vec<Value> = documents(&webhook_dir().join("base/monitoring.yaml"))
        .into_iter()
        .filter(|d| d["kind"] == "ServiceMonitor")
        .collect();
    assert_eq!(sms.len(), 1);
    check_service_monitor("webhook", &sms[0], &svc_labels);
}
