"""The validating admission webhook: `kubectl apply` of a bad RLJob fails with every problem's field path.

It runs the same pydantic validation as `kuberl validate` (`kuberl.api.parse_rljob`), so the
cross-field rules the CRD schema cannot express (gae needs a critic, minReplicas <= maxReplicas,
credentials in env ...) are refused at the door. The serving certificate comes from files
(KUBERL_WEBHOOK_CERT/KEY, e.g. from cert-manager) or is self-signed at start-up; kopf keeps the
ValidatingWebhookConfiguration (KUBERL_WEBHOOK_CONFIGURATION) pointing at it with that CA.
"""

import datetime
import ipaddress
from collections.abc import AsyncIterator, Collection
from typing import Any

import kopf

from kuberl.api import GROUP, PLURAL, VERSION, ManifestError, Problem, parse_rljob

WEBHOOK_ID = "validate-rljob"


def problems_of(body: dict[str, Any]) -> list[Problem]:
    """Every problem of an RLJob as the API server would store it; status is the operator's and not checked."""
    manifest = {key: body[key] for key in ("apiVersion", "kind", "metadata", "spec") if key in body}
    try:
        parse_rljob(manifest)
    except ManifestError as error:
        return error.problems
    return []


def admission_message(problems: list[Problem]) -> str:
    """One line per problem, each with its field path: `spec.models.critic: ...`."""
    return f"invalid RLJob ({len(problems)} problem(s)):\n" + "\n".join(f"  {problem}" for problem in problems)


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"], registry=registry)
    def validate_rljob(body: kopf.Body, old: Any = None, operation: str | None = None, **_: Any) -> None:
        if operation == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
            return  # metadata-only writes (labels, kopf's annotations) of an already admitted job
        problems = problems_of(dict(body))
        if problems:
            raise kopf.AdmissionError(admission_message(problems), code=422)


def self_signed_certificate(hostnames: Collection[str], password: str | None = None) -> tuple[bytes, bytes]:
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
        .not_valid_after(now + datetime.timedelta(days=365))
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


class WebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server with a `cryptography` self-signed certificate, and optionally a Service.

    `service` ("namespace/name[:port]") makes the API server reach the webhook through that Service
    (the usual in-cluster set-up) instead of the URL `https://<host>:<port>`.
    """

    def __init__(self, *, service: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service = service

    @staticmethod
    def build_certificate(hostnames: Collection[str], password: str | None = None) -> tuple[bytes, bytes]:
        return self_signed_certificate(hostnames, password)

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for client_config in super().__call__(fn):
            if self.service is None:
                yield client_config
                continue
            namespace, _, rest = self.service.partition("/")
            name, _, port = rest.partition(":")
            service: dict[str, Any] = {"namespace": namespace, "name": name, "port": int(port or 443)}
            config: dict[str, Any] = {"service": service}
            if "caBundle" in client_config:
                config["caBundle"] = client_config["caBundle"]
            yield config
