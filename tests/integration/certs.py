"""A self-signed serving certificate for the tests' webhook servers (the chart makes its own with Helm's genCA).

The certificate is its own CA (basicConstraints CA=true), so the same PEM is the server's certificate
and the caBundle the API server verifies it with.
"""

import datetime
import ipaddress
from collections.abc import Collection
from pathlib import Path


def self_signed_certificate(
    hostnames: Collection[str], password: str | None = None, days: int = 30
) -> tuple[bytes, bytes]:
    """A self-signed CA certificate (PEM) and its EC key for `hostnames` (DNS names and IPs as SANs).

    kopf's own generator needs `certbuilder`; this one uses `cryptography`.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    sans: list[x509.GeneralName] = []
    dns = []
    for hostname in hostnames:
        try:
            address = ipaddress.ip_address(hostname)
        except ValueError:
            dns.append(hostname)
            sans.append(x509.DNSName(hostname))
        else:
            if not address.is_unspecified:
                sans.append(x509.IPAddress(address))
    common_name = dns[0] if dns else next(h for h in hostnames if not ipaddress.ip_address(h).is_unspecified)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    return certificate.public_bytes(serialization.Encoding.PEM), pem_key


def write_certificate(folder: Path, hostnames: Collection[str]) -> tuple[Path, Path, bytes]:
    """(certificate file, key file, CA PEM) of a fresh certificate for `hostnames`, as a mounted Secret holds them."""
    pem, key = self_signed_certificate(hostnames)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tls.crt").write_bytes(pem)
    (folder / "tls.key").write_bytes(key)
    return folder / "tls.crt", folder / "tls.key", pem
