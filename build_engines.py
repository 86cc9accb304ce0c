#!/usr/bin/env python
"""Build the artifacts the model repository serves (same as `zerocheck build`); see --help."""
import argparse
import sys

from zerocheck.build import cli

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="build_engines.py", description=__doc__)
    cli.add_arguments(parser)
    sys.exit(cli.run(parser.parse_args()))
