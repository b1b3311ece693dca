"""The ``uni`` command: ``uni info``, ``uni demo``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _info() -> int:
    import numpy as np

    import uni
    from uni import backends, cuda

    print(f"uni {uni.__version__} (numpy {np.__version__}, python {sys.version.split()[0]})")
    print("dtypes:   " + ", ".join(d.name for d in uni.SUPPORTED_DTYPES))
    print("backends: " + (", ".join(backends.available()) or "none"))
    for line in cuda.describe():  # the devices, or why CUDA is unavailable
        print(line)
    return 0


def _demo() -> int:
    from uni._demo import run

    return run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="uni", description="uni tensor runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, dtypes, backends, and the CUDA devices or why none")
    sub.add_parser("demo", help="a short tour: leases, ordering, operations and the walk")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    return _demo()


if __name__ == "__main__":
    raise SystemExit(main())
