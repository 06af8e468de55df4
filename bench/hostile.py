#!/usr/bin/env python3
"""Helper of bench/hostile: runs `kata-addons fetch` on every case of the hostile-layer
catalogue under GNU time, checks each ends as expected (extracted, or refused with the
expected message), and prints (and with --write, puts into BENCHMARKS.md) a table of peak
RSS and CPU time against the goal: at most 64 MiB and 5 s per layer of at most 1 MiB.

Standard library only. See bench/hostile for the entry point.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys

RSS_GOAL_MIB = 64.0
CPU_GOAL_S = 5.0
BEGIN = "<!-- bench/hostile begin -->"
END = "<!-- bench/hostile end -->"


def run_case(a, case, i):
    dest = os.path.join(a.work, f"dest-{case['id']}-{i}")
    tfile = os.path.join(a.work, "time.out")
    if "argv" in case:  # node configuration and ConfigMaps: the command as given
        cmd = ["/usr/bin/time", "-f", "%M %U %S %e", "-o", tfile, a.bin] + case["argv"]
    else:
        cmd = ["/usr/bin/time", "-f", "%M %U %S %e", "-o", tfile, a.bin, "fetch", "--image", case["image"], "--dest",
               dest]
        for p in case["paths"]:
            cmd += ["--path", p]
        cmd += case["args"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADDON_", "RUST_LOG"))}
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    shutil.rmtree(dest, ignore_errors=True)
    with open(tfile) as f:
        last = f.read().strip().splitlines()[-1].split()
    rss_kib, user, sys_, wall = int(last[0]), float(last[1]), float(last[2]), float(last[3])
    if case["expect"] == "extracted":
        ok = p.returncode == 0
    else:
        ok = p.returncode == case.get("code", 1) and case["needle"] in p.stderr
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    return {"code": p.returncode, "ok": ok, "rss": rss_kib / 1024, "cpu": user + sys_, "user": user, "sys": sys_,
            "wall": wall, "err": err}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) // 1024 // 1024
    return f"{os.cpu_count()} × {model}, {mem} GiB RAM, Linux {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--command", default="bench/hostile")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    with open(os.path.join(a.cases, "cases.json")) as f:
        cases = json.load(f)
    load_before = loadavg()
    start = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for c in cases:
        results = [run_case(a, c, i) for i in range(a.runs)]
        worst_rss = max(r["rss"] for r in results)
        worst = max(results, key=lambda r: r["cpu"])
        ok = all(r["ok"] for r in results)
        rows.append((c, worst_rss, worst, ok, results))
        print(f"{c['id']:>18}: exit {[r['code'] for r in results]} peak RSS {worst_rss:.1f} MiB, CPU "
              f"{worst['cpu']:.2f} s (user {worst['user']:.2f} + sys {worst['sys']:.2f}), wall {worst['wall']:.2f} s"
              f"{'' if ok else '  UNEXPECTED: ' + results[-1]['err']}", file=sys.stderr)
    load_after = loadavg()
    lines = [
        BEGIN,
        f"Measured {start:%Y-%m-%d %H:%M} UTC with `{a.command}` ({a.runs} runs per case, the highest "
        f"RSS and CPU shown): release binary, default limits, `kata-addons fetch` from an OCI layout on "
        f"local disk (the `gpt-*` cases: `kata-addons install` of a measured guest disk from an OCI layout on a "
        f"fresh node root). Machine: {machine()}. Load average (1/5/15 min) {load_before} before, {load_after} "
        f"after.",
        "",
        "| case | layer (each ≤ 1 MiB) | largest layer | outcome | peak RSS | CPU (user + sys) | wall | ≤ 64 MiB | ≤ 5 s CPU |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for c, rss, w, ok, results in rows:
        if not ok:
            outcome = f"**unexpected** (exit {results[-1]['code']}: {results[-1]['err'][:80]})"
        elif c["expect"] == "extracted":
            outcome = "extracted"
        else:
            outcome = f"refused ({c['needle']})"
        layers = f"{c['largest_layer'] / 1024:.0f} KiB" + (f" × {c['layers']}" if c["layers"] > 1 else "")
        if "argv" in c:
            layers = "—"
            outcome = outcome.replace("refused", f"exit {c['code']}", 1) if ok else outcome
        lines.append(
            f"| `{c['id']}` | {c['what']} | {layers} | {outcome} | {rss:.1f} MiB | {w['cpu']:.2f} s "
            f"({w['user']:.2f} + {w['sys']:.2f}) | {w['wall']:.2f} s | {'met' if rss <= RSS_GOAL_MIB else '**not met**'} "
            f"| {'met' if w['cpu'] <= CPU_GOAL_S else '**not met**'} |")
    met = all(rss <= RSS_GOAL_MIB and w["cpu"] <= CPU_GOAL_S and ok for _, rss, w, ok, _ in rows)
    lines += ["", f"Goal (≤ {RSS_GOAL_MIB:.0f} MiB peak RSS and ≤ {CPU_GOAL_S:.0f} s CPU per case, expected outcome): "
              + ("**met by every case**." if met else "**not met by every case** (see the rows marked)."), END]
    table = "\n".join(lines)
    print(table)
    if a.write:
        path = "BENCHMARKS.md"
        with open(path) as f:
            text = f.read()
        if BEGIN in text and END in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: table, text, flags=re.S)
        else:
            text = text.rstrip("\n") + "\n\n## Hostile layers, release binary\n\n" + table + "\n"
        with open(path, "w") as f:
            f.write(text)
        print(f"updated {path}", file=sys.stderr)
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
