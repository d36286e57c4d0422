"""elmo_jax.lookahead.ahead, the one look-ahead thread (Elmo.embed's host preparation and the
training input pipeline's batch assembly), and BatchPipeline on top of it."""

import threading
import time

import pytest

from elmo_jax.data.prefetch import BatchPipeline, DataWorkerError
from elmo_jax.errors import ElmoError
from elmo_jax.lookahead import ahead


def _threads(name):
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def _counted(n, made):
    """0..n-1, each appended to ``made`` as the producer makes it."""
    for i in range(n):
        made.append(i)
        yield i


def test_items_in_order_never_more_than_depth_ahead():
    made, got = [], []
    for item in ahead(_counted(20, made), depth=3, name="t-order"):
        time.sleep(0.01)  # a slow consumer: the thread fills the queue and waits
        # consumed item + the queue's 3 + the one the thread holds while the queue is full
        assert len(made) - len(got) <= 3 + 2, (len(made), len(got))
        got.append(item)
    assert got == list(range(20))
    assert not _threads("t-order")


def test_an_error_is_raised_at_the_consumer_in_its_place():
    def items():
        yield 1
        yield 2
        raise ValueError("item 3 is bad")

    gen = ahead(items(), depth=2, name="t-error")
    assert [next(gen), next(gen)] == [1, 2]
    with pytest.raises(ValueError, match="item 3 is bad"):
        next(gen)
    assert not _threads("t-error")


def test_closing_stops_the_thread_and_what_was_ahead_is_dropped():
    made = []
    gen = ahead(_counted(10_000, made), depth=2, name="t-close")
    assert next(gen) == 0
    time.sleep(0.05)
    gen.close()
    assert not _threads("t-close")
    assert len(made) <= 5  # it stopped at the queue's bound, not at the end of the items


class _Batcher:
    """The part of LMBatcher that BatchPipeline uses: numbered batches, then the end (or an error)."""

    def __init__(self, n, fail_at=None, error=None):
        self.n, self.i, self.fail_at, self.error = n, 0, fail_at, error
        self._provider = type("P", (), {"reset": lambda self: None})()

    def _build_next(self):
        if self.i == self.fail_at:
            raise self.error
        if self.i == self.n:
            raise StopIteration
        self.i += 1
        return {"batch": self.i}

    def _snapshot(self):
        return self.i

    def _state_of(self, snapshot):
        return {"next": snapshot}

    def _build_state(self):
        return {"next": self.i}

    def _apply_state(self, state):
        self.i = state["next"]


def test_batch_pipeline_hands_out_batches_with_the_state_after_each():
    p = BatchPipeline(_Batcher(5), depth=2)
    assert p.next() == {"batch": 1} and p.state() == {"next": 1}  # not the thread's position
    assert p.next() == {"batch": 2} and p.state() == {"next": 2}
    p.set_state({"next": 4})  # stops the thread, drops what it built, continues from 4
    assert p.next() == {"batch": 5}
    with pytest.raises(StopIteration):
        p.next()
    assert p.state() == {"next": 5}
    with pytest.raises(StopIteration):
        p.next()
    assert not _threads("elmo-jax-batches")


def test_batch_pipeline_names_a_builders_error_and_passes_the_packages_own():
    p = BatchPipeline(_Batcher(5, fail_at=2, error=KeyError("row 7")), depth=2)
    assert p.next() == {"batch": 1} and p.next() == {"batch": 2}
    with pytest.raises(DataWorkerError, match=r"building a batch failed: .*KeyError.*row 7"):
        p.next()
    assert not _threads("elmo-jax-batches")
    p = BatchPipeline(_Batcher(5, fail_at=0, error=ElmoError("the index changed under the run")), depth=2)
    with pytest.raises(ElmoError, match="the index changed under the run") as e:
        p.next()
    assert type(e.value) is ElmoError
    p.close()
