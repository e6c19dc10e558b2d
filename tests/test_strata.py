"""Certifying per kind of text (language, document length): which kinds stand alone, what
the runtime applies to a chunk, and that the bound then holds for any mix of the kinds
where one certificate for the calibration's mix does not."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import SMALL_CHUNKS, TINY_PATH, calibration, kascade_cli, texts
from pydantic import ValidationError

from kascade.operators.calibration import Cascade
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.operators.items import ChunkTask, DocMeta
from kascade.operators.verdicts import cheap_stages
from kascade.schemas.cascade import POOL, OperatingPoint, Stratum
from kascade.schemas.manifest import read_manifest
from kascade.toolchain.calibrate import calibrate, s0_threshold
from kascade.toolchain.certify import DISABLED, certify
from kascade.toolchain.strata import Planned, certify_strata, chunk_kinds, plan

EPS, DELTA = 0.05, 0.1
PATH = (0.99, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.3, 0.1)


def kinds(*cells: tuple[str, str, int]) -> tuple[np.ndarray, np.ndarray]:
    langs = [lang for lang, _, n in cells for _ in range(n)]
    lengths = [length for _, length, n in cells for _ in range(n)]
    return np.array(langs, dtype=object), np.array(lengths, dtype=object)


def named(planned: list[Planned]) -> dict[str, int]:
    return {p.name: int(p.members.sum()) for p in planned}


def test_kinds_with_enough_chunks_stand_alone_and_the_rest_is_one_pool() -> None:
    langs, lengths = kinds(
        ("de", "short", 900), ("de", "long", 900), ("ja", "long", 900),
        ("sw", "short", 400), ("yo", "long", 400),
    )  # fmt: skip
    got = named(plan(langs, lengths, 0.02, 0.05))  # 711 chunks stand alone here
    assert got == {"de/short": 900, "de/long": 900, "ja/long": 900, POOL: 800}


def test_a_languages_small_lengths_stand_together_where_they_are_enough_together() -> None:
    langs, lengths = kinds(("de", "short", 400), ("de", "long", 400), ("ja", "long", 900))
    got = named(plan(langs, lengths, 0.02, 0.05))
    assert got == {"de": 800, "ja/long": 900, POOL: 1700}  # no rest: the pool is the mix


def test_a_calibration_of_one_kind_or_too_little_of_each_keeps_one_certificate() -> None:
    assert named(plan(*kinds(("de", "short", 5000)), 0.02, 0.05)) == {POOL: 5000}
    few = kinds(*((lang, "short", 100) for lang in ("de", "en", "fr", "ja", "sw")))
    assert named(plan(*few, 0.02, 0.05)) == {POOL: 500}


def test_language_tags_that_name_the_pool_everything_or_any_language_never_stand_alone() -> None:
    tags = ["other", "all", "*", "de"]
    langs, lengths = chunk_kinds(tags, np.repeat(np.arange(4), 900))
    assert named(plan(langs, lengths, 0.02, 0.05)) == {"de/long": 900, POOL: 2700}


def test_without_languages_the_strata_are_lengths_of_any_language() -> None:
    langs, lengths = chunk_kinds(None, np.repeat(np.arange(1400), [1] * 700 + [3] * 700))
    got = plan(langs, lengths, 0.02, 0.05)
    assert named(got) == {"short": 700, "long": 2100, POOL: 2800}
    point = _point([_stratum(p, 0.9) for p in got])
    assert point.stratum("sw", 1).name == "short" and point.stratum(None, 4).name == "long"


def test_a_chunk_takes_its_kinds_thresholds_and_unseen_kinds_the_pools() -> None:
    langs, lengths = kinds(("de", "short", 900), ("de", "long", 900), ("und", "long", 900))
    planned = plan(langs, lengths, 0.02, 0.05)
    strata = [_stratum(p, t) for p, t in zip(planned, (0.9, 0.8, 0.7, 0.6), strict=True)]
    point = _point(strata)
    assert point.stratum("de", 1).name == "de/short"
    assert point.stratum("de", 6).name == "de/long"
    assert point.stratum(None, 6).name == "und/long"  # a record without a language
    assert point.stratum("sw", 1).name == POOL and point.stratum(None, 1).name == POOL
    assert _point([]).stratum("de", 1) is None  # one certificate: no strata


def test_an_operating_point_needs_exactly_one_pool_and_unique_names() -> None:
    a = _stratum(Planned("de", ("de",), ("short", "long"), np.ones(1, bool)), 0.9)
    pool = _stratum(Planned(POOL, (), ("short", "long"), np.ones(1, bool)), 0.9)
    with pytest.raises(ValidationError, match="exactly one pool"):
        _point([a])
    with pytest.raises(ValidationError, match="named twice"):
        _point([a, a, pool])
    with pytest.raises(ValidationError, match="lengths"):
        _point([a.model_copy(update={"lengths": ["medium"]}), pool])


def _draw(rng: np.random.Generator, n: int, hardness: float) -> tuple[np.ndarray, np.ndarray]:
    """Chunks whose head confidence is uniform and whose disagreement rate with the full
    model is ``hardness * (1 - confidence)``: settling above ``t`` disagrees on
    ``hardness * (1 - t) / 2`` of the settled."""
    c = rng.uniform(size=n)
    return c, rng.uniform(size=n) < hardness * (1 - c)


def test_per_stratum_certificates_hold_on_any_mix_where_one_for_the_mix_does_not() -> None:
    # An easy kind and a hard one, half each in the calibration. One certificate for the
    # mix lets the hard kind disagree on about 7% (> epsilon 5%) in most draws, so a
    # stream of the hard kind alone breaks it; certified apart, each kind holds its
    # epsilon in all but at most delta of the draws.
    rng = np.random.default_rng(0)
    hardness = {"easy": 0.02, "hard": 0.5}
    draws, pooled_broken, strata_broken = 300, 0, 0
    for _ in range(draws):
        parts = [_draw(rng, 1500, hardness[k]) for k in ("easy", "hard")]
        c = np.concatenate([p[0] for p in parts])
        wrong = np.concatenate([p[1] for p in parts])
        hard = np.arange(3000) >= 1500

        def outcome(t: float, members: np.ndarray, c=c, wrong=wrong) -> tuple[int, int]:
            settled = members & (c >= t)
            return int(settled.sum()), int((settled & wrong).sum())

        everything = np.ones(3000, dtype=bool)
        t_mix, _, _ = certify(list(PATH), lambda t, e=everything: outcome(t, e), EPS, DELTA)
        pooled_broken += t_mix != DISABLED and hardness["hard"] * (1 - t_mix) / 2 > EPS
        planned = [
            Planned("easy", ("easy",), ("short", "long"), ~hard),
            Planned("hard", ("hard",), ("short", "long"), hard),
            Planned(POOL, (), ("short", "long"), everything),
        ]
        got = certify_strata(planned, outcome, PATH, EPS, DELTA, s0_threshold)
        assert [s.delta for s in got] == [DELTA / 3] * 3
        true_rate = {s.name: hardness.get(s.name, 0.26) * (1 - s.threshold_s1) / 2 for s in got}
        strata_broken += any(s.certified and true_rate[s.name] > EPS for s in got)
    assert pooled_broken / draws > 0.5
    assert strata_broken / draws <= DELTA


def test_a_stratum_no_threshold_certifies_goes_to_the_full_model_and_says_so() -> None:
    wrong_everywhere = [Planned("bad", ("xx",), ("short", "long"), np.ones(500, bool))]
    planned = [*wrong_everywhere, Planned(POOL, (), ("short", "long"), np.ones(500, bool))]

    def outcome(t: float, members: np.ndarray) -> tuple[int, int]:
        n = int(members.sum())
        return (n, n // 2) if members is planned[0].members else (n, 0)

    bad, pool = certify_strata(planned, outcome, PATH, EPS, DELTA, s0_threshold)
    assert not bad.certified and bad.threshold_s1 == DISABLED and bad.accepted == 0
    assert pool.certified and pool.upper_bound_at_delta < EPS


def test_a_calibration_with_languages_certifies_them_apart_and_the_runtime_applies_each(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "m"
    shutil.copytree(exported["modernbert"], d)
    langs = ["en", "de"] * 450
    spec = calibrate(
        d, texts(900), calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS),
        languages=langs, path=TINY_PATH,
    )  # fmt: skip
    point = spec.operating_points[spec.default_operating_point]
    assert [s.name for s in point.strata] == ["de/short", "en/short", POOL]
    assert all(s.delta == pytest.approx(0.1 / 3) for s in point.strata)
    assert sum(s.certify for s in point.strata[:2]) == spec.report.certify
    _, digest = read_manifest(d)
    cascade = Cascade.load(d, digest)
    assert cascade.scope_of("de", 1) == "de/short" and cascade.scope_of("de", 5) == "de"
    assert cascade.scope_of(None, 1) is None  # only the overall test
    # A stratum no threshold certified: its chunks never settle, the others' as before.
    off = point.strata[0].model_copy(update={"threshold_s0": DISABLED, "threshold_s1": DISABLED})
    changed = point.model_copy(update={"strata": [off, *point.strata[1:]]})
    loaded = load_model_dir(d)
    encoder = Encoder(loaded, threads=1, graphs="stages", engine=cascade.spec.engine)
    ids = [np.asarray(loaded.tokenizer.encode(t).ids, dtype=np.int64) for t in texts(40)]

    def stages(at: OperatingPoint, lang: str) -> list[str]:
        cheap = cheap_stages(encoder, replace(cascade, point=at), audit_fraction=0.0)
        meta = DocMeta(lang, 1, lang, None, None)
        return [cheap(ChunkTask(meta, 0, i, len(i))).stage for i in ids]

    assert "uncertain" not in set(stages(point, "de")) or len(set(stages(point, "de"))) > 1
    assert set(stages(changed, "de")) == {"uncertain"}
    assert stages(changed, "en") == stages(point, "en")


def _stratum(p: Planned, t: float) -> Stratum:
    return Stratum(
        name=p.name, languages=list(p.languages), lengths=list(p.lengths),
        threshold_s0=s0_threshold(t), threshold_s1=t, delta=0.01,
        certify=int(p.members.sum()), accepted=0, disagreements=0, upper_bound_at_delta=1.0,
    )  # fmt: skip


def _point(strata: list[Stratum]) -> OperatingPoint:
    return OperatingPoint(
        threshold_s0=0.99, threshold_s1=0.9, epsilon=0.02, delta=0.05,
        expected_share_s0=0.5, expected_share_s1=0.2, calibration_accepted=100,
        calibration_disagreements=0, strata=strata,
    )  # fmt: skip


def test_kascade_calibrate_prints_each_stratum_and_the_documents_languages_pick_theirs(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "m"
    shutil.copytree(exported["modernbert"], d)
    rows = [{"text": t, "lang": ["en", "de"][i % 2]} for i, t in enumerate(texts(900))]
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = kascade_cli(
        "calibrate", "--model", str(d), "--texts", str(data), "--lang-column", "lang",
        "--epsilon", "0.1", "--delta", "0.1", "--chunk-tokens", "64", "--overlap", "8",
        timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "certified per kind of text" in r.stdout, r.stdout
    lines = [line.strip() for line in r.stdout.splitlines()]
    assert any(line.startswith("de/short (de, short documents): S1 ") for line in lines), lines
    assert any(line.startswith("other (the rest (on the whole calibration mix))") for line in lines)
