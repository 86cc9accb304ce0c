"""End-to-end benchmark of both sampler paths through one real server; same as `zerocheck bench`.

    python benchmarks/e2e.py [--concurrency 1 8 32] [--max-tokens 128] [--artifacts artifacts [artifacts-128k]]
"""
import argparse
import sys
from pathlib import Path

from machine import commit
from zerocheck.bench import cli

RESULTS = Path(__file__).resolve().parent / "results"  # the checkout's results, beside the other benchmarks'

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_arguments(parser)
    parser.set_defaults(out=RESULTS)
    # the checkout's commit and the command, beside the CPU that zerocheck bench records
    sys.exit(cli.run(parser.parse_args(),
                     meta={"commit": commit(), "command": " ".join(["benchmarks/e2e.py", *sys.argv[1:]])}))
