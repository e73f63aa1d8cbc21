"""Data entry point: `python data/prepare.py --output prepared/smollm2 [--regenerate]` (= `specheads prepare`)."""

import sys

from specheads.cli import main

if __name__ == "__main__":
    sys.exit(main(["prepare", *sys.argv[1:]]))
