"""Secure by default: the transport and credential rules, as pure logic (#38)."""

from __future__ import annotations

import pytest

from services.domain.errors import ConfigurationError
from services.runtime.auth import check_transport
from services.runtime.settings import cassandra_from_env, rabbitmq_from_env, s3_from_env, with_credentials


def test_a_server_needs_a_certificate_or_an_explicit_plaintext_on_loopback():
    check_transport("0.0.0.0", tls_serving=True, plaintext=False)
    check_transport("127.0.0.1", tls_serving=False, plaintext=True)
    check_transport("::1", tls_serving=False, plaintext=True)
    with pytest.raises(ConfigurationError, match="no TLS certificate"):
        check_transport("127.0.0.1", tls_serving=False, plaintext=False)
    with pytest.raises(ConfigurationError, match="loopback only"):
        check_transport("0.0.0.0", tls_serving=False, plaintext=True)
    with pytest.raises(ConfigurationError, match="choose one"):
        check_transport("127.0.0.1", tls_serving=True, plaintext=True)


def test_credentials_come_from_the_folder_before_the_variables(tmp_path):
    (tmp_path / "cassandra-username").write_text("mailqueue_enqueue\n")
    (tmp_path / "cassandra-password").write_text("s3cr3t\n")
    (tmp_path / "rabbitmq-username").write_text("mailqueue-enqueue")
    (tmp_path / "rabbitmq-password").write_text("p@ss,word")
    (tmp_path / "s3-access-key").write_text("mailqueue-enqueue")
    (tmp_path / "s3-secret-key").write_text("k3y")
    env = {"MAILQUEUE_CREDENTIALS_DIR": str(tmp_path), "MAILQUEUE_CASSANDRA_USERNAME": "ignored",
           "MAILQUEUE_RABBITMQ_URLS": "amqps://old:old@a:5671/%2F,amqps://b:5671/%2F"}
    c = cassandra_from_env(env)
    assert (c.username, c.password) == ("mailqueue_enqueue", "s3cr3t")
    assert rabbitmq_from_env(env).urls == ("amqps://mailqueue-enqueue:p%40ss%2Cword@a:5671/%2F",
                                                   "amqps://mailqueue-enqueue:p%40ss%2Cword@b:5671/%2F")
    s3 = s3_from_env(env)
    assert (s3.access_key, s3.secret_key) == ("mailqueue-enqueue", "k3y")


def test_a_missing_file_in_the_folder_leaves_the_variable_and_a_ca_file_must_exist(tmp_path):
    env = {"MAILQUEUE_CREDENTIALS_DIR": str(tmp_path), "MAILQUEUE_CASSANDRA_USERNAME": "from-env"}
    assert cassandra_from_env(env).username == "from-env"
    assert with_credentials(("amqp://h:5672/%2F",), None, None) == ("amqp://h:5672/%2F",)
    with pytest.raises(ConfigurationError, match="no such file"):
        cassandra_from_env({"MAILQUEUE_CASSANDRA_CA_FILE": str(tmp_path / "none.pem")})
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(ConfigurationError, match="MAILQUEUE_S3_CA_FILE=.* holds no PEM certificate"):  # not a traceback later
        s3_from_env({"MAILQUEUE_S3_CA_FILE": str(ca)})
    ca.write_text(_a_ca_certificate(tmp_path))
    s3 = s3_from_env({"MAILQUEUE_S3_CA_FILE": str(ca)})
    assert s3.secure and s3.ca_file == str(ca)  # a CA means HTTPS


def _a_ca_certificate(folder) -> str:
    """A self-signed certificate, PEM (openssl, as stack/pki.sh makes the stack's)."""
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=test-ca", "-days", "1",
                    "-keyout", str(folder / "ca.key"), "-out", str(folder / "made.pem")], check=True, capture_output=True)
    return (folder / "made.pem").read_text()


def test_a_credentials_folder_that_is_not_there_is_refused_not_replaced_by_default_logins(tmp_path):
    # A typo in the mount path used to fall back to guest and minioadmin: each backend then refused the login
    for missing in (tmp_path / "nowhere", tmp_path / "ca.pem"):
        (tmp_path / "ca.pem").write_text("x")
        with pytest.raises(ConfigurationError, match="MAILQUEUE_CREDENTIALS_DIR=.* is not a folder"):
            cassandra_from_env({"MAILQUEUE_CREDENTIALS_DIR": str(missing)})
