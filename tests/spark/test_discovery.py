"""``format("shoal")`` without ``shoal.spark.register``: pyspark's own data source lookup.

pyspark looks data sources up once per JVM, so the check runs in a fresh process with a
fresh session. That process sees shoal laid out as an installation would place it: the
packages pyproject.toml installs (found the way setuptools finds them) copied into a
directory of their own on PYTHONPATH, run from another directory, so neither the checkout
nor the development install is what makes it work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.support.clients import create_topic, produce_all, producer

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession

    bootstrap, topic, local_dir = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[1]").appName("shoal-discovery")
             .config("spark.ui.enabled", "false").config("spark.local.dir", local_dir).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        def values():
            df = spark.read.format("shoal").option("kafka.bootstrap.servers", bootstrap) \\
                .option("subscribe", topic).load()
            return (sorted(bytes(r.value).decode() for r in df.select("value").collect()),
                    df.where("offset >= 3").count())

        import shoal
        found = values()          # no register call
        import shoal.spark
        shoal.spark.register(spark)
        registered = values()     # registering over the discovered source still works
        print("RESULT " + json.dumps({"shoal": shoal.__file__, "found": found, "registered": registered}))
    except Exception as e:
        java = getattr(e, "java_exception", None)  # a Py4JJavaError's own message is only "calling oN"
        text = java.toString() if java is not None else str(e)
        print("ERROR " + (text.strip().splitlines() or [type(e).__name__])[0])
        raise
    finally:
        spark.stop()
""")


def _installed_layout(dest: Path) -> None:
    """Copy the packages ``[tool.setuptools.packages.find]`` selects, as a wheel would hold them."""
    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    top = sorted({p.split(".")[0] for p in find_packages(where=str(ROOT), include=include)})
    for name in top:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def test_format_shoal_works_without_register(spark_broker, topic_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    produce_all(producer(bs), topic_name, ({"value": b"e%d" % i, "partition": i % 2} for i in range(20)))

    site = tmp_path / "site"
    site.mkdir()
    _installed_layout(site)
    script = tmp_path / "discover.py"
    script.write_text(SCRIPT)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(script), bs, topic_name, str(tmp_path / "spark-local")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=280, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}: {errors}\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["shoal"].startswith(str(site)), result["shoal"]
    want = [sorted(f"e{i}" for i in range(20)), 14]  # and 7 of each partition's 10 from offset 3
    assert result["found"] == want
    assert result["registered"] == want
