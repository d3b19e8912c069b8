"""Which acks leave as one ``multiple`` ack: only the oldest run of outstanding tags that is
wholly acked, so an ack never covers a delivery still in a consumer's hands."""

import pytest

from services.adapters.rabbitmq.consuming import ack_frames


@pytest.mark.parametrize("outstanding, acked, multiple, singles", [
    ([1, 2, 3, 4], {1, 2, 3, 4}, 4, []),
    ([1, 2, 3, 4], {1, 2, 4}, 2, [4]),          # 3 is still out: 4 leaves alone
    ([1, 2, 3, 4], {2, 3, 4}, None, [2, 3, 4]),  # 1 is still out: no multiple ack at all
    ([1, 2, 3], {1}, None, [1]),                 # a run of one is a plain ack
    ([5, 9, 12], {5, 9}, 9, []),                 # tags rejected or acked before are gone from the list
    ([], {7}, None, [7]),                        # not seen (a closed channel's): acked as asked
    ([1, 2], set(), None, []),
])
def test_only_the_oldest_wholly_acked_run_is_one_multiple_ack(outstanding, acked, multiple, singles):
    assert ack_frames(outstanding, acked) == (multiple, singles)
