"""End-to-end benchmark of both sampler paths through one real server; same as `zerocheck bench`.

    python benchmarks/e2e.py [--concurrency 1 8 32] [--max-tokens 128] [--artifacts artifacts [artifacts-128k]]
"""
import argparse
import sys

from zerocheck.bench import cli

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_arguments(parser)
    sys.exit(cli.run(parser.parse_args()))
