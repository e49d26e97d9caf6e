"""The interop lake in S3-compatible storage (a moto server on loopback), for the Rust test
`s3` in crates/engine/tests/it/s3.rs. Reuses make_fixtures.py (the shared generator) so the
data, keys and Iceberg commits are those of the local interop lake.

usage:
  s3_lake.py setup MAKE_FIXTURES.py ENDPOINT BUCKET INTEROP_DIR OUT_DIR
      creates BUCKET; copies the PyArrow-encrypted data files of lake.sales.customers into
      s3://BUCKET/wh/sales/customers/data and commits them with PyIceberg (SqlCatalog in
      OUT_DIR/catalog.db, warehouse s3://BUCKET/wh) in the same two snapshots; writes
      s3://BUCKET/files/columns.parquet (a copy of the standalone file) and
      s3://BUCKET/files/external.parquet with PyArrow's *external* key material
      (_KEY_MATERIAL_FOR_external.parquet.json, written to S3 by PyArrow itself).
  s3_lake.py setup_rest MAKE_FIXTURES.py ENDPOINT INTEROP_DIR REST_URI
      the same table committed through a REST catalog whose warehouse is on S3 (PyIceberg
      given no S3 credentials: it writes with those the catalog vends).
  s3_lake.py readback MAKE_FIXTURES.py ENDPOINT CATALOG_DB WAREHOUSE TABLE KEYRING
      loads TABLE with PyIceberg, reads every data file of its current snapshot from S3
      with PyArrow's CryptoFactory and prints a JSON summary.
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

import boto3
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe

KEY_ID = "testing"
SECRET = "testing"
REGION = "us-east-1"


def load_make_fixtures(path):
    spec = importlib.util.spec_from_file_location("make_fixtures", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def s3fs(endpoint):
    scheme, host = endpoint.split("://", 1)
    return pafs.S3FileSystem(access_key=KEY_ID, secret_key=SECRET, region=REGION,
                             endpoint_override=host, scheme=scheme)


def catalog(mf, db, warehouse, endpoint):
    from pyiceberg.catalog.sql import SqlCatalog
    return SqlCatalog("lake", uri=f"sqlite:///{db}", warehouse=warehouse, **{
        "s3.endpoint": endpoint, "s3.access-key-id": KEY_ID,
        "s3.secret-access-key": SECRET, "s3.region": REGION,
    })


def make_bucket(endpoint, bucket):
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID,
                 aws_secret_access_key=SECRET, region_name=REGION).create_bucket(Bucket=bucket)


def commit_interop_table(mf, cat, fs, interop):
    """Copies the interop table's encrypted data files next to a new `sales.customers` of
    `cat` (its location decides where) and commits them in the same two snapshots."""
    keyring = mf.load_keyring(interop / "keyring.json")
    cf = mf.crypto_factory(keyring)
    dp = cf.file_decryption_properties(mf.KMS_CONN, pe.DecryptionConfiguration())
    mf.patch_snapshot_ids(mf.SNAPSHOT_ID_SEED)
    cat.create_namespace("sales")
    table = cat.create_table("sales.customers", schema=mf.iceberg_schema())
    local_data = interop / "warehouse" / "sales" / "customers" / "data"
    batches = [["00000-customers-a.parquet", "00001-customers-b.parquet"],
               ["00002-customers-c.parquet"]]
    for names in batches:
        files = []
        for name in names:
            uri = f"{table.location()}/data/{name}"
            with fs.open_output_stream(uri[len("s3://"):]) as f:
                f.write((local_data / name).read_bytes())
            files.append(mf.data_file_for_encrypted_parquet(table, uri, local_data / name, dp))
        with table.transaction() as tx:
            with tx.update_snapshot().fast_append() as fa:
                for df in files:
                    fa.append_data_file(df)
        table = cat.load_table("sales.customers")
    return cf


def setup(mf, endpoint, bucket, interop, out):
    interop, out = Path(interop), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    make_bucket(endpoint, bucket)
    fs = s3fs(endpoint)
    cat = catalog(mf, out / "catalog.db", f"s3://{bucket}/wh", endpoint)
    cf = commit_interop_table(mf, cat, fs, interop)

    with fs.open_output_stream(f"{bucket}/files/columns.parquet") as f:
        f.write((interop / "columns.parquet").read_bytes())
    customers = mf.make_customers()
    cfg = mf.enc_config("columns")
    cfg.internal_key_material = False
    ext = f"{bucket}/files/external.parquet"
    props = cf.file_encryption_properties(mf.KMS_CONN, cfg, ext, fs)
    pq.write_table(customers, ext, filesystem=fs, row_group_size=mf.ROW_GROUP_SIZE,
                   use_dictionary=["country"], encryption_properties=props)
    side = f"{bucket}/files/_KEY_MATERIAL_FOR_external.parquet.json"
    assert fs.get_file_info(side).type == pafs.FileType.File, "PyArrow wrote no side file"
    print(json.dumps({"catalog_db": str(out / "catalog.db"), "warehouse": f"s3://{bucket}/wh"}))


def setup_rest(mf, endpoint, interop, rest_uri):
    """The interop table committed through a REST catalog whose warehouse is on S3; PyIceberg
    is given no S3 credentials: it uses those the catalog vends."""
    from pyiceberg.catalog.rest import RestCatalog
    cat = RestCatalog("rest", uri=rest_uri, **{"s3.endpoint": endpoint, "s3.region": REGION})
    fs = s3fs(endpoint)
    commit_interop_table(mf, cat, fs, Path(interop))
    t = cat.load_table("sales.customers")
    print(json.dumps({"location": t.location(),
                      "vended": t.io.properties.get("s3.access-key-id") is not None}))


def readback(mf, endpoint, db, warehouse, table_name, keyring_path):
    fs = s3fs(endpoint)
    keyring = mf.load_keyring(Path(keyring_path))
    cf = mf.crypto_factory(keyring)
    dp = cf.file_decryption_properties(mf.KMS_CONN, pe.DecryptionConfiguration())
    table = catalog(mf, db, warehouse, endpoint).load_table(table_name)
    rows, files, sums = 0, [], {}
    for task in table.scan().plan_files():
        path = task.file.file_path
        t = pq.read_table(path[len("s3://"):], filesystem=fs, decryption_properties=dp)
        rows += t.num_rows
        files.append(path)
        for c in t.column_names:
            if c in ("id",):
                sums[c] = sums.get(c, 0) + (pc.sum(t[c]).as_py() or 0)
    print(json.dumps({"rows": rows, "files": files, "sums": sums,
                      "snapshot": table.current_snapshot().snapshot_id}))


def main():
    cmd, mf_path, *args = sys.argv[1:]
    mf = load_make_fixtures(mf_path)
    {"setup": setup, "setup_rest": setup_rest, "readback": readback}[cmd](mf, *args)
    # Arrow's S3 client may abort at interpreter exit while its threads wind down
    # ("terminate called without an active exception"): the work is done, leave now.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
