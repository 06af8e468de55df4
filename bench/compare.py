#!/usr/bin/env python3
"""Helper of bench/compare: builds the benchmark images straight into a docker-registry
filesystem storage, and times `kata-addons install` against the reference pipeline
(skopeo copy + umoci unpack + cp), podman (pull + create + cp, vfs storage: the method of
OpenShift's MachineConfig mode) and the floor (manifest + needed blobs through gzip -dc).

Standard library only. See bench/compare for the entry point.
"""

import argparse
import datetime
import gzip  # noqa: F401  (documents the format; zlib does the work)
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import zlib
from concurrent.futures import ProcessPoolExecutor

MiB = 1 << 20
KERNEL = "/boot/vmlinuz"
INITRD = "/boot/initrd.img"
REPO = "bench"
# Full scale (the reference images: BENCHMARKS.md) and a quick smoke scale.
SCALES = {
    "full": {"fill": 48 * MiB, "kernel": 8 * MiB, "initrd": 24 * MiB, "end_filler": 160 * MiB, "base": 4},
    "quick": {"fill": 6 * MiB, "kernel": 1 * MiB, "initrd": 3 * MiB, "end_filler": 20 * MiB, "base": 4},
}
# Scaling: number of base (fill) layers for ~0.25, 1 and 2 GB images at full scale.
SCALING = [("0.25g", 4), ("1g", 20), ("2g", 40)]
LEVEL = 6  # gzip's and Go's default level, as image builders use


# ---------------------------------------------------------------------------- images


def v2(storage):
    return os.path.join(storage, "docker", "registry", "v2")


def blob_dir(storage, hexd):
    return os.path.join(v2(storage), "blobs", "sha256", hexd[:2], hexd)


def write_link(d, digest):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "link"), "w") as f:
        f.write(digest)


def put_blob(storage, data):
    hexd = hashlib.sha256(data).hexdigest()
    d = blob_dir(storage, hexd)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "data"), "wb") as f:
        f.write(data)
    return "sha256:" + hexd


def tar_header(name, size, kind=tarfile.REGTYPE):
    ti = tarfile.TarInfo(name)
    ti.size = size if kind == tarfile.REGTYPE else 0
    ti.type = kind
    ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    ti.mtime = 1_700_000_000
    ti.uname = ti.gname = "root"
    return ti.tobuf(format=tarfile.PAX_FORMAT)


def build_layer(args):
    """Writes one gzip'd tar layer of random files into the registry storage.

    `files` is a list of (path, size); directories are added for every parent.
    Returns (name, digest, diff_id, compressed size)."""
    storage, name, files = args
    tmp = os.path.join(v2(storage), f".tmp-{name}-{os.getpid()}")
    os.makedirs(os.path.dirname(tmp), exist_ok=True)
    comp = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)
    h_c, h_u = hashlib.sha256(), hashlib.sha256()
    size = 0
    with open(tmp, "wb") as out:

        def emit(b):
            nonlocal size
            h_u.update(b)
            c = comp.compress(b)
            if c:
                h_c.update(c)
                out.write(c)
                size += len(c)

        dirs = set()
        for path, _ in files:
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    emit(tar_header(d + "/", 0, tarfile.DIRTYPE))
        for path, n in files:
            emit(tar_header(path.strip("/"), n))
            left = n
            while left:
                k = min(left, 4 * MiB)
                emit(os.urandom(k))
                left -= k
            if n % 512:
                emit(b"\0" * (512 - n % 512))
        emit(b"\0" * 1024)
        c = comp.flush()
        h_c.update(c)
        out.write(c)
        size += len(c)
    hexd = h_c.hexdigest()
    d = blob_dir(storage, hexd)
    os.makedirs(d, exist_ok=True)
    os.replace(tmp, os.path.join(d, "data"))
    return name, "sha256:" + hexd, "sha256:" + h_u.hexdigest(), size


def gen(a):
    sc = SCALES[a.scale]
    storage = a.storage
    catalog_path = os.path.join(storage, f"catalog-{a.scale}.json")
    catalog = {}
    if os.path.exists(catalog_path):
        with open(catalog_path) as f:
            catalog = json.load(f)
    n_fill = max(n for _, n in SCALING) if a.scaling else sc["base"]
    wanted = {f"fill-{i:02d}": [(f"/usr/share/fill/fill-{i:02d}.bin", sc["fill"])] for i in range(1, n_fill + 1)}
    wanted["files"] = [(KERNEL, sc["kernel"]), (INITRD, sc["initrd"])]
    wanted["end"] = [("/usr/share/fill/filler.bin", sc["end_filler"]), (KERNEL, sc["kernel"]), (INITRD, sc["initrd"])]
    todo = [
        (storage, name, files)
        for name, files in wanted.items()
        if name not in catalog or not os.path.exists(os.path.join(blob_dir(storage, catalog[name]["digest"][7:]), "data"))
    ]
    if todo:
        total = sum(n for _, _, fs in todo for _, n in fs)
        print(f"generating {len(todo)} layers ({total / 1e9:.2f} GB of random data, gzip -{LEVEL})", file=sys.stderr)
        t0 = time.time()
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as ex:
            for name, digest, diff_id, size in ex.map(build_layer, todo):
                catalog[name] = {"digest": digest, "diff_id": diff_id, "size": size}
        print(f"generated in {time.time() - t0:.1f} s", file=sys.stderr)
        with open(catalog_path, "w") as f:
            json.dump(catalog, f, indent=1)

    fills = [f"fill-{i:02d}" for i in range(1, n_fill + 1)]
    images = {"top": fills[: sc["base"]] + ["files"], "end": ["end"]}
    if a.scaling:
        for label, n in SCALING:
            images[f"top-{label}"] = fills[:n] + ["files"]
            images[f"bottom-{label}"] = ["files"] + fills[:n]
    out = {}
    for tag, layer_names in images.items():
        layers = [catalog[n] for n in layer_names]
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [l["diff_id"] for l in layers]},
            }
        ).encode()
        cdigest = put_blob(storage, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": len(config)},
                "layers": [
                    {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": l["digest"], "size": l["size"]}
                    for l in layers
                ],
            }
        ).encode()
        mdigest = put_blob(storage, manifest)
        repo = os.path.join(v2(storage), "repositories", REPO)
        for d in [cdigest] + [l["digest"] for l in layers]:
            write_link(os.path.join(repo, "_layers", "sha256", d[7:]), d)
        m = os.path.join(repo, "_manifests")
        write_link(os.path.join(m, "revisions", "sha256", mdigest[7:]), mdigest)
        write_link(os.path.join(m, "tags", tag, "current"), mdigest)
        write_link(os.path.join(m, "tags", tag, "index", "sha256", mdigest[7:]), mdigest)
        # The blobs a minimal client must read: top down to the layer holding the files.
        holder = max(i for i, n in enumerate(layer_names) if n in ("files", "end"))
        needed = [l["digest"] for l in layers[holder:]][::-1]
        out[tag] = {
            "layers": layer_names,
            "image_bytes": sum(l["size"] for l in layers) + len(config),
            "needed": needed,
            "needed_bytes": sum(l["size"] for l in layers[holder:]),
            "files_bytes": sc["kernel"] + sc["initrd"],
        }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


# ---------------------------------------------------------------------------- timing


def disk_usage(path):
    """Bytes of disk allocated under path (like du -s --block-size=1), 0 if absent."""
    total = 0
    if not os.path.lexists(path):
        return 0
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            try:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
            except FileNotFoundError:
                pass
    try:
        total += os.lstat(path).st_blocks * 512
    except FileNotFoundError:
        pass
    return total


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            b = f.read(4 * MiB)
            if not b:
                return h.hexdigest()
            h.update(b)


def timed(cmd, env, tfile):
    """Runs cmd under /usr/bin/time; returns (wall s, peak RSS KiB, bytes written)."""
    full = ["/usr/bin/time", "-f", "%M %O", "-o", tfile] + cmd
    t0 = time.perf_counter()
    r = subprocess.run(full, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.stderr.write(r.stderr.decode(errors="replace"))
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}")
    with open(tfile) as f:
        last = f.read().strip().splitlines()[-1].split()
    return wall, int(last[0]), int(last[1]) * 512


class Variants:
    def __init__(self, a, images):
        self.a = a
        self.images = images
        self.addr = a.registry
        self.work = a.work
        self.env = dict(os.environ)
        self.env["TMPDIR"] = os.path.join(self.work, "tmp")
        os.makedirs(self.env["TMPDIR"], exist_ok=True)
        self.cache = os.path.join(self.work, "policy-cache")
        self.counter = 0

    def fresh(self, name):
        self.counter += 1
        p = os.path.join(self.work, f"{name}-{self.counter}")
        shutil.rmtree(p, ignore_errors=True)
        return p

    def ours(self, tag):
        root = self.fresh("node")
        os.makedirs(os.path.join(root, "etc/kata-containers/kata-tdx"))
        with open(os.path.join(root, "etc/kata-containers/kata-tdx/configuration.toml"), "w") as f:
            f.write('[hypervisor.qemu]\npath = "/usr/bin/qemu-system-x86_64"\n')
        env = dict(self.env)
        env.update(
            ADDON_IMAGE=f"{self.addr}/{REPO}:{tag}",
            ADDON_PROVIDER="tdx",
            ADDON_KERNEL_PATH=KERNEL,
            ADDON_INITRD_PATH=INITRD,
            RUST_LOG="warn",
        )
        cmd = [self.a.bin, "--cache-dir", self.cache, "install", "--root", root, "--insecure-registry", self.addr]
        addons = os.path.join(root, "etc/kata-containers/addons")

        def measure():
            files = []
            for d, _, fs in os.walk(addons):
                if d != addons:  # the version directory; state.json is beside it
                    files += [os.path.join(d, f) for f in fs]
            installed = sum(os.lstat(f).st_blocks * 512 for f in files)
            return disk_usage(root) - installed - disk_usage(os.path.join(root, "etc/kata-containers/kata-tdx/configuration.toml")), files

        return cmd, env, root, measure

    def reference(self, tag):
        w = self.fresh("ref")
        os.makedirs(w)
        dest = os.path.join(w, "dest")
        script = (
            "set -e\n"
            f"skopeo copy --quiet --remove-signatures --src-tls-verify=false docker://{self.addr}/{REPO}:{tag} oci:{w}/oci:{tag}\n"
            f"umoci unpack --rootless --image {w}/oci:{tag} {w}/bundle 2>/dev/null\n"
            f"mkdir -p {dest}\n"
            f"cp {w}/bundle/rootfs{KERNEL} {dest}/vmlinuz\n"
            f"cp {w}/bundle/rootfs{INITRD} {dest}/initrd.img\n"
        )

        def measure():
            temp = disk_usage(os.path.join(w, "oci")) + disk_usage(os.path.join(w, "bundle"))
            return temp, [os.path.join(dest, "vmlinuz"), os.path.join(dest, "initrd.img")]

        return ["bash", "-c", script], self.env, w, measure

    def podman(self, tag):
        """podman pull + create + cp, as a MachineConfig-style node would, with every piece of
        podman state (storage, run root, libpod tmp, blob staging via TMPDIR) in a throwaway
        directory; vfs storage (no overlay mounts, so it runs anywhere root runs). The image
        reference is fully qualified: podman talks to the loopback registry only."""
        w = self.fresh("podman")
        os.makedirs(os.path.join(w, "tmp"))
        dest = os.path.join(w, "dest")
        image = f"{self.addr}/{REPO}:{tag}"
        p = (
            f"podman --root {w}/root --runroot {w}/run --tmpdir {w}/libpod --storage-driver vfs "
            "--cgroup-manager cgroupfs --events-backend none"
        )
        script = (
            "set -e\n"
            f"export TMPDIR={w}/tmp\n"
            f"{p} pull --quiet --tls-verify=false {image}\n"
            f"{p} create --network none --name bench {image} true\n"
            f"mkdir -p {dest}\n"
            f"{p} cp bench:{KERNEL} {dest}/vmlinuz\n"
            f"{p} cp bench:{INITRD} {dest}/initrd.img\n"
        )

        def measure():
            temp = sum(disk_usage(os.path.join(w, d)) for d in ("root", "run", "libpod", "tmp"))
            return temp, [os.path.join(dest, "vmlinuz"), os.path.join(dest, "initrd.img")]

        return ["bash", "-c", script], self.env, w, measure

    def floor(self, tag):
        base = f"http://{self.addr}/v2/{REPO}"
        lines = [
            "set -eo pipefail",
            f"curl -sSf -H 'Accept: application/vnd.oci.image.manifest.v1+json' {base}/manifests/{tag} -o /dev/null",
        ]
        for d in self.images[tag]["needed"]:
            lines.append(f"curl -sSf {base}/blobs/{d} | gzip -dc > /dev/null")
        return ["bash", "-c", "\n".join(lines)], self.env, None, lambda: (0, [])


def run(a):
    with open(a.images) as f:
        images = json.load(f)
    v = Variants(a, images)
    cases = a.cases.split(",")
    kinds = a.kinds.split(",")
    # Warm the policy cache and the page cache (untimed), and check correctness once.
    results = {c: {k: [] for k in kinds} for c in cases}
    for c in cases:
        digests = {}
        for k in kinds:
            cmd, env, d, measure = getattr(v, k)(c)
            timed(cmd, env, os.path.join(a.work, "time.out"))
            _, files = measure()
            digests[k] = sorted(sha256_file(f) for f in files)
            if d:
                shutil.rmtree(d, ignore_errors=True)
        for peer in [k for k in kinds if k in ("reference", "podman")]:
            if digests["ours"] != digests[peer] or len(digests["ours"]) != 2:
                raise SystemExit(f"{c}: kata-addons and {peer} installed different files: {digests}")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for r in range(a.runs):
        for c in cases:
            for k in kinds:  # interleaved: A B C A B C ...
                cmd, env, d, measure = getattr(v, k)(c)
                wall, rss, written = timed(cmd, env, os.path.join(a.work, "time.out"))
                temp, _ = measure()
                results[c][k].append({"s": wall, "rss_kib": rss, "temp": temp, "written": written})
                if d:
                    shutil.rmtree(d, ignore_errors=True)
        print(f"run {r + 1}/{a.runs} done", file=sys.stderr)
    load = {"before": load_before, "after": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    summary = {}
    for c in cases:
        summary[c] = {"image_bytes": images[c]["image_bytes"], "files_bytes": images[c]["files_bytes"]}
        for k in kinds:
            xs = results[c][k]
            summary[c][k] = {
                "median_s": statistics.median(x["s"] for x in xs),
                "min_s": min(x["s"] for x in xs),
                "max_s": max(x["s"] for x in xs),
                "rss_mib": max(x["rss_kib"] for x in xs) / 1024,
                "temp_mb": max(x["temp"] for x in xs) / 1e6,
                "written_mb": statistics.median(x["written"] for x in xs) / 1e6,
            }
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "raw": results, "load": load}, f, indent=1)


# ---------------------------------------------------------------------------- report

NAMES = {
    "ours": "kata-addons install",
    "reference": "skopeo + umoci + cp",
    "podman": "podman pull + create + cp (vfs)",
    "floor": "floor (curl \\| gzip -dc)",
}
# The goals against the peers: (case, peer, least ratio peer / ours), and the peak RSS of ours.
GOALS = [("top", "reference", 25), ("top", "podman", 20), ("end", "reference", 12), ("end", "podman", 8)]
RSS_GOAL_MIB = 32


def ratio(res, c, peer):
    return res[c][peer]["median_s"] / res[c]["ours"]["median_s"]


def ratio_text(raw, c, peer):
    """Median ratio peer / ours and the range of the per-run ratios (run i of each)."""
    if peer not in raw[c]:
        return "—"
    per = [p["s"] / o["s"] for p, o in zip(raw[c][peer], raw[c]["ours"])]
    med = statistics.median(x["s"] for x in raw[c][peer]) / statistics.median(x["s"] for x in raw[c]["ours"])
    return f"{med:.1f}× ({min(per):.1f}–{max(per):.1f}×)"


LABELS = {
    "top": "files in the top layer (4 × base + top)",
    "end": "files at the end of one layer",
}


def label(c, images):
    if c in LABELS:
        return LABELS[c]
    where, size = c.split("-", 1)
    return f"{size.replace('g', ' GB')}, files in the {where} layer"


def report(a):
    with open(a.results) as f:
        loaded = json.load(f)
    res, raw = loaded["summary"], loaded["raw"]
    load = loaded.get("load")
    with open(a.images) as f:
        images = json.load(f)
    lines = []
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines.append(f"Run {now} on {platform.node()}: {os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, "
                 f"Linux {platform.release()}; `{a.command}` ({a.runs} interleaved runs, median)."
                 + (f" Load average (1/5/15 min) {load['before']} before, {load['after']} after." if load else ""))
    lines.append("")
    lines.append("| case | image MB | read MB | variant | median s | min–max s | peak RSS MiB | temp disk MB | written MB |")
    lines.append("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for c, s in res.items():
        for k in [k for k in NAMES if k in s]:
            x = s[k]
            lines.append(
                f"| {label(c, images)} | {s['image_bytes'] / 1e6:.0f} | {images[c]['needed_bytes'] / 1e6:.0f} | {NAMES[k]} "
                f"| {x['median_s']:.3f} | {x['min_s']:.3f}–{x['max_s']:.3f} | {x['rss_mib']:.1f} | {x['temp_mb']:.1f} "
                f"| {x['written_mb']:.0f} |"
            )
    lines.append("")
    lines.append(
        "| case | skopeo / ours (per-run range) | podman / ours (per-run range) | ours / floor | installed MB | ours temp disk MB |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for c, s in res.items():
        lines.append(
            f"| {label(c, images)} | {ratio_text(raw, c, 'reference')} | {ratio_text(raw, c, 'podman')} "
            f"| {s['ours']['median_s'] / s['floor']['median_s']:.2f}× | {s['files_bytes'] / 1e6:.1f} "
            f"| {s['ours']['temp_mb']:.1f} |"
        )
    goals = [(c, peer, want) for c, peer, want in GOALS if c in res and peer in res[c]]
    if goals:
        lines.append("")
        lines.append("| goal | result (median ratio; per-run range) | |")
        lines.append("| --- | --- | --- |")
        for c, peer, want in goals:
            r = ratio(res, c, peer)
            lines.append(
                f"| {label(c, images)}: ≥ {want}× {NAMES[peer]} | {ratio_text(raw, c, peer)} "
                f"| {'met' if r >= want else '**not met**'} |"
            )
        rss = max(s["ours"]["rss_mib"] for s in res.values())
        lines.append(f"| peak RSS ≤ {RSS_GOAL_MIB} MiB | {rss:.1f} MiB | {'met' if rss <= RSS_GOAL_MIB else '**not met**'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        with open(a.write) as f:
            doc = f.read()
        begin, end = f"<!-- bench/compare {a.section} begin -->", f"<!-- bench/compare {a.section} end -->"
        block = f"{begin}\n{text}{end}"
        if begin in doc and end in doc:
            i, j = doc.index(begin), doc.index(end) + len(end)
            doc = doc[:i] + block + doc[j:]
        else:
            doc = doc.rstrip("\n") + "\n\n" + block + "\n"
        with open(a.write, "w") as f:
            f.write(doc)
        print(f"wrote the {a.section} table into {a.write}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--storage", required=True)
    g.add_argument("--scale", choices=sorted(SCALES), default="full")
    g.add_argument("--scaling", action="store_true")
    g.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True)
    r.add_argument("--registry", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--images", required=True)
    r.add_argument("--cases", required=True)
    r.add_argument("--kinds", default="ours,reference,podman,floor", help="variants to run, comma-separated")
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--out", required=True)
    w = sub.add_parser("report")
    w.add_argument("--results", required=True)
    w.add_argument("--images", required=True)
    w.add_argument("--command", required=True)
    w.add_argument("--runs", type=int, required=True)
    w.add_argument("--section", required=True)
    w.add_argument("--write")
    a = p.parse_args()
    {"gen": gen, "run": run, "report": report}[a.cmd](a)


if __name__ == "__main__":
    main()
