#!/usr/bin/env bash
# Mixture-of-experts models in checkpoints and generation: the manifest and the weights
# file record the MoE settings; resuming with another --top-k, --capacity-factor,
# --moe-every or --shared-expert is refused with one line naming the flag and both
# values (exit 2, not "start fresh"), the same settings resume; `loom ckpt export` of an
# MoE checkpoint and --save-weights give the same file contents, and `loom generate`
# runs both (greedy: the same text). Decoding logits = the training forward's are checked
# in tests/unit/test_generate.c; the export against PyTorch in tests/ckpt/test_export.py.
# Usage: test_moe_ckpt.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_moe_ckpt.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh"
for _ in $(seq 20); do cat "$0"; done > "$TMP/text.txt"
"$LOOM" data bytes --input "$TMP/text.txt" --out "$TMP/data" --val-fraction 0 2>/dev/null
SEED=${LOOM_TEST_SEED:-$RANDOM}
echo "seed $SEED"
# Top-k 1 or 2 and with or without the shared expert, by seed.
K=$((1 + SEED % 2))
SHARED=()
[ $((SEED / 2 % 2)) = 1 ] && SHARED=(--shared-expert)
for family in gpt2 llama; do
    args=(train --family "$family" --vocab-size 256 --seq-len 16 --n-layer 2 --d-model 32
          --n-head 4 --d-ff 48 --micro-batch 2 --global-batch 4 --lr 3e-3 --warmup-steps 2
          --threads 1 --log-every 0 --seed "$SEED" --data "$TMP/data/train_*.bin"
          --n-experts 4 --top-k $K --moe-every 1 --capacity-factor 0 --aux-loss-coef 0.01
          "${SHARED[@]}")
    ck="$TMP/$family.ck"
    if ! "$LOOM" "${args[@]}" --steps 3 --ckpt-dir "$ck" --ckpt-every 3 \
        --save-weights "$TMP/$family.w.safetensors" 2>"$TMP/err"; then
        echo "FAIL: $family MoE run"; cat "$TMP/err"; fail=$((fail + 1)); continue
    fi
    man=$(ls -d "$ck"/step_* | tail -1)/manifest.json
    check "$family: manifest records the MoE settings" python3 - "$man" "$K" "${#SHARED[@]}" <<'PY'
import json, sys
moe = json.load(open(sys.argv[1]))["model"]["moe"]
assert moe == {"n_experts": 4, "top_k": int(sys.argv[2]), "moe_every": 1,
               "shared_expert": sys.argv[3] == "1", "capacity_factor": 0.0,
               "aux_loss_coef": moe["aux_loss_coef"], "z_loss_coef": 0.0}, moe
assert abs(moe["aux_loss_coef"] - 0.01) < 1e-9, moe
PY
    # A changed setting is refused with one line naming the flag, saved and given values.
    for change in "--top-k $((3 - K)):--top-k $K" "--capacity-factor 1.5:--capacity-factor 0" \
                  "--moe-every 2:--moe-every 1" "--aux-loss-coef 0.02:--aux-loss-coef 0.01"; do
        given=${change%%:*} saved=${change#*:}
        # shellcheck disable=SC2086
        "$LOOM" "${args[@]}" --steps 5 --ckpt-dir "$ck" --resume auto $given >/dev/null 2>"$TMP/rerr"
        rc=$?
        check "$family: resume with $given refused (exit $rc)" \
            test $rc -eq 2 -a "$(grep -c -- "$given: .*manifest.json was saved with $saved" "$TMP/rerr")" = 1
        check "$family: $given: not started fresh" test "$(grep -c "starting fresh" "$TMP/rerr")" = 0
    done
    "$LOOM" "${args[@]}" --steps 5 --ckpt-dir "$ck" --resume auto >/dev/null 2>"$TMP/rerr"
    check "$family: same settings resume" grep -q "resumed from .*step 3" "$TMP/rerr"
    # Export of the step-3 checkpoint = the weights saved at the end of the 3-step run.
    "$LOOM" ckpt export "$man" --format safetensors -o "$TMP/$family.x.safetensors" 2>"$TMP/xerr" ||
        "$LOOM" ckpt export "$(dirname "$man")" --format safetensors -o "$TMP/$family.x.safetensors" 2>"$TMP/xerr"
    check "$family: ckpt export of an MoE checkpoint" test -s "$TMP/$family.x.safetensors"
    check "$family: export = --save-weights tensors" python3 - "$TMP/$family.x.safetensors" "$TMP/$family.w.safetensors" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    return meta, {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
ma, a = load(sys.argv[1])
mb, b = load(sys.argv[2])
assert a == b, sorted(set(a) ^ set(b))
assert any(".experts.3." in k for k in a), "no expert tensors"
for k in ("n_experts", "top_k", "moe_every", "shared_expert", "capacity_factor"):
    assert ma[k] == mb[k], (k, ma.get(k), mb.get(k))
PY
    for w in x w; do
        "$LOOM" generate --weights "$TMP/$family.$w.safetensors" --prompt "# Mixture" \
            --max-tokens 10 --temperature 0 >"$TMP/gen.$w" 2>"$TMP/gerr"
        check "$family: generate from the MoE file ($w, exit $?)" grep -aq "^# Mixture" "$TMP/gen.$w"
    done
    check "$family: greedy text from export = from --save-weights" cmp -s "$TMP/gen.x" "$TMP/gen.w"
done
finish test_moe_ckpt
