"""Reads a table ClearIce wrote through SQL with PyIceberg (catalog, manifests) and
PyArrow's own PME implementation (CryptoFactory, the keyring KMS): what a Python
consumer of the lake sees. Used by crates/cli/tests/it/writes.rs.

usage: read_written.py CATALOG_DB WAREHOUSE KEYRING.json NAMESPACE.TABLE
prints JSON: {"rows": [[id, name, ssn, salary_cents, dept], ...] sorted by id,
              "bounds": [columns with lower/upper bounds in any manifest entry],
              "files": [data file paths], "snapshots": [operations, oldest first]}
"""
import base64
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pyiceberg.catalog.sql import SqlCatalog


class KeyringKmsClient(pe.KmsClient):
    def __init__(self, keyring):
        super().__init__()
        self.keyring = keyring

    def wrap_key(self, key_bytes, master_key_identifier):
        nonce = os.urandom(12)
        ct = AESGCM(self.keyring[master_key_identifier]).encrypt(
            nonce, key_bytes, master_key_identifier.encode())
        return base64.b64encode(nonce + ct).decode()

    def unwrap_key(self, wrapped_key, master_key_identifier):
        data = base64.b64decode(wrapped_key)
        return AESGCM(self.keyring[master_key_identifier]).decrypt(
            data[:12], data[12:], master_key_identifier.encode())


def local(uri):
    return uri[len("file://"):] if uri.startswith("file://") else uri


def main():
    db, warehouse, keyring_path, name = sys.argv[1:5]
    cat = SqlCatalog("lake", uri=f"sqlite:///{db}", warehouse=warehouse)
    tbl = cat.load_table(name)
    files = tbl.inspect.files().to_pylist()
    names = {f.field_id: f.name for f in tbl.schema().fields}
    bounds = set()
    for f in files:
        for key, _ in (f["lower_bounds"] or []) + (f["upper_bounds"] or []):
            bounds.add(names.get(key, str(key)))
    keyring = {k: base64.b64decode(v) for k, v in json.load(open(keyring_path)).items()}
    factory = pe.CryptoFactory(lambda cfg: KeyringKmsClient(keyring))
    props = factory.file_decryption_properties(pe.KmsConnectionConfig(), pe.DecryptionConfiguration())
    tables = [pq.read_table(local(f["file_path"]), decryption_properties=props) for f in files]
    rows = []
    for t in tables:
        for r in t.to_pylist():
            salary = r["salary"]
            rows.append([r["id"], r["name"], r["ssn"],
                         None if salary is None else round(salary * 100), r["dept"]])
    rows.sort(key=lambda r: r[0])
    snapshots = [s.summary.operation.value
                 for s in sorted(tbl.snapshots(), key=lambda s: s.sequence_number)]
    print(json.dumps({"rows": rows, "bounds": sorted(bounds),
                      "files": [f["file_path"] for f in files], "snapshots": snapshots}))


if __name__ == "__main__":
    main()
