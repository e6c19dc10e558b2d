"""``kascade calibrate``: fit the cascade's heads and certify their thresholds.

Unlabeled text is enough: the target is the full model's own answer on each chunk.
The calibration chunks are split three ways, seeded: the heads are fitted on one part;
candidate thresholds are chosen on a second (the lowest confidence at which the
empirical disagreement stays within a fraction of epsilon); and the third certifies
them with fixed-sequence testing (Learn-then-Test): candidates are tested from the most
conservative on, each with an exact binomial test of "disagreement > epsilon", and the
last one rejected is kept. Each stage gets delta/2, so with probability >= 1 - delta the
chunks accepted by S0 and by S1 disagree with the full model on at most epsilon of them.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import beta, binom

from operators.cascade import pooled
from operators.chunking import chunk_text
from operators.encoder import Encoder, load_model_dir
from schemas.cascade import CASCADE_FILE, CascadeSpec, HeadWeights, OperatingPoint
from toolchain import ToolchainError

RISK_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
DISABLED = 1.01  # a threshold no probability reaches


class CalibrationTooSmall(ToolchainError):
    """The calibration set cannot certify the requested guarantee."""


def min_accepted(epsilon: float, delta: float) -> int:
    """Accepted chunks needed to certify ``epsilon`` at ``delta`` with zero disagreements.

    >>> min_accepted(0.01, 0.05), min_accepted(0.02, 0.05)
    (299, 149)
    """
    return math.ceil(math.log(delta) / math.log(1 - epsilon))


def p_value(disagreements: int, accepted: int, epsilon: float) -> float:
    """P(at most this many disagreements | true rate = epsilon): small rejects "rate > epsilon"."""
    return float(binom.cdf(disagreements, accepted, epsilon)) if accepted else 1.0


def upper_bound(disagreements: int, accepted: int, delta: float) -> float:
    """One-sided Clopper-Pearson upper bound on the disagreement rate at confidence 1 - delta."""
    if accepted == 0:
        return 1.0
    if disagreements >= accepted:
        return 1.0
    return float(beta.ppf(1 - delta, disagreements + 1, accepted - disagreements))


@dataclass(frozen=True)
class Features:
    embeddings: np.ndarray  # n x H, mean-pooled embedding-layer output
    hidden: np.ndarray  # n x H, mean-pooled output of the cascade layer
    target: np.ndarray  # n, the full model's label index
    tokens: np.ndarray  # n, chunk lengths


def extract(model_dir: Path, texts: list[str], *, max_tokens: int, overlap: int) -> Features:
    """Pooled features and the full model's answer for every chunk of ``texts``."""
    loaded = load_model_dir(model_dir)
    enc = Encoder(loaded, graphs="stages")
    f0, f1, y, n = [], [], [], []
    for text in texts:
        for c in chunk_text(
            text, loaded.tokenizer, max_tokens=max_tokens, overlap=overlap, max_chunks=10_000
        ):
            ids = c.ids[None, :]
            mask = np.ones_like(ids)
            emb = enc.embeddings(ids, mask)
            hidden = enc.prefix(emb, mask)
            f0.append(pooled(emb))
            f1.append(pooled(hidden))
            y.append(int(enc.suffix(hidden, mask)[0].argmax()))
            n.append(c.n_tokens)
    return Features(np.stack(f0), np.stack(f1), np.asarray(y), np.asarray(n))


def fit_head(x: np.ndarray, y: np.ndarray, n_labels: int, feature: str, seed: int) -> HeadWeights:
    """Logistic regression on standardized features, the scaling folded into the weights."""
    from sklearn.linear_model import LogisticRegression

    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    clf = LogisticRegression(C=1.0, max_iter=3000, random_state=seed)
    clf.fit((x - mean) / std, y)
    weight = np.zeros((n_labels, x.shape[1]))
    bias = np.full(n_labels, -30.0)  # labels never seen in fitting: never predicted
    coef, intercept = clf.coef_, clf.intercept_
    if len(clf.classes_) == 2:  # sklearn's binary form: one row for class 1
        coef = np.vstack([-coef[0] / 2, coef[0] / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
    for row, cls in enumerate(clf.classes_):
        weight[cls] = coef[row] / std
        bias[cls] = intercept[row] - coef[row] @ (mean / std)
    return HeadWeights(feature=feature, weight=weight.tolist(), bias=bias.tolist())


def _probs(head: HeadWeights, x: np.ndarray) -> np.ndarray:
    z = x @ np.asarray(head.weight).T + np.asarray(head.bias)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def candidates(conf: np.ndarray, wrong: np.ndarray, epsilon: float) -> list[float]:
    """Thresholds, most conservative first: for each fraction rho of epsilon, the lowest
    confidence at which the empirical disagreement of accepted chunks stays <= rho*eps."""
    order = np.argsort(-conf)
    cum_wrong = np.cumsum(wrong[order])
    rate = cum_wrong / np.arange(1, len(order) + 1)
    out: list[float] = []
    for rho in RISK_FRACTIONS:
        ok = np.flatnonzero(rate <= rho * epsilon)
        if len(ok):
            t = float(conf[order][ok.max()])
            if t not in out:
                out.append(t)
    return sorted(out, reverse=True)


def certify(
    conf: np.ndarray, wrong: np.ndarray, thresholds: list[float], epsilon: float, delta: float
) -> tuple[float, int, int]:
    """Fixed-sequence test; returns (threshold, accepted, disagreements) or DISABLED."""
    best = (DISABLED, 0, 0)
    for t in thresholds:  # most conservative first; stop at the first failure
        accepted = conf >= t
        n, k = int(accepted.sum()), int(wrong[accepted].sum())
        if p_value(k, n, epsilon) > delta:
            break
        best = (t, n, k)
    return best


def calibrate(
    model_dir: Path,
    texts: list[str],
    *,
    epsilon: float = 0.01,
    delta: float = 0.05,
    max_tokens: int = 256,
    overlap: int = 32,
    fit_fraction: float = 0.4,
    choose_fraction: float = 0.2,
    seed: int = 0,
    head_texts: list[str] | None = None,
    name: str = "default",
) -> CascadeSpec:
    """Fit heads, certify thresholds, and write ``cascade.json`` into ``model_dir``."""
    loaded = load_model_dir(model_dir)
    m = loaded.manifest
    feats = extract(model_dir, texts, max_tokens=max_tokens, overlap=overlap)
    n = len(feats.target)
    order = np.random.default_rng(seed).permutation(n)
    n_fit, n_choose = int(n * fit_fraction), int(n * choose_fraction)
    fit, choose, cert = np.split(order, [n_fit, n_fit + n_choose])
    need = min_accepted(epsilon, delta / 2)
    if len(cert) < need:
        raise CalibrationTooSmall(
            f"{n} calibration chunks leave {len(cert)} to certify with; epsilon={epsilon:g} at"
            f" delta={delta:g} needs at least {need} accepted chunks with no disagreement"
            f" (about {math.ceil(need / (1 - fit_fraction - choose_fraction))} chunks in all)"
        )
    x0, x1, y = feats.embeddings, feats.hidden, feats.target
    f0, f1 = x0[fit], x1[fit]
    yf = y[fit]
    if head_texts:
        extra = extract(model_dir, head_texts, max_tokens=max_tokens, overlap=overlap)
        f0, f1 = np.vstack([f0, extra.embeddings]), np.vstack([f1, extra.hidden])
        yf = np.concatenate([yf, extra.target])
    labels = len(m.labels)
    s0 = fit_head(f0, yf, labels, "embeddings", seed)
    s1 = fit_head(f1, yf, labels, "hidden", seed)

    def stage(head: HeadWeights, x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = _probs(head, x[idx])
        return p.max(axis=1), p.argmax(axis=1) != y[idx]

    c0a, w0a = stage(s0, x0, choose)
    c0b, w0b = stage(s0, x0, cert)
    t0, n0, k0 = certify(c0b, w0b, candidates(c0a, w0a, epsilon), epsilon, delta / 2)
    # S1 sees what S0 did not accept, on both splits.
    rest_a, rest_b = choose[c0a < t0], cert[c0b < t0]
    c1a, w1a = stage(s1, x1, rest_a)
    c1b, w1b = stage(s1, x1, rest_b)
    t1, n1, k1 = certify(c1b, w1b, candidates(c1a, w1a, epsilon), epsilon, delta / 2)
    if t0 == DISABLED and t1 == DISABLED:
        raise CalibrationTooSmall(
            f"no threshold could be certified for epsilon={epsilon:g} at delta={delta:g} on"
            f" {len(cert)} certification chunks (need >= {need} accepted with no"
            " disagreement); give more calibration text or a larger epsilon"
        )
    accepted, wrong = n0 + n1, k0 + k1
    point = OperatingPoint(
        threshold_s0=t0,
        threshold_s1=t1,
        epsilon=epsilon,
        delta=delta,
        expected_share_s0=n0 / len(cert),
        expected_share_s1=n1 / len(cert),
        calibration_accepted=accepted,
        calibration_disagreements=wrong,
    )
    report = {
        "chunks": n,
        "fit": len(fit) + (0 if not head_texts else len(yf) - len(fit)),
        "choose": len(choose),
        "certify": len(cert),
        "head_agreement_s0": float(np.mean(_probs(s0, x0[cert]).argmax(1) == y[cert])),
        "head_agreement_s1": float(np.mean(_probs(s1, x1[cert]).argmax(1) == y[cert])),
        "accepted_s0": n0,
        "disagreements_s0": k0,
        "accepted_s1": n1,
        "disagreements_s1": k1,
        "certified_upper_bound_at_delta": upper_bound(wrong, accepted, delta),
        "max_tokens": max_tokens,
    }
    spec = CascadeSpec(
        model_manifest_sha256=loaded.manifest_sha256,
        cascade_layer=m.cascade_layer,
        labels=m.labels,
        s0=s0,
        s1=s1,
        operating_points={name: point},
        default_operating_point=name,
        report=report,
    )
    _write_atomically(Path(model_dir) / CASCADE_FILE, spec.model_dump_json(indent=1) + "\n")
    return spec


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
