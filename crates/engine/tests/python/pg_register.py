"""Registers the interop lake's PyIceberg table in a PyIceberg SqlCatalog on PostgreSQL.

usage: pg_register.py PG_URI INTEROP_DIR NAMESPACE

PyIceberg creates its catalog tables in the PostgreSQL database (SQLAlchemy DDL) and registers
`NAMESPACE.customers` at the metadata file of the interop lake's `sales.customers` (written by
PyIceberg into its SQLite catalog): same metadata, manifests and PME-encrypted data files.
Run by crates/engine/tests/it/postgres.rs.
"""
import sys

from pyiceberg.catalog.sql import SqlCatalog


def main():
    pg_uri, interop, namespace = sys.argv[1:4]
    sqlite = SqlCatalog("lake", uri=f"sqlite:///{interop}/catalog.db", warehouse=f"file://{interop}/warehouse")
    metadata = sqlite.load_table("sales.customers").metadata_location
    # SQLAlchemy names the driver in the scheme
    pg = SqlCatalog("pylake", uri=pg_uri.replace("postgres://", "postgresql+psycopg2://", 1),
                    warehouse=f"file://{interop}/warehouse")
    pg.create_namespace(namespace)
    table = pg.register_table(f"{namespace}.customers", metadata)
    print(table.metadata_location)


if __name__ == "__main__":
    main()
