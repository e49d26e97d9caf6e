"""Registers an existing table's current metadata under other names with PyIceberg's
`register_table`, as a pipeline adds tables the policy does not name. Used by
crates/cli/tests/it/writes.rs.

usage: register_table.py CATALOG_DB WAREHOUSE SOURCE NEW [NEW ...]   (names namespace.table)
"""
import sys

from pyiceberg.catalog.sql import SqlCatalog


def main():
    db, warehouse, source, new = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    cat = SqlCatalog("lake", uri=f"sqlite:///{db}", warehouse=f"file://{warehouse}")
    location = cat.load_table(source).metadata_location
    for name in new:
        ns = tuple(name.split(".")[:-1])
        for depth in range(1, len(ns) + 1):
            cat.create_namespace_if_not_exists(ns[:depth])
        cat.register_table(name, location)


if __name__ == "__main__":
    main()
