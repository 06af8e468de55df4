"""The tests' own computation of IBM Secure Execution reference values, written from the
definitions in Trustee's deps/verifier/src/se/se_parse_hdr.py (the script is Trustee's and
stays there), with PyPI `cryptography` (in the venv tests/run creates).

  se_oracle.py phkh HKD.crt            -> hex SHA-256 of the key's x||y, each padded to 80 bytes
  se_oracle.py values HDR.bin HKD...   -> JSON {name: [values]} as se_parse_hdr.py prints them

se_parse_hdr.py unpacks the header with the host's byte order ('8sII'): it runs on s390x,
which is big-endian, so this reads '>8sII'.
"""

import hashlib
import json
import struct
import sys

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def phkh(path):
    with open(path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey), "not an EC key"
    point = key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    size = key.curve.key_size // 8 + 1  # 66 for P-521
    x, y = point[1 : 1 + size], point[1 + size :]
    data = x.rjust(80, b"\0") + y.rjust(80, b"\0")
    return hashlib.sha256(data).hexdigest()


def values(hdr_path, hkds):
    with open(hdr_path, "rb") as f:
        hdr = f.read()
    magic, version, phs = struct.unpack(">8sII", hdr[:16])
    assert magic == b"IBMSecEx", magic
    head = 8 + 4 + 4 + 12 + 4 + 8 + 8 + 8 + 8 + 160 + 64 + 64 + 64
    after_slots = 144
    slots = hdr[head : phs - after_slots]
    digests = [slots[i : i + 32].hex() for i in range(0, len(slots) - 79, 80)]
    out = {"se.version": [str(version)], "se.tag": [hdr[-16:].hex()]}
    if hkds:
        hashes = [phkh(p) for p in hkds]
        out["se.attestation_phkh"] = sorted(set(hashes), key=hashes.index)
        image = [d for h in hashes for d in digests if d == h]
        if len(image) == len(hashes):
            out["se.image_phkh"] = sorted(set(image), key=image.index)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "phkh":
        print(phkh(sys.argv[2]))
    elif sys.argv[1] == "values":
        print(json.dumps(values(sys.argv[2], sys.argv[3:]), sort_keys=True))
    else:
        sys.exit("usage: se_oracle.py phkh HKD | values HDR HKD...")
