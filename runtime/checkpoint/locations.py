"""Where a job's checkpoints, exported model and outputs live: given by the spec, else on its claim, else local.

On a claim every job writes under its own folder (`contract.job_folder_on_claim`), so jobs may share one
ReadWriteMany claim; the operator checks paths against the same mount (operator/cluster_checks.py).
"""

from pathlib import Path

from kuberl.api import RLJob, contract
from kuberl.runtime.objectstore import is_remote


def job_folder_on_claim(job: RLJob) -> Path:
    """`<claim mount>/<namespace>/<name>`: one job's folder on a checkpoint claim, which jobs may share (RWX)."""
    return Path(contract.job_folder_on_claim(job.metadata.namespace, job.metadata.name))


def checkpoint_uri(job: RLJob, output_dir: Path) -> str:
    """checkpoint.uri as given (relative paths inside the output folder), the job's folder on its claim, or
    <output>/checkpoints."""
    ckpt = job.spec.checkpoint
    if ckpt.uri:
        if "://" in ckpt.uri or Path(ckpt.uri).is_absolute():
            return ckpt.uri
        return str(output_dir / ckpt.uri)
    if ckpt.pvc_claim_name:
        return str(job_folder_on_claim(job) / "checkpoints")
    return str(output_dir / "checkpoints")


def export_location(job: RLJob, output_dir: Path) -> str:
    """Where the final model is exported, so that it outlives the pods (rank 0's own disk does not): beside the
    checkpoints on an object store (`<checkpoint uri>/model`), in the job's folder on its claim
    (`<claim>/<namespace>/<name>/model`, where every pod mounts it), else in the output folder."""
    checkpoints = checkpoint_uri(job, output_dir)
    if is_remote(checkpoints):
        return checkpoints.rstrip("/") + "/model"
    if job.spec.checkpoint.pvc_claim_name:
        return str(job_folder_on_claim(job) / "model")
    return str(output_dir.resolve() / "model")  # absolute: rank 0 may run in another working directory


def default_output_dir(job: RLJob) -> Path:
    """runs/<job name>/, or the job's folder on its checkpoint claim when it has one: the exported model,
    metrics.jsonl and TensorBoard events then outlive the pod, on the claim beside the checkpoints."""
    return job_folder_on_claim(job) if job.spec.checkpoint.pvc_claim_name else Path("runs") / job.metadata.name
