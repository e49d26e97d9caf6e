"""Identity provider and Flight SQL client for crates/cli/tests/it/remote.rs.

usage:
  remote_client.py keygen DIR          -> DIR/idp.key (PKCS#8) and DIR/idp.pub (SPKI), ES256
  remote_client.py tlsgen DIR          -> DIR/ca.pem, DIR/server.pem, DIR/server.key (127.0.0.1)
  remote_client.py pyread FILE KEYRING...  -> rows of FILE (id, ssn, email) read by PyArrow
                                          with the master keys of the keyring files
  remote_client.py query ADDR KEY AUD  -> one JSON object: what each token saw over ADBC

Users' own tokens are ES256 JWTs signed here with the identity provider's key; the
crypto-server trusts its public key. The ClearIce user is the same for every token
(analyst): only the token passed as `key_access_token` differs.
"""
import base64
import json
import sys
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def es256(key, claims: dict) -> str:
    header = b64url(json.dumps({"alg": "ES256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps(claims).encode())
    der = key.sign(f"{header}.{payload}".encode(), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return f"{header}.{payload}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def keygen(out: Path):
    key = ec.generate_private_key(ec.SECP256R1())
    (out / "idp.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (out / "idp.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def tlsgen(out: Path):
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "clearice test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (out / "ca.pem").write_bytes(ca.public_bytes(pem))
    (out / "server.pem").write_bytes(cert.public_bytes(pem))
    (out / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def pyread(path, keyrings):
    import pyarrow.parquet as pq
    import pyarrow.parquet.encryption as pe
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    keys = {}
    for k in keyrings:
        for name, value in json.loads(Path(k).read_text()).items():
            keys[name] = base64.b64decode(value if isinstance(value, str) else value[-1])

    class Keyring(pe.KmsClient):
        def __init__(self, _config):
            super().__init__()

        def wrap_key(self, key_bytes, master_key_identifier):
            raise NotImplementedError

        def unwrap_key(self, wrapped_key, master_key_identifier):
            data = base64.b64decode(wrapped_key)
            return AESGCM(keys[master_key_identifier]).decrypt(
                data[:12], data[12:], master_key_identifier.encode())

    factory = pe.CryptoFactory(lambda cfg: Keyring(cfg))
    props = factory.file_decryption_properties(pe.KmsConnectionConfig())
    table = pq.read_table(path, columns=["id", "ssn", "email"], decryption_properties=props)
    print(json.dumps(table.slice(0, 3).to_pylist()))


ROW = "SELECT id, ssn FROM lake.sales.customers WHERE id = 1000001"


def query(addr, token, user="analyst", sql=ROW):
    kwargs = {"username": user, "password": user}
    if token is not None:
        kwargs["adbc.flight.sql.rpc.call_header.key_access_token"] = token
    try:
        conn = flightsql.connect(f"grpc://{addr}", db_kwargs=kwargs)
        cur = conn.cursor()
        cur.execute(sql)
        rows = [list(r) for r in cur.fetchall()]
        conn.close()
        return {"rows": rows}
    except adbc_driver_manager.Error as e:
        return {"error": str(e)}


def main():
    if sys.argv[1] == "keygen":
        keygen(Path(sys.argv[2]))
        return
    if sys.argv[1] == "pyread":
        pyread(sys.argv[2], sys.argv[3:])
        return
    if sys.argv[1] == "tlsgen":
        tlsgen(Path(sys.argv[2]))
        return
    addr, key_file, aud = sys.argv[2], sys.argv[3], sys.argv[4]
    key = serialization.load_pem_private_key(Path(key_file).read_bytes(), None)
    now = int(time.time())
    alice = es256(key, {"sub": "alice", "aud": aud, "exp": now + 600, "roles": ["admin"]})
    bob = es256(key, {"sub": "bob", "aud": aud, "exp": now + 600})
    expired = es256(key, {"sub": "alice", "aud": aud, "exp": now - 3600, "roles": ["admin"]})
    print(json.dumps({
        "own_credentials": query(addr, None),
        "admin_own_credentials": query(addr, None, "admin"),
        "alice": query(addr, alice),
        "alice_plan": query(addr, alice, sql="EXPLAIN " + ROW),
        "bob": query(addr, bob),
        "expired": query(addr, expired),
    }))


if __name__ == "__main__":
    main()
