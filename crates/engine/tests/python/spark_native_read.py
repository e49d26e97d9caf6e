"""Spark reads a table ClearIce wrote, for the Rust test `native` (crates/engine/tests/it/native.rs).

usage: spark_native_read.py RUNTIME_JAR KMS_JAR KEYRING METASTORE_URI WAREHOUSE NAME=METADATA...

Spark 4.1 with Iceberg 1.12 (the catalog of spark_native.py: Iceberg's Hive catalog, the Java
keyring KMS) registers each METADATA (a metadata file ClearIce committed) as `hive.db.NAME`
with `system.register_table`, then prints, after `RESULT `, one JSON object by NAME with its rows ordered by id
(every column but id as a string), its rows' lineage (`_row_id`, `_last_updated_sequence_number`),
its deletion vectors (and those naming removed files) and its snapshots' operations.
"""
import json
import os
import sys
from pathlib import Path

from spark_native import render, spark_session


def main():
    jar, kms_jar, keyring, uri, warehouse = sys.argv[1:6]
    spark = spark_session([jar, kms_jar], uri, Path(warehouse), Path(keyring).resolve())
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
    out = {}
    for arg in sys.argv[6:]:
        name, metadata = arg.split("=", 1)
        spark.sql(f"CALL hive.system.register_table(table => 'db.{name}', metadata_file => '{metadata}')")
        cols = list(spark.sql(f"SELECT * FROM hive.db.{name}").columns)
        sel = ", ".join("id" if c == "id" else f"CAST(`{c}` AS STRING) AS `{c}`" for c in cols)
        rows = spark.sql(f"SELECT {sel} FROM hive.db.{name} ORDER BY id").collect()
        ops = [r.operation for r in spark.sql(
            f"SELECT operation FROM hive.db.{name}.snapshots ORDER BY committed_at").collect()]
        out[name] = {"columns": cols, "rows": [[render(r[c]) for c in cols] for r in rows], "operations": ops}
        # Format 3: each row's lineage, [id, _row_id, _last_updated_sequence_number].
        out[name]["lineage"] = [list(r) for r in spark.sql(
            f"SELECT id, _row_id, _last_updated_sequence_number FROM hive.db.{name} ORDER BY id").collect()]
        # Deletion vectors, and those of data files no longer in the table (the spec
        # has them removed with their file).
        out[name]["dvs"] = spark.sql(f"SELECT count(*) FROM hive.db.{name}.delete_files").collect()[0][0]
        out[name]["dangling_dvs"] = spark.sql(
            f"SELECT count(*) FROM hive.db.{name}.delete_files d WHERE d.referenced_data_file IS NOT NULL "
            f"AND NOT EXISTS (SELECT 1 FROM hive.db.{name}.data_files f "
            f"WHERE f.file_path = d.referenced_data_file)").collect()[0][0]
    print("\nRESULT " + json.dumps(out))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
