"""The ``uni`` command: ``uni info``, ``uni demo``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from uni import _demo, backends, cuda
from uni._dtypes import SUPPORTED_DTYPES
from uni._version import __version__


def _info() -> int:
    print(f"uni {__version__} (numpy {np.__version__}, python {sys.version.split()[0]})")
    print("dtypes:   " + ", ".join(d.name for d in SUPPORTED_DTYPES))
    print("backends: " + (", ".join(backends.available()) or "none"))
    for line in cuda.describe():  # the devices, or why CUDA is unavailable
        print(line)
    return 0


def _run_demo() -> int:
    return _demo.run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="uni", description="uni tensor runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, dtypes, backends, and the CUDA devices or why none")
    sub.add_parser("demo", help="a short tour: leases, ordering, operations and the walk")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    return _run_demo()


if __name__ == "__main__":
    raise SystemExit(main())
