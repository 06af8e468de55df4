#!/usr/bin/env bash
# The main job on an embedded default, no registry needed: installs the example SE kernel
# from the OCI layout shipped in examples/layout into a throwaway node root that holds a
# sample Kata config (examples/node-root), then shows status and the drop-in.
#
# Usage: examples/demo.sh [NODE_ROOT]   (default: a new temporary directory)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${1:-$(mktemp -d /tmp/kata-addons-demo.XXXXXX)}"
# The policy guest is built for wasm32-wasip2 by host/build.rs; rustup does not add the
# target named in rust-toolchain.toml by itself on every machine, so add it when missing.
if ! (cd "$here/.." && rustup target list --installed) | grep -qx wasm32-wasip2; then
  (cd "$here/.." && rustup target add wasm32-wasip2)
fi
# The `demo` profile (Cargo.toml): release without optimisation, the shortest build to the
# first drop-in; `cargo build --release` is what the image and the benchmarks use.
cargo build --quiet --profile demo -p kata-addons --manifest-path "$here/../Cargo.toml"
bin="$(cargo metadata --format-version 1 --no-deps --manifest-path "$here/../Cargo.toml" | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/demo/kata-addons"
cp -a "$here/node-root/." "$root/"

# What a controller would set on the DaemonSet from the ConfigMap (see `preview --output yaml`).
export ADDON_IMAGE="oci:$here/layout:v1.0"
export ADDON_KERNEL_PATH=/artifacts/kernel/vmlinuz
export ADDON_KERNEL_SHA256=85ce53af56bff552c6ddcba6f06163a380e68a93d1842ceac505e9efc5c9a2fe

echo "== install into $root"
"$bin" install --root "$root"
echo "== install again (idempotent)"
"$bin" install --root "$root"
echo "== status"
"$bin" status --root "$root"
echo "== the drop-in Kata reads (config.d beside the resolved configuration.toml)"
cat "$root/opt/kata/share/defaults/kata-containers/config.d/50-kata-addons.toml"
echo "== uninstall with: $bin uninstall --root $root"
