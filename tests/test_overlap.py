"""Calibration never fits on what it certifies on: texts sharing a sentence stay on one
side of the split, and text files that share sentences are named with the counts."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
from helpers import kascade_cli, texts
from hypothesis import given, settings
from hypothesis import strategies as st

from kascade.toolchain.calibrate import split_by_group
from kascade.toolchain.overlap import groups, shared


@settings(max_examples=200, deadline=None)
@given(
    text_groups=st.lists(st.integers(0, 6), min_size=1, max_size=30),
    chunks=st.lists(st.integers(1, 4), min_size=30, max_size=30),
    fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 5),
)
def test_no_group_of_texts_is_on_both_sides_of_the_split(text_groups, chunks, fraction, seed):
    source = np.repeat(np.arange(len(text_groups)), chunks[: len(text_groups)])
    fit, cert = split_by_group(source, text_groups, fraction, seed)
    assert sorted([*fit.tolist(), *cert.tolist()]) == list(range(len(source)))
    g = np.asarray(text_groups)
    assert not set(g[source[fit]].tolist()) & set(g[source[cert]].tolist())


def test_texts_sharing_a_sentence_in_any_script_are_one_group() -> None:
    jp = "東京の新しい美術館は来月開館する予定です。"
    got = groups([
        f"Intro one. {jp}",
        "Nothing in common with anything else here.",
        f"{jp}別の文がここに続きます、十分に長く書いておきます。",
        "Rain is EXPECTED over the weekend!",
        "rain is expected over the weekend",
    ])  # fmt: skip
    assert got == [0, 1, 0, 3, 3]


def test_a_copied_sentence_with_a_word_a_name_or_a_date_changed_is_found_between_inputs() -> None:
    texts = [
        "Markets fell sharply on Monday after the central bank raised interest rates again.",
        "Der Zug nach Berlin fährt am 12. März um 14 Uhr vom Hauptbahnhof ab, pünktlich.",
        "東京の新しい美術館は来月開館する予定で、多くの観光客が訪れると見られています。",
        "A story about something else entirely, with nothing copied from anywhere.",
    ]
    documents = [
        "Intro. Markets fell sharply on Tuesday after the central bank raised interest rates.",
        "Der Zug nach Hamburg fährt am 3. April um 9 Uhr vom Hauptbahnhof ab, pünktlich.",
        "大阪の新しい美術館は来月開館する予定で、多くの観光客が訪れると見られています。",
        "Nothing of the kind. A page about gardening, with tomatoes and beans in rows.",
    ]
    assert shared(documents, texts) == (3, 3)
    # Within one input only exact copies join texts (the split's groups).
    assert groups(texts + documents) == list(range(8))


def test_sentences_on_one_topic_in_the_same_words_are_not_taken_for_copies() -> None:
    texts = ["The central bank raised interest rates to fight inflation this spring."]
    others = [
        "Inflation fell after the central bank kept interest rates high all year.",
        "Interest rates at the central bank will stay where they are, analysts say.",
    ]
    assert shared(others, texts) == (0, 0)


def test_short_common_phrases_do_not_join_texts() -> None:
    assert groups(["Yes. The first long sentence here.", "Yes. Another long sentence there."]) == [
        0,
        1,
    ]
    assert shared(["Read more."], ["Read more."]) == (0, 0)


def test_calibrate_names_documents_that_share_sentences_with_its_texts(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(exported["modernbert"], model)
    # Documents of another source than the calibration texts (the test corpus's long
    # documents are made of its sentences, as its texts are: near-copies of them).
    # (named in letters: documents that differ only in digits are one draw for the stop)
    names = ["".join("abcdefghij"[int(d)] for d in str(i)) for i in range(60)]
    docs = [
        f"Archive entry {name}. " + "The crate by the north wall holds old maps and letters. " * 9
        for name in names
    ]
    calibration = tmp_path / "texts.jsonl"
    calibration.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(400)))
    documents = tmp_path / "documents.jsonl"
    # two of them carry a calibration text whole, as a copied page would, and one with a
    # word changed
    docs[0] += ". " + texts(400)[5] + "."
    docs[1] = texts(400)[9] + ". " + docs[1]
    docs[2] += ". " + texts(400)[11].replace(" the ", " a ", 1) + "."
    documents.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    r = kascade_cli(
        "calibrate", "--model", str(model), "--texts", str(calibration), "--documents",
        str(documents), "--epsilon", "0.1", "--delta", "0.1", "--epsilon-doc", "0.2",
        "--chunk-tokens", "64", "--overlap", "8", timeout=600,
    )  # fmt: skip
    assert "3 of the 60 --documents texts share 3 sentences with --texts" in r.stderr, r.stderr


FURNITURE = (
    "We use cookies to personalise content and ads and to analyse our traffic here. "
    "Accept all, reject all or manage the settings of our partners at any time. "
)


VOCABULARY = [
    "river", "harbour", "council", "budget", "festival", "vaccine", "orbit", "glacier",
    "election", "tariff", "museum", "drought", "striker", "senate", "satellite", "wildfire",
    "pension", "asteroid", "parliament", "orchestra", "factory", "monsoon", "verdict",
    "airline", "chess", "volcano", "reactor", "treaty", "marathon", "pipeline",
]  # fmt: skip


def article(i: int) -> str:
    """A text of its own: two sentences of seeded words no other article repeats."""
    rng = random.Random(i)
    return ". ".join(" ".join(rng.sample(VOCABULARY, 9)).capitalize() for _ in range(2)) + "."


def test_texts_opening_with_the_same_boilerplate_are_not_one_group_but_shared_content_joins():
    # A third of the texts open with a site's chrome (as scraped pages do): joined through
    # it they were one group, which went wholly to one side of the split.
    texts = [(FURNITURE if i % 3 == 0 else "") + article(i) for i in range(60)]
    texts.append(article(4) + " An update.")  # content of another text: related
    got = groups(texts)
    assert got[:60] == list(range(60)) and got[60] == 4
    source = np.arange(len(texts))
    for seed in range(5):
        _, cert = split_by_group(source, got, 0.4, seed)
        opening = np.mean([texts[i].startswith(FURNITURE) for i in cert])
        assert 0.15 < opening < 0.5  # about the third it is in all


def test_boilerplate_both_inputs_carry_is_not_named_as_shared_content() -> None:
    texts = [FURNITURE + article(i) for i in range(20)]
    documents = [FURNITURE + article(i) for i in range(100, 120)]
    assert shared(documents, texts) == (0, 0)
    assert shared([*documents, article(3)], texts) == (1, 2)  # a copied text still is
