"""The ``uni`` command: ``uni demo``, ``uni bench``, ``uni info``.

Exit status: 0 success; 1 a wrong result or a failed operation or benchmark; 2 the command
cannot run as asked (bad flags, a device or an optional package that is not there).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from uni import _bench, _demo, _info


def _demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo", help="stream a matrix through mapped files with overlapped leases, and check it",
        description=(_demo.__doc__ or "").split("\n\n")[0],
    )
    demo.add_argument("--size", default=_demo.DEFAULT_SIZE, type=_size,
                      help="input matrix size, e.g. 256MiB, 64M, 1GiB; a bare number is MiB "
                           f"(default {_demo.DEFAULT_SIZE})")
    demo.add_argument("--blocks", type=int, default=_demo.DEFAULT_BLOCKS,
                      help=f"row blocks to stream (default {_demo.DEFAULT_BLOCKS})")
    demo.add_argument("--device", default="auto", choices=("auto", "host", "cuda"),
                      help="where the stages run: host (uni's workers) or cuda (two CUDA "
                           "streams, pinned staging); auto is cuda when usable (default auto)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the generated input")
    demo.add_argument("--blas-threads", type=int, metavar="N",
                      help="BLAS threads per call, in both runs alike (default: the usable "
                           "cores but one, at least 1: that core runs the overlapping stages)")
    demo.add_argument("--timeline", metavar="FILE.png",
                      help="draw each block's read/compute/write spans (needs matplotlib)")
    demo.add_argument("--json", metavar="FILE",
                      help="also write the measurement as JSON (wall times, stage and step "
                           "times, ratio, backends, checks)")


def _size(text: str) -> int:
    try:
        return _demo.parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench", help="run the benchmarks/ suite: ratios against numpy/scipy in the same run",
        description="Run every benchmarks/bench_*.py module and print one table of ratios "
                    "(reference time / uni time; above 1 uni is faster).",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    bench.add_argument("--json", metavar="FILE", help="write the results (docs/performance.md)")
    bench.add_argument("--plot", metavar="FILE.png", help="bar chart of the ratios (matplotlib)")
    bench.add_argument("--only", metavar="NAMES",
                       help="comma-separated module names to run (e.g. lease,copy)")
    bench.add_argument("--suite", metavar="DIR",
                       help="the benchmarks directory (default: $UNI_BENCHMARKS, ./benchmarks, "
                            "or the one beside the uni package in a source checkout)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="uni", description="uni tensor runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    _demo_parser(sub)
    _bench_parser(sub)
    sub.add_parser("info", help="version, dtypes, backends, BLAS and whether CUDA is usable")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo.run(_demo.DemoOptions(size=args.size, blocks=args.blocks,
                                           device=args.device, seed=args.seed,
                                           timeline=args.timeline,
                                           blas_threads=args.blas_threads,
                                           json_path=args.json))
    if args.command == "bench":
        only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
        return _bench.run(quick=args.quick, json_path=args.json, plot_path=args.plot,
                          only=only, suite=args.suite or os.environ.get("UNI_BENCHMARKS"))
    return _info.run()


if __name__ == "__main__":
    sys.exit(main())
