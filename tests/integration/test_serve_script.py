"""scripts/serve.sh says what it does: the one-time install (and how long it takes), then
the start. Run here with a stand-in Python whose venv and pip take no time."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

_PYTHON = """#!/usr/bin/env bash
# a stand-in python3: --version, -c (the version check), -m venv DIR
case "$1" in
  --version) echo "Python 3.11.9" ;;
  -c) exit 0 ;;
  -m) mkdir -p "$3/bin"
      cat > "$3/bin/python" <<'INNER'
#!/usr/bin/env bash
# the venv's python: -c (the import check) fails until pip ran; -m pip install succeeds
case "$1" in
  -c) [ -e .venv/.installed ] ;;
  -m) touch .venv/.installed ;;
esac
INNER
      printf '#!/usr/bin/env bash\\necho "listening on 127.0.0.1:9092 ($*)"\\n' > "$3/bin/shoal"
      chmod +x "$3/bin/python" "$3/bin/shoal" ;;
esac
"""


def _run(checkout: Path, python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(checkout / "scripts" / "serve.sh"), *args], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHON": str(python)})


def test_serve_sh_says_what_it_installs_and_how_long_the_next_start_takes(tmp_path: Path) -> None:
    checkout = tmp_path / "shoal"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "serve.sh", checkout / "scripts" / "serve.sh")
    (checkout / "pyproject.toml").write_text("")
    python = tmp_path / "python3"
    python.write_text(_PYTHON)
    python.chmod(0o755)

    first = _run(checkout, python, "--port", "0")
    assert first.returncode == 0, first.stderr
    steps = first.stderr.splitlines()
    assert steps[0] == "serve.sh: first run: creating .venv with Python 3.11.9"
    assert steps[1].startswith("serve.sh: installing shoal") and "about a minute" in steps[1]
    assert steps[2].startswith("serve.sh: installed in ") and "the next start skips this step" in steps[2]
    assert steps[3] == "serve.sh: starting: .venv/bin/shoal serve --data-dir ./shoal-data --port 0 (Ctrl-C stops it)"
    assert first.stdout == "listening on 127.0.0.1:9092 (serve --data-dir ./shoal-data --port 0)\n"

    second = _run(checkout, python)
    assert second.returncode == 0, second.stderr
    assert second.stderr.splitlines() == [
        "serve.sh: starting: .venv/bin/shoal serve --data-dir ./shoal-data (Ctrl-C stops it)"]
