#!/usr/bin/env bash
# The head-kinds comparison of issues 23 and 24, across device calls (each at most 10 min): prepare
# the data once from the saved regeneration, train every kind of KINDS on it alone on one GPU
# (the same data, epochs and batch for all), benchmark each with scripts/bench.py (ar and
# KIND-tree, batch 1 and 8, chat and coding prompts of the evaluation suite's test split), then
# one table (gpu_runs/kinds_table.py). Every call does what is left and stops itself before
# BUDGET seconds; training resumes from its last checkpoint (the trainer saves one on SIGTERM).
#   calls 1 + 2: stage.sh a / b (gpu_runs/README.md); then, back to back, carrying .dev/regen:
#   bash gpu_runs/kinds_pipeline.sh      (repeat until it prints "kinds: table ready")
# Each call returns $OUT/kinds.tgz (every kind's calls, curves, summary, bench files and logs, the
# table once made) and, at the end, $OUT/kinds_table.{json,md,png}. Everything else stays in
# $ROOT (/tmp: lost once the machine goes cold; the next call then starts again from staging).
# Kinds share the GPUs: kind i runs in slot i mod (NGPU x PER_GPU), on GPU slot mod NGPU; a slot's kinds run
# one after another. PER_GPU (1) > 1 trains that many kinds at once on each GPU (small heads leave a card
# idle between kernels); a kind then benches only once the other slots' kinds on its GPU are trained, so
# that no training shares the GPU a bench times.
# Env: BUDGET (s, default 550), KINDS ("eagle3 mtp eagle medusa"), EPOCHS (1), BATCH (16 conversations
#      an optimizer step, one process a kind), ROOT (/tmp/kinds), REGEN (.dev/regen), NGPU (all; 0 = CPU),
#      PREPARE_ARGS (--cut-loops 32, as the current head's data), TRAIN_ARGS (extra --set ... for every
#      kind), CHAT_PER_CATEGORY (10: 70 chat prompts), CODING (64; with SPLIT=validation 40, all it has),
#      SPLIT (test; validation for an ablation: the suite's validation part, 40 prompts a category), BENCH_ARGS (extra bench.py flags, e.g. --num-prompts 2),
#      EXTRA_METHODS (more bench.py methods beside ar and KIND-tree, e.g. "medusa+ngram-tree": the n-gram assist
#      on the kind's chosen tree), BENCH_NEED (s left that a bench of one prompt set needs to start, 200), PY (python3), ARGS_<kind> (extra
#      --set ... for that kind alone, e.g. ARGS_mtp="--set head.num_modules=6"; a variant KIND+LABEL in KINDS is
#      a run of its own with ARGS_KIND_LABEL, e.g. KINDS="mtp mtp+rand" ARGS_mtp_rand="--set
#      head.lm_head_from_target=false" (an ablation: SPLIT=validation); the default shapes otherwise:
#      mtp 3 modules, medusa 4 heads, so their trees are 3 and 4 deep where eagle3's and eagle's are 6),
#      TREES ("S,K,N ..." candidate trees for every kind; TREES_<kind> for one: each kind benches the one with the
#      best mean speedup at batch 1 on the validation split's chat prompts, TUNE_PER_CATEGORY (8) of each chat
#      category, `specheads evaluate` with TUNE_ARGS; bench/KIND-tree.json records the choice (made again, with the
#      benches, where a later call names other candidates); unset: the kind's default tree (medusa 2,8,12, else 6,4,15);
#      with SPLIT=validation the benches then run on prompts the tree was chosen on).
# An ablation's variants (issue 20; gpu_runs/README.md, "An ablation on the validation split"):
#      EPOCHS_<kind> (that run's epochs instead of EPOCHS, e.g. EPOCHS_eagle3_4ep=4);
#      DATA_<kind> ("SOURCE[:FRACTION] ...": that run's own data, e.g. DATA_eagle3_code="code-prompts:1"): each
#      SOURCE (a packaged source of `prepare --data`: code-prompts, chitchat) is answered once by the target
#      (`prepare --data SOURCE --regenerate PREPARE_ARGS REGEN_ARGS`, REGEN_ARGS default --batch-size 512: greedy,
#      every turn, at most 512 new tokens, as .dev/regen's ShareGPT was), kept in ROOT/regen-SOURCE for every run
#      naming it and returned once as $OUT/regen-SOURCE.jsonl.gz (saved here as REGEN-SOURCE/part00, e.g.
#      .dev/regen-code-prompts/part00, and carried, a later machine takes it instead of regenerating); the run's
#      data is then the whole ShareGPT regeneration plus FRACTION (0 < FRACTION <= 1, default 1: all) of each
#      SOURCE's answered conversations: `prepare PREPARE_ARGS --set data.sources=[{name: jsonl, path: ..., ratio:
#      COUNT}, ...] --limit SUM` (each part's conversation count as its ratio) into ROOT/prepared-SPEC (shared by
#      the runs naming the same SPEC). Once trained, such a run is also evaluated on the shared data's held-out
#      split (`specheads eval --rows EVAL_ROWS`, 256: runs/KIND/eval_shared.json), the conversations every other
#      row's held-out figures come from, once `kinds_table.py held-out-check` (runs/KIND/heldout_check.json)
#      finds that its data trains on none of them (a mix holds out what its sources hold out). DATA_NEED (s left that a regeneration or a variant's prepare needs, 300).
set -uo pipefail
source gpu_runs/env.sh  # a TARGET set before (the CPU dry run) wins over env.sh's
source gpu_runs/slots.sh  # which slot and GPU a kind runs on; neighbours_trained
T0=$SECONDS
BUDGET=${BUDGET:-550}
KINDS=${KINDS:-eagle3 mtp eagle medusa}
EPOCHS=${EPOCHS:-1}
BATCH=${BATCH:-16}
ROOT=${ROOT:-/tmp/kinds}
REGEN=${REGEN:-.dev/regen}
PY=${PY:-python3}
PREPARE_ARGS=${PREPARE_ARGS---cut-loops 32}
TRAIN_ARGS=${TRAIN_ARGS:-}
BENCH_ARGS=${BENCH_ARGS:-}
BENCH_NEED=${BENCH_NEED:-200}
PER_GPU=${PER_GPU:-1}
SPLIT=${SPLIT:-test}
REGEN_ARGS=${REGEN_ARGS---batch-size 512}
DATA_NEED=${DATA_NEED:-300}
CHAT_CATEGORIES=${CHAT_CATEGORIES:-writing roleplay reasoning math extraction stem humanities}
if [ -z "${NGPU:-}" ]; then NGPU=$(nvidia-smi -L 2>/dev/null | wc -l); fi
DATA=$ROOT/prepared
left() { echo $(( BUDGET - (SECONDS - T0) )); }
mkdir -p $ROOT/runs $ROOT/bench $ROOT/logs $OUT
CARD=cpu
[ "$NGPU" -gt 0 ] && CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "kinds: $CARD x $NGPU; kinds $KINDS; $EPOCHS epoch(s), batch $BATCH ($(left) s left)"

# the wheels (pydantic, datasets, gguf, ...): carried here as .whl, or copied to /tmp/stage/whl by stage.sh a
if ! $PY -c "import pydantic, datasets, gguf" 2>/dev/null; then
  for w in .whl /tmp/stage/whl; do
    ls $w/*.whl >/dev/null 2>&1 || continue
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $w/*.whl \
      && echo "kinds: wheels of $w installed" && break
  done
fi

# ---------------------------------------------------------------- data, once
if [ ! -f $DATA/prepare_report.json ]; then
  ls $REGEN/part* >/dev/null 2>&1 || { echo "kinds: no $REGEN/part* (carry .dev/regen)"; exit 1; }
  cat $REGEN/part* > $ROOT/regenerated.jsonl.gz
  echo "kinds: prepare from the saved regeneration ($(left) s left)"
  timeout -s TERM -k 20 $(( $(left) - 60 )) $PY -m specheads.cli prepare --target $TARGET --output $DATA \
    --data $ROOT/regenerated.jsonl.gz $PREPARE_ARGS > $ROOT/logs/prepare.log 2>&1
  grep -v -E "it/s\]|conv/s\]|turn/s\]|s/turn\]|^frame #" $ROOT/logs/prepare.log | tail -15
  [ -f $DATA/prepare_report.json ] || { echo "kinds: prepare to be continued"; exit 0; }
  cp $DATA/prepare_report.json $ROOT/
fi
if [ ! -f $ROOT/prompts/prompts.json ]; then
  $PY gpu_runs/kinds_table.py prompts --out $ROOT/prompts --per-category ${CHAT_PER_CATEGORY:-10} \
    --coding ${CODING:-$([ $SPLIT = validation ] && echo 40 || echo 64)} --split $SPLIT
fi
# the code that ran: the device's git HEAD may be an older commit than the tree it was given, so
# also a hash of specheads/ (here, of a commit: python3 gpu_runs/code_hash.py --commit COMMIT)
code_sha1() { $PY gpu_runs/code_hash.py specheads; }
cat > $ROOT/settings.json <<EOF
{"kinds": [$(printf '"%s",' $KINDS | sed 's/,$//')], "epochs": $EPOCHS, "batch": $BATCH, "card": "$CARD",
 "max_new_tokens": 256, "commit": "$(git rev-parse --short HEAD 2>/dev/null || echo ?)", "code_sha1": "$(code_sha1)",
 "prepare_args": "$PREPARE_ARGS", "train_args": "$TRAIN_ARGS", "bench_args": "$BENCH_ARGS",
 "kind_args": {$(for k in $KINDS; do v=ARGS_${k//[^A-Za-z0-9_]/_}; printf '"%s": "%s",' $k "${!v:-}"; done | sed 's/,$//')},
 "kind_epochs": {$(for k in $KINDS; do v=EPOCHS_${k//[^A-Za-z0-9_]/_}; printf '"%s": %s,' $k "${!v:-$EPOCHS}"; done | sed 's/,$//')},
 "kind_data": {$(for k in $KINDS; do v=DATA_${k//[^A-Za-z0-9_]/_}; printf '"%s": "%s",' $k "${!v:-}"; done | sed 's/,$//')},
 "split": "$SPLIT", "regen_args": "$REGEN_ARGS", "per_gpu": $PER_GPU}
EOF

# ---------------------------------------------------------------- a variant's own data (DATA_<kind>), once
data_spec() { local v=DATA_${1//[^A-Za-z0-9_]/_}; echo "${!v:-}"; }
data_of() {  # the prepared folder kind $1 trains on
  local spec; spec=$(data_spec $1)
  if [ -n "$spec" ]; then echo "$ROOT/prepared-$(echo $spec | tr -c 'A-Za-z0-9.\n-' '_')"; else echo $DATA; fi
}
answered() {  # $1: a source; 0 once the target's answers are in $ROOT/regen-$1/regenerated.jsonl.gz
  local src=$1 dir=$ROOT/regen-$1 l
  [ -f $dir/done ] && return 0
  mkdir -p $dir
  if ls $REGEN-$src/part* >/dev/null 2>&1; then  # answered on an earlier machine ($OUT/regen-SOURCE.jsonl.gz)
    cat $REGEN-$src/part* > $dir/regenerated.jsonl.gz && echo "saved: $REGEN-$src" > $dir/done
    echo "kinds: $src answered as $REGEN-$src saved it"; return 0
  fi
  l=$(left)
  [ $l -lt $DATA_NEED ] && { echo "kinds: $src regeneration next call ($l s left)"; return 1; }
  echo "kinds: the target answers $src ($l s left)"
  # a cut run resumes: prepare --regenerate saves its state a chunk at a time in $dir
  timeout -s TERM -k 20 $(( l - 60 )) $PY -m specheads.cli prepare --target $TARGET --output $dir --data $src \
    --regenerate $([ "$NGPU" -gt 1 ] && echo --devices $NGPU) $PREPARE_ARGS $REGEN_ARGS > $ROOT/logs/$src.regen.log 2>&1
  grep -v -E "it/s\]|conv/s\]|turn/s\]|s/turn\]|^frame #" $ROOT/logs/$src.regen.log | tail -8
  [ -f $dir/prepare_report.json ] || { echo "kinds: $src regeneration to be continued"; return 1; }
  echo regenerated > $dir/done
  cp $dir/regenerated.jsonl.gz $OUT/regen-$src.jsonl.gz
}
variant_data() {  # $1: a kind with DATA_<kind>; 0 once its prepared folder is there
  local spec out item src frac n0 n limit srcs l log
  spec=$(data_spec $1); out=$(data_of $1)
  [ -f $out/prepare_report.json ] && return 0
  for item in $spec; do answered ${item%%:*} || return 1; done
  n0=$(zcat $ROOT/regenerated.jsonl.gz | wc -l); limit=$n0
  srcs="{name: jsonl, path: '$ROOT/regenerated.jsonl.gz', ratio: $n0}"
  for item in $spec; do
    src=${item%%:*}; frac=1; [ "$item" != "$src" ] && frac=${item#*:}
    n=$(zcat $ROOT/regen-$src/regenerated.jsonl.gz | wc -l)
    n=$(awk -v n=$n -v f=$frac 'BEGIN { if (!(f > 0 && f <= 1)) exit 1; printf "%d", n * f + 0.5 }') \
      || { echo "kinds: $1: the fraction $frac of $src is not in (0, 1]"; return 1; }
    [ $n -ge 1 ] || { echo "kinds: $1: $item leaves no conversation of $src"; return 1; }
    srcs="$srcs, {name: jsonl, path: '$ROOT/regen-$src/regenerated.jsonl.gz', ratio: $n}"; limit=$(( limit + n ))
  done
  l=$(left)
  [ $l -lt $DATA_NEED ] && { echo "kinds: $1's data ($spec) next call ($l s left)"; return 1; }
  echo "kinds: $1's data: the ShareGPT regeneration ($n0) + $spec, $limit conversations ($l s left)"
  log=$ROOT/logs/data-${out##*/prepared-}.prepare.log
  timeout -s TERM -k 20 $(( l - 60 )) $PY -m specheads.cli prepare --target $TARGET --output $out \
    --set "data.sources=[$srcs]" --limit $limit $PREPARE_ARGS > $log 2>&1
  grep -v -E "it/s\]|conv/s\]|turn/s\]|s/turn\]|^frame #" $log | tail -12
  [ -f $out/prepare_report.json ] || { echo "kinds: $1's data to be continued"; return 1; }
}
for kind in $KINDS; do  # before any training, so that a regeneration has the GPU alone
  [ -n "$(data_spec $kind)" ] && variant_data $kind
done

last_step() {  # the newest finished checkpoint's step (0 if none)
  ls -d $1/checkpoints/step_* 2>/dev/null | sed 's/.*step_//' | grep -E '^[0-9]+$' | sort -n | tail -1 | grep . || echo 0
}

# ---------------------------------------------------------------- one kind: train (resuming), then bench
kind_job() {  # $1: a kind, or a variant KIND+LABEL (its own run, with ARGS_, EPOCHS_ and DATA_KIND_LABEL)
  local kind=$1 run=$ROOT/runs/$1 t s0 rc l src extra=ARGS_${1//[^A-Za-z0-9_]/_} head=${1%%+*}
  local ep=EPOCHS_${1//[^A-Za-z0-9_]/_} epochs data spec
  epochs=${!ep:-$EPOCHS}; data=$(data_of $1); spec=$(data_spec $1)
  [ -f $data/prepare_report.json ] || { echo "kinds: $kind waits for its data ($spec)"; return; }
  mkdir -p $run
  cp $data/prepare_report.json $run/data_report.json
  # what this run is (the table reads it: runs of several machines' kinds.tgz unpacked into one folder)
  cat > $run/variant.json <<EOF
{"kind": "$kind", "head": "$head", "epochs": $epochs, "args": "${!extra:-}", "train_args": "$TRAIN_ARGS",
 "data_spec": "$spec", "data": "$data", "split": "$SPLIT"}
EOF
  if [ ! -f $run/final/model.safetensors ]; then
    l=$(left)
    [ $l -lt 120 ] && { echo "kinds: $kind trains next call"; return; }
    s0=$(last_step $run); t=$SECONDS
    echo "kinds: $kind trains from step $s0 ($l s left)"
    # SIGTERM 45 s before the end: the trainer finishes its step, saves a checkpoint and exits
    timeout -s TERM -k 30 $(( l - 45 )) $PY train/train.py --config configs/smollm2-135m-eagle3.yaml \
      --target $TARGET --data $data --output-dir $run --set head.kind=$head \
      --set train.batch_size=$BATCH --set train.epochs=$epochs --set train.deepspeed=null \
      --set train.save_every=200 --set train.eval_every=100000 --set train.log_every=25 $TRAIN_ARGS ${!extra:-} \
      >> $ROOT/logs/$kind.train.log 2>&1
    rc=$?
    echo "{\"wall_s\": $(( SECONDS - t )), \"step_before\": $s0, \"step_after\": $(last_step $run), \"rc\": $rc, \"finished\": $([ -f $run/final/model.safetensors ] && echo true || echo false), \"device\": \"$CARD\"}" >> $run/calls.jsonl
    tail -1 $run/calls.jsonl | sed "s/^/kinds: $kind call: /"
    [ -f $run/final/model.safetensors ] || { echo "kinds: $kind training to be continued (rc $rc)"; return; }
  fi
  [ -f $run/params.json ] || $PY gpu_runs/kinds_table.py params $run/final > $run/params.json
  if [ -n "$spec" ] && [ ! -f $run/heldout_check.json ]; then  # did its data train on the others' held-out ones?
    $PY gpu_runs/kinds_table.py held-out-check $DATA $data > $run/heldout_check.json \
      || echo "kinds: $kind's data trains on the shared held-out conversations ($(cat $run/heldout_check.json)): its own split's figures stand"
  fi
  if [ -n "$spec" ] && [ ! -f $run/eval_shared.json ] && grep -q '"in_run_train": 0' $run/heldout_check.json; then
    l=$(left)
    [ $l -lt 90 ] && { echo "kinds: $kind held-out evaluation on the shared data next call"; return; }
    timeout -s TERM -k 10 $(( l - 15 )) $PY -m specheads.cli eval --draft $run/final --data $DATA --target $TARGET \
      --rows ${EVAL_ROWS:-256} --json > $run/.eval_shared.json 2>> $ROOT/logs/$kind.train.log \
      && mv $run/.eval_shared.json $run/eval_shared.json \
      || { echo "kinds: $kind held-out evaluation on the shared data failed or cut"; tail -5 $ROOT/logs/$kind.train.log; return; }
  fi
  # PER_GPU > 1: a bench times its GPU alone, once the kinds of the other slots on it are trained
  while [ "$PER_GPU" -gt 1 ] && ! neighbours_trained $kind; do
    l=$(left)
    [ $l -lt $BENCH_NEED ] && { echo "kinds: $kind benches next call (its GPU still trains)"; return; }
    sleep ${BARRIER_POLL:-10}
  done
  # the tree: chosen on the validation split's chat prompts where TREES (or TREES_<kind>) names candidates
  local trees=TREES_${1//[^A-Za-z0-9_]/_} cands tree_arg="" t
  cands=${!trees:-${TREES:-}}
  if [ -n "$cands" ]; then
    # a choice made among other candidates (TREES changed on a warm machine): tuned and benched again
    if [ -f $ROOT/bench/$kind-tree.json ] && ! $PY gpu_runs/kinds_table.py tree-current $ROOT/bench/$kind-tree.json $cands; then
      echo "kinds: $kind's tree was chosen among other candidates than $cands: it tunes and benches again"
      rm -f $ROOT/bench/$kind-tree.json $ROOT/bench/$kind-tune.* $ROOT/bench/$kind-chat.* $ROOT/bench/$kind-coding.*
    fi
    if [ ! -f $ROOT/bench/$kind-tree.json ]; then
      l=$(left)
      [ $l -lt $BENCH_NEED ] && { echo "kinds: $kind tree tuning next call"; return; }
      echo "kinds: $kind tunes its tree on the validation split ($cands; $l s left)"
      timeout -s TERM -k 10 $(( l - 15 )) $PY -m specheads.evaluation --target $TARGET --draft $run/final \
        --methods $(for t in $cands; do printf '%s@%s ' $head $t; done) --split validation \
        --categories $CHAT_CATEGORIES --limit ${TUNE_PER_CATEGORY:-8} --batch-size 1 \
        --out $ROOT/bench/$kind-tune ${TUNE_ARGS:-} >> $ROOT/logs/$kind.bench.log 2>&1 \
        && $PY gpu_runs/kinds_table.py pick-tree $ROOT/bench/$kind-tune.json --out $ROOT/bench/$kind-tree.json \
        || { echo "kinds: $kind tree tuning failed or cut"; tail -5 $ROOT/logs/$kind.bench.log; rm -f $ROOT/bench/$kind-tree.json; return; }
    fi
    tree_arg="--tree $($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen'])" $ROOT/bench/$kind-tree.json)"
    echo "kinds: $kind benches with $tree_arg"
  fi
  for src in chat coding; do
    [ -f $ROOT/bench/$kind-$src.json ] && continue
    l=$(left)
    [ $l -lt $BENCH_NEED ] && { echo "kinds: $kind bench on $src next call"; return; }
    echo "kinds: $kind bench on $src ($l s left)"
    # a bench cut short leaves no file under the final name: the next call runs it again
    timeout -s TERM -k 10 $(( l - 15 )) $PY scripts/bench.py --target $TARGET --draft $run/final \
      --methods ar $head-tree ${EXTRA_METHODS:-} --batch-sizes 1 8 --speculation-policy fixed --peers --num-prompts 100 \
      --prompts $ROOT/prompts/$src.json --out $ROOT/bench/.$kind-$src $tree_arg $BENCH_ARGS >> $ROOT/logs/$kind.bench.log 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      mv $ROOT/bench/.$kind-$src.json $ROOT/bench/$kind-$src.json
      mv $ROOT/bench/.$kind-$src.png $ROOT/bench/$kind-$src.png 2>/dev/null
    else
      echo "kinds: $kind bench on $src failed or cut (rc $rc)"; tail -5 $ROOT/logs/$kind.bench.log; return
    fi
  done
  echo "kinds: $kind done"
}

slot_jobs() {  # the kinds of slot $1, one after another, on GPU $1 mod GPUS (or the CPU)
  local slot=$1 i=0 kind
  for kind in $KINDS; do
    if [ $(( i % SLOTS )) -eq $slot ]; then
      if [ "$NGPU" -gt 0 ]; then CUDA_VISIBLE_DEVICES=$(( slot % GPUS )) kind_job $kind; else kind_job $kind; fi
    fi
    i=$(( i + 1 ))
  done
}

GPUS=$(( NGPU > 0 ? NGPU : 1 ))
SLOTS=$(( GPUS * PER_GPU ))
# the kinds share the host's cores: a kind's bench (batch-1 timing is host-bound) beside others' training
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / SLOTS > 0 ? $(nproc) / SLOTS : 1 ))}
pids=()
for slot in $(seq 0 $(( SLOTS - 1 ))); do
  slot_jobs $slot > $ROOT/logs/slot$slot.txt 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
cat $ROOT/logs/slot*.txt
for kind in $KINDS; do
  echo "--- $kind: $(grep -E "Error|resumed from|stopped by signal|simulated chain acceptance|final head" \
    $ROOT/logs/$kind.train.log 2>/dev/null | tail -3 | tr '\n' ' ' | cut -c1-500)"
done

# ---------------------------------------------------------------- the table, once every kind is benched
all=1
for kind in $KINDS; do
  for src in chat coding; do [ -f $ROOT/bench/$kind-$src.json ] || all=0; done
done
if [ $all -eq 1 ] || [ "${TABLE_ANYWAY:-0}" = 1 ]; then
  $PY gpu_runs/kinds_table.py table --root $ROOT --out $ROOT/kinds_table && cp $ROOT/kinds_table.{json,md,png} $OUT/
fi
# what comes back each call (small files only: no weights, no checkpoints)
tar -czf $OUT/kinds.tgz -C $ROOT --exclude=checkpoints --exclude=final --exclude=prepared --exclude=regenerated.jsonl.gz \
  --exclude='prepared-*' --exclude='regen-*' --exclude='*.safetensors' --exclude='hidden_cache' .
ls -la $OUT
if [ $all -eq 1 ]; then echo "kinds: table ready"; else echo "kinds: to be continued"; fi
