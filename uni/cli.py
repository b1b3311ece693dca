"""The ``uni`` command: ``uni demo``, ``uni bench``, ``uni info``, ``uni recover``.

Exit status: 0 success; 1 a wrong result or a failed operation or benchmark; 2 the command
cannot run as asked (bad flags, a device or an optional package that is not there).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from uni import StorageError
from uni._app import _bench, _demo, _info
from uni.storage import recover as recover_file


def _demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo", help="stream a matrix through mapped files with overlapped leases, and check it",
        description=(_demo.__doc__ or "").split("\n\n")[0],
    )
    demo.add_argument("--size", default=_demo.DEFAULT_SIZE, type=_size,
                      help="input matrix size, e.g. 256MiB, 64M, 1GiB; a bare number is MiB "
                           f"(default {_demo.DEFAULT_SIZE})")
    demo.add_argument("--blocks", type=_positive_int, default=_demo.DEFAULT_BLOCKS,
                      help=f"row blocks to stream (default {_demo.DEFAULT_BLOCKS})")
    demo.add_argument("--device", default="auto", choices=("auto", "host", "cuda"),
                      help="where the stages run: host (uni's workers) or cuda (two CUDA "
                           "streams, pinned staging); auto is cuda when usable (default auto)")
    demo.add_argument("--seed", type=_seed, default=0,
                      help="seed of the generated input, a whole number >= 0 (default 0)")
    demo.add_argument("--blas-threads", type=_positive_int, metavar="N",
                      help="BLAS threads per call, in both runs alike (default: the usable "
                           "cores but one, at least 1: that core runs the overlapping stages)")
    demo.add_argument("--timeline", metavar="FILE.png", type=_figure_file,
                      help="draw each block's read/compute/write spans (needs matplotlib)")
    demo.add_argument("--json", metavar="FILE", type=_output_file,
                      help="also write the measurement as JSON (wall times, stage and step "
                           "times, ratio, backends, checks)")


# The validators below run while argparse reads the flags, so a bad value exits 2 with
# "argument --flag: expected ..., got ..." before any work starts (not after a whole run).
def _size(text: str) -> int:
    try:
        size = _demo.parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return size


def _whole_number(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _whole_number(text, 1, "a whole number >= 1")


def _seed(text: str) -> int:
    # numpy's SeedSequence takes any whole number >= 0 and refuses negative ones.
    return _whole_number(text, 0, "a whole number >= 0")


def _output_file(text: str) -> str:
    """A file that can be written at the end of the run: checked now, not after the work."""
    path = os.path.abspath(text)
    folder = os.path.dirname(path)
    if not text or os.path.isdir(path):
        why = "it is a directory" if text else "it is empty"
    elif not os.path.isdir(folder):
        why = f"{folder} is not a directory"
    elif not os.access(folder, os.W_OK | os.X_OK):
        why = f"{folder} is not writable"
    elif os.path.exists(path) and not os.access(path, os.W_OK):
        why = "it exists and is not writable"
    else:
        return text
    raise argparse.ArgumentTypeError(
        f"expected a file in a writable directory, got {text!r} ({why})")


#: What matplotlib's savefig writes without extra packages, by file name.
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


def _figure_file(text: str) -> str:
    if os.path.splitext(text)[1].lower() not in FIGURE_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"expected a file name ending in {', '.join(FIGURE_SUFFIXES)}, got {text!r}")
    return _output_file(text)


def _module_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or not all(names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated module names, each once (e.g. lease,copy), got {text!r}")
    return names


def _same_file(parser: argparse.ArgumentParser, first: tuple[str, str | None],
               second: tuple[str, str | None]) -> None:
    """Two output flags naming one file: the second write would destroy the first."""
    (flag_a, a), (flag_b, b) = first, second
    if a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b):
        parser.error(f"{flag_a} and {flag_b}: expected two different files, got {a!r} for both")


def _bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench", help="run the benchmarks/ suite: ratios against numpy/scipy in the same run",
        description="Run every benchmarks/bench_*.py module and print one table of ratios "
                    "(reference time / uni time; above 1 uni is faster).",
    )
    bench.add_argument("--quick", action="store_true",
                       help="small sizes (about 1.5 minutes on 2 cores)")
    bench.add_argument("--json", metavar="FILE", type=_output_file,
                       help="write the results (docs/performance.md)")
    bench.add_argument("--plot", metavar="FILE.png", type=_figure_file,
                       help="bar charts of the ratios, a panel per module (matplotlib)")
    bench.add_argument("--only", metavar="NAMES", type=_module_names,
                       help="comma-separated module names to run (e.g. lease,copy)")
    bench.add_argument("--suite", metavar="DIR",
                       help="the benchmarks directory (default: $UNI_BENCHMARKS, ./benchmarks, "
                            "or the one beside the uni package in a source checkout)")


def _recover_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    recover = sub.add_parser(
        "recover", help="roll back a mapped file's unfinished commits (after a crash), for "
                        "programs that read it without uni",
        description="Roll back the commits a dead process left unfinished in PATH (a "
                    "MappedFileStorage file), without opening a storage: afterwards plain "
                    "numpy.fromfile or np.memmap read each region's old or new contents, "
                    "never a mix. Exit status 0 when done (or nothing to do), 2 when refused.",
    )
    recover.add_argument("path", metavar="PATH", help="the data file (not its journal)")


def _recover(path: str) -> int:
    try:
        done = recover_file(path)
    except StorageError as err:
        print(f"uni recover: {err}", file=sys.stderr)
        return 2
    print(done)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="uni", description="uni tensor runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    _demo_parser(sub)
    _bench_parser(sub)
    sub.add_parser("info", help="version, dtypes, backends, BLAS and whether CUDA is usable")
    _recover_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        _same_file(sub.choices["demo"], ("--json", args.json), ("--timeline", args.timeline))
        return _demo.run(_demo.DemoOptions(size=args.size, blocks=args.blocks,
                                           device=args.device, seed=args.seed,
                                           timeline=args.timeline,
                                           blas_threads=args.blas_threads,
                                           json_path=args.json))
    if args.command == "bench":
        _same_file(sub.choices["bench"], ("--json", args.json), ("--plot", args.plot))
        return _bench.run(quick=args.quick, json_path=args.json, plot_path=args.plot,
                          only=args.only, suite=args.suite or os.environ.get("UNI_BENCHMARKS"))
    if args.command == "recover":
        return _recover(args.path)
    return _info.run()


if __name__ == "__main__":
    sys.exit(main())
