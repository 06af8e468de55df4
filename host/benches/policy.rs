//! Policy sandbox benchmarks (BENCHMARKS.md, "Policy sandbox"): cold load (compile) vs
//! cached load (verify + deserialize), instantiate + call for the seed ConfigMap and a
//! 64 KiB ConfigMap, and the same policy called natively for the wasm/native ratio.
//!
//! `KATA_ADDONS_BENCH_WASM=path.wasm` benchmarks another component instead of the
//! embedded one (the native figures are always the `kata-addons-guest` crate).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use kata_addons::policy::{KeyValue, Policy, PolicyOptions};
use kata_addons_guest as native;

/// The seed ConfigMap: `examples/kata-addon-artifacts.yaml` data.
fn seed() -> Vec<(String, String)> {
    vec![
        ("addonImage".into(), "quay.io/openshift_sandboxed_containers/kata-se-artifacts:v1.0".into()),
        ("kernelPath".into(), "/artifacts/kernel/vmlinuz".into()),
    ]
}

/// 64 KiB of ConfigMap data: the seed plus 63 `noteNN` keys of 1 KiB each. With the real
/// rules this is the rejection path (63 unknown-key violations, all reported at once).
fn big() -> Vec<(String, String)> {
    let mut data = seed();
    for i in 0..63 {
        data.push((format!("note{i:02}"), "x".repeat(1024)));
    }
    data
}

fn wit(data: &[(String, String)]) -> Vec<KeyValue> {
    data.iter().map(|(n, v)| KeyValue { name: n.clone(), value: v.clone() }).collect()
}

fn plain(data: &[(String, String)]) -> Vec<native::KeyValue> {
    data.iter().map(|(n, v)| native::KeyValue { name: n.clone(), value: v.clone() }).collect()
}

fn component() -> Vec<u8> {
    match std::env::var_os("KATA_ADDONS_BENCH_WASM") {
        Some(p) => std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.to_string_lossy())),
        None => kata_addons::GUEST_WASM.to_vec(),
    }
}

fn options(cache: Option<&std::path::Path>) -> PolicyOptions {
    PolicyOptions { cache_dir: cache.map(std::path::Path::to_path_buf), ..PolicyOptions::default() }
}

fn load(c: &mut Criterion) {
    let wasm = component();
    let mut g = c.benchmark_group("load");
    g.sample_size(10);
    g.bench_function("cold (compile)", |b| b.iter(|| Policy::from_bytes(black_box(&wasm), options(None)).unwrap()));
    let dir = tempfile::tempdir().unwrap();
    drop(Policy::from_bytes(&wasm, options(Some(dir.path()))).unwrap());
    g.sample_size(50);
    g.bench_function("cached (verify + deserialize)", |b| {
        b.iter(|| {
            let p = Policy::from_bytes(black_box(&wasm), options(Some(dir.path()))).unwrap();
            assert_eq!(p.loaded_from(), kata_addons::policy::LoadedFrom::Cache);
            p
        })
    });
    g.finish();
}

fn calls(c: &mut Criterion) {
    let policy = Policy::from_bytes(&component(), options(None)).unwrap();
    let mut g = c.benchmark_group("call");
    for (name, data) in [("seed", seed()), ("64KiB", big())] {
        let (w, n) = (wit(&data), plain(&data));
        // Same answer kind (ok/rejected) either way, or the ratio compares different work.
        let _ = black_box(policy.env(&w));
        g.bench_function(format!("wasm env ({name}): instantiate + call"), |b| {
            b.iter(|| black_box(policy.env(black_box(&w))))
        });
        g.bench_function(format!("native env ({name})"), |b| b.iter(|| black_box(native::env(black_box(&n)))));
    }
    // `plan` and `render` on the seed, when this component accepts it (the placeholder
    // rules do not; the real rules and the test guests do).
    let (Ok(env), Ok(nenv)) = (policy.env(&wit(&seed())), native::env(&plain(&seed()))) else { return g.finish() };
    let node = native::NodeOptions::default();
    if let (Ok(plan), Ok(nplan)) = (policy.plan(&env), native::plan(&nenv, &node)) {
        g.bench_function("wasm plan (seed): instantiate + call", |b| {
            b.iter(|| black_box(policy.plan(black_box(&env))))
        });
        g.bench_function("native plan (seed)", |b| b.iter(|| black_box(native::plan(black_box(&nenv), &node))));
        // One runtime configuration, as on an OpenShift node.
        let rcs: Vec<_> =
            plan.runtime_configs.iter().take(1).map(|p| kata_addons::policy::path_only_facts(p)).collect();
        let nrcs: Vec<native::RuntimeConfigFacts> = rcs
            .iter()
            .map(|r| native::RuntimeConfigFacts {
                path: r.path.clone(),
                handler: None,
                keys: Vec::new(),
                extensions: Vec::new(),
                extensions_from: None,
            })
            .collect();
        let installed = kata_addons::layout::installed_files(&plan, "v1.0-0123456789ab");
        let ninstalled: Vec<native::InstalledFile> = nplan
            .artifacts
            .iter()
            .map(|a| native::InstalledFile {
                kind: a.kind,
                path: format!("{}/v1.0-0123456789ab/{}", kata_addons_facts::INSTALL_DIR, a.file_name),
                filesystem: None,
                verity: None,
            })
            .collect();
        g.bench_function("wasm render (seed): instantiate + call", |b| {
            b.iter(|| black_box(policy.render(black_box(&plan), black_box(&installed), &rcs)))
        });
        g.bench_function("native render (seed)", |b| {
            b.iter(|| black_box(native::render(black_box(&nplan), black_box(&ninstalled), &nrcs)))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = load, calls
}
criterion_main!(benches);
