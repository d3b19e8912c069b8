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
