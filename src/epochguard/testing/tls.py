"""Throw-away TLS material for the test clusters, generated at test time.

One CA and one server certificate for ``localhost`` and ``127.0.0.1``, written as PEM (for
Python clients and the EmbeddedCluster's ``ssl`` module) and as a PKCS12 keystore/truststore
(for Kafka's JVM). Nothing here is fit for production: the keys live unencrypted on disk
next to a password printed in the returned object.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import attrs

__all__ = ["TlsMaterial", "make_tls_material"]

# Kafka reads a PKCS12 store only with a password; this one protects nothing.
STORE_PASSWORD = "epochguard-test"


@attrs.frozen
class TlsMaterial:
    """Paths of the generated files; ``cafile`` is what a client's ``ssl_cafile`` wants."""

    directory: Path
    cafile: Path
    certfile: Path
    keyfile: Path
    keystore: Path
    truststore: Path
    store_password: str = STORE_PASSWORD

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.certfile), str(self.keyfile))
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.cafile))
        return context


def make_tls_material(directory: Path, *, days: int = 2) -> TlsMaterial:
    """Write a CA and a 127.0.0.1/localhost server certificate signed by it to ``directory``."""
    # Imported here: cryptography is a dev dependency, needed only by secured test clusters.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID

    if days < 1:
        raise ValueError(f"certificates must be valid for at least one day, got days={days}")
    directory.mkdir(parents=True, exist_ok=True)
    # Back-dated: a clock a little behind ours must still accept the certificate.
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    until = now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "epochguard test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    cafile = directory / "ca.pem"
    certfile = directory / "server.pem"
    keyfile = directory / "server-key.pem"
    cafile.write_bytes(ca_cert.public_bytes(pem))
    certfile.write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    keyfile.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    keyfile.chmod(0o600)
    password = STORE_PASSWORD.encode()
    keystore = directory / "server.p12"
    keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"server", key, cert, [ca_cert], serialization.BestAvailableEncryption(password)
        )
    )
    truststore = directory / "truststore.p12"
    truststore.write_bytes(
        pkcs12.serialize_java_truststore(
            [pkcs12.PKCS12Certificate(ca_cert, b"ca")],
            serialization.BestAvailableEncryption(password),
        )
    )
    return TlsMaterial(directory, cafile, certfile, keyfile, keystore, truststore)
