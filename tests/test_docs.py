"""The manual: docs/reference/ is what scripts/docs_reference.py writes from the code's tables, every relative
link in README.md and docs/ points to a file that exists, and the docs site builds with `mkdocs build --strict`."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def test_the_reference_pages_are_generated_from_the_code(tmp_path: Path) -> None:
    out = tmp_path / "reference"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_reference.py"), "--out", str(out)],
                   check=True, capture_output=True, text=True)
    written = sorted(path.name for path in out.glob("*.md"))
    committed = sorted(path.name for path in REFERENCE.glob("*.md"))
    assert written == committed, "docs/reference/ is stale: python scripts/docs_reference.py"
    for name in written:
        assert (out / name).read_text() == (REFERENCE / name).read_text(), \
            f"docs/reference/{name} is stale: python scripts/docs_reference.py"


def relative_links(page: Path) -> list[str]:
    """The link targets of a Markdown page that are neither URLs nor anchors of the page itself (code left out)."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def test_every_relative_link_points_to_a_file() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in pages for target in relative_links(page)
              if not (page.parent / target.split("#", 1)[0]).exists()]
    assert not broken, "links to missing files:\n" + "\n".join(broken)
    assert relative_links(ROOT / "README.md"), "README.md links no page"


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
