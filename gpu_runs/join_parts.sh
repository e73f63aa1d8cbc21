# Sourced by gpu_runs/stage_qwen.sh and gpu_runs/stage_head.sh: join a file carried to the device machine in
# parts over several calls.
#   join_parts NAME STAGE DEST BYTES SHA PART...
# copies the PARTs carried by this call into STAGE; once the staged parts (part[0-9]*, in name order) add
# up to BYTES, joins them into DEST and checks its sha256 against SHA. Prints what it staged, prefixed by
# NAME. Returns 0 with DEST joined and checked (STAGE removed), 3 while parts are missing, 1 where the
# joined file's sha256 is wrong (DEST removed).
join_parts() {
  local name=$1 stage=$2 dest=$3 bytes=$4 sha=$5 n=0 part have got
  shift 5
  mkdir -p "$stage"
  for part in "$@"; do
    [ -f "$part" ] || continue
    cp "$part" "$stage/" && n=$((n + 1))
  done
  have=$(cat "$stage"/part[0-9]* 2>/dev/null | wc -c)
  echo "$name: $n part(s) copied; $(ls "$stage" | wc -l) staged, $have of $bytes bytes"
  if [ "$have" -lt "$bytes" ]; then return 3; fi
  cat "$stage"/part[0-9]* > "$dest"
  got=$(sha256sum "$dest" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "$name: $dest sha256 $got, expected $sha: a part is missing or damaged; staged parts:" >&2
    ls -l "$stage" >&2
    rm -f "$dest"
    return 1
  fi
  rm -rf "$stage"  # the parts are in DEST now
  return 0
}
