"""Reading back what the trackers recorded: a wandb offline run file and an MLflow store."""

import json
import struct
from pathlib import Path

#: The .wandb file is LevelDB's log format: 32 KiB blocks of records, each with a 7-byte header
#: (CRC32C, length, type: 1 full, 2 first, 3 middle, 4 last), after a 7-byte ":W&B" file header.
_BLOCK, _HEADER = 32768, 7


def wandb_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    records, pending, position = [], b"", _HEADER
    while position + _HEADER <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + _HEADER])
        position += _HEADER
        if kind == 0:  # zero padding to the end of the block
            position += left - _HEADER
            continue
        pending += data[position : position + length]
        position += length
        if kind in (1, 4):
            records.append(pending)
            pending = b""
    return records


def wandb_offline_run(output_dir: Path) -> tuple[dict, list[dict]]:
    """(run facts: project, name, tags, id) and the logged history rows (without wandb's own _ keys)."""
    from wandb.proto import wandb_internal_pb2

    (run_file,) = output_dir.glob("wandb/offline-run-*/run-*.wandb")
    run: dict = {}
    history = []
    for raw in wandb_records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = {
                "project": record.run.project,
                "name": record.run.display_name,
                "tags": list(record.run.tags),
                "id": record.run.run_id,
            }
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.append({key: value for key, value in row.items() if not key.startswith("_") or key == "_step"})
    return run, history


def mlflow_run_metrics(uri: str, experiment: str) -> tuple[dict, dict[int, dict[str, float]]]:
    """(the run's name and tags) and every metric by step, read back through MLflow's client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    (run,) = client.search_runs([experiment_id])
    by_step: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, key):
            by_step.setdefault(metric.step, {})[key] = metric.value
    return {"name": run.info.run_name, "tags": run.data.tags, "status": run.info.status}, by_step
