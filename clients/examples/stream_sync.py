"""Stream one completion with the blocking client and check it: `python stream_sync.py --url 127.0.0.1:8001`."""
import argparse
import sys

from zerocheck.clients import Client, ZerocheckError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=None)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    args = parser.parse_args()
    client = Client(args.url, args.protocol, timeout=60)
    try:
        for event in client.stream("def fibonacci(n):", max_tokens=16, temperature=0.7, seed=7):
            print(event.text, end="", flush=True)
            result = event.final
    except ZerocheckError as error:
        print(f"\nerror ({type(error).__name__}): {error}", file=sys.stderr)
        return 1
    print(f"\n{result.completion_tokens} tokens, finish_reason={result.finish_reason}, TTFT {result.ttft_s:.3f} s")
    ok = bool(result.text) and bool(result.finish_reason)
    print("OK" if ok else "FAILED: empty text or no finish_reason")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
