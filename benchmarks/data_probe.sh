#!/usr/bin/env bash
# Scaling probe: repeated against fresh verifier answers at an equal fine-tuning budget.
#
#   HF_HUB_OFFLINE=1 benchmarks/data_probe.sh [FRESH.jsonl.gz] [OUT]
#
# Both arms continue the shipped `sd2` drafter with the sd2 recipe and the shipped fine-tunes' settings
# (docs/drafters.md, stage 3) for $STEPS steps of 8 rows:
#   repeated  the first $POOL answers of FRESH, seen STEPS·8/POOL times (today's regime: a few thousand
#             answers, several epochs)
#   fresh     every answer of FRESH, each seen at most once
# A copy of each run is taken when it reaches half the budget (same cosine schedule, not a separate run),
# so τ is read at 0, STEPS/2 and STEPS. Then one `sd2 bench` process decodes the 24 held-out chat prompts
# (k = 4, T = 0, 48 tokens) with the shipped pretrained and sd2 and the four probe drafters, and
# benchmarks/paired_tau.py compares them pairwise. Results land in OUT (default ~/.cache/sd2/probe).
#
# BASE=CKPT starts both arms from another checkpoint instead (e.g. one `sd2 train grow` deepened: the
# probe's arm (c)), ARMS="fresh" runs only that arm, and PREFIX=deep- names its drafters deep-fresh-384...
#
# MORE=A.jsonl.gz,B.jsonl.gz adds a third point, budget 2·STEPS: each arm continues from its STEPS
# export for STEPS more steps (a second stage, its own warm-up and cosine schedule), the repeated arm on
# its pool again, the fresh arm on the answers of MORE (answers neither arm has seen).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
FRESH=${1:-$ROOT/assets/data/synth/sharegpt-train-T0-from3584.jsonl.gz}
OUT=${2:-$HOME/.cache/sd2/probe}
STEPS=${STEPS:-384}
POOL=${POOL:-768}
THREADS=${THREADS:-2}
PY=${PYTHON:-$ROOT/.venv/bin/python}
BASE=${BASE:-$ROOT/assets/drafters/sd2}
read -r -a RUN_ARMS <<< "${ARMS:-repeated fresh}"
PREFIX=${PREFIX:-}
HALF=$((STEPS / 2))
mkdir -p "$OUT"

# the repeated arm's pool: a prefix of the same file, beside a copy of its settings
META=${FRESH%.gz}.meta.json
head -n "$POOL" < <(zcat -f "$FRESH") > "$OUT/pool.jsonl"  # no pipe: zcat may die of SIGPIPE
cp "$META" "$OUT/pool.jsonl.meta.json"

snapshot_at_half() {  # copy the run folder once its card says it reached HALF steps
    local run=$1 copy=$2
    until [ -d "$copy" ]; do
        if [ -f "$run/sd2_card.json" ] && \
           [ "$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' "$run/sd2_card.json")" = "$HALF" ]; then
            cp -r "$run" "$copy.tmp" && mv "$copy.tmp" "$copy"
        fi
        sleep 5
    done
}

train() {  # FROM DATA RUN: STEPS steps of the sd2 recipe, the shipped fine-tunes' settings
    "$PY" -m sd2 -v train sd2 --from "$1" --data "$2" --out "$3" --steps "$STEPS" --batch-size 8 \
        --seq-len 256 --lr 3e-4 --warmup-steps 20 --k 4 --eval-every "$STEPS" --save-every "$((HALF / 2))" \
        --seed 7 --threads "$THREADS" --precision bf16
}

train_arm() {  # NAME DATA
    local name=$PREFIX$1 data=$2
    [ -f "$OUT/$name-$STEPS/sd2_card.json" ] && return 0
    snapshot_at_half "$OUT/run-$name" "$OUT/run-$name-$HALF" &
    train "$BASE" "synth:$data" "$OUT/run-$name"
    wait
    "$PY" -m sd2 train export "$OUT/run-$name-$HALF" --out "$OUT/$name-$HALF"
    "$PY" -m sd2 train export "$OUT/run-$name" --out "$OUT/$name-$STEPS"
}

second_stage() {  # NAME DATA: continue NAME-STEPS for STEPS more steps
    local name=$PREFIX$1 data=$2
    [ -f "$OUT/$name-$((2 * STEPS))/sd2_card.json" ] && return 0
    train "$OUT/$name-$STEPS" "$data" "$OUT/run-$name-stage2"
    "$PY" -m sd2 train export "$OUT/run-$name-stage2" --out "$OUT/$name-$((2 * STEPS))"
}

declare -A ARM_DATA=([repeated]="$OUT/pool.jsonl" [fresh]="$FRESH")
declare -A MORE_DATA=([repeated]="synth:$OUT/pool.jsonl" [fresh]="synth:${MORE//,/,synth:}")
ARMS=()
for arm in "${RUN_ARMS[@]}"; do
    train_arm "$arm" "${ARM_DATA[$arm]}"
    ARMS+=("$PREFIX$arm-$HALF" "$PREFIX$arm-$STEPS")
done
if [ -n "${MORE:-}" ]; then
    for arm in "${RUN_ARMS[@]}"; do
        second_stage "$arm" "${MORE_DATA[$arm]}"
        ARMS+=("$PREFIX$arm-$((2 * STEPS))")
    done
fi

D=$ROOT/assets/drafters
DRAFTERS=(--drafter "pretrained=$D/pretrained" --drafter "sd2=$D/sd2")
for arm in "${ARMS[@]}"; do
    # every arm drafts over the shipped sd2's reduced vocabulary, as sd2 does (exports made before
    # fine-tunes kept their base's vocabulary lack it)
    [ -f "$OUT/$arm/draft_vocab.json" ] || cp "$D/sd2/draft_vocab.json" "$OUT/$arm/"
    DRAFTERS+=(--drafter "$arm=$OUT/$arm")
done
rm -rf "$OUT/bench"
"$PY" -m sd2 -v bench --methods pretrained sd2 "${ARMS[@]}" "${DRAFTERS[@]}" \
    --prompt-sets chat --k 4 --temperatures 0 --max-new-tokens 48 --repeats 1 --max-prompts 24 \
    --out "$OUT/bench"
"$PY" "$ROOT/benchmarks/paired_tau.py" "$OUT/bench/bench.json" --set chat --k 4 --temperature 0 \
    > "$OUT/paired.md"
cat "$OUT/paired.md"
