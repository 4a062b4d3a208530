"""What leaves a run: metric names and exporters, the metric files, trackers, and the status report.

telemetry.py          every metric's name, once, and the Prometheus exporter
metrics.py            metrics.jsonl, TensorBoard, the progress bar and the final plot
tracking.py           wandb and MLflow (spec.tracking)
status_publisher.py   the report the operator copies into the RLJob's status
"""
