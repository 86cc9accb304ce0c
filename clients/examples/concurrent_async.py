"""Eight concurrent completions with the asyncio client, checked: `python concurrent_async.py --url 127.0.0.1:8001`."""
import argparse
import asyncio
import sys

from zerocheck.clients import AsyncClient, ZerocheckError

PROMPTS = [f"def task_{index}(x):" for index in range(8)]


async def main(url: str | None, protocol: str) -> int:
    async with AsyncClient(url, protocol, timeout=60) as client:
        try:
            results = await asyncio.gather(*(client.generate(p, max_tokens=16, seed=i) for i, p in enumerate(PROMPTS)))
        except ZerocheckError as error:
            print(f"error ({type(error).__name__}): {error}", file=sys.stderr)
            return 1
    for prompt, result in zip(PROMPTS, results):
        print(f"{prompt!r}: {result.completion_tokens} tokens ({result.finish_reason}) {result.text!r}")
    failed = [p for p, r in zip(PROMPTS, results) if not r.text or not r.finish_reason]
    print("OK" if not failed else f"FAILED: empty text or no finish_reason for {failed}")
    return 0 if not failed else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=None)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    arguments = parser.parse_args()
    sys.exit(asyncio.run(main(arguments.url, arguments.protocol)))
