"""`python -m specheads.evaluation ...`: the same as `specheads evaluate ...`, importing only what
decoding needs (for machines that have torch and transformers but not the training stack)."""

import argparse
import sys

from specheads.cli import _add_evaluate_args, cmd_evaluate

parser = argparse.ArgumentParser(prog="python -m specheads.evaluation", description="specheads evaluate")
_add_evaluate_args(parser)
sys.exit(cmd_evaluate(parser.parse_args()))
