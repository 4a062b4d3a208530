"""The validating admission webhook: `kubectl apply` of a bad RLJob fails with every problem's field path.

It runs the same pydantic validation as `kuberl validate` (`kuberl.api.parse_rljob`), so the
cross-field rules the CRD schema cannot express (gae needs a critic, minReplicas <= maxReplicas,
credentials in env ...) are refused at the door. The operator only serves it: the
ValidatingWebhookConfiguration that sends RLJob reviews here is templated by the Helm chart
(charts/kuberl/templates/webhook.yaml), with the CA of the serving certificate the chart (or
cert-manager) puts in a Secret. The operator's account holds no admissionregistration permission, and
the configuration outlives operator restarts: while the operator is down, RLJob writes are refused
(failurePolicy Fail), never let through unvalidated.

Beyond `kuberl validate`, the webhook knows the job is for a cluster (cluster_checks.py): it refuses a job
whose checkpoints would land on the head's own disk, and warns (AdmissionReview `warnings`, which kubectl
prints) for every local path a pod reads without mounting a volume that holds it. `kuberl validate --cluster`
runs the same checks, both as errors.
"""

from dataclasses import dataclass, field
from typing import Any

import kopf

from kuberl.api import GROUP, PLURAL, VERSION, ManifestError, Problem, parse_rljob
from kuberl.operator.cluster_checks import review_for_cluster
from kuberl.operator.settings import OperatorSettings

#: The handler's id, which kopf serves at the path `/<id>`: the configuration's `clientConfig.service.path`.
WEBHOOK_ID = "validate-rljob"
#: How often kopf checks the certificate files for a renewal.
CERTIFICATE_CHECK_SECONDS = 10.0


@dataclass(frozen=True)
class Review:
    """The webhook's answer: problems refuse the RLJob; warnings admit it and are shown to whoever applied it."""

    problems: list[Problem]
    warnings: list[str] = field(default_factory=list)


def review(body: dict[str, Any], old: dict[str, Any] | None = None) -> Review:
    """An RLJob as the API server would store it, reviewed for a cluster; status is the operator's, not checked.

    `old`, on an update: the stored RLJob. A cluster refusal it already had (a job admitted before the rule
    existed) is a warning instead, as Kubernetes ratchets its own validation: the owner can still suspend,
    fix or finish the job; only a new problem is refused.
    """
    try:
        job = parse_rljob(_manifest(body))
    except ManifestError as error:
        return Review(error.problems)
    cluster = review_for_cluster(job)
    warnings = [str(problem) for problem in cluster.unreachable]
    already = _cluster_refusals(old) if old is not None else set()
    refusals = [problem for problem in cluster.refusals if str(problem) not in already]
    warnings += [
        f"{problem} (admitted before this was checked; fix it)"
        for problem in cluster.refusals
        if str(problem) in already
    ]
    return Review(refusals, warnings)


def _manifest(body: dict[str, Any]) -> dict[str, Any]:
    """The RLJob without its status (the operator's). Every other key counts: the CRD keeps unknown fields
    (api/crd.py), so a key mistyped at the top (`runpolicy:` beside `spec:`) is refused here, not dropped."""
    return {key: value for key, value in body.items() if key != "status"}


def _content(body: Any) -> dict[str, Any]:
    """What a write may change besides metadata and status: the spec, and any key mistyped beside it."""
    return {key: value for key, value in dict(body).items() if key not in ("metadata", "status")}


def _cluster_refusals(old: dict[str, Any]) -> set[str]:
    """The cluster refusals of the stored RLJob (none when it no longer parses: then nothing ratchets)."""
    try:
        job = parse_rljob(_manifest(old))
    except ManifestError:
        return set()
    return {str(problem) for problem in review_for_cluster(job).refusals}


def admission_message(problems: list[Problem]) -> str:
    """One line per problem, each with its field path: `spec.models.critic: ...`."""
    return f"invalid RLJob ({len(problems)} problem(s)):\n" + "\n".join(f"  {problem}" for problem in problems)


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"], registry=registry)
    def validate_rljob(
        body: kopf.Body, warnings: list[str], old: Any = None, operation: str | None = None, **_: Any
    ) -> None:
        if operation == "UPDATE" and old is not None and _content(old) == _content(body):
            return  # metadata-only writes (labels, kopf's annotations) of an already admitted job
        answer = review(dict(body), dict(old) if operation == "UPDATE" and old is not None else None)
        if answer.problems:
            raise kopf.AdmissionError(admission_message(answer.problems), code=422)
        warnings.extend(answer.warnings)


def server(settings: OperatorSettings) -> kopf.WebhookServer:
    """kopf's HTTPS server for the webhook, with the certificate from files (templates/webhook.yaml mounts them).

    kopf re-reads the files when their content changes (every `file_check_interval` seconds) and restarts
    the listener with the new pair, so a renewed certificate (cert-manager) is served without a restart.
    """
    if not (settings.webhook_cert and settings.webhook_key):
        raise ValueError(
            "the webhook needs its serving certificate: set KUBERL_WEBHOOK_CERT and KUBERL_WEBHOOK_KEY to PEM files "
            "(the Helm chart mounts them), or run without --webhook-port"
        )
    return kopf.WebhookServer(
        addr=settings.webhook_addr,
        port=settings.webhook_port,
        certfile=settings.webhook_cert,
        pkeyfile=settings.webhook_key,
        file_check_interval=CERTIFICATE_CHECK_SECONDS,
    )
