#!/usr/bin/env python3
"""Builds examples/layout: a small, deterministic OCI image layout holding a fake Secure
Execution kernel at /artifacts/kernel/vmlinuz (tag v1.0). The layout is committed; this
script documents how it was made and rebuilds it byte for byte.

Usage: python3 examples/make-layout.py [OUT_DIR]
"""
import gzip, hashlib, io, json, os, random, shutil, sys, tarfile

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout")

def tar_layer(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            if data is None:
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
                tf.addfile(ti)
            else:
                ti.mode = 0o644
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as g:
        g.write(raw)
    return raw, gz.getvalue()

def put(blob):
    d = hashlib.sha256(blob).hexdigest()
    with open(os.path.join(out, "blobs", "sha256", d), "wb") as f:
        f.write(blob)
    return "sha256:" + d

rng = random.Random(20261129)
kernel = bytes(rng.getrandbits(8) for _ in range(256 * 1024))

shutil.rmtree(out, ignore_errors=True)
os.makedirs(os.path.join(out, "blobs", "sha256"))
base_raw, base_gz = tar_layer([("etc/", None), ("etc/os-release", b"ID=kata-addons-example\n")])
top_raw, top_gz = tar_layer([("artifacts/", None), ("artifacts/kernel/", None), ("artifacts/kernel/vmlinuz", kernel)])
layers = []
for raw, gz in [(base_raw, base_gz), (top_raw, top_gz)]:
    layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(gz), "size": len(gz)})
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(r).hexdigest() for r in (base_raw, top_raw)]},
    "config": {},
}, sort_keys=True).encode()
manifest = json.dumps({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(config), "size": len(config)},
    "layers": layers,
}, sort_keys=True).encode()
mdigest = put(manifest)
index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{
    "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest, "size": len(manifest),
    "annotations": {"org.opencontainers.image.ref.name": "v1.0"},
}]}
with open(os.path.join(out, "index.json"), "w") as f:
    json.dump(index, f, sort_keys=True)
with open(os.path.join(out, "oci-layout"), "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
print(f"{out}: manifest {mdigest}, kernel sha256 {hashlib.sha256(kernel).hexdigest()}")
