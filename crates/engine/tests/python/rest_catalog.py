"""PyIceberg as a REST catalog client, for the Rust test `rest` (crates/engine/tests/it/rest.rs),
against Iceberg's own RESTCatalogServer.

usage:
  rest_catalog.py register URI INTEROP_DIR
      creates namespace `sales` and registers the interop lake's `sales.customers` (its
      current metadata file, PyArrow-encrypted data files) in the REST catalog.
  rest_catalog.py create_later URI
      creates `sales.later` (id long, note string) and appends three rows with PyIceberg.
"""
import json
import sys

import pyarrow as pa


def rest(uri):
    from pyiceberg.catalog.rest import RestCatalog
    return RestCatalog("rest", uri=uri, credential="pyiceberg:secret")


def register(uri, interop):
    from pyiceberg.catalog.sql import SqlCatalog
    local = SqlCatalog("lake", uri=f"sqlite:///{interop}/catalog.db", warehouse=f"file://{interop}/warehouse")
    metadata = local.load_table("sales.customers").metadata_location
    cat = rest(uri)
    cat.create_namespace("sales")
    t = cat.register_table("sales.customers", metadata)
    print(json.dumps({"metadata": metadata, "snapshot": t.current_snapshot().snapshot_id}))


def create_later(uri):
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType
    cat = rest(uri)
    t = cat.create_table("sales.later", schema=Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "note", StringType(), required=False)))
    t.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "note": ["a", "b", None]}))
    print(json.dumps({"location": t.location()}))


def main():
    cmd, *args = sys.argv[1:]
    {"register": register, "create_later": create_later}[cmd](*args)


if __name__ == "__main__":
    main()
