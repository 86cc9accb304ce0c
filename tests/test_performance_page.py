"""docs/performance.md is what benchmarks/performance_page.py renders from the committed benchmark JSON."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_performance_page_is_generated_from_the_results(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "performance.md"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "performance_page.py"), "--out", str(out)],
                   check=True, capture_output=True, text=True)
    assert out.read_text() == (ROOT / "docs" / "performance.md").read_text(), \
        "docs/performance.md is stale: python benchmarks/performance_page.py"
