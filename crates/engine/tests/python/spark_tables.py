"""Iceberg tables as Spark leaves them, for the Rust test `spark` (crates/engine/tests/it/spark.rs).

usage: spark_tables.py MAKE_FIXTURES.py RUNTIME_JAR KEYRING OUT_DIR

Spark 4.1 (pyspark, local mode) with Iceberg's Spark runtime writes tables into a Hadoop catalog
under OUT_DIR/warehouse; PyIceberg then registers each one in a SQLite SqlCatalog
(OUT_DIR/catalog.db, catalog `spark`, namespace `db`), which ClearIce opens.

  db.mor      v2, partitioned by region, merge-on-read: Spark's DELETE, UPDATE and MERGE leave
              Parquet position delete files; then a column rename and an added column, a tag
              and a branch.
  db.dv       v3, merge-on-read: Spark's DELETE and UPDATE leave deletion vectors (Puffin).
  db.eq       v2, unpartitioned: equality delete files (PyArrow-written, committed through
              Iceberg's Java API: RowDelta) on `id` (global) and on `name` (with a NULL),
              with rows re-inserted after a delete (sequence-number rule).
  db.eqp      v2, partitioned by region: an equality delete scoped to one partition;
              snapshot summaries name the partitions (write.summary.partition-limit).
  db.pme      v2: data files PME-encrypted by PyArrow (keyring KMS of the interop lake:
              footer_key, ssn/email under pii_key, amount under finance_key), committed
              through the Java API. Its deletes: Spark's position deletes computed on the
              plaintext twin `db.pme_plain` (same rows, same order), rewritten for db.pme's
              paths and PME-encrypted by PyArrow; and an equality delete on the encrypted
              column `ssn`, itself encrypted under pii_key.

Expected results are Spark's own answers, at every snapshot of every table (db.pme's from
its plaintext twin, whose snapshots correspond one to one). Prints a JSON summary and writes
OUT_DIR/expected.json.
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe

FIELD_ID = b"PARQUET:field_id"
FILE_PATH_ID = 2147483546
POS_ID = 2147483545


def load_module(path):
    spec = importlib.util.spec_from_file_location("make_fixtures", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def spark_session(jar, warehouse):
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName("clearice-spark-tables")
        .config("spark.jars", jar)
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.sp", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.sp.type", "hadoop")
        .config("spark.sql.catalog.sp.warehouse", f"file://{warehouse}")
        .config("spark.sql.catalog.sp.cache-enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )


MOR = ("'format-version'='2', 'write.delete.mode'='merge-on-read', "
       "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read'")

ROWS = ("id", "CASE id % 3 WHEN 0 THEN 'EU' WHEN 1 THEN 'US' ELSE 'APAC' END AS region",
        "CASE WHEN id % 11 = 0 THEN NULL ELSE concat('n', id) END AS name",
        "CAST(id * 1.25 AS decimal(10,2)) AS amount")


def rows(spark, lo, hi, parts=2):
    return spark.range(lo, hi).selectExpr(*ROWS).repartition(parts)


class Java:
    """Iceberg's Java API in Spark's JVM (py4j)."""

    def __init__(self, spark):
        self.spark = spark
        self.gw = spark.sparkContext._gateway
        self.jvm = spark.sparkContext._jvm

    def table(self, name):
        return self.jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(self.spark._jsparkSession, name)

    def ints(self, values):
        arr = self.gw.new_array(self.jvm.int, len(values))
        for i, v in enumerate(values):
            arr[i] = v
        return arr

    def delete_file(self, table, path, records, equality_ids=None, partition=None):
        b = self.jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(table.spec())
        b = b.ofEqualityDeletes(self.ints(equality_ids)) if equality_ids else b.ofPositionDeletes()
        b = b.withPath(f"file://{path}").withFormat("parquet").withFileSizeInBytes(os.path.getsize(path))
        b = b.withRecordCount(records)
        if partition:
            b = b.withPartitionPath(partition)
        return b.build()

    def commit_deletes(self, name, files):
        t = self.table(name)
        rd = t.newRowDelta()
        for f in files:
            rd = rd.addDeletes(f)
        rd.commit()

    def append(self, name, paths_records):
        t = self.table(name)
        ap = t.newAppend()
        for path, n in paths_records:
            df = (self.jvm.org.apache.iceberg.DataFiles.builder(t.spec()).withPath(f"file://{path}")
                  .withFormat("parquet").withFileSizeInBytes(os.path.getsize(path)).withRecordCount(n).build())
            ap = ap.appendFile(df)
        ap.commit()


def field(name, typ, fid, nullable=True):
    return pa.field(name, typ, nullable=nullable, metadata={FIELD_ID: str(fid).encode()})


def write(table, path, props=None):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    kw = {"encryption_properties": props} if props is not None else {}
    pq.write_table(table, str(path), **kw)
    return str(path)


def local(uri):
    for p in ("file://", "file:"):
        if uri.startswith(p):
            return uri[len(p):]
    return uri


def build_mor(spark):
    spark.sql(f"CREATE TABLE sp.db.mor (id bigint, region string, name string, amount decimal(10,2)) "
              f"USING iceberg PARTITIONED BY (region) TBLPROPERTIES ({MOR})")
    rows(spark, 1, 601).writeTo("sp.db.mor").append()
    rows(spark, 601, 1001).writeTo("sp.db.mor").append()
    spark.sql("DELETE FROM sp.db.mor WHERE id % 7 = 0")
    spark.sql("UPDATE sp.db.mor SET amount = amount + 1, name = concat(name, '+') WHERE id % 5 = 0")
    spark.sql("ALTER TABLE sp.db.mor CREATE TAG before_merge")
    rows(spark, 990, 1011, 1).createOrReplaceTempView("src")
    spark.sql("""MERGE INTO sp.db.mor t USING (SELECT id, region, concat('m', id) AS name, amount FROM src) s
                 ON t.id = s.id
                 WHEN MATCHED AND s.id % 2 = 0 THEN DELETE
                 WHEN MATCHED THEN UPDATE SET t.name = s.name
                 WHEN NOT MATCHED THEN INSERT *""")
    spark.sql("ALTER TABLE sp.db.mor CREATE BRANCH audit")
    spark.sql("ALTER TABLE sp.db.mor RENAME COLUMN name TO label")
    spark.sql("ALTER TABLE sp.db.mor ADD COLUMN note string")
    spark.sql("INSERT INTO sp.db.mor VALUES (2001, 'EU', 'late', 3.50, 'added after the rename')")
    spark.sql("DELETE FROM sp.db.mor WHERE id = 3")


def build_dv(spark):
    spark.sql(f"CREATE TABLE sp.db.dv (id bigint, region string, name string, amount decimal(10,2)) "
              f"USING iceberg TBLPROPERTIES ({MOR.replace(chr(39) + '2' + chr(39), chr(39) + '3' + chr(39))})")
    rows(spark, 1, 801).writeTo("sp.db.dv").append()
    spark.sql("DELETE FROM sp.db.dv WHERE id % 6 = 0")
    spark.sql("UPDATE sp.db.dv SET name = 'updated' WHERE id % 9 = 1")
    spark.sql("DELETE FROM sp.db.dv WHERE id BETWEEN 100 AND 120")


def build_eq(spark, java, out):
    spark.sql("CREATE TABLE sp.db.eq (id bigint, region string, name string, amount decimal(10,2)) "
              "USING iceberg TBLPROPERTIES ('format-version'='2')")
    rows(spark, 1, 501).writeTo("sp.db.eq").append()
    t = java.table("sp.db.eq")
    ids = [2, 4] + list(range(10, 21))
    p = write(pa.table({"id": pa.array(ids, pa.int64())},
                       schema=pa.schema([field("id", pa.int64(), 1, False)])),
              out / "deletes/eq-id.parquet")
    java.commit_deletes("sp.db.eq", [java.delete_file(t, p, len(ids), equality_ids=[1])])
    # Rows with deleted ids come back later: a newer data sequence number survives the delete.
    rows(spark, 15, 18, 1).writeTo("sp.db.eq").append()
    names = ["n30", "n31", None, "no-such-name"]
    p = write(pa.table({"name": pa.array(names, pa.string())},
                       schema=pa.schema([field("name", pa.string(), 3)])),
              out / "deletes/eq-name.parquet")
    java.commit_deletes("sp.db.eq", [java.delete_file(java.table("sp.db.eq"), p, len(names), equality_ids=[3])])


def build_eqp(spark, java, out):
    spark.sql("CREATE TABLE sp.db.eqp (id bigint, region string, name string, amount decimal(10,2)) "
              "USING iceberg PARTITIONED BY (region) TBLPROPERTIES ('format-version'='2', "
              "'write.summary.partition-limit'='10')")
    rows(spark, 1, 301).writeTo("sp.db.eqp").append()
    t = java.table("sp.db.eqp")
    # ids 3, 6, 9 are in EU; 1, 4 in US: an EU-scoped delete of all five removes only 3, 6, 9.
    ids = [1, 3, 4, 6, 9]
    p = write(pa.table({"id": pa.array(ids, pa.int64())},
                       schema=pa.schema([field("id", pa.int64(), 1, False)])),
              out / "deletes/eqp-id.parquet")
    java.commit_deletes("sp.db.eqp", [java.delete_file(t, p, len(ids), equality_ids=[1], partition="region=EU")])


PME_SCHEMA = pa.schema([field("id", pa.int64(), 1, False), field("ssn", pa.string(), 2),
                        field("email", pa.string(), 3), field("amount", pa.decimal128(10, 2), 4)])


def pme_rows(lo, hi):
    ids = list(range(lo, hi))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "ssn": [None if i % 13 == 0 else f"{100 + i % 800:03d}-{10 + i % 89:02d}-{1000 + i:04d}" for i in ids],
        "email": [f"user{i}@example.com" for i in ids],
        "amount": pa.array([None if i % 17 == 0 else __import__("decimal").Decimal(i) / 4 for i in ids],
                           pa.decimal128(10, 2)),
    }, schema=PME_SCHEMA)


def build_pme(spark, java, out, mf, keyring):
    cf = mf.crypto_factory(keyring)
    conn = pe.KmsConnectionConfig()
    data_cfg = pe.EncryptionConfiguration(footer_key="footer_key",
                                          column_keys={"pii_key": ["ssn", "email"], "finance_key": ["amount"]})
    for name in ("pme", "pme_plain"):
        spark.sql(f"CREATE TABLE sp.db.{name} (id bigint NOT NULL, ssn string, email string, amount decimal(10,2)) "
                  f"USING iceberg TBLPROPERTIES ({MOR})")
    data = {"pme": out / "warehouse/db/pme/data", "pme_plain": out / "warehouse/db/pme_plain/data"}
    parts = [("a.parquet", 1, 301), ("b.parquet", 301, 601)]
    for name, d in data.items():
        files = []
        for fname, lo, hi in parts:
            props = cf.file_encryption_properties(conn, data_cfg) if name == "pme" else None
            files.append((write(pme_rows(lo, hi), d / fname, props), hi - lo))
        java.append(f"sp.db.{name}", files)
    # Spark computes the positions on the twin; the same rows in the same order are deleted
    # from db.pme by a PyArrow-encrypted copy of Spark's delete file(s).
    spark.sql("DELETE FROM sp.db.pme_plain WHERE id % 4 = 0 OR amount > 140")
    t = java.table("sp.db.pme_plain")
    snap = t.currentSnapshot()
    added = snap.addedDeleteFiles(t.io())
    pos_files = []
    it = added.iterator()
    while it.hasNext():
        pos_files.append(local(it.next().location()))
    assert pos_files, "Spark wrote no position delete file"
    pos_cfg = pe.EncryptionConfiguration(footer_key="footer_key", uniform_encryption=True)
    pme_t = java.table("sp.db.pme")
    committed = []
    for i, f in enumerate(pos_files):
        d = pq.read_table(f)
        paths = [p.replace("/db/pme_plain/", "/db/pme/") for p in d.column("file_path").to_pylist()]
        rewritten = pa.table({"file_path": paths, "pos": d.column("pos")},
                             schema=pa.schema([field("file_path", pa.string(), FILE_PATH_ID, False),
                                               field("pos", pa.int64(), POS_ID, False)]))
        p = write(rewritten, out / f"warehouse/db/pme/data/pos-{i}.parquet",
                  cf.file_encryption_properties(conn, pos_cfg))
        committed.append(java.delete_file(pme_t, p, rewritten.num_rows))
    java.commit_deletes("sp.db.pme", committed)
    # An equality delete on the encrypted column ssn (the delete file encrypts it too).
    victims = pme_rows(1, 601).filter(pa.compute.is_in(pa.compute.field("id"), pa.array([5, 7, 301, 333])))
    ssns = victims.column("ssn").to_pylist()
    eq = pa.table({"ssn": ssns}, schema=pa.schema([field("ssn", pa.string(), 2)]))
    eq_cfg = pe.EncryptionConfiguration(footer_key="footer_key", column_keys={"pii_key": ["ssn"]})
    for name in ("pme", "pme_plain"):
        props = cf.file_encryption_properties(conn, eq_cfg) if name == "pme" else None
        p = write(eq, out / f"warehouse/db/{name}/data/eq-ssn.parquet", props)
        java.commit_deletes(f"sp.db.{name}", [java.delete_file(java.table(f"sp.db.{name}"), p, len(ssns),
                                                               equality_ids=[2])])


def render(v):
    if v is None or isinstance(v, (int, str)):
        return v
    return str(v)


def answers(spark, name, source=None):
    """Spark's answers at every snapshot (and at refs) of `name` (computed on `source`)."""
    source = source or name
    snaps = spark.sql(f"SELECT snapshot_id, unix_millis(committed_at) AS ms, operation "
                      f"FROM sp.db.{source}.snapshots ORDER BY committed_at, snapshot_id").collect()
    own = spark.sql(f"SELECT snapshot_id, unix_millis(committed_at) AS ms "
                    f"FROM sp.db.{name}.snapshots ORDER BY committed_at, snapshot_id").collect()
    assert len(own) == len(snaps), (name, len(own), len(snaps))
    out = []
    for s, o in zip(snaps, own):
        df = spark.sql(f"SELECT * FROM sp.db.{source} VERSION AS OF {s.snapshot_id}")
        cols = [c for c in df.columns]
        sel = ", ".join(f"CAST(`{c}` AS STRING) AS `{c}`" if c not in ("id",) else "id" for c in cols)
        data = spark.sql(f"SELECT {sel} FROM sp.db.{source} VERSION AS OF {s.snapshot_id} ORDER BY id").collect()
        out.append({
            "snapshot_id": o.snapshot_id,
            "committed_at_ms": o.ms,
            "operation": s.operation,
            "columns": cols,
            "rows": [[render(r[c]) for c in cols] for r in data],
        })
    refs = {r.name: r.snapshot_id for r in spark.sql(f"SELECT name, snapshot_id FROM sp.db.{name}.refs").collect()}
    delete_files = spark.sql(f"SELECT file_format, content FROM sp.db.{source}.delete_files").collect() \
        if source == name else []
    return {"snapshots": out, "refs": refs,
            "delete_formats": sorted({f"{r.content}:{r.file_format}" for r in delete_files})}


def register(out, names):
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("spark", uri=f"sqlite:///{out / 'catalog.db'}", warehouse=f"file://{out / 'warehouse'}")
    cat.create_namespace("db")
    for n in names:
        meta = out / "warehouse/db" / n / "metadata"
        version = int((meta / "version-hint.text").read_text().strip())
        cat.register_table(f"db.{n}", f"file://{meta / f'v{version}.metadata.json'}")
    # A v3 table whose metadata asks for Iceberg-native encryption (what Iceberg 1.11+ writes
    # through its Hive catalog): db.dv's metadata with `encryption.key-id` set, to check
    # ClearIce's error.
    meta = out / "warehouse/db/dv/metadata"
    version = int((meta / "version-hint.text").read_text().strip())
    md = json.loads((meta / f"v{version}.metadata.json").read_text())
    md.setdefault("properties", {})["encryption.key-id"] = "keyA"
    target = meta / "native-encryption.metadata.json"
    target.write_text(json.dumps(md))
    cat.register_table("db.native_enc", f"file://{target}")


def main():
    make_fixtures, jar, keyring, out = sys.argv[1:5]
    out = Path(out).resolve()
    mf = load_module(make_fixtures)
    keys = mf.load_keyring(Path(keyring))
    spark = spark_session(jar, out / "warehouse")
    spark.sparkContext.setLogLevel("ERROR")
    java = Java(spark)
    build_mor(spark)
    build_dv(spark)
    build_eq(spark, java, out)
    build_eqp(spark, java, out)
    build_pme(spark, java, out, mf, keys)
    tables = ["mor", "dv", "eq", "eqp", "pme", "pme_plain"]
    expected = {n: answers(spark, n) for n in tables if n != "pme"}
    expected["pme"] = answers(spark, "pme", source="pme_plain")
    # The tag and branch of db.mor as Spark reads them.
    for ref in ("before_merge", "audit"):
        expected["mor"].setdefault("ref_counts", {})[ref] = spark.sql(
            f"SELECT count(*) AS n FROM sp.db.mor VERSION AS OF '{ref}'").collect()[0].n
    spark.stop()
    register(out, tables)
    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    print(json.dumps({"catalog": str(out / "catalog.db"), "warehouse": str(out / "warehouse"),
                      "tables": {n: {"snapshots": len(e["snapshots"]), "delete_formats": e["delete_formats"]}
                                 for n, e in expected.items()}}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
