#!/usr/bin/env bash
# Whole-process wall time of `kata-addons preview`, cold compile cache vs warm cache.
#
#   bench/preview.sh [POLICY.wasm CONFIGMAP.yaml]
#
# Without arguments it runs the embedded policy on examples/kata-addon-artifacts.yaml.
# Builds the release binary from this checkout and times a private copy of it (the target
# dir may be shared). Uses hyperfine when installed (median of 20/30 runs), else a shell
# loop (median of 15).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --quiet -p kata-addons
policy_args=()
configmap=examples/kata-addon-artifacts.yaml
if [ $# -ge 2 ]; then
  policy_args=(--policy-component "$1")
  configmap=$2
fi
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
bin=$cache/kata-addons
cp "$target/release/kata-addons" "$bin"
cmd=("$bin" "${policy_args[@]}" --cache-dir "$cache/entries" preview --output json --configmap "$configmap")
# A policy that rejects the input exits non-zero: the process is timed anyway.
"${cmd[@]}" >/dev/null 2>&1 || echo "note: preview exits $? with this policy (timed anyway)" >&2

if command -v hyperfine >/dev/null 2>&1; then
  hyperfine -N -i --runs 20 --prepare "rm -rf $cache/entries" -n "preview, cold cache (compile)" \
    "${cmd[*]}" --export-json "$cache/cold.json" >&2
  hyperfine -N -i --warmup 3 --runs 30 -n "preview, warm cache" \
    "${cmd[*]}" --export-json "$cache/warm.json" >&2
  for f in cold warm; do
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]
print("%s: median %.1f ms (min %.1f, max %.1f, %d runs)" % (r["command"], r["median"]*1e3, r["min"]*1e3, r["max"]*1e3, len(r["times"])))' "$cache/$f.json"
  done
  exit 0
fi

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
run() { local s e; s=$(date +%s%N); "${cmd[@]}" >/dev/null 2>&1 || true; e=$(date +%s%N); echo $(((e - s) / 1000)); }
cold=$(for _ in $(seq 15); do rm -rf "$cache/entries"; run; done | median)
"${cmd[@]}" >/dev/null 2>&1 || true
warm=$(for _ in $(seq 15); do run; done | median)
printf 'preview, cold cache: median %s µs\npreview, warm cache: median %s µs\n' "$cold" "$warm"
