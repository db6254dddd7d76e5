"""The README's snippets, run as a user pastes them, against a real broker (so the README
cannot drift from the product).

Every ```python block runs with this interpreter, in order, against one fresh broker, with
``127.0.0.1:9092`` replaced by its address, fed line by line to an interactive console as a
paste into ``python`` is; every ``.venv/bin/shoal`` command of the ```sh
blocks runs too (as ``python -m shoal``). Left out: the Spark block (it needs Java and runs
a stream for a minute or more; tests/spark covers the data source), and set-up commands (``bash
scripts/...``, ``pip install``, ``examples/pipeline.py``, which tests/spark runs).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


# Feeds a snippet line by line to an interactive console, as pasting into the REPL does (a
# compound statement must end with a blank line there); any error is exit code 1.
PASTE = """
import code, sys, traceback

class Console(code.InteractiveConsole):
    def showsyntaxerror(self, filename=None, **kw):
        traceback.print_exc()
        sys.exit(1)

    def showtraceback(self):
        traceback.print_exc()
        sys.exit(1)

console = Console()
more = False
for line in sys.argv[1].splitlines():
    more = console.push(line)
if more:
    console.push("")
"""


def snippets() -> list[tuple[str, str]]:
    """(kind, text) of every runnable snippet, in README order."""
    out = []
    for lang, body in FENCE.findall(README.read_text()):
        if lang == "python":
            if "pyspark" not in body:
                out.append(("python", body))
        elif lang == "sh":
            for command in body.replace("\\\n", " ").splitlines():
                if ".venv/bin/shoal " in command:
                    out.append(("sh", command))
    return out


def test_readme_has_the_snippets_this_test_runs() -> None:
    kinds = [k for k, _ in snippets()]
    assert kinds.count("python") >= 4 and kinds.count("sh") >= 10


def test_readme_snippets_run_as_pasted(broker: BrokerProcess, tmp_path: Path) -> None:
    shoal = f"{shlex.quote(sys.executable)} -m shoal"
    for kind, text in snippets():
        text = text.replace("127.0.0.1:9092", broker.bootstrap)
        if kind == "python":
            cmd = [sys.executable, "-c", PASTE, text]
        else:
            cmd = ["bash", "-c", "set -o pipefail; " + text.replace(".venv/bin/shoal", shoal)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 0, f"README snippet failed (exit {r.returncode}):\n{text}\n" \
                                  f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
        if "ShareConsumer(" in text:
            # "prints jobs 0, 1, 2, 4 and 5 with delivery count 1, then job 3 with delivery count 2"
            lines = [ln for ln in r.stdout.splitlines() if " b'job " in ln]  # a REPL also echoes values
            assert [ln.split(" ", 1)[1] for ln in lines] == [
                "b'job 0' delivery 1", "b'job 1' delivery 1", "b'job 2' delivery 1", "b'job 4' delivery 1",
                "b'job 5' delivery 1", "b'job 3' delivery 2"], lines
