"""Apache Kafka as a reference: its broker, its command-line tools and its Java clients.

The jars are Apache Kafka's releases, fetched by Maven (reference/kafka/pom.xml) through
``reference/kafka/kit.sh`` once; afterwards the cached classpath is used without Maven or
network. Usage::

    run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", b, "--list")
    KafkaBroker(tmp_path / "kafka").start()   # KRaft combined mode, share groups on
    prog = JavaProgram(Path("tests/reference/java/ShareDriver.java"))
    prog.run("arg", ...)                       # compiled once (cached by source hash)

Nothing here is needed by shoal itself: only the tests under tests/reference use it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "KIT_DIR",
    "TOOLS",
    "JavaProgram",
    "KafkaBroker",
    "KitError",
    "classpath",
    "free_port",
    "java_command",
    "run_tool",
]

ROOT = Path(__file__).resolve().parents[2]
KIT_DIR = ROOT / "reference" / "kafka"
TARGET = KIT_DIR / "target"
LOG4J = KIT_DIR / "log4j2.properties"

# Kafka's command-line tools by the name of their bin/ script.
TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "kafka-groups": "org.apache.kafka.tools.GroupsCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-dump-log": "org.apache.kafka.tools.DumpLogSegments",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-storage": "kafka.tools.StorageTool",
    "kafka-server-start": "kafka.Kafka",
}

# Short-lived JVMs (tools, drivers) start faster with C1 only and the serial collector.
_QUICK_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto"]


class KitError(RuntimeError):
    pass


_classpath: str | None = None


def classpath() -> str:
    """Kafka's jars, fetched by Maven on the first call of a fresh machine (kit.sh)."""
    global _classpath
    if _classpath is None:
        proc = subprocess.run(["bash", str(KIT_DIR / "kit.sh"), "classpath"], check=False, capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != 0:
            raise KitError(f"reference/kafka/kit.sh could not fetch Apache Kafka's jars:\n{proc.stderr}")
        _classpath = Path(proc.stdout.strip()).read_text().strip()
    return _classpath


def _cds_archive() -> Path:
    """The class-data-sharing archive of Kafka's classpath (made by the first tool run)."""
    digest = hashlib.sha256(classpath().encode()).hexdigest()[:16]
    return TARGET / "cds" / f"kafka-{digest}.jsa"


def java_command(main_class: str, *args: str, extra_classpath: Sequence[Path] = (),
                 jvm: Sequence[str] = (), quick: bool = True, cds_dump: Path | None = None) -> list[str]:
    """The java command line running ``main_class`` with Kafka's jars.

    Short-lived JVMs (``quick``) use the class-data-sharing archive of Kafka's classpath
    when it exists (it roughly halves a tool's start); ``cds_dump`` writes one instead.
    Extra class directories go after Kafka's jars, so that the archive still applies.
    """
    java = shutil.which("java")
    if java is None:
        raise KitError("java is not installed (Java 17+ is needed for Apache Kafka's tools)")
    cp = os.pathsep.join([classpath(), *(str(p) for p in extra_classpath)])
    flags: list[str] = []
    if quick:
        flags += _QUICK_JVM
        # the JVM's own log (CDS notes included) goes to stderr, errors only: stdout is the tool's
        flags += ["-Xlog:disable", "-Xlog:all=error:stderr"]
        if cds_dump is not None:
            flags.append(f"-XX:ArchiveClassesAtExit={cds_dump}")
        elif _cds_archive().exists():
            flags.append(f"-XX:SharedArchiveFile={_cds_archive()}")
    return [java, *flags, f"-Dlog4j2.configurationFile={LOG4J}", *jvm, "-cp", cp, main_class, *args]


def run_tool(tool: str, *args: str, input: str | None = None, timeout: float = 120,
             check: bool = True, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's tools (a bin/ script name from TOOLS, or a class name) to completion.

    With ``check``, a non-zero exit raises with the tool's output. The first successful run
    on a machine also writes the class-data-sharing archive that later runs start from.
    """
    cls = TOOLS.get(tool, tool)
    archive = _cds_archive()
    dump = None if archive.exists() else archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    if dump is not None:
        dump.parent.mkdir(parents=True, exist_ok=True)
    cmd = java_command(cls, *args, cds_dump=dump)
    try:
        proc = subprocess.run(cmd, input=input, check=False, capture_output=True, text=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL,
                              env={**os.environ, **(env or {})})
        if dump is not None and proc.returncode == 0 and dump.exists():
            os.replace(dump, archive)
    finally:
        if dump is not None and dump.exists():
            dump.unlink()
    if check and proc.returncode != 0:
        raise KitError(f"{tool} {' '.join(args)} exited with {proc.returncode}\n"
                       f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kafka_uuid() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaBroker:
    """One Apache Kafka broker in KRaft combined mode (broker and controller in one JVM).

    Its data directory is formatted with Kafka's StorageTool, with share groups enabled
    (the ``share.version`` feature), one replica for every internal topic, and short group
    timeouts. ``start()`` waits until the broker serves requests; ``stop()`` ends it
    (SIGTERM, then SIGKILL) and is safe to call twice.
    """

    START_TIMEOUT_S = 120.0

    def __init__(self, work_dir: Path, overrides: Mapping[str, str] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.overrides = dict(overrides or {})
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.work_dir / "server.log"

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise KitError("Kafka broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    def properties(self, port: int, controller_port: int) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
            "group.coordinator.rebalance.protocols": "classic,consumer,share",
            "group.consumer.heartbeat.interval.ms": "1000",
            "group.consumer.min.heartbeat.interval.ms": "1000",
            "group.consumer.session.timeout.ms": "10000",
            "group.consumer.min.session.timeout.ms": "6000",
            "group.share.heartbeat.interval.ms": "1000",
            "group.share.min.heartbeat.interval.ms": "1000",
            "group.share.session.timeout.ms": "10000",
            "group.share.min.session.timeout.ms": "6000",
            "auto.create.topics.enable": "true",
        }
        props.update(self.overrides)
        return props

    def start(self) -> KafkaBroker:
        if self.proc is not None and self.proc.poll() is None:
            raise KitError("Kafka broker already running")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port, controller_port = free_port(), free_port()
        props = self.properties(self.port, controller_port)
        config = self.work_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        if not (self.data_dir / "meta.properties").exists():
            run_tool("kafka-storage", "format", "--cluster-id", _kafka_uuid(), "--config", str(config),
                     "--feature", "share.version=1", "--ignore-formatted", timeout=180)
        log = open(self.log_path, "ab")
        try:
            cmd = java_command("kafka.Kafka", str(config), quick=False,
                               jvm=["-Xms256m", "-Xmx768m", "-XX:+UseSerialGC", "-Dkafka.ref.log.level=INFO"])
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        try:
            self._wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_started(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise KitError(f"Kafka broker exited with {self.proc.returncode}\n{self.log_tail()}")
            if "Kafka Server started" in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise KitError(f"Kafka broker did not start within {self.START_TIMEOUT_S}s\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class JavaProgram:
    """A Java source file compiled against Kafka's jars (cached by source hash) and run.

    The class is compiled into reference/kafka/target/java/<hash>/; a changed source
    compiles again, an unchanged one never does.
    """

    def __init__(self, source: Path) -> None:
        self.source = Path(source)
        self.main_class = self.source.stem
        digest = hashlib.sha256(self.source.read_bytes()).hexdigest()[:16]
        self.classes = TARGET / "java" / f"{self.main_class}-{digest}"

    def compile(self) -> Path:
        marker = self.classes / ".compiled"
        if marker.exists():
            return self.classes
        javac = shutil.which("javac")
        if javac is None:
            raise KitError("javac is not installed (a JDK 17+ is needed)")
        tmp = self.classes.with_name(self.classes.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        proc = subprocess.run([javac, "-nowarn", "-encoding", "UTF-8", "-d", str(tmp), "-cp", classpath(),
                               str(self.source)], check=False, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise KitError(f"javac {self.source.name} failed:\n{proc.stdout}\n{proc.stderr}")
        (tmp / ".compiled").write_text(self.source.name)
        try:
            tmp.rename(self.classes)
        except OSError:  # compiled meanwhile by another process
            shutil.rmtree(tmp, ignore_errors=True)
        return self.classes

    def command(self, *args: str, jvm: Sequence[str] = ()) -> list[str]:
        return java_command(self.main_class, *args, extra_classpath=[self.compile()], jvm=jvm)

    def run(self, *args: str, timeout: float = 300, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run to completion; a run past ``timeout`` is killed and raises with what it printed."""
        cmd = self.command(*args)
        with subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
            try:
                stdout, stderr = p.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
                raise KitError(f"{self.main_class} {' '.join(args)} did not finish within {timeout}s\n"
                               f"--- stdout ---\n{stdout[-6000:]}\n--- stderr ---\n{stderr[-6000:]}") from None
        proc = subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
        if check and proc.returncode != 0:
            raise KitError(f"{self.main_class} {' '.join(args)} exited with {proc.returncode}\n"
                           f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
        return proc
