"""Reads Parquet files written by ClearIce with PyArrow's own PME implementation
(pyarrow.parquet.encryption.CryptoFactory) and the Keyring KMS, and prints a JSON
summary per file. Used by the Rust test `pyarrow::pyarrow_reads_files_written_by_clearice`.

usage: read_back.py KEYRING.json FILE.parquet...
"""
import base64
import json
import os
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


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


def main():
    keyring = {k: base64.b64decode(v) for k, v in json.load(open(sys.argv[1])).items()}
    factory = pe.CryptoFactory(lambda cfg: KeyringKmsClient(keyring))
    props = factory.file_decryption_properties(pe.KmsConnectionConfig(), pe.DecryptionConfiguration())
    out = []
    for path in sys.argv[2:]:
        t = pq.read_table(path, decryption_properties=props)
        t = t.sort_by("id")
        out.append({
            "file": path,
            "rows": t.num_rows,
            "sum_balance": str(pc.sum(t["balance"]).as_py()),
            "count_ssn": t["ssn"].num_chunks and pc.count(t["ssn"]).as_py(),
            "first_ssn": t["ssn"][0].as_py(),
            "first_email": t["email"][0].as_py(),
            "field_ids": [f.metadata.get(b"PARQUET:field_id", b"").decode() for f in t.schema],
        })
    print(json.dumps(out))
    sys.stdout.flush()
    # Arrow C++'s thread pools can abort the interpreter's teardown under load
    # ("terminate called without an active exception") after the answer is out.
    os._exit(0)


if __name__ == "__main__":
    main()
