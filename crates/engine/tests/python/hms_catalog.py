"""PyIceberg as a Hive Metastore client, for the Rust test `hms` (crates/engine/tests/it/hms.rs),
against Hive's standalone metastore.

usage: hms_catalog.py register THRIFT_URI INTEROP_DIR
    creates database `sales` and registers the interop lake's `sales.customers` (its current
    metadata file, PyArrow-encrypted data files) as an Iceberg table in the metastore.
"""
import json
import sys


def register(uri, interop):
    from pyiceberg.catalog.hive import HiveCatalog
    from pyiceberg.catalog.sql import SqlCatalog
    local = SqlCatalog("lake", uri=f"sqlite:///{interop}/catalog.db", warehouse=f"file://{interop}/warehouse")
    metadata = local.load_table("sales.customers").metadata_location
    cat = HiveCatalog("hms", uri=uri)
    cat.create_namespace("sales")
    t = cat.register_table("sales.customers", metadata)
    print(json.dumps({"metadata": metadata, "snapshot": t.current_snapshot().snapshot_id}))


def main():
    cmd, *args = sys.argv[1:]
    {"register": register}[cmd](*args)


if __name__ == "__main__":
    main()
