"""The `kuberl` command: validate, explain, crds, run, convert, operator.

Heavy parts (the runtime's torch and Ray, the operator's kopf) are imported only by the
sub-commands that need them, so `kuberl validate` works from the base install.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kuberl import __version__
from kuberl.api.contract import IMAGE_FILES_DIR, add_runtime_options, runtime_args_of


def cmd_validate(args: argparse.Namespace) -> int:
    from kuberl.api import validate_file

    more_checks = None
    if args.cluster:  # pure builders and checks: no kopf or Kubernetes client needed
        from kuberl.operator.cluster_checks import cluster_problems

        more_checks = cluster_problems
    failed = 0
    for path in args.files:
        errors = validate_file(path, only_rljobs=args.only_rljobs, more_checks=more_checks)
        for error in errors:
            print(error, file=sys.stderr)
        if errors:
            failed += 1
        elif not args.quiet:
            print(f"{path}: valid")
    return 1 if failed else 0


def cmd_explain(args: argparse.Namespace) -> int:
    from kuberl.api.explain import UnknownFieldPath, explain, explain_verl_defaults

    try:
        print(explain_verl_defaults() if args.verl else explain(args.field or ""))
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
    return int(run_from_cli(runtime_args_of(args)))


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


#: `kuberl convert verl` exit code when a lost knob changes what is trained and --accept-loss was not given.
EXIT_LOSSY_CONVERSION = 3


def cmd_convert_verl(args: argparse.Namespace) -> int:
    import os
    import shlex

    import yaml

    from kuberl.api import ManifestError
    from kuberl.verl.command import LaunchError, read_launch
    from kuberl.verl.convert import convert

    if len(args.launch) > 1:  # a command line, after --
        source, text = "the command line", shlex.join(args.launch)
    elif args.launch == ["-"]:
        source, text = "stdin", sys.stdin.read()
    else:
        source = args.launch[0]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as error:
            print(f"kuberl convert verl: cannot read {source}: {error.strerror}", file=sys.stderr)
            return 1
    bad = [item for item in args.env if "=" not in item]
    if bad:
        print(f"kuberl convert verl: --env {bad[0]}: write NAME=VALUE", file=sys.stderr)
        return 1
    environment = dict(os.environ) | dict(item.split("=", 1) for item in args.env)
    try:
        conversion = convert(read_launch(text, environment), name=args.name)
    except LaunchError as error:
        print(f"kuberl convert verl: {source}: {error}", file=sys.stderr)
        return 1
    except ManifestError as error:
        print(f"kuberl convert verl: the converted job is not valid:\n{error}", file=sys.stderr)
        return 1
    for knob in conversion.lost:
        print(f"lost: {knob}", file=sys.stderr)
    if conversion.changes_training and not args.accept_loss:
        names = ", ".join(knob.key for knob in conversion.changes_training)
        print(
            f"kuberl convert verl: {len(conversion.changes_training)} lost knobs change what is trained ({names}); "
            "pass --accept-loss to print the manifest anyway",
            file=sys.stderr,
        )
        return EXIT_LOSSY_CONVERSION
    sys.stdout.write(yaml.safe_dump(conversion.manifest, sort_keys=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl", description="RL post-training of language models on Kubernetes.")
    parser.add_argument("--version", action="version", version=f"kuberl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser("validate", help="check RLJob manifests; prints every problem with its field path")
    validate.add_argument("files", nargs="+", help="YAML files (several documents per file are checked one by one)")
    validate.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    validate.add_argument(
        "--only-rljobs",
        action="store_true",
        help="skip documents of other kinds (and files without an RLJob): for a pre-commit check over a GitOps "
        "repository, see docs/gitops.md",
    )
    validate.add_argument(
        "--cluster",
        action="store_true",
        help="also check what a run on Kubernetes needs, as the webhook does: checkpoints on a claim or an object "
        "store, and every local path the job names on a volume mounted by each pod that reads it (or in kuberl's "
        f"runtime image under {IMAGE_FILES_DIR}); the webhook only warns about paths: an image of yours may hold them",
    )
    validate.set_defaults(func=cmd_validate)

    explain = sub.add_parser("explain", help="document a field, e.g. `kuberl explain spec.algorithm.groupSize`")
    explain.add_argument("field", nargs="?", help="dotted field path; omit for the top level")
    explain.add_argument("--verl", action="store_true", help="list every default that differs from verl's, and why")
    explain.set_defaults(func=cmd_explain)

    crds = sub.add_parser("crds", help="print the RLJob CRD generated from the schema, or write it into folders")
    crds.add_argument("--write", nargs="+", metavar="DIR", help="write kuberl.io_rljobs.yaml into each DIR")
    crds.set_defaults(func=cmd_crds)

    run = sub.add_parser("run", help="run an RLJob on this machine (starts a local Ray)")
    add_runtime_options(run, spec_positional=True)  # the runtime's own options (api/contract.py)
    run.set_defaults(func=cmd_run)

    convert = sub.add_parser("convert", help="write another framework's launch as an RLJob manifest")
    frameworks = convert.add_subparsers(dest="framework", required=True)
    verl = frameworks.add_parser(
        "verl",
        help="a verl launch script or command line (python3 -m verl.trainer.main_ppo key=value ...) as an RLJob",
        description="Prints the RLJob on stdout and every verl knob it cannot carry on stderr. Exits 3, printing "
        "no manifest, when a lost knob changes what is trained, unless --accept-loss.",
    )
    verl.add_argument(
        "launch",
        nargs="+",
        help="the .sh script or a file holding the command line (- reads stdin), or after -- the command line itself",
    )
    verl.add_argument("--name", help="metadata.name of the RLJob (default: from trainer.experiment_name)")
    verl.add_argument(
        "--accept-loss", action="store_true", help="print the manifest even if lost knobs change training"
    )
    verl.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a shell variable the script reads (repeatable)",
    )
    verl.set_defaults(func=cmd_convert_verl)

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
