#!/usr/bin/env python3
"""Helper of bench/fleet: runs N concurrent `kata-addons install` processes (one node root
and one proxy address each) against a throttling proxy in front of one docker-registry, and
reports successes, wall time, p50/p99 per node, retries and bytes served per node.

Standard library only. See bench/fleet for the entry point.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request

KERNEL = "/boot/vmlinuz"
INITRD = "/boot/initrd.img"
REPO = "bench"
TAG = "top"


def node_root(work, n, i):
    root = os.path.join(work, f"fleet-{n}", f"node-{i:03d}")
    cfg = os.path.join(root, "etc/kata-containers/kata-tdx")
    os.makedirs(cfg)
    with open(os.path.join(cfg, "configuration.toml"), "w") as f:
        f.write('[hypervisor.qemu]\npath = "/usr/bin/qemu-system-x86_64"\n')
    return root


def install_cmd(a, root, addr):
    env = dict(os.environ)
    env.update(
        ADDON_IMAGE=f"{addr}/{REPO}:{TAG}",
        ADDON_PROVIDER="tdx",
        ADDON_KERNEL_PATH=KERNEL,
        ADDON_INITRD_PATH=INITRD,
        RUST_LOG="warn",
    )
    cmd = [a.bin, "--cache-dir", os.path.join(a.work, "policy-cache"), "install", "--root", root,
           "--insecure-registry", addr]
    return cmd, env


def manifest_size(registry):
    req = urllib.request.Request(
        f"http://{registry}/v2/{REPO}/manifests/{TAG}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(req) as r:
        return len(r.read())


def pct(xs, p):
    """Nearest-rank percentile."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def run_fleet(a, n, need_blob, need_manifest):
    proxy = subprocess.Popen(
        [a.proxy, "--upstream", a.registry, "--nodes", str(n), "--max-blobs", str(a.max_blobs),
         "--retry-after", a.retry_after],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        first = proxy.stdout.readline().split()
        if not first or first[0] != "listening":
            raise SystemExit(f"throttle-proxy did not start: {first}")
        port = first[1]
        roots = [node_root(a.work, n, i) for i in range(n)]
        procs = []
        t0 = time.perf_counter()
        for i, root in enumerate(roots):
            cmd, env = install_cmd(a, root, f"127.0.1.{i + 1}:{port}")
            err = open(os.path.join(a.work, f"fleet-{n}", f"node-{i:03d}.log"), "w+")
            procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err), err, time.perf_counter()))
        ends, ok, retries, errors = [], 0, [], []
        pending = list(range(n))
        done_at = [None] * n
        while pending:
            still = []
            for i in pending:
                p = procs[i][0]
                if p.poll() is None:
                    still.append(i)
                else:
                    done_at[i] = time.perf_counter()
            pending = still
            if pending:
                time.sleep(0.005)
        for i, (p, err, start) in enumerate(procs):
            err.seek(0)
            text = err.read()
            err.close()
            retries.append(sum(1 for line in text.splitlines() if " retry " in line and "of at most" in line))
            if p.returncode == 0:
                ok += 1
                ends.append(done_at[i] - t0)
            else:
                errors.append(f"node {i}: exit {p.returncode}: {text.strip().splitlines()[-1] if text.strip() else ''}")
        proxy.stdin.write("stats\n")
        proxy.stdin.flush()
        stats = json.loads(proxy.stdout.readline())
    finally:
        proxy.stdin.close()
        proxy.wait(timeout=30)
    per_node = {s["ip"]: s for s in stats["nodes"]}
    served = []
    for i in range(n):
        s = per_node.get(f"127.0.1.{i + 1}", {})
        served.append((s.get("blob_bytes", 0), s.get("manifest_bytes", 0), s.get("throttled", 0)))
    exact = all(b == need_blob and m == need_manifest for b, m, _ in served)
    shutil.rmtree(os.path.join(a.work, f"fleet-{n}"), ignore_errors=True)
    return {
        "n": n,
        "ok": ok,
        "wall": max(ends) if ends else float("nan"),
        "p50": pct(ends, 50) if ends else float("nan"),
        "p99": pct(ends, 99) if ends else float("nan"),
        "throttled": sum(t for _, _, t in served),
        "retries_total": sum(retries),
        "retries_max": max(retries),
        "served_min": min(b + m for b, m, _ in served),
        "served_max": max(b + m for b, m, _ in served),
        "exact": exact,
        "peak_blobs": stats["peak_blobs"],
        "errors": errors,
    }


def main():
    ap = argparse.ArgumentParser()
    for k in ("bin", "proxy", "registry", "work", "images", "nodes", "max_blobs", "retry_after", "command"):
        ap.add_argument("--" + k.replace("_", "-"), required=True)
    ap.add_argument("--write")
    a = ap.parse_args()
    with open(a.images) as f:
        img = json.load(f)[TAG]
    need_blob = img["needed_bytes"]
    need_manifest = manifest_size(a.registry)
    # Warm the policy cache (untimed, straight to the registry).
    root = node_root(a.work, 0, 0)
    cmd, env = install_cmd(a, root, a.registry)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(os.path.join(a.work, "fleet-0"), ignore_errors=True)
    rows = []
    for n in [int(x) for x in a.nodes.split()]:
        load = os.getloadavg()[0]
        r = run_fleet(a, n, need_blob, need_manifest)
        r["load"] = load
        rows.append(r)
        print(f"N={n}: {r['ok']}/{n} ok, wall {r['wall']:.2f} s, p50 {r['p50']:.2f} s, p99 {r['p99']:.2f} s, "
              f"429s {r['throttled']}, retry lines {r['retries_total']} (max {r['retries_max']}/node), "
              f"served/node {r['served_min']}..{r['served_max']} (exact: {r['exact']}), peak blobs {r['peak_blobs']}, "
              f"load {load:.1f}", file=sys.stderr)
        for e in r["errors"][:5]:
            print("  " + e, file=sys.stderr)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Run {now} on {platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}; `{a.command}`. "
        f"Image `top` of bench/compare (4 × 48 MiB base layers + a {need_blob / 1e6:.1f} MB top layer); "
        f"a node needs the manifest ({need_manifest} B) and the top layer ({need_blob} B) = {need_blob + need_manifest} B.",
        "",
        "| nodes | succeeded | wall to last success s | p50 per node s | p99 per node s | 429s answered | retries logged (max per node) | bytes served per node | = needed | peak blob downloads | load avg (1 min) at start |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        served = f"{r['served_min']}" if r["served_min"] == r["served_max"] else f"{r['served_min']}–{r['served_max']}"
        lines.append(
            f"| {r['n']} | {r['ok']}/{r['n']} | {r['wall']:.2f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['throttled']} "
            f"| {r['retries_total']} ({r['retries_max']}) | {served} | {'yes' if r['exact'] else 'NO'} | {r['peak_blobs']} "
            f"| {r['load']:.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    if a.write:
        with open(a.write) as f:
            doc = f.read()
        begin, end = "<!-- bench/fleet begin -->", "<!-- bench/fleet end -->"
        block = f"{begin}\n{text}\n{end}"
        if begin in doc and end in doc:
            doc = doc[: doc.index(begin)] + block + doc[doc.index(end) + len(end):]
        else:
            doc = doc.rstrip("\n") + "\n\n## Many nodes, one registry\n\n" + block + "\n"
        with open(a.write, "w") as f:
            f.write(doc)
    if any(r["ok"] != r["n"] or not r["exact"] for r in rows):
        raise SystemExit("bench/fleet: a node failed or was served more than it needs")


if __name__ == "__main__":
    main()
