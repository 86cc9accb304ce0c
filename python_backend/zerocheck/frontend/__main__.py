"""`python -m zerocheck.frontend`: the same as `zerocheck openai`."""
import argparse
import sys

from zerocheck.frontend import cli

parser = argparse.ArgumentParser(prog="python -m zerocheck.frontend", description=cli.__doc__)
cli.add_arguments(parser)
sys.exit(cli.run(parser.parse_args()))
