# Sourced by gpu_runs/kinds_pipeline.sh: where its kinds run. Kind i (in KINDS order) runs in slot
# i mod SLOTS, slot s on GPU s mod GPUS (SLOTS = GPUS x PER_GPU); a slot's kinds run one after
# another. Reads KINDS, SLOTS, GPUS and ROOT (a kind is trained once ROOT/runs/KIND/final/model.safetensors
# exists). tests/test_kinds_pipeline.py checks it.

kind_index() {  # $1: a kind of KINDS -> its place (0-based); -1 if it is not there
  local i=0 k
  for k in $KINDS; do [ "$k" = "$1" ] && { echo $i; return; }; i=$(( i + 1 )); done
  echo -1
}

neighbours_trained() {  # 0 once every kind of another slot on kind $1's GPU has its final head
  local i=0 me k
  me=$(kind_index $1)
  for k in $KINDS; do
    if [ $(( i % SLOTS )) -ne $(( me % SLOTS )) ] && [ $(( i % SLOTS % GPUS )) -eq $(( me % SLOTS % GPUS )) ] \
       && [ ! -f $ROOT/runs/$k/final/model.safetensors ]; then return 1; fi
    i=$(( i + 1 ))
  done
  return 0
}
