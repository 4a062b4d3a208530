"""The `kuberl` command: validate, explain, crds, run, operator.

Heavy parts (the runtime's torch and Ray, the operator's kopf) are imported only by the
sub-commands that need them, so `kuberl validate` works from the base install.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kuberl import __version__


def cmd_validate(args: argparse.Namespace) -> int:
    from kuberl.api import validate_file

    failed = 0
    for path in args.files:
        errors = validate_file(path)
        for error in errors:
            print(error, file=sys.stderr)
        if errors:
            failed += 1
        elif not args.quiet:
            print(f"{path}: valid")
    return 1 if failed else 0


def cmd_explain(args: argparse.Namespace) -> int:
    from kuberl.api.explain import UnknownFieldPath, explain

    try:
        print(explain(args.field or ""))
    except UnknownFieldPath as error:
        print(f"kuberl explain: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_crds(args: argparse.Namespace) -> int:
    from kuberl.api.crd import CRD_FILE_NAME, render_crd_yaml

    text = render_crd_yaml()
    if not args.write:
        sys.stdout.write(text)
        return 0
    for directory in args.write:
        target = Path(directory) / CRD_FILE_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    try:
        from kuberl.runtime.main import run_from_cli
    except ImportError as error:
        print(
            f"kuberl run: the runtime is not available ({error}); install kuberl[runtime] (make run does)",
            file=sys.stderr,
        )
        return 2
    return int(run_from_cli(args))


def cmd_operator(args: argparse.Namespace) -> int:
    try:
        from kuberl.operator.main import run_operator
    except ImportError as error:
        print(
            f"kuberl operator: the operator is not available ({error}); install kuberl[operator]",
            file=sys.stderr,
        )
        return 2
    return int(run_operator(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl", description="RL post-training of language models on Kubernetes.")
    parser.add_argument("--version", action="version", version=f"kuberl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser("validate", help="check RLJob manifests; prints every problem with its field path")
    validate.add_argument("files", nargs="+", help="YAML files (several documents per file are checked one by one)")
    validate.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    validate.set_defaults(func=cmd_validate)

    explain = sub.add_parser("explain", help="document a field, e.g. `kuberl explain spec.algorithm.groupSize`")
    explain.add_argument("field", nargs="?", help="dotted field path; omit for the top level")
    explain.set_defaults(func=cmd_explain)

    crds = sub.add_parser("crds", help="print the RLJob CRD generated from the schema, or write it into folders")
    crds.add_argument("--write", nargs="+", metavar="DIR", help="write kuberl.io_rljobs.yaml into each DIR")
    crds.set_defaults(func=cmd_crds)

    run = sub.add_parser("run", help="run an RLJob on this machine (starts a local Ray)")
    run.add_argument("spec", help="RLJob YAML file")
    run.add_argument("--output", help="directory for everything the run writes (default: runs/<job name>/)")
    run.add_argument("--address", help="join this Ray cluster instead of starting one")
    run.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics at :PORT/metrics while it runs (0: any free port)"
    )
    run.set_defaults(func=cmd_run)

    operator = sub.add_parser("operator", help="run the kopf operator against the current kube context")
    operator.add_argument("--namespace", action="append", help="watch only these namespaces (repeatable)")
    operator.add_argument("--webhook-port", type=int, default=None, help="serve the validating webhook on this port")
    operator.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port")
    operator.set_defaults(func=cmd_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
