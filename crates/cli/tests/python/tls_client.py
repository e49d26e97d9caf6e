"""TLS end to end.

`gen DIR` writes a self-signed server certificate for 127.0.0.1 (server.pem, server.key), a
client CA (clients-ca.pem) and a client certificate it signed (client.pem, client.key).
`query ADDR CERT [CLIENT_CERT CLIENT_KEY]` queries a `clearice serve` over grpc+tls with CERT as
the trusted root, presenting the client certificate when given (mTLS)."""
import datetime
import ipaddress
import json
import sys
from pathlib import Path


def gen(out):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    out = Path(out)

    def cert(cn, key, issuer_cn, issuer_key, ca, extensions=()):
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        for ext in extensions:
            b = b.add_extension(ext, critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(name, c, key):
        (out / f"{name}.pem").write_bytes(c.public_bytes(serialization.Encoding.PEM))
        (out / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    write("server", cert("localhost", key, "localhost", key, True, [san]), key)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    write("clients-ca", cert("clearice test clients", ca_key, "clearice test clients", ca_key, True), ca_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = cert(
        "analyst-laptop",
        client_key,
        "clearice test clients",
        ca_key,
        False,
        [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])],
    )
    write("client", client, client_key)


def query(addr, cert, client_cert=None, client_key=None):
    import adbc_driver_flightsql.dbapi as flightsql

    db_kwargs = {
        "username": "analyst",
        "password": "analyst",
        "adbc.flight.sql.client_option.tls_root_certs": Path(cert).read_text(),
    }
    if client_cert:
        db_kwargs["adbc.flight.sql.client_option.mtls_cert_chain"] = Path(client_cert).read_text()
        db_kwargs["adbc.flight.sql.client_option.mtls_private_key"] = Path(client_key).read_text()
    conn = flightsql.connect(f"grpc+tls://{addr}", db_kwargs=db_kwargs)
    cur = conn.cursor()
    cur.execute("SELECT ssn FROM lake.sales.customers WHERE id = 1000001")
    print(json.dumps(cur.fetchall()))
    conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(sys.argv[2])
    else:
        query(*sys.argv[2:])
