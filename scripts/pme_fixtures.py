#!/usr/bin/env python3
"""PME files written by PyArrow for ClearIce's decrypting-reader tests.

Writes into OUT_DIR (absent or empty): `keyring.json` (Keyring KMS master keys, the
interop wrap format), a plaintext twin per dataset, its encrypted variants, and
`fixtures.json` listing each encrypted file with its twin and what it exercises.

Variants cover what parquet-testing does not: AES_GCM_CTR_V1 written by PyArrow (with
and without a plaintext footer), 192 and 256-bit data keys, data page v2, page indexes
(column and offset index) of encrypted columns with many pages per chunk, dictionary
pages, nested columns (struct, list, map), an AAD prefix that is not stored, and external
key material (side files).

Usage: pme_fixtures.py OUT_DIR
"""

import base64
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MASTER_KEYS = {"footer_key": 32, "pii_key": 16, "finance_key": 24}
ROWS = 20_000


class KeyringKmsClient(pe.KmsClient):
    """wrapped = base64(nonce || AES-GCM(master, key, aad = master key id) || tag)."""

    def __init__(self, keyring):
        pe.KmsClient.__init__(self)
        self._keys = keyring

    def wrap_key(self, key_bytes, master_key_identifier):
        nonce = os.urandom(12)
        master = self._keys[master_key_identifier]
        ct = AESGCM(master).encrypt(nonce, bytes(key_bytes), master_key_identifier.encode())
        return base64.b64encode(nonce + ct).decode()

    def unwrap_key(self, wrapped_key, master_key_identifier):
        raw = base64.b64decode(wrapped_key)
        master = self._keys[master_key_identifier]
        return AESGCM(master).decrypt(raw[:12], raw[12:], master_key_identifier.encode())


def flat_table() -> pa.Table:
    rng = np.random.default_rng(11)
    n = ROWS
    ids = np.arange(n, dtype=np.int64)
    ssn = [None if i % 19 == 0 else f"{rng.integers(100, 999)}-{i % 100:02d}-{i:04d}"[:11] for i in range(n)]
    email = [None if i % 23 == 0 else f"user{i}@example.org" for i in range(n)]
    import decimal
    balance = pa.array([None if i % 17 == 0 else decimal.Decimal((i * 37) % 100000 - 20000).scaleb(-2)
                        for i in range(n)], type=pa.decimal128(12, 2))
    country = pa.array([["US", "DE", "FR", "JP", "BR"][i % 5] for i in range(n)]).dictionary_encode()
    score = pa.array(rng.normal(size=n))
    return pa.table({"id": ids, "ssn": ssn, "email": email, "balance": balance,
                     "country": country, "score": score})


def nested_table() -> pa.Table:
    n = ROWS // 4
    s = pa.StructArray.from_arrays(
        [pa.array([i * 3 for i in range(n)], pa.int32()), pa.array([f"n{i}" for i in range(n)])],
        names=["a", "b"])
    lists = pa.array([None if i % 7 == 0 else [f"t{j}" for j in range(i % 4)] for i in range(n)],
                     pa.list_(pa.string()))
    maps = pa.array([[(f"k{i % 3}", i)] if i % 5 else None for i in range(n)],
                    pa.map_(pa.string(), pa.int64()))
    return pa.table({"id": pa.array(range(n), pa.int64()), "s": s, "tags": lists, "attrs": maps})


def write(table, path, encryption=None, factory=None, **kw):
    props = None
    if encryption is not None:
        props = factory.file_encryption_properties(pe.KmsConnectionConfig(), encryption,
                                                   *( [kw.pop("key_material_store")] if "key_material_store" in kw else []))
    pq.write_table(table, path, encryption_properties=props, **kw)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        print(f"error: {out} is not empty", file=sys.stderr)
        return 2
    rng = np.random.default_rng(5)
    keyring = {k: bytes(rng.integers(0, 256, n, dtype=np.uint8)) for k, n in MASTER_KEYS.items()}
    (out / "keyring.json").write_text(json.dumps({k: base64.b64encode(v).decode() for k, v in keyring.items()}))
    factory = pe.CryptoFactory(lambda _: KeyringKmsClient(keyring))

    common = dict(row_group_size=5_000, data_page_size=4096, write_page_index=True,
                  use_dictionary=["country"], compression="snappy", write_statistics=True)
    flat, nested = flat_table(), nested_table()
    write(flat, out / "flat_plain.parquet", **common)
    write(flat, out / "flat_plain_v2.parquet", data_page_version="2.0", **common)
    write(nested, out / "nested_plain.parquet", **common)

    def cfg(**kw):
        base = dict(footer_key="footer_key",
                    column_keys={"pii_key": ["ssn", "email"], "finance_key": ["balance"]})
        base.update(kw)
        return pe.EncryptionConfiguration(**base)

    fixtures = []

    def add(name, twin, table, config, note, **kw):
        opts = dict(common)
        opts.update(kw)
        write(table, out / name, encryption=config, factory=factory, **opts)
        fixtures.append({"file": name, "twin": twin, "note": note})

    add("ctr_columns.parquet", "flat_plain.parquet", flat,
        cfg(encryption_algorithm="AES_GCM_CTR_V1"), "CTR, encrypted footer, column keys")
    add("ctr_plaintext_footer.parquet", "flat_plain.parquet", flat,
        cfg(encryption_algorithm="AES_GCM_CTR_V1", plaintext_footer=True),
        "CTR, plaintext (signed) footer")
    add("gcm_256_v2.parquet", "flat_plain_v2.parquet", flat,
        cfg(data_key_length_bits=256), "256-bit data keys, data page v2", data_page_version="2.0")
    add("gcm_192_uniform.parquet", "flat_plain.parquet", flat,
        cfg(data_key_length_bits=192, column_keys={}, uniform_encryption=True),
        "192-bit data keys, every column under the footer key")
    add("gcm_nested_uniform.parquet", "nested_plain.parquet", nested,
        cfg(column_keys={}, uniform_encryption=True), "struct, list and map columns")
    add("ctr_nested_uniform.parquet", "nested_plain.parquet", nested,
        cfg(encryption_algorithm="AES_GCM_CTR_V1", column_keys={}, uniform_encryption=True),
        "CTR, struct, list and map columns")
    add("gcm_plaintext_footer_v2.parquet", "flat_plain_v2.parquet", flat,
        cfg(plaintext_footer=True), "GCM, plaintext footer, data page v2", data_page_version="2.0")

    # Same-layout files for the tampering suite: fixed-size values, no compression, no
    # dictionary, equal row groups, so that modules can be swapped between row groups,
    # columns and files. Not in fixtures.json.
    # (Integers: ClearIce reads no bounds or column index of float columns, NaN-safe.)
    grid = pa.table({"a": pa.array(np.arange(4000, dtype=np.int64)),
                     "b": pa.array(np.arange(4000, dtype=np.int64) * -1)})
    swap = dict(row_group_size=1000, data_page_size=2048, write_page_index=True,
                use_dictionary=False, compression="none")
    for name in ("swap_a.parquet", "swap_b.parquet"):
        write(grid, out / name, factory=factory, **swap,
              encryption=cfg(column_keys={"pii_key": ["a"], "finance_key": ["b"]}))
    write(grid, out / "swap_plain.parquet", **swap)

    (out / "fixtures.json").write_text(json.dumps(fixtures, indent=1))
    # Every file reads back with PyArrow itself.
    for f in fixtures:
        dec = factory.file_decryption_properties(pe.KmsConnectionConfig())
        got = pq.read_table(out / f["file"], decryption_properties=dec)
        want = pq.read_table(out / f["twin"])
        assert got.equals(want), f["file"]
    print(f"done: {out} ({len(fixtures)} encrypted files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
