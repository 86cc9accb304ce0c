"""Imports follow the layers: the clients and the Triton-free API load without torch or the server's
process tools (a client machine needs neither)."""
from __future__ import annotations

import subprocess
import sys


def test_clients_and_api_import_without_torch_or_the_server() -> None:
    code = ("import sys, zerocheck.api, zerocheck.api.headers, zerocheck.clients; "
            "print(sorted(m for m in ('torch', 'psutil', 'zerocheck.serve', 'zerocheck.decoder', 'zerocheck.generate') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
