"""The quantization table of multilingual-e5-small over 20 languages, from ``kascade
evaluate`` results (one JSON per language) and ``bench.latency`` at 256 tokens, with a
per-language plot.

    python -m bench.e5_table runs/e5-eval --latency runs/latency-e5.json \\
        --json runs/e5-quantization.json --plot docs/e5_languages.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.plots import plt, save  # plots selects the Agg backend before pyplot loads
from kascade.schemas.files import write_text_atomically


def by_variant(eval_dir: Path) -> dict[str, dict[str, dict]]:
    """variant -> language -> that language's row."""
    out: dict[str, dict[str, dict]] = {}
    for f in sorted(eval_dir.glob("*.json")):
        for row in json.loads(f.read_text())["rows"]:
            name = Path(row["directory"]).name
            out.setdefault(name, {})[f.stem] = row
    return out


def summary(rows: dict[str, dict[str, dict]], latency: dict | None) -> list[dict]:
    speed = {Path(r["directory"]).name: r for r in (latency or {}).get("rows", [])}
    table = []
    for name, langs in rows.items():
        agreement = [r["agreement"] for r in langs.values()]
        f1 = [r["macro_f1"] for r in langs.values()]
        delta = [r["f1_delta"] for r in langs.values()]
        s = speed.get(name, {})
        table.append(
            {
                "variant": name,
                "size_mb": next(iter(langs.values()))["size_mb"],
                "ms_256": s.get("ms_256"),
                "speedup_256": s.get("speedup_256"),
                "agreement_mean": round(statistics.mean(agreement), 4),
                "agreement_min": round(min(agreement), 4),
                "agreement_min_language": min(langs, key=lambda k: langs[k]["agreement"]),
                "macro_f1_mean": round(statistics.mean(f1), 4),
                "f1_delta_mean": round(statistics.mean(delta), 4),
                "languages": len(langs),
            }
        )
    return table


def plot(rows: dict[str, dict[str, dict]], out: Path) -> Path:
    langs = sorted(next(iter(rows.values())))
    fig, (agree, f1) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for name, by_lang in rows.items():
        agree.plot(langs, [by_lang[x]["agreement"] for x in langs], marker="o", label=name)
        f1.plot(langs, [by_lang[x]["macro_f1"] for x in langs], marker="o", label=name)
    agree.set_ylabel("argmax agreement with FP32")
    f1.set_ylabel("macro-F1")
    agree.legend(fontsize=7, ncol=3)
    agree.set_title("multilingual-e5-small (English fine-tune), held-out SIB-200 by language")
    plt.setp(f1.get_xticklabels(), rotation=60, ha="right", fontsize=8)
    return save(fig, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("eval_dir", type=Path)
    p.add_argument("--latency", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, default=Path("docs/e5_languages.png"))
    args = p.parse_args()
    rows = by_variant(args.eval_dir)
    latency = json.loads(args.latency.read_text()) if args.latency else None
    table = summary(rows, latency)
    for row in table:
        print(json.dumps(row))
    if args.json:
        result = {"summary": table, "by_language": rows}
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")
    print(plot(rows, args.plot))


if __name__ == "__main__":
    main()
