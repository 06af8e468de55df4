//! One reference grammar for both halves (docs/design.md#configmap-keys): every `addonImage`
//! the policy guest accepts, the runner accepts and pulls by the same parts; every one it
//! refuses is invalid configuration (exit 2), in `preview`, `install` and the webhook
//! alike.
//!
//! A fixed number of seeded cases (the same every run), built from the pieces references
//! are made of, valid and not; then the known pitfalls through the real binary.

use kata_addons::policy::{ImageSource, KeyValue, Policy, PolicyError, PolicyOptions};
use kata_addons::source::ImageRef;
use kata_addons_tests::{run_kata, show};

/// Cases of the property test (fixed: CI runs the same ones every time).
const CASES: usize = 3000;
/// The seed of the generator.
const SEED: u64 = 0x6b61_7461_7265_6673;

const HOSTS: &[&str] = &[
    "quay.io",
    "localhost",
    "localhost:5000",
    "127.0.0.1:5000",
    "registry.example.com:65535",
    "docker.io",
    "index.docker.io",
    "Quay.IO",
    "[::1]:5000",
    "[fe80::1]",
    "[::1",
    "qu_ay.io",
    "-quay.io",
    "quay..io",
    "quay.io:0",
    "quay.io:65536",
    "quay.io:05000",
    "quay.io:port",
    "a",
    "",
];
const COMPONENTS: &[&str] = &["a", "b-c", "c__d", "e.f", "g--h", "x0", "A", "b_", "-b", "b___c", "a.-b", "", "é"];
const TAGS: &[&str] = &["v1", "_t", "1.0-rc_1", "", ".v1", "-v1", "v 1", "latest"];

fn digest(rng: &mut fastrand::Rng) -> String {
    let hex: String = (0..64).map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)])).collect();
    match rng.u8(..6) {
        0 => format!("sha512:{hex}"),
        1 => format!("sha256:{}", hex.to_uppercase()),
        2 => format!("sha256:{}", &hex[..63]),
        _ => format!("sha256:{hex}"),
    }
}

/// A reference from the pieces: host, 1-4 components (sometimes long), tag, digest.
fn reference(rng: &mut fastrand::Rng) -> String {
    let mut s = String::new();
    if rng.u8(..8) != 0 {
        s.push_str(HOSTS[rng.usize(..HOSTS.len())]);
        s.push('/');
    }
    let n = rng.usize(1..=4);
    for i in 0..n {
        if i > 0 {
            s.push('/');
        }
        if rng.u8(..6) == 0 {
            // Around the 255-byte name limit, with and without Docker Hub's `library/`.
            s.push_str(&"a".repeat(rng.usize(200..=250)));
        } else {
            s.push_str(COMPONENTS[rng.usize(..COMPONENTS.len())]);
        }
    }
    if rng.bool() {
        s.push(':');
        s.push_str(TAGS[rng.usize(..TAGS.len())]);
    }
    if rng.u8(..4) == 0 {
        s.push('@');
        s.push_str(&digest(rng));
    }
    s
}

fn policy() -> Policy {
    Policy::embedded(PolicyOptions { timeout: std::time::Duration::from_secs(20), ..PolicyOptions::default() })
        .expect("the embedded policy loads")
}

fn data(image: &str) -> Vec<KeyValue> {
    // A version of its own, so that no tag's default version is judged here.
    [("addonImage", image), ("kernelPath", "/k"), ("version", "v1")]
        .iter()
        .map(|(n, v)| KeyValue { name: (*n).into(), value: (*v).into() })
        .collect()
}

/// Checks one reference; returns whether the policy accepted it.
fn check(policy: &Policy, image: &str) -> bool {
    let native = kata_addons_guest::env(&[
        kata_addons_guest::KeyValue::new("addonImage", image),
        kata_addons_guest::KeyValue::new("kernelPath", "/k"),
        kata_addons_guest::KeyValue::new("version", "v1"),
    ]);
    match policy.env(&data(image)) {
        Ok(env) => {
            assert!(native.is_ok(), "{image:?}: the component accepts what the native guest refuses: {native:?}");
            // The runner accepts the plan (its own checks of every field it acts on) ...
            let plan = policy.plan(&env).unwrap_or_else(|e| panic!("{image:?}: the runner refuses the plan: {e}"));
            let ImageSource::Registry(r) = &plan.source else { panic!("{image:?}: not a registry source") };
            // ... and pulls by the very parts the guest parsed, which the runner's own
            // reading of the normalised text (command line, node files) gives too.
            let by_parts = ImageRef::from_plan(r);
            assert_eq!(by_parts.to_string(), plan.image, "{image:?}");
            let by_text = ImageRef::parse(&plan.image).unwrap_or_else(|e| panic!("{image:?}: {e:#}"));
            assert_eq!(by_text, by_parts, "{image:?}: the runner reads the normalised reference otherwise");
            true
        }
        Err(PolicyError::Rejected(v)) => {
            let n = native.expect_err("the native guest refuses it too");
            assert_eq!(n.len(), v.len(), "{image:?}");
            // An empty reference is a missing one; anything else is an invalid one.
            let code = if image.trim().is_empty() {
                kata_addons::policy::ViolationCode::Missing
            } else {
                kata_addons::policy::ViolationCode::InvalidReference
            };
            assert!(v.iter().all(|v| v.key == "addonImage" && v.code == code), "{image:?}: {v:?}");
            // Rejected is invalid configuration: exit 2 wherever it surfaces.
            let err = anyhow::Error::new(PolicyError::Rejected(v));
            assert_eq!(kata_addons::error::classify(&err).exit_code(), 2, "{image:?}");
            false
        }
        Err(other) => panic!("{image:?}: {other}"),
    }
}

#[test]
fn every_reference_the_policy_accepts_the_runner_pulls_and_every_other_is_exit_2() {
    let policy = policy();
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut accepted = 0;
    for _ in 0..CASES {
        accepted += usize::from(check(&policy, &reference(&mut rng)));
    }
    // Both sides of the property are exercised.
    assert!(accepted > CASES / 20 && accepted < CASES - CASES / 20, "{accepted} of {CASES} accepted");
}

/// Bracketed IPv6 hosts and over-long Docker Hub names: invalid configuration on every path.
#[test]
fn bracketed_ipv6_and_long_docker_hub_names_are_invalid_configuration_everywhere() {
    let policy = policy();
    let long = |n: usize| format!("docker.io/{}:v1", "a".repeat(n));
    let mut refused: Vec<String> = vec!["[::1]:5000/a/b:v1".into(), "[fe80::1]/a:v1".into()];
    refused.extend((238..=245).map(long));
    for image in &refused {
        assert!(!check(&policy, image), "{image} must be refused");
    }
    // 237: `docker.io/library/` + 237 = 255 bytes, the longest name.
    assert!(check(&policy, &long(237)));
    let dir = tempfile::tempdir().expect("tempdir");
    for image in &refused[..3] {
        let cm = dir.path().join("cm.json");
        let body = serde_json::json!({ "addonImage": image, "kernelPath": "/k" });
        std::fs::write(&cm, body.to_string()).expect("write");
        let cm = cm.to_str().expect("utf-8");
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).expect("root");
        let root = root.to_str().expect("utf-8");
        for args in [vec!["preview", "--configmap", cm], vec!["install", "--root", root, "--configmap", cm]] {
            let out = run_kata(&args);
            assert_eq!(out.status.code(), Some(2), "{image}: {args:?}\n{}", show(&out));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("  addonImage: ") && err.contains("[invalid-reference]"), "{image}: {err}");
        }
    }
}
