#!/usr/bin/env bash
# `bash scripts/demo.sh rl`: post-training by RL on verifiable arithmetic (docs/rl.md).
# Supervised fine-tuning of a small Llama on worked examples ("A+B=C\n", byte tokens) for a
# deliberately short budget, then GRPO with the exact-match reward; plots reward and
# held-out accuracy against the iteration and prints the held-out exact-match accuracy of
# both models. Environment: DIGITS (2), SFT_STEPS (1250), RL_MINUTES (15: loom rl's
# --time-limit), RL_ITERS (2000: at most), RANKS (2: loom rl under mpirun -n RANKS with
# --dp RANKS, one thread a rank). Outputs in runs/rl/.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n== %s\n' "$*"; }
DIGITS=${DIGITS:-2} SFT_STEPS=${SFT_STEPS:-1250} RL_ITERS=${RL_ITERS:-2000} RANKS=${RANKS:-2}
RL_MINUTES=${RL_MINUTES:-15}
LOOM=./build/loom
[ -x $LOOM ] || LOOM_SKIP_CUDA=1 bash scripts/build.sh >/dev/null
mkdir -p runs/rl

say "1/5 tasks: $DIGITS-digit addition, held-out pairs by seed (data/arith$DIGITS)"
$LOOM data arith --out "data/arith$DIGITS" --digits "$DIGITS" --train 20000 --val 200 --seed 1
cp "data/arith$DIGITS/task.json" runs/rl/task.json

say "2/5 supervised fine-tuning: $SFT_STEPS steps (runs/rl/sft.safetensors)"
$LOOM train --family llama --vocab-size 256 --seq-len 32 --n-layer 3 --d-model 96 --n-head 4 \
    --n-kv-head 2 --d-ff 256 --micro-batch 32 --global-batch 32 --steps "$SFT_STEPS" \
    --lr 3e-3 --min-lr 1e-3 --warmup-steps 20 --log-every 250 --seed 1 --threads 1 \
    --data "data/arith$DIGITS/train_*.bin" --save-weights runs/rl/sft.safetensors

say "3/5 GRPO: at most $RL_MINUTES min ($RL_ITERS iterations) of 16 prompts x 8 completions (runs/rl/policy.safetensors)"
launch=()
[ "$RANKS" -gt 1 ] && launch=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 -n "$RANKS")
[ "$RANKS" -gt 1 ] && [ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
"${launch[@]}" $LOOM rl --init-from runs/rl/sft.safetensors --dp "$RANKS" --threads 1 \
    --prompts "data/arith$DIGITS/train_prompts.txt" \
    --eval-prompts "data/arith$DIGITS/val_prompts.txt" --eval-every 25 \
    --iterations "$RL_ITERS" --time-limit "$RL_MINUTES" --prompts-per-iter 16 --group-size 8 \
    --ppo-micro-batch 16 --max-new-tokens $((2 * DIGITS + 2)) --temperature 1 --lr 3e-4 \
    --min-lr 3e-4 --warmup-steps 0 --weight-decay 0 --seed 1 --metrics runs/rl/rl.jsonl \
    --save-weights runs/rl/policy.safetensors

say "4/5 plot reward and held-out accuracy (runs/rl/rl.png)"
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("runs/rl/rl.jsonl")]
with open("runs/rl/reward.dat", "w") as f:
    for r in rows:
        if "reward_mean" in r:
            f.write(f"{r['iteration']} {r['reward_mean']}\n")
with open("runs/rl/heldout.dat", "w") as f:
    for r in rows:
        if "heldout_accuracy" in r:
            f.write(f"{r['iteration']} {r['heldout_accuracy']}\n")
PY
gnuplot <<'GP'
set terminal pngcairo size 900,500
set output "runs/rl/rl.png"
set title "loom rl: GRPO on addition"
set xlabel "iteration"
set yrange [0:1]
plot "runs/rl/reward.dat" using 1:2 with lines title "reward (train prompts, sampled)", \
     "runs/rl/heldout.dat" using 1:2 with linespoints title "held-out exact match (greedy)"
GP

say "5/5 held-out exact-match accuracy (greedy), SFT and RL"
for m in sft policy; do
    $LOOM generate --weights "runs/rl/$m.safetensors" \
        --prompt-file "data/arith$DIGITS/val_prompts.txt" --temperature 0 \
        --max-tokens $((2 * DIGITS + 2)) >"runs/rl/$m.val.txt"
    paste -d' ' "runs/rl/$m.val.txt" "data/arith$DIGITS/val_answers.txt" |
        awk -v m="$m" '$1 == $2 { c++ } END { printf "%-7s %.3f (%d of %d)\n", m, c / NR, c, NR }'
done
