"""PME files whose keys are wrapped by AWS KMS (an AWS-compatible endpoint, moto_server),
written by PyArrow, for crates/cli/tests/it/aws_kms.rs.

usage: aws_kms_fixture.py ENDPOINT OUTDIR -> OUTDIR/aws.parquet (internal key material),
OUTDIR/ext/aws_ext.parquet (external key material, a side file); prints the key ids.
Credentials come from the environment (AWS_ACCESS_KEY_ID...), as the reader's do.
"""
import base64
import json
import sys
from datetime import timedelta
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe


def main():
    endpoint, out = sys.argv[1], Path(sys.argv[2])
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    footer = kms.create_key(Description="clearice footer")["KeyMetadata"]["KeyId"]
    pii = kms.create_key(Description="clearice pii")["KeyMetadata"]["KeyId"]

    class AwsKmsClient(pe.KmsClient):
        def __init__(self, _config):
            super().__init__()

        def wrap_key(self, key_bytes, master_key_identifier):
            blob = kms.encrypt(KeyId=master_key_identifier, Plaintext=key_bytes)["CiphertextBlob"]
            return base64.b64encode(blob).decode()

        def unwrap_key(self, wrapped_key, master_key_identifier):
            return kms.decrypt(KeyId=master_key_identifier,
                               CiphertextBlob=base64.b64decode(wrapped_key))["Plaintext"]

    factory = pe.CryptoFactory(lambda cfg: AwsKmsClient(cfg))
    table = pa.table({
        "id": pa.array(range(1000), pa.int64()),
        "ssn": pa.array([f"{i:03d}-00-{i:04d}" for i in range(1000)]),
    })

    def write(path, internal):
        config = pe.EncryptionConfiguration(
            footer_key=footer, column_keys={pii: ["ssn"]},
            cache_lifetime=timedelta(minutes=5), internal_key_material=internal)
        fs = pafs.LocalFileSystem()
        props = factory.file_encryption_properties(pe.KmsConnectionConfig(), config,
                                                   str(path), fs)
        pq.write_table(table, str(path), encryption_properties=props)

    write(out / "aws.parquet", True)
    (out / "ext").mkdir()
    write(out / "ext" / "aws_ext.parquet", False)
    print(json.dumps({"footer": footer, "pii": pii}))


if __name__ == "__main__":
    main()
