"""Spark (local mode, pyspark) reads data files ClearIce wrote, decrypting them with
parquet-java's key tools (PropertiesDrivenCryptoFactory and a KMS client over the same
keyring). Used by crates/cli/tests/it/writes.rs.

usage: spark_read_written.py KMS_CLIENT_JAR KEYRING.json FILE.parquet...
prints JSON: {"rows": [[id, name, ssn, salary_cents, dept], ...] sorted by id}
"""
import json
import sys

from pyspark.sql import SparkSession


def main():
    jar, keyring, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    spark = (SparkSession.builder.master("local[1]")
             .appName("clearice-read-back")
             .config("spark.jars", jar)
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.hadoop.parquet.crypto.factory.class",
                     "org.apache.parquet.crypto.keytools.PropertiesDrivenCryptoFactory")
             .config("spark.hadoop.parquet.encryption.kms.client.class", "KeyringKmsClient")
             .config("spark.hadoop.clearice.keyring.path", keyring)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.read.parquet(*files)
    rows = []
    for r in df.collect():
        salary = r["salary"]
        rows.append([r["id"], r["name"], r["ssn"],
                     None if salary is None else round(salary * 100), r["dept"]])
    rows.sort(key=lambda r: r[0])
    spark.stop()
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
