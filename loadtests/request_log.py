"""`RequestLog`: appends the `context["llm"]` record of every generate request to `<dir>/requests-<pid>.jsonl`
(one file per Locust process); `read_request_log(dir)` reads them all back for the summary."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any


class RequestLog:
    """Listener of `events.request` (and `events.quitting` to close the file)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: IO[str] | None = None

    def on_request(self, context: dict[str, Any] | None = None, **_: Any) -> None:
        record = (context or {}).get("llm")
        if record is None:
            return
        if self._file is None:  # opened on first use: a forked worker (--processes) writes its own file
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = (self.directory / f"requests-{os.getpid()}.jsonl").open("a")
        self._file.write(json.dumps(record) + "\n")

    def close(self, **_: Any) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_request_log(directory: Path) -> list[dict[str, Any]]:
    """Every record of every `requests-*.jsonl` under `directory`."""
    return [json.loads(line) for path in sorted(directory.glob("requests-*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
