"""The launch-order model (dev/models/bwd_launch_order.py): its schedules keep
the properties the orders are built on."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
import bwd_launch_order as lo  # noqa: E402


def test_equal_lengths_order_changes_nothing():
    chunks = [16] * 8
    assert lo.schedule(chunks, 4, 8, "index") == lo.schedule(chunks, 4, 8, "longest")


def test_longest_first_starts_the_long_walk_at_once():
    # one long sequence behind many short ones, more chain CTAs than SMs
    chunks = [4] * 40 + [100]
    idx, _ = lo.schedule(chunks, 2, 4, "index", sms=132)
    lng, _ = lo.schedule(chunks, 2, 4, "longest", sms=132)
    assert lng == (100 + lo.START) * 1.0  # the reverse chain's walk from t = 0
    assert idx > lng


def test_beside_never_later_than_after_and_ends_after_the_chains():
    chunks = [3, 31, 50, 9, 20, 4, 3, 12]  # the bench's 8k_8seq
    c, after = lo.schedule(chunks, 4, 8, "longest")
    c2, beside = lo.schedule(chunks, 4, 8, "beside")
    assert c == c2
    assert beside <= after
    assert beside >= c + lo.GRAD  # the longest sequence's gradient CTAs wait for its chains
