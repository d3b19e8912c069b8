"""The Spark session of the sweep: master, connector jars and the Cassandra connection.

The Spark Cassandra Connector 3.5.1 and its dependencies come from Maven Central
(spark/connector.sh puts them in ``~/.cache/mailqueue-stack/spark-connector-<version>``; the
container image in ``/opt/mailqueue/spark-jars``). ``MAILQUEUE_SPARK_JARS`` (a folder or a comma
separated list of jars) overrides both.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from services.adapters.cassandra.settings import CassandraSettings

CONNECTOR_VERSION = "3.5.1"
DEFAULT_JAR_DIRS = (
    Path.home() / ".cache" / "mailqueue-stack" / f"spark-connector-{CONNECTOR_VERSION}",
    Path("/opt/mailqueue/spark-jars"),
)


class MissingJars(RuntimeError):
    pass


def connector_jars(spec: str | None = None) -> list[str]:
    """The connector's jars, from ``spec`` (folder or comma list), else the default folders."""
    candidates = [spec] if spec else [str(d) for d in DEFAULT_JAR_DIRS]
    for candidate in candidates:
        if os.path.isdir(candidate):
            jars = sorted(glob.glob(os.path.join(candidate, "*.jar")))
        else:
            jars = [j for j in candidate.split(",") if j]
        if jars and all(os.path.isfile(j) for j in jars):
            return jars
    raise MissingJars(
        f"the Spark Cassandra Connector jars were not found in {', '.join(candidates)}: "
        "run spark/connector.sh (fetches them from Maven Central) or set MAILQUEUE_SPARK_JARS"
    )


LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")

#: JVM options for short runs (small queues, a test's sweep): the client compiler only, one
#: compiler thread and the serial collector. An empty dry run on 2 cores took 24 s with them
#: against 33 s without. Long sweeps keep the JVM's defaults: the optimising compiler pays
#: back over millions of rows. Set with ``MAILQUEUE_SPARK_JAVA_OPTIONS=quick``.
QUICK_START = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"


def java_options(spec: str | None) -> str:
    """The JVM options of the driver and the executors: the log configuration, then
    ``MAILQUEUE_SPARK_JAVA_OPTIONS`` (``quick`` stands for QUICK_START)."""
    extra = (spec or "").strip()
    if extra == "quick":
        extra = QUICK_START
    return f"-Dlog4j2.configurationFile={LOG4J_CONFIG}" + (f" {extra}" if extra else "")


def _loopback_master(master: str) -> bool:
    """A standalone master on this machine: spark://127.x.x.x:port or spark://localhost:port."""
    host = master.removeprefix("spark://").split(",")[0].rsplit(":", 1)[0]
    return master.startswith("spark://") and (host == "localhost" or host.startswith("127."))


TLS_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
              "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384")


def truststore(ca_file: str) -> tuple[str, str]:
    """A PKCS#12 trust store holding the CA of ``ca_file`` (keytool, from the JDK Spark runs on)."""
    import secrets
    import shutil
    import subprocess
    import tempfile

    java_home = os.environ.get("JAVA_HOME")
    keytool = os.path.join(java_home, "bin", "keytool") if java_home else shutil.which("keytool")
    if not keytool or not os.path.exists(keytool):
        raise MissingJars("keytool (from the JDK) is needed to trust the Cassandra CA: set JAVA_HOME")
    folder = tempfile.mkdtemp(prefix="mailqueue-sweep-tls-")
    path, password = os.path.join(folder, "truststore.p12"), secrets.token_urlsafe(18)
    subprocess.run([keytool, "-importcert", "-noprompt", "-alias", "cassandra-ca", "-file", ca_file, "-keystore", path,
                    "-storetype", "PKCS12", "-storepass:env", "MAILQUEUE_TRUSTSTORE_PASSWORD"],
                   check=True, capture_output=True, env={**os.environ, "MAILQUEUE_TRUSTSTORE_PASSWORD": password})
    return path, password


def build(master: str, jars: list[str], cassandra: CassandraSettings, shuffle_partitions: int) -> object:
    """A SparkSession reading Cassandra at LOCAL_QUORUM (the consistency the services write at:
    a row or a mark missed by a weaker read could make a live mail's blob look unreferenced)."""
    # Python workers must be this interpreter: it has the Cassandra driver and the minio SDK installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    jvm_options = java_options(os.environ.get("MAILQUEUE_SPARK_JAVA_OPTIONS"))
    builder = (
        SparkSession.builder.appName("mailqueue-retention-sweep")
        .master(master)
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.cassandra.connection.host", ",".join(cassandra.hosts))
        .config("spark.cassandra.connection.port", str(cassandra.port))
        .config("spark.cassandra.input.consistency.level", "LOCAL_QUORUM")
        .config("spark.sql.extensions", "com.datastax.spark.connector.CassandraSparkExtensions")
        .config("spark.driver.memory", os.environ.get("MAILQUEUE_SPARK_DRIVER_MEMORY", "2g"))
        # Spark's own log lines as JSON, like every other log line of the suite.
        .config("spark.driver.extraJavaOptions", jvm_options)
        .config("spark.executor.extraJavaOptions", jvm_options)
    )
    driver_host = os.environ.get("MAILQUEUE_SPARK_DRIVER_HOST") or (
        "127.0.0.1" if master.startswith("local") or _loopback_master(master) else None)
    if driver_host:
        # Local mode, or a standalone cluster on this machine (stack.sh up --cluster): executors
        # reach the driver on loopback; elsewhere MAILQUEUE_SPARK_DRIVER_HOST is the address the
        # executors can reach (a pod's IP). Nothing listens on the machine's other interfaces.
        if driver_host == "127.0.0.1":
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
        builder = builder.config("spark.driver.host", driver_host)
    if cassandra.local_dc:
        builder = builder.config("spark.cassandra.connection.localDC", cassandra.local_dc)
    if cassandra.ca_file:
        # The connector's driver (Java) reads a keystore, not a PEM file: the CA goes into a
        # PKCS#12 trust store made with the JDK's keytool, in a private folder of this run.
        path, password = truststore(cassandra.ca_file)
        builder = (builder.config("spark.cassandra.connection.ssl.enabled", "true")
                   .config("spark.cassandra.connection.ssl.trustStore.path", path)
                   .config("spark.cassandra.connection.ssl.trustStore.password", password)
                   .config("spark.cassandra.connection.ssl.trustStore.type", "PKCS12")
                   # The connector's default suites (TLS_RSA_WITH_AES_*_CBC_SHA) are disabled by
                   # current JDKs' security policy: TLS 1.3 and ECDHE with AES-GCM instead.
                   .config("spark.cassandra.connection.ssl.enabledAlgorithms", ",".join(TLS_SUITES)))
    if cassandra.username:
        builder = builder.config("spark.cassandra.auth.username", cassandra.username)
        builder = builder.config("spark.cassandra.auth.password", cassandra.password or "")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
