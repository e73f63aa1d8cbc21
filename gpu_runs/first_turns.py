"""Write the embedded ShareGPT's conversations cut to their first user turn and its answer, as
.jsonl.gz (about 11 MB against the 27 MB wheel): what `prepare --regenerate --max-turns 1` reads,
small enough to travel to the device machine beside a GGUF chunk.
    python3 gpu_runs/first_turns.py .dev/qdata/sharegpt_first_turns.jsonl.gz"""

import gzip
import json
import sys

from specheads.data.sources import embedded_sharegpt, iter_json_objects

out = sys.argv[1] if len(sys.argv) > 1 else ".dev/qdata/sharegpt_first_turns.jsonl.gz"
n = 0
with gzip.open(out, "wt", compresslevel=9) as f:
    for row in iter_json_objects(embedded_sharegpt()):
        turns = row.get("conversations") or []
        while turns and turns[0].get("from") != "human":  # as prepare drops a leading answer
            turns = turns[1:]
        f.write(json.dumps({"id": row.get("id"), "conversations": turns[:2]}) + "\n")
        n += 1
print(f"{n} conversations -> {out}")
