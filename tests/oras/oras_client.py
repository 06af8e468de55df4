#!/usr/bin/env python3
"""A small command line over the ORAS Python SDK (PyPI `oras`), for the integration tests.

The pushes are the SDK's own (`Registry.push`: blob uploads, titles, the manifest PUT).
Where the SDK (0.2.x) lacks a flag the Go `oras` CLI has, the manifest it builds is given
the fields the Go CLI (oras-go v2 `PackManifest`, image-spec v1.1) writes, before the SDK
uploads it:
  --artifact-type T   `artifactType: T` and the empty config
                      (application/vnd.oci.empty.v1+json, `{}`), as `oras push --artifact-type`;
  a directory         the SDK tars and gzips it under its name (as the Go CLI does) but does
                      not mark it; the Go CLI's `io.deis.oras.content.unpack: "true"` is added.
Commands:
  push REF [--artifact-type T] [--annotation-file F] PATH[:MEDIATYPE]...   (paths relative to the cwd)
  index REF PLATFORM=DIGEST...    an image index over manifests already in REF's repository,
                                  as `oras manifest index create` writes it
  layout REF DIR TAG              copy REF into an OCI image layout (the SDK's NewLayoutFromRegistry)
Plain HTTP (the tests' loopback registry); HTTP basic auth when ORAS_USER and ORAS_PASSWORD
are set. Prints the pushed manifest's digest.
"""

import argparse
import hashlib
import json
import os
import sys

import oras.defaults
import oras.provider
from oras.layout.layout import NewLayoutFromRegistry

EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


class Client(oras.provider.Registry):
    """The SDK's registry client, keeping the manifest it uploads."""

    artifact_type = None
    directories = ()
    last = None

    def upload_manifest(self, manifest, container):
        if self.artifact_type:
            manifest["artifactType"] = self.artifact_type
            manifest["config"] = {"mediaType": EMPTY, "digest": EMPTY_DIGEST, "size": 2, "data": "e30="}
        for layer in manifest["layers"]:
            title = (layer.get("annotations") or {}).get(oras.defaults.annotation_title)
            if title in self.directories:
                layer["annotations"][oras.defaults.annotation_unpack] = "true"
        self.last = json.dumps(manifest, separators=(",", ":")).encode()
        return super().upload_manifest(manifest, container)


def new_client():
    user, password = os.environ.get("ORAS_USER"), os.environ.get("ORAS_PASSWORD")
    if user and password:
        client = Client(insecure=True, auth_backend="basic")
        client.auth.set_basic_auth(user, password)
        return client
    return Client(insecure=True)


def manifest_digest(client):
    # requests sends `json=` as json.dumps(manifest) with its default separators.
    body = json.dumps(json.loads(client.last)).encode()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def push(args):
    client = new_client()
    client.artifact_type = args.artifact_type
    client.directories = {os.path.basename(p.split(":")[0].rstrip("/")) for p in args.paths if os.path.isdir(p.split(":")[0])}
    if args.artifact_type:
        # The empty config blob the manifest names must exist in the registry.
        with open(".oras-empty-config", "w") as f:
            f.write("{}")
        config = ".oras-empty-config:" + EMPTY
    else:
        config = None
    resp = client.push(
        args.ref,
        files=args.paths,
        manifest_config=config,
        annotation_file=args.annotation_file,
        quiet=True,
    )
    if config:
        os.remove(".oras-empty-config")
    print(resp.headers.get("Docker-Content-Digest") or manifest_digest(client))


def index(args):
    client = new_client()
    container = client.get_container(args.ref)
    manifests = []
    for entry in args.entries:
        platform, digest = entry.split("=", 1)
        parts = platform.split("/")
        repo = args.ref.rsplit(":", 1)[0] if "@" not in args.ref else args.ref.split("@")[0]
        target = client.get_container(f"{repo}@{digest}")
        resp = client.do_request(
            f"{client.prefix}://{target.manifest_url()}",
            "GET",
            headers={"Accept": oras.defaults.default_manifest_media_type},
        )
        client._check_200_response(resp)
        desc = {"mediaType": oras.defaults.default_manifest_media_type, "digest": digest, "size": len(resp.content)}
        body = json.loads(resp.content)
        if body.get("artifactType"):
            desc["artifactType"] = body["artifactType"]
        desc["platform"] = {"os": parts[0], "architecture": parts[1]}
        if len(parts) > 2:
            desc["platform"]["variant"] = parts[2]
        manifests.append(desc)
    doc = {"schemaVersion": 2, "mediaType": oras.defaults.default_index_media_type, "manifests": manifests}
    body = json.dumps(doc, separators=(",", ":")).encode()
    resp = client.do_request(
        f"{client.prefix}://{container.manifest_url()}",
        "PUT",
        headers={"Content-Type": oras.defaults.default_index_media_type},
        data=body,
    )
    client._check_200_response(resp)
    print("sha256:" + hashlib.sha256(body).hexdigest())


def layout(args):
    client = new_client()
    NewLayoutFromRegistry(args.dir, client, args.ref, tag=args.tag)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("push")
    a.add_argument("--artifact-type")
    a.add_argument("--annotation-file")
    a.add_argument("ref")
    a.add_argument("paths", nargs="+")
    a.set_defaults(run=push)
    a = sub.add_parser("index")
    a.add_argument("ref")
    a.add_argument("entries", nargs="+")
    a.set_defaults(run=index)
    a = sub.add_parser("layout")
    a.add_argument("ref")
    a.add_argument("dir")
    a.add_argument("tag")
    a.set_defaults(run=layout)
    args = p.parse_args()
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
