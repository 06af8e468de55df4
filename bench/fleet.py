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


CTD_CONFIG = (
    'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-qemu-tdx]\n'
    '  runtime_type = "io.containerd.kata-qemu-tdx.v2"\n'
    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-qemu-tdx.options]\n'
    '  ConfigPath = "/etc/kata-containers/kata-tdx/configuration.toml"\n'
)
UPSTREAM_NAME = "upstream.bench"


def containerd_node(root, server, cache):
    """A containerd configuration and a hosts.toml naming `cache` before `server`."""
    etc = os.path.join(root, "etc/containerd")
    hosts = os.path.join(etc, "certs.d", UPSTREAM_NAME)
    os.makedirs(hosts)
    with open(os.path.join(etc, "config.toml"), "w") as f:
        f.write(CTD_CONFIG)
    with open(os.path.join(hosts, "hosts.toml"), "w") as f:
        f.write(f'server = "http://{server}"\n[host."http://{cache}"]\n  capabilities = ["pull", "resolve"]\n')


def install_cmd(a, root, addr, insecure=True):
    env = dict(os.environ)
    env.update(
        ADDON_IMAGE=f"{addr}/{REPO}:{TAG}",
        ADDON_PROVIDER="tdx",
        ADDON_KERNEL_PATH=KERNEL,
        ADDON_INITRD_PATH=INITRD,
        RUST_LOG="warn",
    )
    cmd = [a.bin, "--cache-dir", os.path.join(a.work, "policy-cache"), "install", "--root", root]
    if insecure:
        cmd += ["--insecure-registry", addr]
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


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cache(a, n, upstream):
    """A docker-registry in proxy mode in front of `upstream`, fresh storage; its address."""
    d = os.path.join(a.work, f"cache-{n}")
    os.makedirs(d)
    port = free_port()
    with open(os.path.join(d, "config.yml"), "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n"
                f"    rootdirectory: {d}/storage\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: bench\n"
                f"proxy:\n  remoteurl: http://{upstream}\n")
    log = open(os.path.join(d, "log"), "w")
    p = subprocess.Popen(["docker-registry", "serve", os.path.join(d, "config.yml")], stdout=log, stderr=log)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).read()
            return p, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("the pull-through cache did not start")


def run_cache(a, n, mode):
    """N nodes whose hosts.toml name one pull-through cache (or a dead address) before the
    upstream (the throttling proxy, node i's server at 127.0.1.(i+2), the cache's 127.0.1.1);
    bytes served upstream per node and wall times. `mode`: "cold cache" (all at once),
    "warm cache" (node 0 alone first, untimed, its bytes counted), "dead cache"."""
    dead = mode == "dead cache"
    proxy = subprocess.Popen(
        [a.proxy, "--upstream", a.registry, "--nodes", str(n + 1), "--max-blobs", str(a.max_blobs),
         "--retry-after", a.retry_after],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    cache = None
    try:
        first = proxy.stdout.readline().split()
        if not first or first[0] != "listening":
            raise SystemExit(f"throttle-proxy did not start: {first}")
        port = first[1]
        if dead:
            cache_addr = f"127.0.0.1:{free_port()}"
        else:
            cache, cache_addr = start_cache(a, n, f"127.0.1.1:{port}")
        roots = []
        for i in range(n):
            root = node_root(a.work, n, i)
            containerd_node(root, f"127.0.1.{i + 2}:{port}", cache_addr)
            roots.append(root)
        if mode == "warm cache":
            cmd, env = install_cmd(a, roots[0], UPSTREAM_NAME, insecure=False)
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs = []
        t0 = time.perf_counter()
        for i, root in enumerate(roots):
            if mode == "warm cache" and i == 0:
                procs.append((subprocess.Popen(["true"]), open(os.devnull, "w+")))
                continue
            cmd, env = install_cmd(a, root, UPSTREAM_NAME, insecure=False)
            err = open(os.path.join(a.work, f"fleet-{n}", f"node-{i:03d}.log"), "w+")
            procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err), err))
        done_at = [None] * n
        pending = list(range(n))
        while pending:
            still = []
            for i in pending:
                if procs[i][0].poll() is None:
                    still.append(i)
                else:
                    done_at[i] = time.perf_counter() - t0
            pending = still
            if pending:
                time.sleep(0.005)
        ok, ends, errors = 0, [], []
        for i, (p, err) in enumerate(procs):
            err.seek(0)
            text = err.read()
            err.close()
            if p.returncode == 0:
                ok += 1
                if not (mode == "warm cache" and i == 0):
                    ends.append(done_at[i])
            else:
                errors.append(f"node {i}: exit {p.returncode}: {text.strip().splitlines()[-1] if text.strip() else ''}")
        proxy.stdin.write("stats\n")
        proxy.stdin.flush()
        stats = json.loads(proxy.stdout.readline())
    finally:
        if cache is not None:
            cache.kill()
            cache.wait()
        proxy.stdin.close()
        proxy.wait(timeout=30)
    by_ip = {s["ip"]: s.get("blob_bytes", 0) + s.get("manifest_bytes", 0) for s in stats["nodes"]}
    via_cache = by_ip.get("127.0.1.1", 0)
    upstream = sum(by_ip.values())
    shutil.rmtree(os.path.join(a.work, f"fleet-{n}"), ignore_errors=True)
    shutil.rmtree(os.path.join(a.work, f"cache-{n}"), ignore_errors=True)
    return {
        "n": n,
        "mode": mode,
        "ok": ok,
        "wall": max(ends) if ends else float("nan"),
        "p50": pct(ends, 50) if ends else float("nan"),
        "p99": pct(ends, 99) if ends else float("nan"),
        "upstream": upstream,
        "via_cache": via_cache,
        "errors": errors,
    }


def main():
    ap = argparse.ArgumentParser()
    for k in ("bin", "proxy", "registry", "work", "images", "nodes", "max_blobs", "retry_after", "command"):
        ap.add_argument("--" + k.replace("_", "-"), required=True)
    ap.add_argument("--write")
    ap.add_argument("--cache", action="store_true", help="also the pull-through cache and dead-cache runs")
    ap.add_argument("--pull-deadline", type=float, default=600.0, help="kata-addons' per-pull deadline, s")
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
    cache_rows = []
    if a.cache:
        need = need_blob + need_manifest
        direct = {r["n"]: r["wall"] for r in rows}
        for n in [int(x) for x in a.nodes.split()]:
            for mode in ("cold cache", "warm cache", "dead cache"):
                load = os.getloadavg()[0]
                r = run_cache(a, n, mode)
                r["load"] = load
                cache_rows.append(r)
                print(f"N={n} {r['mode']}: {r['ok']}/{n} ok, wall {r['wall']:.2f} s, p99 {r['p99']:.2f} s, "
                      f"upstream {r['upstream']} B ({r['upstream'] / n:.0f} B/node; {r['via_cache']} B through the cache), load {load:.1f}", file=sys.stderr)
                for e in r["errors"][:5]:
                    print("  " + e, file=sys.stderr)
        lines = [
            f"Run {now}; `{a.command}`. Every node root has a containerd configuration (a Kata handler, "
            f"`config_path`) and `certs.d/{UPSTREAM_NAME}/hosts.toml` naming one `docker-registry` in proxy mode "
            "(fresh storage per run) before the upstream (the registry behind the throttling proxy, which "
            "counts the bytes it serves). *cold cache*: all N nodes at once on an empty cache; *warm cache*: "
            "one node alone first (untimed; its bytes counted), then the other N − 1 at once; *dead cache*: "
            "the same file naming a closed port. A node needs "
            f"{need} B; the goal for the cache is at most that once for the fleet ({need} / N per node).",
            "",
            "| nodes | mode | succeeded | wall to last success s | p50 per node s | p99 per node s | direct run wall s "
            "| bytes served upstream | of which to the cache | per node | ≤ need / N | load avg (1 min) at start |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in cache_rows:
            per = r["upstream"] / r["n"]
            goal = "—" if r["mode"] == "dead cache" else ("yes" if per <= need / r["n"] else "NO")
            dw = direct.get(r["n"], float("nan"))
            lines.append(
                f"| {r['n']} | {r['mode']} | {r['ok']}/{r['n']} | {r['wall']:.2f} | {r['p50']:.2f} | {r['p99']:.2f} "
                f"| {dw:.2f} | {r['upstream']} | {r['via_cache']} | {per:.0f} | {goal} | {r['load']:.1f} |"
            )
        text = "\n".join(lines)
        print(text)
        if a.write:
            with open(a.write) as f:
                doc = f.read()
            begin, end = "<!-- bench/fleet cache begin -->", "<!-- bench/fleet cache end -->"
            block = f"{begin}\n{text}\n{end}"
            if begin in doc and end in doc:
                doc = doc[: doc.index(begin)] + block + doc[doc.index(end) + len(end):]
            else:
                fleet_end = "<!-- bench/fleet end -->"
                i = doc.index(fleet_end) + len(fleet_end) if fleet_end in doc else len(doc)
                doc = doc[:i] + "\n\n" + block + doc[i:]
            with open(a.write, "w") as f:
                f.write(doc)
    if any(r["ok"] != r["n"] for r in cache_rows):
        raise SystemExit("bench/fleet: a node failed with the pull-through cache or past a dead one")
    if any(r["ok"] == r["n"] and r["wall"] > a.pull_deadline for r in cache_rows):
        raise SystemExit("bench/fleet: a node took longer than the per-pull deadline")
    if any(r["ok"] != r["n"] or not r["exact"] for r in rows):
        raise SystemExit("bench/fleet: a node failed or was served more than it needs")


if __name__ == "__main__":
    main()
