"""Tables Iceberg encrypts itself, for the Rust test `native` (crates/engine/tests/it/native.rs).

usage: spark_native.py RUNTIME_JAR HMS_CLASSPATH KEYRING KMS_JAVA OUT_DIR

Spark 4.1 (pyspark, local mode) with Iceberg 1.12's Spark runtime writes, through Iceberg's
Hive catalog (Hive's standalone metastore 3.1, started here on a loopback port, Derby under
OUT_DIR/hms), tables with Iceberg-native encryption (format v3, `encryption.key-id`). The
catalog's `encryption.kms-impl` is `clearice.test.KeyringKms` (KMS_JAVA, compiled here
against the runtime jar): the interop keyring, in ClearIce's wrap format.

  db.enc     v3, partitioned by region, merge-on-read: two appends, a DELETE (deletion
             vectors, encrypted), an added column, an append with it, an UPDATE (more
             deletion vectors).
  db.tamper  v3: an append and a DELETE, for the tampering test to flip bytes in.
  db.sink    v3, unpartitioned: one append; ClearIce appends to it and Spark reads it back
             (spark_native_read.py).
  db.dvt     v3, unpartitioned, merge-on-read: one file and a DELETE (a deletion vector);
             ClearIce's DELETE and UPDATE rewrite the file, keeping its rows' lineage.

The current metadata file is also registered in a SQLite Iceberg SQL catalog
(OUT_DIR/catalog.db, catalog `spark`, namespace `db`), as a copy named after its SHA-256
(as ClearIce names them: a SQL catalog row vouches for a file of a table Iceberg encrypts
only so), `db.unanchored` under Spark's own name for `db.enc`, and `db.rekeyed`: `db.enc`
claiming table key `pii_key`. Expected results are Spark's own
answers at every snapshot (OUT_DIR/expected.json), with what is on disk: Parquet files end in
`PARE`, manifest lists and manifests start with `AGS1`. Prints a JSON summary.
"""
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

KEY_ID = "finance_key"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_metastore(cp, dir):
    """Hive's standalone metastore on a free port, Derby under `dir` (as hms.rs starts it)."""
    port = free_port()
    conf = dir / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    props = {
        "metastore.thrift.uris": f"thrift://127.0.0.1:{port}",
        "metastore.thrift.port": str(port),
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={dir / 'metastore_db'};create=true",
        "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
        "datanucleus.schema.autoCreateAll": "true",
        "metastore.schema.verification": "false",
        "metastore.warehouse.dir": f"file://{dir / 'warehouse'}",
        "metastore.expression.proxy": "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy",
        "metastore.task.threads.always": "org.apache.hadoop.hive.metastore.events.EventCleanerTask",
    }
    xml = "".join(f"  <property><name>{k}</name><value>{v}</value></property>\n" for k, v in props.items())
    (conf / "metastore-site.xml").write_text(f"<configuration>\n{xml}</configuration>\n")
    log = open(dir / "metastore.log", "w")
    proc = subprocess.Popen(
        ["java", "--add-opens=java.base/java.lang=ALL-UNNAMED", "--add-opens=java.base/java.net=ALL-UNNAMED",
         "--add-opens=java.base/java.util=ALL-UNNAMED", "-cp", f"{conf}:{cp}",
         "org.apache.hadoop.hive.metastore.HiveMetaStore"],
        cwd=dir, stdout=subprocess.DEVNULL, stderr=log)
    start = time.time()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() - start > 180:
                raise SystemExit(f"the metastore did not start:\n{(dir / 'metastore.log').read_text()}")
            time.sleep(0.3)
    return proc, f"thrift://127.0.0.1:{port}"


def compile_kms(jar, source, out):
    classes = out / "kms-classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run(["javac", "-nowarn", "-cp", jar, "-d", str(classes), source], check=True)
    kms_jar = out / "clearice-test-kms.jar"
    subprocess.run(["jar", "cf", str(kms_jar), "-C", str(classes), "."], check=True)
    return kms_jar


def spark_session(jars, uri, warehouse, keyring):
    from pyspark.sql import SparkSession

    c = "spark.sql.catalog.hive"
    return (
        SparkSession.builder.master("local[2]")
        .appName("clearice-spark-native")
        .config("spark.jars", ",".join(str(j) for j in jars))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config(c, "org.apache.iceberg.spark.SparkCatalog")
        .config(f"{c}.type", "hive")
        .config(f"{c}.uri", uri)
        .config(f"{c}.warehouse", f"file://{warehouse}")
        .config(f"{c}.cache-enabled", "false")
        .config(f"{c}.encryption.kms-impl", "clearice.test.KeyringKms")
        .config(f"{c}.clearice.keyring", str(keyring))
        # Hive's standalone metastore here has no transaction tables (HMS locks): commits
        # use no lock (one writer).
        .config("spark.hadoop.iceberg.engine.hive.lock-enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.pyspark.jvmStacktrace.enabled", "true")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )


ROWS = ("id", "CASE id % 3 WHEN 0 THEN 'EU' WHEN 1 THEN 'US' ELSE 'APAC' END AS region",
        "CASE WHEN id % 11 = 0 THEN NULL ELSE concat('n', id) END AS name",
        "CAST(id * 1.25 AS decimal(10,2)) AS amount")


def render(v):
    if v is None or isinstance(v, (int, str)):
        return v
    return str(v)


def build(spark):
    t = "hive.db.enc"
    spark.sql("CREATE DATABASE IF NOT EXISTS hive.db")
    spark.sql(f"""CREATE TABLE {t} (id bigint, region string, name string, amount decimal(10,2))
                  USING iceberg PARTITIONED BY (region)
                  TBLPROPERTIES ('format-version'='3', 'encryption.key-id'='{KEY_ID}',
                                 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read',
                                 'write.merge.mode'='merge-on-read')""")
    spark.range(0, 600).selectExpr(*ROWS).repartition(2).writeTo(t).append()
    spark.range(600, 1000).selectExpr(*ROWS).repartition(2).writeTo(t).append()
    spark.sql(f"DELETE FROM {t} WHERE id % 7 = 0")
    spark.sql(f"ALTER TABLE {t} ADD COLUMN note string")
    spark.range(1000, 1200).selectExpr(*ROWS, "concat('note ', id) AS note").writeTo(t).append()
    spark.sql(f"UPDATE {t} SET name = concat(name, '!'), note = 'updated' WHERE id % 13 = 0")
    # A small twin the tampering test flips bytes in (and restores).
    spark.sql(f"""CREATE TABLE hive.db.tamper (id bigint, region string, name string, amount decimal(10,2))
                  USING iceberg
                  TBLPROPERTIES ('format-version'='3', 'encryption.key-id'='{KEY_ID}',
                                 'write.delete.mode'='merge-on-read')""")
    spark.range(0, 200).selectExpr(*ROWS).repartition(2).writeTo("hive.db.tamper").append()
    spark.sql("DELETE FROM hive.db.tamper WHERE id % 7 = 0")
    # The table ClearIce appends to (and Spark reads back): unpartitioned, one append.
    spark.sql(f"""CREATE TABLE hive.db.sink (id bigint, region string, name string, amount decimal(10,2))
                  USING iceberg
                  TBLPROPERTIES ('format-version'='3', 'encryption.key-id'='{KEY_ID}')""")
    spark.range(0, 50).selectExpr(*ROWS).writeTo("hive.db.sink").append()
    # One data file with a deletion vector, which ClearIce rewrites.
    spark.sql(f"""CREATE TABLE hive.db.dvt (id bigint, region string, name string, amount decimal(10,2))
                  USING iceberg
                  TBLPROPERTIES ('format-version'='3', 'encryption.key-id'='{KEY_ID}',
                                 'write.delete.mode'='merge-on-read')""")
    spark.range(0, 60).selectExpr(*ROWS).repartition(1).writeTo("hive.db.dvt").append()
    spark.sql("DELETE FROM hive.db.dvt WHERE id % 5 = 0")


def answers(spark, name):
    snaps = spark.sql(f"SELECT snapshot_id, unix_millis(committed_at) AS ms, operation "
                      f"FROM hive.db.{name}.snapshots ORDER BY committed_at, snapshot_id").collect()
    out = []
    for s in snaps:
        df = spark.sql(f"SELECT * FROM hive.db.{name} VERSION AS OF {s.snapshot_id}")
        cols = list(df.columns)
        sel = ", ".join("id" if c == "id" else f"CAST(`{c}` AS STRING) AS `{c}`" for c in cols)
        data = spark.sql(f"SELECT {sel} FROM hive.db.{name} VERSION AS OF {s.snapshot_id} ORDER BY id").collect()
        out.append({"snapshot_id": s.snapshot_id, "committed_at_ms": s.ms, "operation": s.operation,
                    "columns": cols, "rows": [[render(r[c]) for c in cols] for r in data]})
    return out


def on_disk(table_dir):
    """What Iceberg wrote: magic bytes of every file, the metadata's encryption entries."""
    meta = table_dir / "metadata"
    current = max(meta.glob("*.metadata.json"), key=lambda p: int(p.name.split("-")[0]))
    md = json.loads(current.read_text())
    facts = {"metadata": str(current), "encryption_keys": len(md.get("encryption-keys", [])),
             "snapshots_with_key_id": sum(1 for s in md.get("snapshots", []) if "key-id" in s),
             "parquet_end_PARE": 0, "parquet_other": 0, "avro_AGS1": 0, "avro_other": 0,
             "puffin_AGS1": 0, "puffin_other": 0}
    for p in table_dir.rglob("*"):
        if not p.is_file():
            continue
        b = p.read_bytes()
        if p.suffix == ".parquet":
            facts["parquet_end_PARE" if b[-4:] == b"PARE" else "parquet_other"] += 1
        elif p.suffix == ".avro":
            facts["avro_AGS1" if b[:4] == b"AGS1" else "avro_other"] += 1
        elif p.suffix == ".puffin":  # deletion vectors
            facts["puffin_AGS1" if b[:4] == b"AGS1" else "puffin_other"] += 1
    return facts


def anchored_copy(metadata):
    """A copy of `metadata` named as ClearIce names the metadata files of tables Iceberg
    encrypts in SQL catalogs: the uuid part is the first 128 bits of the file's SHA-256, so
    the catalog row (not the warehouse) vouches for the content."""
    src = Path(metadata)
    data = src.read_bytes()
    h = hashlib.sha256(data).hexdigest()[:32]
    dst = src.with_name(f"{src.name.split('-')[0]}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}.metadata.json")
    dst.write_bytes(data)
    return dst


def register_sql(out, name, metadata):
    """The JDBC catalog schema (as PyIceberg's SqlCatalog creates it), one row per table."""
    db = sqlite3.connect(out / "catalog.db")
    db.execute("CREATE TABLE IF NOT EXISTS iceberg_tables (catalog_name VARCHAR(255) NOT NULL, "
               "table_namespace VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL, "
               "metadata_location VARCHAR(1000), previous_metadata_location VARCHAR(1000), "
               "iceberg_type VARCHAR(5), PRIMARY KEY (catalog_name, table_namespace, table_name))")
    db.execute("CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL, "
               "namespace VARCHAR(255) NOT NULL, property_key VARCHAR(255) NOT NULL, "
               "property_value VARCHAR(1000) NOT NULL, PRIMARY KEY (catalog_name, namespace, property_key))")
    db.execute("INSERT OR REPLACE INTO iceberg_namespace_properties VALUES ('spark', 'db', 'exists', 'true')")
    db.execute("INSERT OR REPLACE INTO iceberg_tables VALUES ('spark', 'db', ?, ?, NULL, 'TABLE')",
               (name, f"file://{metadata}"))
    db.commit()
    db.close()


def main():
    jar, hms_cp, keyring, kms_java, out = sys.argv[1:6]
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    warehouse = out / "warehouse"
    kms_jar = compile_kms(jar, kms_java, out)
    hms_dir = out / "hms"
    hms_dir.mkdir(exist_ok=True)
    metastore, uri = start_metastore(hms_cp, hms_dir)
    try:
        spark = spark_session([jar, kms_jar], uri, warehouse, Path(keyring).resolve())
        spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
        build(spark)
        expected = {"enc": {"key_id": KEY_ID, "snapshots": answers(spark, "enc")}}
        spark.stop()
    finally:
        metastore.terminate()
        metastore.wait(timeout=60)
    for name in ("enc", "tamper", "sink", "dvt"):
        facts = on_disk(warehouse / "db.db" / name)
        assert facts["parquet_other"] == 0 and facts["avro_other"] == 0 and facts["parquet_end_PARE"] > 0, facts
        assert facts["avro_AGS1"] > 0 and facts["snapshots_with_key_id"] > 0, facts
        assert name == "sink" or facts["puffin_AGS1"] > 0, facts
        expected.setdefault(name, {})["on_disk"] = facts
        register_sql(out, name, anchored_copy(facts["metadata"]))
    # Spark's own file name, which no SQL catalog row can vouch for: refused.
    register_sql(out, "unanchored", expected["enc"]["on_disk"]["metadata"])
    # db.enc's metadata claiming another table key than the one its keys are wrapped by
    # (as a writer of the metadata could make it, to pass a policy on that key): anchored,
    # so only the key binding refuses it.
    enc = Path(expected["enc"]["on_disk"]["metadata"])
    md = json.loads(enc.read_text())
    md["properties"]["encryption.key-id"] = "pii_key"
    rekeyed = enc.with_name("00099-00000000-0000-0000-0000-000000000000.metadata.json")
    rekeyed.write_text(json.dumps(md))
    register_sql(out, "rekeyed", anchored_copy(rekeyed))
    rekeyed.unlink()
    facts = expected["enc"]["on_disk"]
    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    print(json.dumps({"tables": {"enc": {"snapshots": len(expected["enc"]["snapshots"]), **facts}}}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
