"""Certificates for the TLS fixtures, made fresh per session: an authority, and the server and
client certificates it signs (for 127.0.0.1 and localhost), valid or already expired; and a
second authority that signed nothing the servers show."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rankstream.stack import TlsFiles

Key = ec.EllipticCurvePrivateKey
DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Authority:
    key: Key
    cert: x509.Certificate
    file: Path  # its certificate, PEM: what a client trusts


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def authority(folder: Path, name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 30 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{name}.pem"
    file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(key, cert, file)


def issue(
    ca: Authority, folder: Path, name: str, expired: bool = False, password: bytes | None = None
) -> TlsFiles:
    """A certificate `ca` signs for 127.0.0.1 and localhost, good for a server and a client;
    `expired`: its validity ended yesterday; `password`: its key file is encrypted with it."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    until = now - DAY if expired else now + 30 * DAY
    alt = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(until - 60 * DAY)
        .not_valid_after(until)
        .add_extension(alt, critical=False)
        .add_extension(usage, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = folder / f"{name}.crt", folder / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    encryption = (
        serialization.NoEncryption() if password is None else serialization.BestAvailableEncryption(password)
    )
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    key_file.chmod(0o600)
    return TlsFiles(ca.file, cert_file, key_file)
