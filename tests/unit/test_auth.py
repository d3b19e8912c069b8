import hashlib

import pytest

from services.domain.errors import ConfigurationError
from services.runtime.auth import allowed, check_exposure, role_of
from services.runtime.settings import parse_tokens

TOKENS = parse_tokens("admin:aaaaaaaaaaaaaaaa, producer:pppppppppppppppp,consumer:cccccccccccccccc,reader:rrrrrrrrrrrrrrrr")


@pytest.mark.parametrize(
    "method, role, expected",
    [
        ("/mailqueue.v1.EnqueueService/Enqueue", "producer", True),
        ("/mailqueue.v1.EnqueueService/Enqueue", "consumer", False),
        ("/mailqueue.v1.DequeueService/Dequeue", "consumer", True),
        ("/mailqueue.v1.DequeueService/Dequeue", "producer", False),
        ("/mailqueue.v1.BrowseService/Browse", "reader", True),
        ("/mailqueue.v1.AdminService/ClearQueue", "reader", False),
        ("/mailqueue.v1.EventService/WatchEvents", "reader", True),
        ("/mailqueue.v1.EventService/WatchEvents", "producer", False),
        ("/mailqueue.v1.EventService/WatchEvents", "consumer", False),
        ("/mailqueue.v1.EventService/GetMailHistory", "reader", True),
        ("/mailqueue.v1.AdminService/ClearQueue", "admin", True),
        ("/mailqueue.v1.BlobService/Put", "producer", True),
        ("/mailqueue.v1.BlobService/Get", "producer", False),
        ("/mailqueue.v1.BlobService/Get", "consumer", True),
        ("/mailqueue.v1.BlobService/Delete", "consumer", False),
        ("/grpc.health.v1.Health/Check", "reader", True),
        ("/some.Other/Method", "reader", False),
    ],
)
def test_permissions(method, role, expected):
    assert allowed(method, role) is expected


def test_a_token_given_by_its_digest_is_the_token():
    """A service may hold only the digests (``role:sha256:<hex>``): the token itself is the caller's."""
    digest = hashlib.sha256(b"pppppppppppppppp").hexdigest()
    tokens = parse_tokens(f"producer:sha256:{digest.upper()},reader:rrrrrrrrrrrrrrrr")
    assert tokens == digests(producer="pppppppppppppppp", reader="rrrrrrrrrrrrrrrr")
    assert role_of(tokens, [("authorization", "Bearer pppppppppppppppp")]) == "producer"
    assert role_of(tokens, [("authorization", f"Bearer {digest}")]) is None  # the digest is no token
    assert role_of(tokens, [("authorization", f"Bearer sha256:{digest}")]) is None


@pytest.mark.parametrize("spec", ["admin:sha256:" + "a" * 63, "admin:sha256:" + "g" * 64, "admin:sha256:" + "a" * 65,
                                  "admin:sha256:"])
def test_a_malformed_digest_is_refused_without_its_text(spec):
    with pytest.raises(ConfigurationError, match="64 hex digits") as e:
        parse_tokens(spec)
    assert "aaaaaaaa" not in str(e.value) and "gggggggg" not in str(e.value)


def digests(**roles: str) -> dict[str, str]:
    return {hashlib.sha256(t.encode()).hexdigest(): r for r, t in roles.items()}


def test_tokens_map_to_roles_and_need_the_bearer_scheme():
    assert role_of(TOKENS, [("authorization", "Bearer pppppppppppppppp")]) == "producer"
    assert role_of(TOKENS, [("authorization", "pppppppppppppppp")]) is None
    assert role_of(TOKENS, [("authorization", "Bearer wrong")]) is None
    assert role_of(TOKENS, []) is None


@pytest.mark.parametrize("spec", ["admin", "boss:aaaaaaaaaaaaaaaa", "admin:short"])
def test_bad_token_specs_are_refused(spec):
    with pytest.raises(ConfigurationError):
        parse_tokens(spec)


@pytest.mark.parametrize("spec", ["admin=0123456789abcdefXYZ", "reader:rrrrrrrrrrrrrrrr,admin;0123456789abcdefXYZ",
                                  "0123456789abcdefXYZ:admin", "admin:0123456789abc"])
def test_a_refused_token_spec_never_shows_the_token(spec):
    with pytest.raises(ConfigurationError) as e:
        parse_tokens(spec)
    assert "0123456789abc" not in str(e.value), e.value
    assert "entry" in str(e.value)


def test_no_tokens_means_loopback_only():
    check_exposure("127.0.0.1", {})
    check_exposure("::1", {})
    check_exposure("0.0.0.0", TOKENS)
    with pytest.raises(ConfigurationError, match="refusing to listen on 0.0.0.0"):
        check_exposure("0.0.0.0", {})
