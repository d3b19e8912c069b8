"""MAILQUEUE_WEBHOOKS_FILE: what webhook_svc takes from the file, and what refuses its start."""

import json

import pytest

from services.domain.errors import ConfigurationError
from services.runtime.webhooks import endpoints_from_file


def write(tmp_path, **entry) -> str:  # noqa: ANN003
    (tmp_path / "secret").write_text("s3cret\n")
    path = tmp_path / "webhooks.json"
    path.write_text(json.dumps([{"name": "billing", "url": "https://billing.example/in", "secret_file": str(tmp_path / "secret"),
                                 **entry}]))
    return str(path)


def test_max_age_unset_or_zero_is_the_day_of_a_registration(tmp_path):
    assert endpoints_from_file(write(tmp_path))[0][0].max_age_s == 86400
    assert endpoints_from_file(write(tmp_path, max_age_s=0))[0][0].max_age_s == 86400  # it dropped every event
    assert endpoints_from_file(write(tmp_path, max_age_s=3600))[0][0].max_age_s == 3600


@pytest.mark.parametrize("max_age", [0.5, -1])
def test_a_max_age_under_a_second_refuses_the_start(tmp_path, max_age):
    with pytest.raises(ConfigurationError, match="max_age_s .* is under 1 s"):
        endpoints_from_file(write(tmp_path, max_age_s=max_age))


def test_a_secret_file_gone_refuses_the_start_but_only_skips_its_entry_at_a_reload(tmp_path):
    path = tmp_path / "webhooks.json"
    (tmp_path / "secret").write_text("s3cret\n")
    path.write_text(json.dumps([
        {"name": "gone", "url": "https://a.example/in", "secret_file": str(tmp_path / "missing")},
        {"name": "billing", "url": "https://billing.example/in", "secret_file": str(tmp_path / "secret")},
    ]))
    with pytest.raises(ConfigurationError, match="missing"):
        endpoints_from_file(str(path))
    assert [e.name for e, _ in endpoints_from_file(str(path), running=True)] == ["billing"]


@pytest.mark.parametrize("entry", [{"batch_size": 0}, {"batch_size": -5}, {"timeout_s": 0}, {"timeout_s": -1}])
def test_a_batch_size_or_timeout_that_could_never_deliver_refuses_the_start(tmp_path, entry):
    with pytest.raises(ConfigurationError, match="out of range"):
        endpoints_from_file(write(tmp_path, **entry))


@pytest.mark.parametrize(("url", "says"), [("https://user:pw@h.example/in", "user or password"),
                                           ("https://h.example/hoöks", "not ASCII"), ("ftp://h.example/", "http")])
def test_a_file_endpoint_is_held_to_what_a_registration_is(tmp_path, url, says):
    # It was taken, then failed at every POST (logging the password each time), or put the
    # endpoint in a restart loop.
    with pytest.raises(ConfigurationError, match=says) as refused:
        endpoints_from_file(write(tmp_path, url=url))
    assert "pw" not in str(refused.value).replace("password", "")


@pytest.mark.parametrize(("entry", "says"), [({"types": ["swept"]}, "mail history only"),
                                             ({"queues": ["out bound"]}, "queue name")])
def test_a_file_endpoint_of_a_type_never_streamed_or_a_queue_no_queue_can_have_refuses_the_start(tmp_path, entry, says):
    # It was taken, and waited for ever (swept is written to the history only) or matched nothing.
    with pytest.raises(ConfigurationError, match=says):
        endpoints_from_file(write(tmp_path, **entry))


def test_a_secret_file_must_be_a_small_regular_file_inside_the_secrets_folder(tmp_path):
    from services.runtime.webhooks import MAX_SECRET_BYTES, read_secret

    folder = tmp_path / "secrets"
    (folder / "..data").mkdir(parents=True)
    (folder / "..data" / "billing").write_text("s3cret\n")
    (folder / "billing").symlink_to("..data/billing")  # how a mounted Secret links its keys
    (tmp_path / "credential").write_text("password")
    (folder / "out").symlink_to(tmp_path / "credential")
    (folder / "big").write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    assert read_secret(str(folder / "billing"), str(folder)) == b"s3cret"
    assert read_secret(str(tmp_path / "credential")) == b"password"  # no folder set: any regular file
    with pytest.raises(ValueError, match="outside MAILQUEUE_WEBHOOK_SECRETS_DIR"):
        read_secret(str(folder / "out"), str(folder))
    with pytest.raises(ValueError, match="outside"):
        read_secret(str(folder / ".." / "credential"), str(folder))
    with pytest.raises(ValueError, match="not a regular file"):
        read_secret("/dev/zero")  # read for ever, before
    with pytest.raises(ValueError, match="not a regular file"):
        read_secret(str(folder))
    with pytest.raises(ValueError, match="larger than"):
        read_secret(str(folder / "big"))


def test_without_proc_the_file_open_is_found_by_its_path_and_checked_to_be_the_same(tmp_path, monkeypatch):
    import os

    from services.runtime import webhooks

    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "billing").write_text("s3cret\n")
    (tmp_path / "credential").write_text("password")
    (folder / "out").symlink_to(tmp_path / "credential")
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: False if str(p).startswith("/proc/") else real_exists(p))  # no /proc
    assert webhooks.read_secret(str(folder / "billing"), str(folder)) == b"s3cret"
    with pytest.raises(ValueError, match="outside"):
        webhooks.read_secret(str(folder / "out"), str(folder))
    fd = os.open(folder / "billing", os.O_RDONLY)
    try:
        os.replace(tmp_path / "credential", folder / "billing")  # another file under the path since it was opened
        assert webhooks._opened(fd, str(folder / "billing")) == "/"
    finally:
        os.close(fd)
