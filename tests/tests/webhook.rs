//! `kata-addons webhook` tested as the API server talks to it: the real binary on
//! 127.0.0.1 with a test CA, real HTTPS (HTTP/1.1 and HTTP/2), AdmissionReview bodies
//! built from k8s-openapi types. Build the binary first: `cargo build -p kata-addons`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kata_addons_tests::admission::{
    Client, NAME, Proto, Reply, Webhook, configmap, create, full, object, review, unsized_body,
};
use kata_addons_tests::guests::guest;
use kata_addons_tests::tls::TestCa;
use serde_json::Value;

/// The global flag that selects another policy component.
const POLICY_FLAG: &str = "--policy-component";

const VALID: &[(&str, &str)] = &[("addonImage", "quay.io/example/addon:v1"), ("kernelPath", "/boot/vmlinuz")];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

struct Fixture {
    ca: TestCa,
    hook: Webhook,
    client: Client,
}

fn start(global: &[&str], extra: &[&str]) -> Fixture {
    let ca = TestCa::new();
    let hook = Webhook::start(global, &ca.server_cert, &ca.server_key, extra, &ca.ca_cert);
    let client = Client::new(hook.addr, &[&ca.ca_cert]);
    Fixture { ca, hook, client }
}

/// The `response` of a 200 review reply, after checking the envelope and the uid echo.
fn response(r: &Reply, uid: &str) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], uid, "the uid is echoed");
    v["response"].clone()
}

fn warnings(resp: &Value) -> Vec<String> {
    resp["warnings"].as_array().into_iter().flatten().map(|w| w.as_str().expect("string").to_string()).collect()
}

/// The denial `status`, typed.
fn status(resp: &Value) -> Status {
    assert_eq!(resp["allowed"], false, "{resp}");
    serde_json::from_value(resp["status"].clone()).expect("status is a meta/v1 Status")
}

/// The violation lines `kata-addons preview` prints for the same ConfigMap.
fn preview_lines(cm: &ConfigMap) -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cm.json");
    std::fs::write(&file, serde_json::to_vec(&object(cm)).expect("json")).expect("write");
    let cache = kata_addons_tests::admission::cache_dir().to_str().expect("utf-8");
    let out =
        kata_addons_tests::run_kata(&["--cache-dir", cache, "preview", "--configmap", file.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2), "{}", kata_addons_tests::show(&out));
    String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("  ")).map(String::from).collect()
}

#[test]
fn valid_configmap_is_allowed_with_a_preview() {
    let f = start(&[], &[]);
    let rt = rt();
    let sha = "a".repeat(64);
    let cm = configmap(NAME, &[VALID[0], VALID[1], ("kernelSha256", &sha), ("version", "v1.2")]);
    for proto in [Proto::Http1, Proto::Http2] {
        let r = rt.block_on(f.client.post(proto, "/validate?timeout=5s", &create("uid-valid", &cm)));
        let resp = response(&r, "uid-valid");
        assert_eq!(resp["allowed"], true, "{resp}");
        assert!(resp.get("status").is_none(), "{resp}");
        let w = warnings(&resp);
        let all = w.join("\n");
        for want in [
            "image quay.io/example/addon:v1",
            "provider se: the Kata runtime for IBM Secure Execution",
            "version v1.2",
            "kernel /boot/vmlinuz from the image, sha256 aaaa",
            "drop-in sets hypervisor.qemu.kernel = \"/etc/kata-containers/addons/v1.2-<digest>/",
            "this change invalidates se.version, se.tag, se.image_phkh, kata_addons.kernel.sha256 on kata-se",
        ] {
            assert!(all.contains(want), "warnings lack {want:?}:\n{all}");
        }
        // No node path of a runtime configuration: it depends on each node's layout.
        assert!(!all.contains("configuration"), "{all}");
        // The API server's limits: printable, <= 120 characters each, bounded in total.
        assert!(w.len() <= 16);
        for x in &w {
            assert!(x.chars().count() <= 120 && !x.chars().any(char::is_control), "{x:?}");
        }
        assert_eq!(w.iter().collect::<BTreeSet<_>>().len(), w.len(), "warnings are unique");
    }
}

#[test]
fn every_violation_class_is_denied_exactly_as_preview_prints_it() {
    let f = start(&[], &[]);
    let rt = rt();
    let b64 = "b".repeat(64);
    // Fits in 255 bytes as written, not with Docker Hub's `library/`.
    let long_hub = format!("docker.io/{}:v1", "a".repeat(240));
    let img = VALID[0];
    let kp = VALID[1];
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("unknown-key", vec![img, kp, ("kernelpath", "/k")]),
        ("invalid-reference", vec![("addonImage", "Quay.io/X"), kp]),
        ("invalid-reference", vec![("addonImage", "[::1]:5000/a/b:v1"), kp]),
        ("invalid-reference", vec![("addonImage", "[fe80::1]/a:v1"), kp]),
        ("invalid-reference", vec![("addonImage", &long_hub[..]), kp]),
        ("invalid-path", vec![img, ("kernelPath", "boot/../vmlinuz")]),
        ("invalid-version", vec![img, kp, ("version", "-bad")]),
        ("invalid-provider", vec![img, kp, ("provider", "sev")]),
        ("invalid-sha256", vec![img, kp, ("kernelSha256", "abc")]),
        ("not-allowed", vec![img, kp, ("initrdPath", "/initrd")]),
        ("conflict", vec![img, ("provider", "tdx"), ("initrdPath", "/i"), ("imagePath", "/img")]),
        ("missing", vec![kp]),
        ("inconsistent", vec![img, kp, ("provider", "tdx"), ("initrdSha256", &b64[..])]),
        // Everything at once: every violation is listed, not just the first.
        (
            "unknown-key invalid-reference invalid-provider missing",
            vec![("addonImage", "Quay.io/X"), ("provider", "sev"), ("kernelpath", "/k")],
        ),
    ];
    for (i, (codes, data)) in cases.iter().enumerate() {
        let cm = configmap(NAME, data);
        let uid = format!("uid-{i}");
        let proto = if i % 2 == 0 { Proto::Http1 } else { Proto::Http2 };
        let r = rt.block_on(f.client.post(proto, "/validate", &create(&uid, &cm)));
        let resp = response(&r, &uid);
        let st = status(&resp);
        assert_eq!(
            (st.code, st.reason.as_deref(), st.status.as_deref()),
            (Some(422), Some("Invalid"), Some("Failure"))
        );
        let message = st.message.expect("message");
        let lines: Vec<String> = message.lines().skip(1).map(String::from).collect();
        assert_eq!(message.lines().next(), Some("invalid configuration:"), "{message}");
        for code in codes.split(' ') {
            assert!(lines.iter().any(|l| l.ends_with(&format!("[{code}]"))), "{codes}: no [{code}] in\n{message}");
        }
        assert_eq!(lines, preview_lines(&cm), "{codes}: the webhook and preview disagree");
        assert!(warnings(&resp).is_empty());
    }
}

#[test]
fn binary_data_and_a_key_in_both_maps_are_denied_by_name() {
    let f = start(&[], &[]);
    let rt = rt();
    let mut cm = configmap(NAME, VALID);
    cm.binary_data = Some(
        [
            ("blob".to_string(), k8s_openapi::ByteString(vec![0, 1, 2])),
            ("kernelPath".to_string(), k8s_openapi::ByteString(b"/boot/other".to_vec())),
        ]
        .into(),
    );
    let r = rt.block_on(f.client.post(Proto::Http2, "/validate", &create("uid-bin", &cm)));
    let st = status(&response(&r, "uid-bin"));
    assert_eq!(st.code, Some(422));
    let msg = st.message.expect("message");
    assert!(msg.contains("  binaryData.blob: ") && msg.contains("[not-allowed]"), "{msg}");
    assert!(msg.contains("  kernelPath: is set in both data and binaryData") && msg.contains("[conflict]"), "{msg}");
    // Policy violations of `data` are listed too.
    let mut cm2 = cm.clone();
    cm2.data.as_mut().expect("data").insert("provider".into(), "sev".into());
    let r = rt.block_on(f.client.post(Proto::Http1, "/validate", &create("uid-bin2", &cm2)));
    let msg = status(&response(&r, "uid-bin2")).message.expect("message");
    assert!(msg.contains("binaryData.blob") && msg.contains("[invalid-provider]"), "{msg}");
}

#[test]
fn delete_is_allowed_with_a_warning_and_others_untouched() {
    let f = start(&[], &[]);
    let rt = rt();
    let cm = configmap(NAME, VALID);
    // DELETE: object is null, oldObject holds the ConfigMap.
    let del = review("uid-del", "DELETE", ("", "v1", "ConfigMap"), NAME, None, Some(object(&cm)), false);
    let resp = response(&rt.block_on(f.client.post(Proto::Http1, "/validate", &del)), "uid-del");
    assert_eq!(resp["allowed"], true);
    let w = warnings(&resp);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("nodes keep the installed addon") && w[0].contains("uninstall"), "{w:?}");
    // An invalid ConfigMap with another name, a Secret with our name, and a CONNECT: allowed,
    // no warnings, no policy run (the invalid data would be denied otherwise).
    let bad = [("kernelpath", "/k")];
    let other = configmap("something-else", &bad);
    let secret = Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(NAME.into()),
            ..Default::default()
        },
        string_data: Some([("kernelpath".to_string(), "/k".to_string())].into()),
        ..Default::default()
    };
    let cases = [
        create("uid-other", &other),
        review("uid-other", "UPDATE", ("", "v1", "Secret"), NAME, Some(object(&secret)), None, false),
        review(
            "uid-other",
            "CREATE",
            ("apps", "v1", "ConfigMap"),
            NAME,
            Some(object(&configmap(NAME, &bad))),
            None,
            false,
        ),
        review("uid-other", "DELETE", ("", "v1", "ConfigMap"), "something-else", None, Some(object(&other)), false),
        review("uid-other", "CONNECT", ("", "v1", "ConfigMap"), NAME, None, None, false),
    ];
    for (i, c) in cases.iter().enumerate() {
        let resp = response(&rt.block_on(f.client.post(Proto::Http2, "/validate", c)), "uid-other");
        assert_eq!(resp["allowed"], true, "case {i}: {resp}");
        assert!(resp.get("warnings").is_none() && resp.get("status").is_none(), "case {i}: {resp}");
    }
    // generateName-style CREATE with an empty request.name: the object's name decides.
    let mut no_name = review("uid-gen", "CREATE", ("", "v1", "ConfigMap"), "", None, None, false);
    no_name["request"]["object"] = object(&configmap(NAME, &bad));
    let resp = response(&rt.block_on(f.client.post(Proto::Http1, "/validate", &no_name)), "uid-gen");
    assert_eq!(resp["allowed"], false, "{resp}");
}

#[test]
fn dry_run_behaves_the_same() {
    let f = start(&[], &[]);
    let rt = rt();
    for data in [VALID.to_vec(), vec![("kernelpath", "/k")]] {
        let cm = configmap(NAME, &data);
        let real =
            review("uid-dry", "UPDATE", ("", "v1", "ConfigMap"), NAME, Some(object(&cm)), Some(object(&cm)), false);
        let dry =
            review("uid-dry", "UPDATE", ("", "v1", "ConfigMap"), NAME, Some(object(&cm)), Some(object(&cm)), true);
        let a = response(&rt.block_on(f.client.post(Proto::Http1, "/validate", &real)), "uid-dry");
        let b = response(&rt.block_on(f.client.post(Proto::Http2, "/validate", &dry)), "uid-dry");
        assert_eq!(a, b);
    }
}

#[test]
fn malformed_reviews_get_400_and_are_logged() {
    let f = start(&[], &[]);
    let rt = rt();
    let good = create("uid-x", &configmap(NAME, VALID));
    let mut no_request = good.clone();
    no_request.as_object_mut().expect("object").remove("request");
    let mut v1beta1 = good.clone();
    v1beta1["apiVersion"] = "admission.k8s.io/v1beta1".into();
    let mut wrong_kind = good.clone();
    wrong_kind["kind"] = "ConfigMap".into();
    let mut no_uid = good.clone();
    no_uid["request"].as_object_mut().expect("request").remove("uid");
    let mut bad_object = good.clone();
    bad_object["request"]["object"]["data"] = serde_json::json!({"kernelPath": 7});
    let mut no_object = good.clone();
    no_object["request"]["object"] = Value::Null;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("malformed JSON", b"{\"apiVersion\": \"admission.k8s.io/v1\", ".to_vec()),
        ("not an object", b"[1,2]".to_vec()),
        ("empty body", Vec::new()),
        ("no request", serde_json::to_vec(&no_request).expect("json")),
        ("v1beta1", serde_json::to_vec(&v1beta1).expect("json")),
        ("wrong kind", serde_json::to_vec(&wrong_kind).expect("json")),
        ("no uid", serde_json::to_vec(&no_uid).expect("json")),
        ("object not a ConfigMap", serde_json::to_vec(&bad_object).expect("json")),
        ("CREATE without object", serde_json::to_vec(&no_object).expect("json")),
    ];
    let mut refusals = 0u64;
    for (what, body) in cases {
        let r = rt.block_on(async {
            let mut c = f.client.connect(Proto::Http1).await.expect("connect");
            c.send("POST", "/validate", full(body)).await.expect("request")
        });
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        if what == "v1beta1" {
            assert!(r.text().contains("admission.k8s.io/v1beta1"), "{what}: {}", r.text());
        }
        refusals += 1;
    }
    // One client: its first refusal is logged in full, the others counted in one line per
    // connection or interval (docs/webhook.md); every refusal is accounted for. The count of
    // the last connection is logged when the server sees it close: a 60 s failure detector.
    let give_up_at = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let logs = loop {
        let logs = f.hook.logs();
        if logged_refusals(&logs) >= refusals || std::time::Instant::now() > give_up_at {
            break logs;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(logs.contains("refused an admission request"), "{logs}");
    assert_eq!(logged_refusals(&logs), refusals, "{logs}");
    // Other paths and methods.
    let r = rt.block_on(f.client.get("/validate")).expect("GET");
    assert_eq!(r.status, 405);
    let r = rt.block_on(f.client.get("/nope")).expect("GET");
    assert_eq!(r.status, 404);
    assert_eq!(rt.block_on(f.client.get("/readyz")).expect("GET").status, 200);
}

#[test]
fn a_4_mib_body_is_refused_without_buffering_it() {
    let f = start(&[], &[]);
    let rt = rt();
    let big = vec![b' '; 4 << 20];
    for proto in [Proto::Http1, Proto::Http2] {
        // Declared length.
        let r = rt.block_on(async {
            let mut c = f.client.connect(proto).await.expect("connect");
            c.send("POST", "/validate", full(big.clone())).await
        });
        // The server may answer 413 before reading the body, or close the stream.
        if let Ok(r) = r {
            assert_eq!(r.status, 413, "{proto:?}: {}", r.text());
        }
        // No declared length: read with the cap.
        let r = rt.block_on(async {
            let mut c = f.client.connect(proto).await.expect("connect");
            c.send("POST", "/validate", unsized_body(64, 64 << 10)).await
        });
        if let Ok(r) = r {
            assert_eq!(r.status, 413, "{proto:?} streamed: {}", r.text());
        }
    }
    assert!(f.hook.logs().contains("larger than 3145728 bytes"), "{}", f.hook.logs());
    // Still serving.
    let r = rt.block_on(f.client.post(Proto::Http1, "/validate", &create("uid-after", &configmap(NAME, VALID))));
    assert_eq!(response(&r, "uid-after")["allowed"], true);
}

#[test]
fn a_looping_policy_is_denied_at_the_deadline() {
    let looping = guest("loop");
    let f = start(&[POLICY_FLAG, looping.to_str().expect("utf-8"), "--policy-timeout", "0.3"], &[]);
    let rt = rt();
    let started = Instant::now();
    let cm = configmap(NAME, &[("spin", "yes")]);
    let r = rt.block_on(f.client.post(Proto::Http2, "/validate", &create("uid-spin", &cm)));
    let st = status(&response(&r, "uid-spin"));
    assert_eq!(st.code, Some(500));
    let msg = st.message.expect("message");
    assert!(msg.contains("did not finish within"), "{msg}");
    // A failure detector (the loop never ends by itself), not a benchmark.
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    // The server is fine afterwards.
    let r = rt.block_on(f.client.post(Proto::Http1, "/validate", &create("uid-ok", &configmap(NAME, VALID))));
    assert_eq!(response(&r, "uid-ok")["allowed"], true);
}

/// kubelet's layout of a secret volume: `tls.crt -> ..data/tls.crt`, `..data -> ..<ts>`.
fn secret_volume_swap(dir: &Path, generation: &str, cert: &Path, key: &Path) {
    let ts = dir.join(format!("..{generation}"));
    std::fs::create_dir(&ts).expect("mkdir");
    std::fs::copy(cert, ts.join("tls.crt")).expect("cert");
    std::fs::copy(key, ts.join("tls.key")).expect("key");
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{generation}"), &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for f in ["tls.crt", "tls.key"] {
        if !dir.join(f).exists() {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).expect("symlink");
        }
    }
}

#[test]
fn certificate_rotation_while_serving() {
    let (ca1, ca2) = (TestCa::new(), TestCa::new());
    let vol = tempfile::tempdir().expect("tempdir");
    secret_volume_swap(vol.path(), "gen1", &ca1.server_cert, &ca1.server_key);
    let (cert, key) = (vol.path().join("tls.crt"), vol.path().join("tls.key"));
    let hook = Webhook::start(&[], &cert, &key, &["--cert-poll-interval", "0.2"], &ca1.ca_cert);
    let client = Client::new(hook.addr, &[&ca1.ca_cert, &ca2.ca_cert]);
    let rt = rt();
    let first = rt.block_on(client.served_cert());
    let pem_der = |p: &Path| {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        CertificateDer::from_pem_file(p).expect("pem").as_ref().to_vec()
    };
    assert_eq!(first, pem_der(&ca1.server_cert));
    // A connection opened before the swap keeps working across it.
    let mut conn = rt.block_on(client.connect(Proto::Http2)).expect("connect");
    let wait_for = |want: Vec<u8>, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let review = create("uid-rot", &configmap(NAME, VALID));
            assert_eq!(
                response(&rt.block_on(client.post(Proto::Http1, "/validate", &review)), "uid-rot")["allowed"],
                true
            );
            if rt.block_on(client.served_cert()) == want {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: the served certificate did not change:\n{}", hook.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // 1. kubelet's atomic `..data` symlink swap (service-ca and cert-manager secrets).
    secret_volume_swap(vol.path(), "gen2", &ca2.server_cert, &ca2.server_key);
    wait_for(pem_der(&ca2.server_cert), "..data swap");
    let r = rt.block_on(conn.post("/validate", &create("uid-old-conn", &configmap(NAME, VALID)))).expect("old conn");
    assert_eq!(response(&r, "uid-old-conn")["allowed"], true);
    // 2. Plain files replaced one at a time: a certificate whose key has not arrived yet is
    // not served (the old pair stays), then the pair is.
    let plain = tempfile::tempdir().expect("tempdir");
    let hook2 = Webhook::start(
        &[],
        &plain_copy(plain.path(), "tls.crt", &ca1.server_cert),
        &plain_copy(plain.path(), "tls.key", &ca1.server_key),
        &["--cert-poll-interval", "0.2"],
        &ca1.ca_cert,
    );
    let client2 = Client::new(hook2.addr, &[&ca1.ca_cert, &ca2.ca_cert]);
    plain_copy(plain.path(), "tls.crt", &ca2.server_cert);
    // The reloader saw the half pair and refused it (it logs so), then the old pair is served.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !hook2.logs().contains("not usable (yet)") {
        assert!(Instant::now() < deadline, "the half pair was not noticed:\n{}", hook2.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rt.block_on(client2.served_cert()), pem_der(&ca1.server_cert), "half a pair is not served");
    plain_copy(plain.path(), "tls.key", &ca2.server_key);
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(client2.served_cert()) != pem_der(&ca2.server_cert) {
        assert!(Instant::now() < deadline, "rename rotation not picked up:\n{}", hook2.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(hook.logs().contains("TLS certificate reloaded"));
}

/// Writes `src`'s content to `dir/name` atomically (temp file + rename).
fn plain_copy(dir: &Path, name: &str, src: &Path) -> std::path::PathBuf {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::copy(src, &tmp).expect("copy");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
    dir.join(name)
}

#[test]
fn sigterm_finishes_in_flight_requests_and_exits_0() {
    let looping = guest("loop");
    let mut f = start(
        &[POLICY_FLAG, looping.to_str().expect("utf-8"), "--policy-timeout", "1.5"],
        &["--concurrency", "2", "--review-timeout", "5"],
    );
    let rt = rt();
    let spin = create("uid-inflight", &configmap(NAME, &[("spin", "yes")]));
    let (c1, c2) = (f.client.clone(), f.client.clone());
    let (s1, s2) = (spin.clone(), spin.clone());
    let h1 = rt.spawn(async move { c1.post(Proto::Http1, "/validate", &s1).await });
    let h2 = rt.spawn(async move { c2.post(Proto::Http2, "/validate", &s2).await });
    // Both are running (the loop guest spins for 1.5 s) when SIGTERM arrives.
    std::thread::sleep(Duration::from_millis(500));
    f.hook.sigterm();
    for h in [h1, h2] {
        let r = rt.block_on(h).expect("task");
        let st = status(&response(&r, "uid-inflight"));
        assert!(st.message.expect("message").contains("did not finish within"));
    }
    let code = f.hook.wait(Duration::from_secs(10));
    assert_eq!(code.code(), Some(0), "{}", f.hook.logs());
    assert!(f.hook.logs().contains("SIGTERM"), "{}", f.hook.logs());
    // The listener is closed.
    assert!(rt.block_on(f.client.get("/healthz")).is_err());
    drop(f.ca);
}

// ---------------------------------------------------------------------------------------
// Under abuse (docs/webhook.md#under-abuse): idle connections, one address taking every
// slot, slow bodies, floods of large bodies. The probes answer throughout; memory stays
// under the limit.

use kata_addons_tests::abuse::{
    big_review, keep_alive_until_closed, open_idle, post_from, refused, source, trickle, until_closed,
};

#[test]
fn one_address_cannot_take_every_slot_and_a_full_server_makes_room_for_a_review() {
    let f = start(&[], &["--max-connections", "8", "--max-connections-per-ip", "4"]);
    let rt = rt();
    rt.block_on(async {
        let mut held = Vec::new();
        for (ip, n) in [(source(0), 4), (source(1), 4)] {
            for i in 0..n {
                let proto = if i % 2 == 0 { Proto::Http1 } else { Proto::Http2 };
                held.push(open_idle(&f.client, Some(ip), proto).await.expect("idle connection"));
            }
            assert!(refused(&f.client, Some(ip)).await, "a fifth connection from {ip} is closed at once");
        }
        // Every slot is taken: the probes have a listener and slots of their own.
        assert_eq!(f.hook.probe("/healthz").await.expect("probe"), 200);
        assert_eq!(f.hook.probe("/readyz").await.expect("probe"), 200);
        // A client with a review to send still gets in: the connection idle the longest
        // (the first one) is closed to make room.
        let oldest = held.remove(0);
        let (status, text) = small_review(&f, source(2)).await;
        assert_eq!(status, 200, "{text}");
        tokio::time::timeout(Duration::from_secs(60), until_closed(oldest)).await.expect("the oldest idle one closed");
        drop(held);
    });
    let logs = f.hook.logs();
    assert!(logs.contains("too many connections from this address"), "{logs}");
}

#[test]
fn idle_and_keep_alive_connections_are_closed_by_the_server() {
    let f = start(&[], &["--idle-timeout", "0.5"]);
    let rt = rt();
    rt.block_on(async {
        // Silent after the handshake (HTTP/1.1), after the preface and SETTINGS (HTTP/2),
        // and well-behaved keep-alive clients after one request (HTTP/2: pings answered).
        let silent1 = open_idle(&f.client, None, Proto::Http1).await.expect("h1");
        let silent2 = open_idle(&f.client, None, Proto::Http2).await.expect("h2");
        let (c1, c2) = (f.client.clone(), f.client.clone());
        let ka1 = tokio::spawn(async move { keep_alive_until_closed(&c1, None, Proto::Http1).await });
        let ka2 = tokio::spawn(async move { keep_alive_until_closed(&c2, None, Proto::Http2).await });
        let bound = Duration::from_secs(60);
        tokio::time::timeout(bound, until_closed(silent1)).await.expect("silent h1 closed by the server");
        tokio::time::timeout(bound, until_closed(silent2)).await.expect("silent h2 closed by the server");
        for ka in [ka1, ka2] {
            let ended = tokio::time::timeout(bound, ka).await.expect("keep-alive closed by the server");
            ended.expect("task").expect("closed cleanly (HTTP/2: GOAWAY)");
        }
    });
}

/// A small valid review from `from`: its HTTP status and body.
async fn small_review(f: &Fixture, from: std::net::IpAddr) -> (u16, String) {
    let body = serde_json::to_vec(&create("uid-small", &configmap(NAME, VALID))).expect("json");
    let mut conn = f.client.connect_from(Some(from), Proto::Http1).await.expect("connect");
    let r = conn.send("POST", "/validate", full(body)).await.expect("reply");
    (r.status, r.text())
}

/// When a retry loop of a test gives up: only a failure detector (a loaded CI machine may
/// take seconds for what takes milliseconds here), never a timing assertion.
fn give_up_at() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[test]
fn request_bodies_share_one_budget_taken_before_reading() {
    // 12 MiB in all; one address may hold a quarter (3 MiB, one largest body).
    let f = start(&[], &["--body-budget", "12", "--review-timeout", "0.5"]);
    let rt = rt();
    rt.block_on(async {
        let slow = |i: usize| {
            let client = f.client.clone();
            tokio::spawn(async move {
                let body = trickle(3 << 20, 1024, Duration::from_millis(200));
                post_from(&client, Some(source(i)), Proto::Http1, body).await
            })
        };
        let first = slow(0);
        // Once the slow body holds its address's share, that address is refused at once
        // while another one is served.
        let deadline = give_up_at();
        let text = loop {
            let (status, text) = small_review(&f, source(0)).await;
            if status == 503 {
                break text;
            }
            assert_eq!(status, 200, "{text}");
            assert!(Instant::now() < deadline, "the slow body never took its share:\n{}", f.hook.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(text.contains("this client already has 3145728 bytes"), "{text}");
        assert_eq!(small_review(&f, source(9)).await.0, 200);
        // Three more slow bodies from other addresses: the whole budget is held, a review
        // from anywhere waits for the review deadline and is refused (503, Retry-After).
        let others: Vec<_> = (1..4).map(slow).collect();
        let large = big_review(1 << 20, false);
        let deadline = give_up_at();
        let text = loop {
            let mut conn = f.client.connect_from(Some(source(9)), Proto::Http1).await.expect("connect");
            let r = conn.send("POST", "/validate", full(large.clone())).await.expect("reply");
            if r.status == 503 {
                break r.text();
            }
            assert!(Instant::now() < deadline, "the budget never filled up:\n{}", f.hook.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(text.contains("webhook overloaded: 12582912 bytes of request bodies already in flight"), "{text}");
        // Reviews of a few KiB (what the API server sends) have a reserve of their own.
        assert_eq!(small_review(&f, source(10)).await.0, 200);
        // The clients give up: the budget is free again.
        for t in others.into_iter().chain([first]) {
            t.abort();
        }
        let deadline = give_up_at();
        loop {
            let mut conn = f.client.connect_from(Some(source(9)), Proto::Http1).await.expect("connect");
            if conn.send("POST", "/validate", full(large.clone())).await.expect("reply").status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "the budget was not given back:\n{}", f.hook.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[test]
fn peak_rss_stays_under_the_deployment_limit_under_a_mix_of_abusive_clients() {
    // Default limits, as deployed (memory limit 256Mi).
    const LIMIT_KIB: u64 = 256 << 10;
    let f = start(&[], &[]);
    let rt = rt();
    let before = f.hook.peak_rss_kib();
    let (statuses, probes) = rt.block_on(async {
        // 240 silent connections from 4 addresses, HTTP/1.1 and HTTP/2.
        let mut idle = Vec::new();
        for ip in 0..4 {
            for i in 0..60 {
                let proto = if i % 2 == 0 { Proto::Http1 } else { Proto::Http2 };
                idle.push(open_idle(&f.client, Some(source(ip)), proto).await.expect("idle connection"));
            }
        }
        // 12 bodies trickling at 5 KiB/s from 4 addresses.
        let mut slow = Vec::new();
        for i in 0..12 {
            let client = f.client.clone();
            slow.push(tokio::spawn(async move {
                let body = trickle(3 << 20, 1024, Duration::from_millis(200));
                post_from(&client, Some(source(4 + i % 4)), Proto::Http1, body).await
            }));
        }
        // 160 bodies of 3 MiB at once from 4 more addresses, over HTTP/1.1 and HTTP/2:
        // an object that is one long array (never parsed), a ConfigMap over its size limit.
        let array = big_review(3 << 20, false);
        let cm = big_review(3 << 20, true);
        let mut flood = Vec::new();
        for i in 0..160 {
            let client = f.client.clone();
            let body = if i % 2 == 0 { array.clone() } else { cm.clone() };
            let proto = if i % 4 < 2 { Proto::Http1 } else { Proto::Http2 };
            flood.push(tokio::spawn(
                async move { post_from(&client, Some(source(8 + i % 4)), proto, full(body)).await },
            ));
        }
        let mut probes = Vec::new();
        while !flood.iter().all(|t| t.is_finished()) {
            probes.push(f.hook.probe("/healthz").await);
        }
        let mut statuses = Vec::new();
        for t in flood {
            statuses.push(t.await.expect("task"));
        }
        for t in slow {
            t.abort();
        }
        drop(idle);
        (statuses, probes)
    });
    let peak = f.hook.peak_rss_kib();
    let answered = statuses.iter().filter(|s| matches!(s, Ok(200))).count();
    // Answered, or refused as overloaded (over HTTP/1.1 the server may close the connection
    // after refusing, before the client finished sending: a write error).
    for s in &statuses {
        assert!(matches!(s, Ok(200 | 503) | Err(_)), "{s:?}");
    }
    assert!(answered > 0, "{statuses:?}");
    assert!(probes.iter().all(|p| matches!(p, Ok(200))), "{probes:?}");
    assert!(
        peak < LIMIT_KIB,
        "peak RSS {peak} KiB (at start {before} KiB) is over the Deployment's limit of {LIMIT_KIB} KiB"
    );
}

/// Refusals a webhook log accounts for: one per "refused an admission request" line plus the
/// `refused` count of every "more admission requests refused" line (text or JSON format).
fn logged_refusals(logs: &str) -> u64 {
    let mut n = logs.matches("refused an admission request").count() as u64;
    for line in logs.lines().filter(|l| l.contains("more admission requests refused")) {
        let Some(at) = line.find("refused=").map(|i| i + 8).or_else(|| line.find("\"refused\":").map(|i| i + 10))
        else {
            continue;
        };
        let digits: String = line[at..].chars().take_while(char::is_ascii_digit).collect();
        n += digits.parse::<u64>().unwrap_or(0);
    }
    n
}
