"""Fetch Spark's Kafka connector (spark-sql-kafka-0-10) for the installed pyspark, with Maven.

    python reference/spark/fetch.py          # fetch once into ~/.m2; print the jars, comma-separated

The connector is resolved at pyspark's own version. When that version is not published on
the Maven repository, the newest release of the same major version below it is taken (from the repository's
maven-metadata.xml; ``MAVEN_REPOSITORY_URL`` names another repository), with a warning (a connector built for another minor version of Spark is not guaranteed to work);
``SPARK_KAFKA_CONNECTOR_VERSION`` chooses a version explicitly.

Of the resolved jars, those pyspark already ships (same artifact, any version) are left out,
so Spark's own copies of scala-library, lz4, snappy and slf4j stay the only ones. The result
goes to ``target/connector.json`` next to this file (the versions, the hash of pom.xml and
the jar paths) and ``target/jars.txt`` (the jars comma-separated, for ``spark.jars`` or
``spark-submit --jars``). While pom.xml, pyspark's version and the override are unchanged and
every jar is still in ~/.m2, a second run neither starts Maven nor touches the network.
Failures (no Maven, no Java, no network, nothing published) exit non-zero with Maven's output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
TARGET = HERE / "target"
STATE = TARGET / "connector.json"
JARS = TARGET / "jars.txt"
ARTIFACT = "spark-sql-kafka-0-10"
OVERRIDE = "SPARK_KAFKA_CONNECTOR_VERSION"
# Where the list of published versions is read when pyspark's own version is not published.
REPOSITORY = os.environ.get("MAVEN_REPOSITORY_URL", "https://repo.maven.apache.org/maven2")


class FetchError(RuntimeError):
    pass


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def scala_binary_version(jars_dir: Path) -> str:
    for jar in jars_dir.glob("scala-library-*.jar"):
        m = re.match(r"scala-library-(\d+\.\d+)\.", jar.name)
        if m:
            return m.group(1)
    raise FetchError(f"no scala-library jar in {jars_dir}: is pyspark installed completely?")


def artifact_of_jar_name(name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``: the name up to the first ``-<digit>``."""
    m = re.match(r"^(.+?)-\d", name)
    return m.group(1) if m else name.removesuffix(".jar")


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def cached() -> dict | None:
    """The recorded fetch if it is still valid for this pyspark, pom.xml and override; else None."""
    try:
        state = json.loads(STATE.read_text())
    except (OSError, ValueError):
        return None
    want = {"pyspark_version": pyspark_version(), "pom_sha256": _pom_hash(),
            "override": os.environ.get(OVERRIDE) or None}
    if any(state.get(k) != v for k, v in want.items()):
        return None
    jars = state.get("jars") or []
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return state


def _mvn(version: str, scala: str, out: Path) -> tuple[bool, str]:
    cmd = ["mvn", "-B", "-q", "-f", str(POM), "dependency:build-classpath",
           f"-Dconnector.version={version}", f"-Dscala.binary.version={scala}",
           f"-Dmdep.outputFile={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode == 0, re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)


def _not_published(log: str) -> bool:
    # Maven says "Could not find artifact G:A:jar:V", or "G:A:jar:V was not found in REPO"
    # when an earlier miss is cached in ~/.m2.
    name = re.escape(f"org.apache.spark:{ARTIFACT}")
    return re.search(rf"Could not find artifact {name}|{name}\S* was not found in", log) is not None


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def newest_release_below(spark: str, scala: str) -> str:
    """The newest published release (no -preview/-rc) of the connector with pyspark's major
    version and not above it, from the repository's maven-metadata.xml."""
    url = f"{REPOSITORY.rstrip('/')}/org/apache/spark/{ARTIFACT}_{scala}/maven-metadata.xml"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            root = ET.fromstring(r.read())
    except (OSError, ET.ParseError) as e:
        raise FetchError(f"cannot read {url}: {e}") from e
    versions = [v.text.strip() for v in root.iter("version") if v.text]
    chosen = newest_release(versions, spark)
    if chosen is None:
        raise FetchError(f"no release of {ARTIFACT}_{scala} {spark.split('.')[0]}.x up to {spark} in {url}")
    return chosen


def newest_release(versions: list[str], spark: str) -> str | None:
    """The highest of ``versions`` that is a release (X.Y.Z, no -preview/-rc), has the major
    version of ``spark`` and is not above it."""
    major = spark.split(".")[0]
    releases = [v for v in versions if re.fullmatch(r"\d+\.\d+\.\d+", v)]
    candidates = [v for v in releases
                  if v.split(".")[0] == major and _version_key(v) <= _version_key(spark)]
    return max(candidates, key=_version_key) if candidates else None


def fetch() -> dict:
    state = cached()
    if state is not None:
        return state
    for tool in ("mvn", "java"):
        if shutil.which(tool) is None:
            raise FetchError(f"{tool} is not installed: Maven and Java 17+ are needed to fetch "
                             f"Spark's Kafka connector")
    jars_dir = pyspark_jars_dir()
    spark = pyspark_version()
    scala = scala_binary_version(jars_dir)
    override = os.environ.get(OVERRIDE) or None
    TARGET.mkdir(parents=True, exist_ok=True)
    out = TARGET / "classpath.tmp"
    print(f"fetch.py: resolving org.apache.spark:{ARTIFACT}_{scala} with Maven (once)", file=sys.stderr)
    ok, log = _mvn(override or spark, scala, out)
    if not ok and override is None and _not_published(log):
        fallback = newest_release_below(spark, scala)
        print(f"fetch.py: warning: {ARTIFACT}_{scala} {spark} is not published; taking {fallback}, "
              f"the newest release of Spark {spark.split('.')[0]} before it (set {OVERRIDE} to "
              f"choose another)", file=sys.stderr)
        ok, log = _mvn(fallback, scala, out)
    if not ok:
        raise FetchError("Maven could not fetch Spark's Kafka connector:\n" + log[-4000:])
    resolved = [p for p in out.read_text().strip().split(os.pathsep) if p]
    out.unlink()
    connector = next((p for p in resolved if Path(p).name.startswith(f"{ARTIFACT}_{scala}-")), None)
    if connector is None:
        raise FetchError(f"Maven's classpath has no {ARTIFACT} jar: {resolved}")
    version = Path(connector).parent.name
    if "-" in version and override is None:
        raise FetchError(f"the newest {ARTIFACT} found is a pre-release ({version}); "
                         f"set {OVERRIDE} to use it or another version")
    shipped = {artifact_of_jar_name(j.name) for j in jars_dir.glob("*.jar")}
    jars = [p for p in resolved if Path(p).parent.parent.name not in shipped]
    state = {"pyspark_version": spark, "connector_version": version, "scala_binary_version": scala,
             "pom_sha256": _pom_hash(), "override": override, "jars": jars}
    STATE.write_text(json.dumps(state, indent=2) + "\n")
    JARS.write_text(",".join(jars) + "\n")
    return state


def main() -> int:
    try:
        state = fetch()
    except FetchError as e:
        print(f"fetch.py: {e}", file=sys.stderr)
        return 1
    if state["connector_version"] != state["pyspark_version"]:
        print(f"fetch.py: warning: {ARTIFACT} {state['connector_version']} is used with pyspark "
              f"{state['pyspark_version']}", file=sys.stderr)
    print(",".join(state["jars"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
