"""``kascade calibrate``: fit the cascade's heads and certify their thresholds.

Unlabeled text is enough: the target is the full model's own answer on each chunk.
The heads are fitted on separate head text, or on a seeded part of the calibration
chunks; the remaining chunks certify thresholds with fixed-sequence testing
(Learn-then-Test): thresholds on a path fixed in advance are tested from the most
conservative on, each with an exact binomial test of "disagreement > epsilon" on the
union of what S0 and S1 accept, and the last one rejected is kept. So with probability
>= 1 - delta, the chunks the cheap stages accept disagree with the full model on at most
epsilon of them.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import numpy as np

from kascade.errors import UsageError
from kascade.operators import backends
from kascade.operators.calibration import Cascade, Head
from kascade.operators.encoder import Loaded, load_model_dir
from kascade.operators.reading import STOP_PATH
from kascade.schemas import Aggregation
from kascade.schemas.cascade import (
    CASCADE_FILE,
    CalibrationReport,
    CascadeSpec,
    CertifiedChunking,
    HeadWeights,
    LanguageCalibration,
    OperatingPoint,
    StopRule,
    Stratum,
)
from kascade.schemas.engine import Engine
from kascade.schemas.files import write_text_atomically
from kascade.schemas.manifest import TOKENIZER
from kascade.schemas.settings import ChunkSettings
from kascade.toolchain import passes
from kascade.toolchain.calibrate_config import CalibrateConfig
from kascade.toolchain.certify import (
    DISABLED,
    CalibrationTooSmall,
    certify,
    min_accepted,
    upper_bound,
)
from kascade.toolchain.document_stop import (
    CalibrationText,
    certify_stop,
    on_topic_targets,
    read_documents,
)
from kascade.toolchain.features import Features, extract
from kascade.toolchain.overlap import groups, shared, split_by_group
from kascade.toolchain.strata import certify_strata, chunk_kinds, plan, thresholds_of

log = logging.getLogger(__name__)

RISK_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def by_language(
    languages: np.ndarray, accepted: np.ndarray, wrong: np.ndarray
) -> dict[str, LanguageCalibration]:
    """Certification chunks, settled and disagreeing ones, per language (one per chunk).

    >>> r = by_language(np.array(["de", "de", "ja"]), np.array([True, False, True]),
    ...                 np.array([False, False, True]))
    >>> r["de"].settled_share, r["ja"].agreement
    (0.5, 0.0)
    """
    out = {}
    for lang in sorted(set(languages.tolist())):
        mine = languages == lang
        out[lang] = LanguageCalibration(
            certify=int(mine.sum()),
            accepted=int((accepted & mine).sum()),
            disagreements=int((wrong & mine).sum()),
        )
    return out


# Inverse L2 strengths the heads choose from, by log-loss on a held-out share.
HEAD_CS = tuple(float(c) for c in np.logspace(-3, 0.5, 8))
HEAD_HELD_OUT = 0.25


@dataclass(frozen=True)
class FittedHead:
    weights: HeadWeights
    c: float  # the inverse L2 strength chosen on held-out fitting chunks


def choose_c(z: np.ndarray, y: np.ndarray, seed: int) -> float:
    """The inverse L2 strength of :data:`HEAD_CS` with the least log-loss on a stratified
    held-out share of the fitting chunks.

    Too few chunks to hold every label out keeps sklearn's default:

    >>> choose_c(np.zeros((6, 2)), np.array([0, 0, 1, 1, 2, 2]), seed=0)
    1.0
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.model_selection import train_test_split

    counts = np.unique(y, return_counts=True)[1]
    if counts.min() < 2 or math.ceil(len(y) * HEAD_HELD_OUT) < len(counts):
        return 1.0
    zt, zv, yt, yv = train_test_split(z, y, test_size=HEAD_HELD_OUT, stratify=y, random_state=seed)
    losses = []
    for c in HEAD_CS:
        clf = LogisticRegression(C=c, max_iter=3000, random_state=seed).fit(zt, yt)
        losses.append(log_loss(yv, clf.predict_proba(zv), labels=clf.classes_))
    return HEAD_CS[int(np.argmin(losses))]


def fit_head(x: np.ndarray, y: np.ndarray, n_labels: int, feature: str, seed: int) -> FittedHead:
    """Logistic regression on standardized features, the scaling folded into the weights.

    Its L2 strength is chosen by held-out log-loss, because thresholds read its
    probabilities: fixed at C = 1, the S1 head of multilingual-e5 was confidently wrong
    (138 of the 2,634 unseen chunks it gave >= 0.99 disagreed with the full model), so no
    threshold could certify epsilon 0.01; with C chosen (0.032 there) it certified it,
    accepting 46% of the certification chunks (docs/BENCHMARKS.md, section 13).
    """
    from sklearn.linear_model import LogisticRegression

    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    z = (x - mean) / std
    c = choose_c(z, y, seed)
    clf = LogisticRegression(C=c, max_iter=3000, random_state=seed).fit(z, y)
    weight = np.zeros((n_labels, x.shape[1]))
    bias = np.full(n_labels, -30.0)  # labels never seen in fitting: never predicted
    coef, intercept = clf.coef_, clf.intercept_
    if len(clf.classes_) == 2:  # sklearn's binary form: one row for class 1
        coef = np.vstack([-coef[0] / 2, coef[0] / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
    for row, cls in enumerate(clf.classes_):
        weight[cls] = coef[row] / std
        bias[cls] = intercept[row] - coef[row] @ (mean / std)
    return FittedHead(HeadWeights(feature=feature, weight=weight.tolist(), bias=bias.tolist()), c)


# The path of thresholds fixed-sequence testing walks, most conservative first. It is
# fixed in advance (not chosen on the data), so every calibration chunk can go to
# certification. S0, the weaker head, gets a stricter threshold on the same path.
PATH = (
    0.9999,
    0.9995,
    0.999,
    0.998,
    0.995,
    0.99,
    0.98,
    0.97,
    0.95,
    0.93,
    0.9,
    0.85,
    0.8,
    0.75,
    0.7,
    0.6,
    0.5,
)


def s0_threshold(t: float) -> float:
    """S0's threshold for S1's ``t``: a quarter of the doubt S1 is allowed."""
    return 1 - (1 - t) / 4


@dataclass(frozen=True)
class ChunkCertificate:
    """Two fitted heads and the thresholds certified for them: one pair, or one pair per
    stratum (:mod:`~kascade.toolchain.strata`) with the chunks' kinds to find each chunk's."""

    s0: FittedHead
    s1: FittedHead
    threshold: float  # S1's (the pool's, with strata); S0's is s0_threshold(threshold)
    accepted: int  # certification chunks the cheap stages accepted
    disagreements: int  # of those, labeled otherwise than by the full model
    strata: tuple[Stratum, ...] = ()
    kinds: tuple[np.ndarray, np.ndarray] | None = None  # every chunk's language, length

    def settles(self, feats: Features, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """Of the chunks ``idx``: who S0 settles, who S1 settles after it, and whether
        each settled one disagrees with the full model (the runtime's own heads)."""
        if self.strata and self.kinds is not None:
            t0, t1 = thresholds_of(list(self.strata), self.kinds[0][idx], self.kinds[1][idx])
            return self.settles_at(feats, idx, t0, t1)
        return self.settles_at(feats, idx, s0_threshold(self.threshold), self.threshold)

    def settles_at(
        self, feats: Features, idx: np.ndarray, t0: float | np.ndarray, t1: float | np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """:meth:`settles` at S0's and S1's thresholds (each one, or one per chunk)."""
        p0 = Head.of(self.s0.weights).probs(feats.embeddings[idx])
        p1 = Head.of(self.s1.weights).probs(feats.hidden[idx])
        y = feats.target[idx]
        by0 = p0.max(1) >= t0
        by1 = ~by0 & (p1.max(1) >= t1)
        wrong = (by0 & (p0.argmax(1) != y)) | (by1 & (p1.argmax(1) != y))
        return by0, by1, wrong

    def agreement(self, feats: Features, idx: np.ndarray) -> tuple[float, float]:
        """Each head's agreement with the full model on the chunks ``idx``."""
        y = feats.target[idx]
        p0 = Head.of(self.s0.weights).probs(feats.embeddings[idx])
        p1 = Head.of(self.s1.weights).probs(feats.hidden[idx])
        return float(np.mean(p0.argmax(1) == y)), float(np.mean(p1.argmax(1) == y))


def certify_chunks(
    feats: Features,
    fit: np.ndarray,
    cert: np.ndarray,
    n_labels: int,
    *,
    epsilon: float,
    delta: float,
    path: tuple[float, ...] = PATH,
    seed: int = 0,
    extra: Features | None = None,
    languages: list[str] | None = None,
    by_kind: bool = True,
) -> ChunkCertificate:
    """Fit the heads on the chunks ``fit`` (and all of ``extra``), then certify thresholds
    on the chunks ``cert``: with probability at least 1 - delta, the chunks the cheap
    stages accept disagree with the full model on at most epsilon, in every stratum the
    calibration holds enough of (:mod:`~kascade.toolchain.strata`; ``languages``, one
    per text, name the texts' languages; ``by_kind`` False: one certificate for the
    calibration's mix, as before strata)."""
    f0, f1, yf = feats.embeddings[fit], feats.hidden[fit], feats.target[fit]
    if extra is not None:
        f0, f1 = np.vstack([f0, extra.embeddings]), np.vstack([f1, extra.hidden])
        yf = np.concatenate([yf, extra.target])
    fitted0 = fit_head(f0, yf, n_labels, "embeddings", seed)
    fitted1 = fit_head(f1, yf, n_labels, "hidden", seed)
    heads = ChunkCertificate(fitted0, fitted1, DISABLED, 0, 0)

    def union(t: float, members: np.ndarray | None = None) -> tuple[int, int]:
        # One test per threshold pair certifies the union of what the cheap stages accept
        # (a test per stage would split delta and halve the power).
        chunks = cert if members is None else cert[members]
        by0, by1, wrong = heads.settles_at(feats, chunks, s0_threshold(t), t)
        return int((by0 | by1).sum()), int(wrong.sum())

    kinds = chunk_kinds(languages, feats.source)
    planned = plan(kinds[0][cert], kinds[1][cert], epsilon, delta) if by_kind else []
    if len(planned) <= 1:  # one certificate for the calibration's mix
        t, accepted, disagreements = certify(list(path), union, epsilon, delta)
        if t == DISABLED:
            _too_small(heads, feats, cert, epsilon, delta)
        return ChunkCertificate(fitted0, fitted1, t, accepted, disagreements)
    got = certify_strata(planned, union, path, epsilon, delta, s0_threshold)
    if not any(s.certified for s in got):
        _too_small(heads, feats, cert, epsilon, delta)
    pool = next(s for s in got if s.pool)
    done = ChunkCertificate(fitted0, fitted1, pool.threshold_s1, 0, 0, tuple(got), kinds)
    by0, by1, wrong = done.settles(feats, cert)
    return replace(done, accepted=int((by0 | by1).sum()), disagreements=int(wrong.sum()))


def _too_small(
    heads: ChunkCertificate, feats: Features, cert: np.ndarray, epsilon: float, delta: float
) -> NoReturn:
    agree0, agree1 = heads.agreement(feats, cert)
    raise CalibrationTooSmall(
        f"no threshold could be certified for epsilon={epsilon:g} at delta={delta:g} on"
        f" {len(cert)} certification chunks (need >= {min_accepted(epsilon, delta)}"
        f" accepted with no disagreement; the heads agree with the full model on"
        f" {agree0:.0%} (S0) and {agree1:.0%} (S1)); give more calibration text or a"
        " larger epsilon"
    )


def _warn_overlap(name: str, these: list[str] | None, other: str, those: list[str]) -> None:
    if not these:
        return
    texts, sentences = shared(these, those)
    if texts:
        log.warning(
            "%d of the %d %s texts share %d sentences with %s: the certificate is then"
            " measured on text the heads (or the stop) have in effect seen, and optimistic"
            " on other text; draw them from separate sources",
            texts,
            len(these),
            name,
            sentences,
            other,
        )


def calibrate(
    model_dir: Path,
    texts: list[str],
    config: CalibrateConfig | None = None,
    *,
    head_texts: list[str] | None = None,
    languages: list[str] | None = None,
    related: Sequence[str | None] | None = None,
    documents: list[str] | None = None,
    document_languages: list[str] | None = None,
    related_documents: Sequence[str | None] | None = None,
    fit_fraction: float | None = None,
    name: str = "default",
    path: tuple[float, ...] = PATH,
    stop_path: tuple[StopRule, ...] = STOP_PATH,
) -> CascadeSpec:
    """Fit heads, certify thresholds, and write ``cascade.json`` into ``model_dir``:
    fit -> certify chunks -> certify the stop -> write.

    ``config`` (:class:`CalibrateConfig`, ``kascade calibrate``'s flags) holds the bound,
    the chunking and the engine: the guarantee holds for chunks made that way, run by
    that engine (``auto`` resolved as ``kascade run`` resolves it), so a run with other
    chunking or another engine refuses the cascade. ``languages`` (one per text) splits
    the report and the strata (:mod:`~kascade.toolchain.strata`) by language.
    ``related`` (one value or ``None`` per text) relates texts such as translations of
    one text: like texts sharing a sentence, they go wholly to fitting or to certifying.
    ``documents`` (long texts like the stream's, none of them among ``texts``; their
    ``document_languages`` pick their strata) certify a document stop at ``epsilon_doc``
    for ``aggregation``, counting each group of ``related_documents`` (and of identical
    texts) as one draw; when none certifies, ``cascade.json`` is written without one and
    :class:`CalibrationTooSmall` says why. The full model runs on up to ``processes``
    worker processes (default: every core), with the same result.
    """
    c = config or CalibrateConfig()
    epsilon, delta, seed, chunking = c.epsilon, c.delta, c.seed, c.chunking
    _check_sizes(texts, languages, related, "texts")
    doc_groups = None
    if documents is not None:
        _check_sizes(documents, document_languages, related_documents, "documents")
        doc_groups = groups(documents, related_documents, by_sentence=False)
        _check_draws(len(documents), len(set(doc_groups)), c.epsilon_doc, delta)
    loaded = load_model_dir(model_dir)
    engine = backends.resolve(c.encoder, loaded.manifest)
    chunks_of = functools.partial(
        extract, model_dir, max_tokens=chunking.max_tokens, overlap=chunking.overlap,
        processes=c.processes, engine=engine,
    )  # fmt: skip
    feats = chunks_of(texts)
    if fit_fraction is None:  # separate head text frees the calibration set for testing
        fit_fraction = 0.0 if head_texts else 0.4
    fit, cert = _split(feats, groups(texts, related), fit_fraction, seed, epsilon, delta)
    _warn_overlap("--head-texts", head_texts, "the certification texts", texts)
    _warn_overlap("--documents", documents, "--texts", texts)
    if fit_fraction == 0.0 and not head_texts:
        raise UsageError("fit_fraction 0 needs head_texts to fit the heads on")
    extra = chunks_of(head_texts) if head_texts else None
    got = certify_chunks(
        feats, fit, cert, len(loaded.manifest.labels), epsilon=epsilon, delta=delta,
        path=path, seed=seed, extra=extra, languages=languages,
    )  # fmt: skip
    spec = _spec(
        loaded, got, (epsilon, delta), feats, fit, cert, extra, languages, chunking, engine, name
    )
    if documents is None or doc_groups is None:
        return _written(model_dir, spec)
    langs = [None] * len(documents) if document_languages is None else document_languages
    named = [CalibrationText(*each) for each in zip(documents, langs, doc_groups, strict=True)]
    return _with_document_stop(model_dir, spec, feats, len(texts), named, c, engine, stop_path)


def _check_sizes(
    texts: list[str],
    languages: Sequence[str] | None,
    related: Sequence[str | None] | None,
    what: str,
) -> None:
    """Refuse, before any model runs, a language or group for other texts than given."""
    for name, given in (("languages", languages), ("groups", related)):
        if given is not None and len(given) != len(texts):
            raise UsageError(f"{len(given)} {name} for {len(texts)} calibration {what}")


def _check_draws(documents: int, draws: int, epsilon_doc: float, delta: float) -> None:
    """Refuse, before any model runs, documents too few to certify a stop with."""
    need = min_accepted(epsilon_doc, delta)
    if draws < need:
        related = (
            f" ({documents} documents in {draws} groups of related documents, each group one draw)"
            if draws < documents
            else ""
        )
        raise CalibrationTooSmall(
            f"{draws} independent documents{related} cannot certify a document stop at"
            f" epsilon={epsilon_doc:g}, delta={delta:g}: it needs at least {need} documents"
            " stopped early with no disagreement with the full read"
        )


def _split(
    feats: Features,
    text_groups: list[int],
    fit_fraction: float,
    seed: int,
    epsilon: float,
    delta: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The chunks the heads are fitted on and those the thresholds are certified on,
    split by group of related texts (:func:`groups`); refused when too few are left to
    certify with."""
    fit, cert = split_by_group(feats.source, text_groups, fit_fraction, seed)
    need = min_accepted(epsilon, delta)
    if len(cert) < need:
        kinds = len(set(text_groups))
        raise CalibrationTooSmall(
            f"{len(feats.target)} calibration chunks leave {len(cert)} to certify with;"
            f" epsilon={epsilon:g} at delta={delta:g} needs at least {need} accepted chunks"
            f" with no disagreement (about {math.ceil(need / (1 - fit_fraction))} chunks in all"
            + (
                f"; the {len(text_groups)} texts are related (a shared sentence or group) so"
                f" much that they make only {kinds} groups that can go to one side or the other"
                if kinds < len(text_groups) / 2
                else ""
            )
            + ")"
        )
    return fit, cert


def _spec(
    loaded: Loaded,
    got: ChunkCertificate,
    at: tuple[float, float],  # epsilon, delta
    feats: Features,
    fit: np.ndarray,
    cert: np.ndarray,
    extra: Features | None,
    languages: list[str] | None,
    chunking: ChunkSettings,
    engine: Engine,
    name: str,
) -> CascadeSpec:
    """The cascade.json of certified chunk thresholds, with the report of how they held."""
    epsilon, delta = at
    t, accepted, disagreements = got.threshold, got.accepted, got.disagreements
    by0, by1, wrong = got.settles(feats, cert)
    n0, n1 = int(by0.sum()), int(by1.sum())
    agree0, agree1 = got.agreement(feats, cert)
    point = OperatingPoint(
        threshold_s0=s0_threshold(t),
        threshold_s1=t,
        epsilon=epsilon,
        delta=delta,
        expected_share_s0=n0 / len(cert),
        expected_share_s1=n1 / len(cert),
        calibration_accepted=accepted,
        calibration_disagreements=disagreements,
        strata=list(got.strata),
    )
    report = CalibrationReport(
        chunks=len(feats.target),
        fit=len(fit) + (0 if extra is None else len(extra.target)),
        certify=len(cert),
        head_agreement_s0=agree0,
        head_agreement_s1=agree1,
        head_c_s0=got.s0.c,
        head_c_s1=got.s1.c,
        accepted_s0=n0,
        disagreements_s0=int((wrong & by0).sum()),
        accepted_s1=n1,
        disagreements_s1=int((wrong & by1).sum()),
        certified_upper_bound_at_delta=upper_bound(disagreements, accepted, delta),
        by_language={}
        if languages is None
        else by_language(np.asarray(languages)[feats.source[cert]], by0 | by1, wrong),
    )
    m = loaded.manifest
    return CascadeSpec(
        model_manifest_sha256=loaded.manifest_sha256,
        chunking=CertifiedChunking(
            max_tokens=chunking.max_tokens,
            overlap=chunking.overlap,
            tokenizer_sha256=m.files[TOKENIZER],
        ),
        engine=engine,
        cascade_layer=m.cascade_layer,
        labels=m.labels,
        s0=got.s0.weights,
        s1=got.s1.weights,
        operating_points={name: point},
        default_operating_point=name,
        report=report,
    )


def _with_document_stop(
    model_dir: Path,
    spec: CascadeSpec,
    feats: Features,
    n_texts: int,
    documents: list[CalibrationText],
    config: CalibrateConfig,
    engine: Engine,
    stop_path: tuple[StopRule, ...],
) -> CascadeSpec:
    """``spec`` with a document stop certified on ``documents``, written; without one
    (written too) when none certifies, which :class:`CalibrationTooSmall` then says."""
    # The on-topic head learns from the calibration texts' chunks when those are documents
    # too; the stop is then certified on other documents, which it has not seen.
    aggregation, seed = config.aggregation, config.seed
    multi_chunk = len(feats.target) >= 2 * n_texts
    on_topic = fit_on_topic(feats, aggregation, seed) if multi_chunk else None
    if on_topic is None:
        stop_path = tuple(r for r in stop_path if r.min_on_topic == 0)
    # The cascade a run would load from this spec, so the stop is certified on the
    # verdicts a run reaches (the runtime's own cheap stages).
    topical = None if on_topic is None else Head.of(on_topic)
    point = spec.operating_points[spec.default_operating_point]
    cascade = Cascade(spec, Head.of(spec.s0), Head.of(spec.s1), point, topical)
    read = functools.partial(
        read_documents, chunking=config.chunking, cascade=cascade, aggregation=aggregation
    )
    blocks = passes.over_texts(
        model_dir,
        read,
        [d for d in documents if d.text.strip()],
        processes=config.processes,
        what="documents",
        engine=engine,
    )
    docs = [doc for block in blocks for doc in block]
    try:
        stop = certify_stop(
            docs,
            aggregation=aggregation,
            epsilon=config.epsilon_doc,
            delta=config.delta,
            path=stop_path,
            seed=seed,
        )
    except CalibrationTooSmall as e:
        _written(model_dir, spec)
        raise CalibrationTooSmall(f"{e} (wrote {CASCADE_FILE} without a document stop)") from None
    if stop.rule.min_on_topic > 0:
        stop = stop.model_copy(update={"on_topic": on_topic})
    return _written(model_dir, spec.model_copy(update={"document_stop": stop}))


def fit_on_topic(feats: Features, aggregation: Aggregation, seed: int) -> HeadWeights | None:
    """The on-topic head, on the mean embeddings of multi-chunk calibration texts; ``None``
    when every chunk (or none) agrees with its document, so there is nothing to learn."""
    y = on_topic_targets(feats, aggregation)
    if len(np.unique(y)) < 2:
        return None
    return fit_head(feats.embeddings, y, 2, "embeddings", seed).weights


def _written(model_dir: Path, spec: CascadeSpec) -> CascadeSpec:
    write_text_atomically(Path(model_dir) / CASCADE_FILE, spec.model_dump_json(indent=1) + "\n")
    return spec
