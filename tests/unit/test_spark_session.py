"""Where the sweep's driver listens: loopback for local mode and for a standalone master on this
machine (stack.sh up --cluster), the operator's address otherwise."""

import pytest

from spark.session import LOG4J_CONFIG, QUICK_START, _loopback_master, java_options


@pytest.mark.parametrize("master, loopback", [
    ("spark://127.0.0.1:7077", True),
    ("spark://localhost:7077", True),
    ("spark://127.0.0.2:7077,127.0.0.3:7077", True),
    ("spark://spark-master.spark.svc:7077", False),
    ("spark://10.0.0.5:7077", False),
    ("k8s://https://kubernetes.default.svc", False),
    ("local[*]", False),  # local mode is decided on its own
])
def test_a_standalone_master_on_this_machine_is_recognised(master, loopback):
    assert _loopback_master(master) is loopback


@pytest.mark.parametrize("spec, extra", [
    (None, ""),
    ("", ""),
    ("quick", " " + QUICK_START),
    (" quick ", " " + QUICK_START),
    ("-Xss4m", " -Xss4m"),
])
def test_the_jvm_options_keep_the_log_configuration_and_add_the_operators(spec, extra):
    assert java_options(spec) == f"-Dlog4j2.configurationFile={LOG4J_CONFIG}{extra}"
