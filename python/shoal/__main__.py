"""`python3 -m shoal`: which shoal this is. `--version` prints the version
and the commit it was built from; with no flag, also where the package and
its torch are."""
import argparse
import os
import sys
from typing import List, Optional

import torch

import shoal


def main(argv: Optional[List[str]] = None) -> int:
    # The binaries' --version line (common/version.h): "shoal 0.9.0 (commit
    # 16650859f82d)"; __version__ has the commit as its local part.
    version = f"shoal {shoal.__version__.split('+')[0]} (commit {shoal.__commit__})"
    parser = argparse.ArgumentParser(
        prog="python3 -m shoal",
        description="Shoal's Python module: import shoal in a training loop (docs/PYTHON.md).")
    parser.add_argument("--version", action="version", version=version)
    parser.parse_args(argv)
    print(version)
    print(f"version: {shoal.__version__}")
    print(f"package: {os.path.dirname(os.path.abspath(shoal.__file__))}")
    print(f"torch:   {torch.__version__} ({os.path.dirname(os.path.abspath(torch.__file__))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
