"""TLS end to end: writes a self-signed certificate for 127.0.0.1 (`gen DIR`), or queries a
`clearice serve` over grpc+tls with that certificate as the trusted root (`query ADDR CERT`)."""
import datetime
import ipaddress
import json
import sys
from pathlib import Path


def gen(out):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    out = Path(out)
    (out / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def query(addr, cert):
    import adbc_driver_flightsql.dbapi as flightsql

    conn = flightsql.connect(
        f"grpc+tls://{addr}",
        db_kwargs={
            "username": "analyst",
            "password": "analyst",
            "adbc.flight.sql.client_option.tls_root_certs": Path(cert).read_text(),
        },
    )
    cur = conn.cursor()
    cur.execute("SELECT ssn FROM lake.sales.customers WHERE id = 1000001")
    print(json.dumps(cur.fetchall()))
    conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(sys.argv[2])
    else:
        query(sys.argv[2], sys.argv[3])
