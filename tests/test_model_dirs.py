"""A model directory is trusted no further than it is checked: hand-made, truncated or
hostile manifests, tokenizers and cascades are each refused by ``kascade run`` before it
touches Kafka, in one line that names the file, never with a traceback."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import kascade_cli

Edit = Callable[[Path], None]


def rewrite(d: Path, name: str, edit: Callable[[dict], None]) -> None:
    """Edit a JSON file of ``d`` and keep the manifest's digest of it true, as a
    careless or hostile hand would."""
    path = d / name
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    if name != "manifest.json":
        manifest = json.loads((d / "manifest.json").read_text())
        if name in manifest["files"]:
            manifest["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
            (d / "manifest.json").write_text(json.dumps(manifest))


def manifest(edit: Callable[[dict], None]) -> Edit:
    return lambda d: rewrite(d, "manifest.json", edit)


def cascade(edit: Callable[[dict], None]) -> Edit:
    return lambda d: rewrite(d, "cascade.json", edit)


def drop(key: str) -> Callable[[dict], None]:
    return lambda m: m["files"].pop(key)


def _set(*path: str, value: object) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return edit


def first_row(cascade_json: dict) -> list[float]:
    return cascade_json["s1"]["weight"][0]


CASES: list[tuple[str, Edit, str]] = [
    (
        "truncated manifest",
        lambda d: (d / "manifest.json").write_text('{"source": "x"'),
        "manifest.json",
    ),
    (
        "binary manifest",
        lambda d: (d / "manifest.json").write_bytes(b"\x00\xff\x12" * 50),
        "manifest.json",
    ),
    ("list-shaped manifest", lambda d: (d / "manifest.json").write_text("[1, 2]"), "manifest.json"),
    ("empty manifest", lambda d: (d / "manifest.json").write_text(""), "manifest.json"),
    ("no tokenizer listed", manifest(drop("tokenizer.json")), "lists no tokenizer.json"),
    ("no full graph listed", manifest(drop("model.onnx")), "lists no model.onnx"),
    (
        "a path outside",
        manifest(_set("files", "../../../etc/hostname", value="0" * 64)),
        "not a file inside",
    ),
    (
        "an absolute path",
        manifest(_set("files", "/etc/hostname", value="0" * 64)),
        "not a file inside",
    ),
    ("a digest that is not one", manifest(_set("files", "model.onnx", value="zz")), "not a sha256"),
    ("layer 99", manifest(_set("cascade_layer", value=99)), "cascade_layer 99"),
    ("no labels", manifest(_set("labels", value=[])), "labels"),
    ("a listed file missing", lambda d: (d / "suffix.onnx").unlink(), "suffix.onnx is listed"),
    ("a file changed", lambda d: (d / "labels.json").write_text('["x"]'), "labels.json"),
    (
        "a garbage tokenizer",
        lambda d: rewrite(d, "tokenizer.json", lambda t: t.clear()),
        "not a tokenizer",
    ),
    ("ragged head", cascade(lambda c: first_row(c).pop()), "not a non-empty matrix"),
    ("NaN weights", cascade(lambda c: first_row(c).__setitem__(0, float("nan"))), "finite"),
    ("a head too wide", cascade(lambda c: [r.append(0.5) for r in c["s1"]["weight"]]), "head is"),
    (
        "more labels",
        cascade(
            lambda c: (
                c["labels"].append("extra"),
                c["s0"]["weight"].append(c["s0"]["weight"][0]),
                c["s0"]["bias"].append(0.0),
            )
        ),
        "labels",
    ),
    ("another layer", cascade(_set("cascade_layer", value=1)), "layer 1"),
    (
        "a zero threshold",
        cascade(
            lambda c: [p.__setitem__("threshold_s1", 0) for p in c["operating_points"].values()]
        ),
        "threshold_s1",
    ),
    ("cascade not JSON", lambda d: (d / "cascade.json").write_text("{{{"), "cascade.json"),
    ("cascade a list", lambda d: (d / "cascade.json").write_text("[]"), "cascade.json"),
]


def test_every_broken_model_directory_is_one_line_naming_the_file(
    calibrated: Path, tmp_path: Path
) -> None:
    dirs = []
    for i, (_, edit, _) in enumerate(CASES):
        d = tmp_path / f"case-{i}"
        shutil.copytree(calibrated, d)
        edit(d)
        dirs.append(d)

    def attempt(d: Path):
        return kascade_cli(
            "run",
            "--bounded",
            "--cascade",
            "on",
            "--model-dir",
            str(d),
            "--chunk-tokens",
            "64",
            "--overlap",
            "8",
            "--brokers",
            "127.0.0.1:1",
            env={"PATH": ""},
        )

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, dirs))
    wrong = []
    for (name, _, words), r in zip(CASES, results, strict=True):
        lines = r.stderr.strip().splitlines()
        if r.returncode not in (1, 2) or len(lines) != 1 or words not in lines[0]:
            wrong.append(f"{name}: exit {r.returncode}: {r.stderr[-600:]!r}")
        elif "cannot reach Kafka" in lines[0]:
            wrong.append(f"{name}: accepted until Kafka")
    assert not wrong, "\n".join(wrong)


def test_a_path_in_the_manifest_is_never_opened(calibrated: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("secret")
    d = tmp_path / "model"
    shutil.copytree(calibrated, d)
    rewrite(
        d, "manifest.json", _set("files", "../outside", value=hashlib.sha256(b"secret").hexdigest())
    )
    r = kascade_cli("run", "--bounded", "--model-dir", str(d), env={"PATH": ""})
    assert r.returncode == 1 and "not a file inside" in r.stderr
