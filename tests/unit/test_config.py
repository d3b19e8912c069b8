import re

import pytest

from services.domain.errors import ConfigurationError
from services.domain.settings import LimitSettings
from services.runtime.settings import Settings, events_from_env


def test_defaults_are_local_and_safe():
    s = Settings.from_env("enqueue", env={})
    assert (s.server.host, s.server.port, s.server.metrics_port) == ("127.0.0.1", 50051, 51051)
    assert s.cassandra.hosts == ("127.0.0.1",) and s.rabbitmq.queue_type == "quorum"
    assert s.view.slice_window_s is None  # the stored configuration is kept unless told otherwise


def test_one_process_unless_workers_are_asked_for():
    assert (Settings.from_env("enqueue", env={}).server.workers, Settings.from_env("enqueue", env={}).server.worker) == (1, 0)
    s = Settings.from_env("dequeue", env={"MAILQUEUE_WORKERS": "4", "MAILQUEUE_WORKER": "3"})
    assert (s.server.workers, s.server.worker, s.server.port) == (4, 3, 50052)


def test_environment_overrides():
    s = Settings.from_env(
        "blob",
        env={"MAILQUEUE_PORT": "6000", "MAILQUEUE_CASSANDRA_HOSTS": "c1, c2", "MAILQUEUE_BUCKET_COUNT": "4",
             "MAILQUEUE_S3_SECURE": "true"},
    )
    assert (s.server.port, s.server.metrics_port) == (6000, 7000)
    assert s.cassandra.hosts == ("c1", "c2") and s.view.bucket_count == 4 and s.s3.secure


@pytest.mark.parametrize(
    "env, message",
    [
    ({"MAILQUEUE_SHUTDOWN_GRACE_S": "soon"}, "MAILQUEUE_SHUTDOWN_GRACE_S='soon' is not a number"),
    ({"MAILQUEUE_CASSANDRA_TIMEOUT_S": "inf"}, "MAILQUEUE_CASSANDRA_TIMEOUT_S=inf must be a finite number"),
        ({"MAILQUEUE_PORT": "x"}, "MAILQUEUE_PORT='x' is not an integer"),
        # found starting a service by hand: 70000 was taken and bound 4464 (70000 - 65536), or failed
        # to bind with a traceback naming no variable
        ({"MAILQUEUE_PORT": "70000", "MAILQUEUE_METRICS_PORT": "0"}, "MAILQUEUE_PORT=70000 must be <= 65535"),
        ({"MAILQUEUE_METRICS_PORT": "70000"}, "MAILQUEUE_METRICS_PORT=70000 must be <= 65535"),
        ({"MAILQUEUE_PORT": "65000"}, "would be 66000, above 65535: set MAILQUEUE_METRICS_PORT"),
        ({"MAILQUEUE_LOG_LEVEL": "verbose"}, "MAILQUEUE_LOG_LEVEL='verbose': use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ({"MAILQUEUE_RABBITMQ_URL": "127.0.0.1:5671"}, "MAILQUEUE_RABBITMQ_URL: '127.0.0.1:5671' is not an amqp:// or amqps:// URL"),
        ({"MAILQUEUE_BUCKET_COUNT": "0"}, "MAILQUEUE_BUCKET_COUNT=0 must be >= 1"),
        ({"MAILQUEUE_RABBITMQ_QUEUE_TYPE": "stream"}, "use quorum or classic"),
        ({"MAILQUEUE_S3_SECURE": "maybe"}, "not a boolean"),
        # A delivery with its content must fit one 16 MiB gRPC message (and one GetBytes answer).
        ({"MAILQUEUE_DEQUEUE_INLINE_BYTES": str(16 * 1024 * 1024)}, "MAILQUEUE_DEQUEUE_INLINE_BYTES=16777216 must be <= 15728640"),
        ({"MAILQUEUE_WORKERS": "0"}, "MAILQUEUE_WORKERS=0 must be >= 1"),
        ({"MAILQUEUE_WORKERS": "65"}, "MAILQUEUE_WORKERS=65 must be <= 64"),
        # Workers share one port: with port 0 each would bind a port of its own, unknown to clients.
        ({"MAILQUEUE_WORKERS": "2", "MAILQUEUE_PORT": "0"}, "MAILQUEUE_WORKERS > 1 needs a fixed MAILQUEUE_PORT"),
    ],
)
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env("enqueue", env=env)


def test_the_queue_cache_lasts_10_s_unless_set_and_never_less_than_a_tenth():
    assert Settings.from_env("browse", env={}).queue_cache_s == 10.0
    assert Settings.from_env("enqueue", env={"MAILQUEUE_QUEUE_CACHE_S": "1.5"}).queue_cache_s == 1.5
    for bad, match in (("0", "must be a finite number >= 0.1"), ("soon", "is not a number")):
        with pytest.raises(ConfigurationError, match=f"MAILQUEUE_QUEUE_CACHE_S.*{match}"):
            Settings.from_env("browse", env={"MAILQUEUE_QUEUE_CACHE_S": bad})


def test_the_domain_errors_and_the_sweep_need_no_grpc():
    import subprocess
    import sys

    code = "import sys, services.domain.errors, spark.sweep; sys.exit('grpc' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_only_a_small_mails_whole_content_travels_in_its_message():
    limits = LimitSettings(small_blob_bytes=10)
    assert limits.carried(b"x" * 10, 10) == b"x" * 10
    assert limits.carried(b"x" * 11, 11) is None  # over the limit: the delivery reads the blob store
    assert limits.carried(b"x" * 4, 10) is None  # not the whole content
    assert limits.carried(None, 4) is None
    assert LimitSettings(small_blob_bytes=0).carried(b"", 0) == b""


def test_several_broker_nodes_in_order_and_one_url_still_works():
    urls = "amqp://u:p@rabbit-0:5672/%2F, amqp://u:p@rabbit-1:5672/%2F,amqps://u:p@rabbit-2:5671/%2F"
    s = Settings.from_env("enqueue", env={"MAILQUEUE_RABBITMQ_URLS": urls})
    assert s.rabbitmq.urls == ("amqp://u:p@rabbit-0:5672/%2F", "amqp://u:p@rabbit-1:5672/%2F", "amqps://u:p@rabbit-2:5671/%2F")
    assert s.rabbitmq.url == "amqp://u:p@rabbit-0:5672/%2F"
    one = Settings.from_env("enqueue", env={"MAILQUEUE_RABBITMQ_URL": "amqp://u:p@solo:5672/%2F"})
    assert one.rabbitmq.urls == ("amqp://u:p@solo:5672/%2F",)
    assert Settings.from_env("enqueue", env={}).rabbitmq.urls == ("amqp://guest:guest@127.0.0.1:5672/%2F",)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MAILQUEUE_RABBITMQ_URLS": "amqp://a/,amqp://b/", "MAILQUEUE_RABBITMQ_URL": "amqp://a/"},
         "set MAILQUEUE_RABBITMQ_URLS or MAILQUEUE_RABBITMQ_URL, not both"),
        # A comma inside a password splits the list: the error names the piece, not the password.
        ({"MAILQUEUE_RABBITMQ_URLS": "amqp://u:pa,ss@rabbit-0:5672/%2F"}, "'rabbit-0:5672/%2F' is not an amqp://"),
        ({"MAILQUEUE_RABBITMQ_URLS": " , "}, "MAILQUEUE_RABBITMQ_URLS is empty"),
        ({"MAILQUEUE_RABBITMQ_HEARTBEAT_S": "0"}, "MAILQUEUE_RABBITMQ_HEARTBEAT_S=0 must be >= 1"),
        ({"MAILQUEUE_RABBITMQ_CONFIRM_TIMEOUT_S": "0"}, "MAILQUEUE_RABBITMQ_CONFIRM_TIMEOUT_S=0 must be a finite number >= 0.1"),
    ],
)
def test_broker_addresses_refused_with_the_rule(env, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)) as e:
        Settings.from_env("enqueue", env=env)
    assert "pa,ss" not in str(e.value) and "u:pa" not in str(e.value)


def test_tls_identities_map_a_uri_san_or_cn_to_a_role():
    from services.runtime.settings import parse_identities

    assert parse_identities("spiffe://mailqueue/ops=admin, reporting=reader") == {
        "spiffe://mailqueue/ops": "admin", "reporting": "reader"}
    for bad in ("spiffe://x=root", "=admin", "ops"):
        with pytest.raises(ConfigurationError, match="identity=role"):
            parse_identities(bad)


@pytest.mark.parametrize("value, enabled, sinks", [
    ("true", True, "all"), ("on", True, "all"), ("off", False, "all"), ("false", False, "all"),
    ("history", True, "history"), ("unwritten", True, "unwritten"), ("stream", True, "stream"), (" History ", True, "history"),
])
def test_events_setting_records_all_none_or_one_part_to_measure(value, enabled, sinks):
    e = events_from_env({"MAILQUEUE_EVENTS": value})
    assert (e.enabled, e.sinks) == (enabled, sinks)


def test_events_setting_refuses_anything_else():
    with pytest.raises(ConfigurationError, match="MAILQUEUE_EVENTS='streams'"):
        events_from_env({"MAILQUEUE_EVENTS": "streams"})


def test_hand_out_event_delay_defaults_to_a_second_takes_zero_and_refuses_past_a_minute():
    assert events_from_env({}).handout_delay_ms == 1000
    assert events_from_env({"MAILQUEUE_HANDOUT_EVENT_DELAY_MS": "0"}).handout_delay_ms == 0
    for bad, match in (("-1", ">= 0"), ("60001", "<= 60000"), ("1s", "not an integer")):
        with pytest.raises(ConfigurationError, match=f"MAILQUEUE_HANDOUT_EVENT_DELAY_MS.*{match}"):
            events_from_env({"MAILQUEUE_HANDOUT_EVENT_DELAY_MS": bad})


def test_webhook_svc_refuses_workers_its_deliverer_is_one_process():
    with pytest.raises(ConfigurationError, match="MAILQUEUE_WORKERS must be 1 for webhook_svc"):
        Settings.from_env("webhook", env={"MAILQUEUE_WORKERS": "2"})
    assert Settings.from_env("webhook", env={"MAILQUEUE_WORKERS": "1"}).server.workers == 1


def test_a_misspelled_variable_is_named_with_the_one_it_is_closest_to():
    # Given a typo in one variable and a variable that is some other tool's
    env = {"MAILQUEUE_CASANDRA_HOSTS": "10.0.0.1", "MAILQUEUE_BENCH_STACK": "cluster", "MAILQUEUE_PORT": "50051",
           "MAILQ_TARGET": "x", "MAILQUEUE_TOKEN": "s3cret"}
    # When the settings are read
    s = Settings.from_env("enqueue", env)
    # Then the typo is named with what it would have set; the variables close to nothing read are left alone
    assert s.misspelled == (("MAILQUEUE_CASANDRA_HOSTS", "MAILQUEUE_CASSANDRA_HOSTS"), ("MAILQUEUE_TOKEN", "MAILQUEUE_TOKENS"))
    assert Settings.from_env("enqueue", {"MAILQUEUE_CASSANDRA_HOSTS": "10.0.0.1"}).misspelled == ()


def test_variables_the_project_s_other_tools_read_are_no_misspelling(tmp_path):
    # The stack's scripts, the clients' tests and a credential its file overrides: none is named
    (tmp_path / "cassandra-password").write_text("from-the-file")
    env = {name: "1" for name in ("MAILQUEUE_CASSANDRA_HEAP", "MAILQUEUE_CASSANDRA_JMX_PORT", "MAILQUEUE_CASSANDRA_STORAGE_PORT",
                                  "MAILQUEUE_RABBITMQ_PORT", "MAILQUEUE_CLUSTER_CASSANDRA_PORT", "MAILQUEUE_TLS_CA",
                                  "MAILQUEUE_BROWSE_TARGET", "MAILQUEUE_S3_SECRET_KEY")}
    env.update({"MAILQUEUE_CREDENTIALS_DIR": str(tmp_path), "MAILQUEUE_CASSANDRA_PASSWORD": "from-the-variable"})
    assert Settings.from_env("enqueue", env).misspelled == ()


def test_an_empty_credential_file_is_refused_not_replaced_by_the_default_login(tmp_path):
    from services.runtime.settings import s3_from_env

    (tmp_path / "s3-access-key").write_text("\n")
    with pytest.raises(ConfigurationError, match="s3-access-key is empty"):
        s3_from_env({"MAILQUEUE_CREDENTIALS_DIR": str(tmp_path)})


@pytest.mark.parametrize("env, says", [
    ({"MAILQUEUE_MAX_CONNECTION_AGE_S": "2147484"}, "MAILQUEUE_MAX_CONNECTION_AGE_S"),  # x 1000 overflowed grpc's C int
    ({"MAILQUEUE_PORT": "50051", "MAILQUEUE_HEALTH_PORT": "50051"}, "MAILQUEUE_PORT and MAILQUEUE_HEALTH_PORT are both 50051"),
    ({"MAILQUEUE_PORT": "50051", "MAILQUEUE_METRICS_PORT": "50051"}, "MAILQUEUE_PORT and MAILQUEUE_METRICS_PORT are both 50051"),
    ({"MAILQUEUE_PORT": "50051", "MAILQUEUE_HEALTH_PORT": "51051"}, "MAILQUEUE_METRICS_PORT and MAILQUEUE_HEALTH_PORT are both 51051"),
])
def test_server_settings_a_listener_cannot_take_are_refused_with_one_line(env, says):
    from services.runtime.settings import server_from_env

    with pytest.raises(ConfigurationError, match=says):
        server_from_env("enqueue", env)


@pytest.mark.parametrize("target", ["dns:///mailqueue-blob:50054", "blob.example.org:50054", "10.0.0.7:50054",
                                    "ipv4:127.0.0.1:50054,10.0.0.7:50054"])
def test_a_blob_target_off_this_machine_needs_a_ca_the_token_never_goes_in_the_clear(target):
    # Without a CA the calls to blob_svc were made in plaintext, MAILQUEUE_SERVICE_TOKEN in each.
    with pytest.raises(ConfigurationError, match="MAILQUEUE_TLS_CA_FILE"):
        Settings.from_env("enqueue", env={"MAILQUEUE_BLOB_TARGET": target, "MAILQUEUE_SERVICE_TOKEN": "t"})


@pytest.mark.parametrize("target", ["127.0.0.1:50054", "localhost:50054", "[::1]:50054", "ipv4:127.0.0.1:50054",
                                    "ipv4:127.0.0.1:46271,127.0.0.1:55907", "dns:///localhost:50054"])
def test_a_blob_target_on_loopback_may_be_plaintext(target):
    assert Settings.from_env("enqueue", env={"MAILQUEUE_BLOB_TARGET": target}).server.blob_target == target


def test_a_backend_reached_in_the_clear_on_another_host_is_named_with_what_to_set():
    from services.adapters.cassandra.settings import CassandraSettings
    from services.adapters.rabbitmq.settings import RabbitMQSettings
    from services.adapters.s3.settings import S3Settings
    from services.runtime.settings import backends_in_the_clear

    assert backends_in_the_clear(CassandraSettings(), RabbitMQSettings(), S3Settings()) == []  # the local stack's defaults
    remote = backends_in_the_clear(CassandraSettings(hosts=("cassandra.example",)),
                                   RabbitMQSettings(urls=("amqp://u:p@rabbit.example:5672/%2F",)),
                                   S3Settings(endpoint="minio.example:9000"))
    assert [r.split()[0] for r in remote] == ["Cassandra", "RabbitMQ", "S3"]
    assert "MAILQUEUE_S3_SECURE=true" in remote[2]
    assert backends_in_the_clear(CassandraSettings(hosts=("cassandra.example",), ca_file="/ca.crt"),
                                 RabbitMQSettings(urls=("amqps://u:p@rabbit.example:5671/%2F",)),
                                 S3Settings(endpoint="minio.example:9000", secure=True)) == []
    assert backends_in_the_clear(CassandraSettings(hosts=("::1",)), RabbitMQSettings(urls=("amqp://u:p@[::1]:5672/%2F",)),
                                 S3Settings(endpoint="[::1]:9000")) == []
