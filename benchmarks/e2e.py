"""End-to-end benchmark of both sampler paths through one real server; same as `zerocheck bench`.

    python benchmarks/e2e.py [--concurrency 1 8 32] [--max-tokens 128] [--artifacts artifacts [artifacts-128k]]
"""
import argparse
import json
import sys
from pathlib import Path

from machine import commit
from zerocheck.bench import cli

RESULTS = Path(__file__).resolve().parent / "results"  # the checkout's results, beside the other benchmarks'

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_arguments(parser)
    parser.set_defaults(out=RESULTS)
    args = parser.parse_args()
    code = cli.run(args)
    if code == 0:  # the checkout's commit and the command, beside the CPU zerocheck bench records
        written = Path(args.out) / "e2e.json"
        results = json.loads(written.read_text())
        results["meta"].update(commit=commit(), command=" ".join(["benchmarks/e2e.py", *sys.argv[1:]]))
        written.write_text(json.dumps(results, indent=2))
    sys.exit(code)
