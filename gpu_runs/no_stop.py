"""Run a bench.py (of this checkout or an older one, whichever is first on PYTHONPATH) with no
stop tokens: every answer runs to --max-new-tokens, so two versions whose outputs differ still
decode the same number of tokens a prompt (a speed comparison that does not mix in answer lengths).

    python3 gpu_runs/no_stop.py ROOT/scripts/bench.py [bench.py arguments]"""
import importlib
import runpy
import sys

for name in ("specheads.target.chat", "specheads.data.regenerate"):  # where each version keeps it
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    if hasattr(module, "stop_token_ids"):
        module.stop_token_ids = lambda tok: set()
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
