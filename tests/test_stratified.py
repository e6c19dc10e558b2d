"""``kascade sample``'s choice: one record from each (partition, language) in turn, kept
in bounded memory without changing which records are chosen."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kascade.dataflow.sample import Places, stratified

# (partition, language) of each record in the order they are read
READS = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["", "de", "en", "fr", "ja"])))


@settings(max_examples=300, deadline=None)
@given(reads=READS, count=st.integers(1, 12))
def test_places_choose_what_stratified_chooses_over_every_record_read(reads, count) -> None:
    everything: dict[tuple[int, str], list[tuple[int, int]]] = {}
    places = Places(count)
    for offset, (partition, lang) in enumerate(reads):
        everything.setdefault((partition, lang), []).append((partition, offset))
        places.add(partition, lang, offset)
        assert places.kept <= 2 * count
    expected: dict[int, set[int]] = {}
    for partition, offset in stratified(everything, count):
        expected.setdefault(partition, set()).add(offset)
    assert places.chosen() == expected


def test_a_busy_bucket_does_not_crowd_out_a_quiet_one() -> None:
    places = Places(4)
    for offset in range(1000):
        places.add(0, "de", offset)
    places.add(1, "fr", 1000)
    assert places.chosen() == {0: {0, 1, 2}, 1: {1000}}
    assert places.kept <= 8


def test_stratified_takes_one_from_each_bucket_in_turn() -> None:
    buckets = {(1, "b"): [4, 5], (0, "a"): [1, 2, 3], (2, "c"): []}
    assert stratified(buckets, 10) == [1, 4, 2, 5, 3]
    assert stratified(buckets, 3) == [1, 4, 2]
    assert stratified({}, 3) == []
