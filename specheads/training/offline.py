"""Offline mode: run the target once, cache its hidden states in safetensors shards.

Per sequence we keep the concatenated captured layers (aux, [T, 3H]) and the final
normed hidden state ([T, H]); the teacher's logits are recomputed from the latter with
the target's lm_head rows, so nothing vocabulary-sized goes to disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from tqdm.auto import tqdm

SHARD_SIZE = 256  # sequences per shard
INDEX_FILE = "index.json"


def cache_bytes(lengths: list[int], hidden_size: int, n_layers: int, dtype: torch.dtype) -> int:
    per_token = (n_layers + 1) * hidden_size * torch.finfo(dtype).bits // 8
    return sum(lengths) * per_token


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


@torch.no_grad()
def build_cache(target, ids: list[torch.Tensor], layer_ids: list[int], folder: Path, batch_size: int,
                fingerprint: dict, rank: int = 0) -> Path:
    """Writes shards once; a folder whose index matches `fingerprint` is reused."""
    folder = Path(folder)
    index_path = folder / INDEX_FILE
    if index_path.is_file() and json.loads(index_path.read_text()).get("fingerprint") == fingerprint:
        return folder
    from safetensors.torch import save_file

    if rank != 0:
        raise RuntimeError("offline cache must be built by rank 0 first")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    device = target.model.embed_tokens.weight.device
    dtype = target.model.embed_tokens.weight.dtype
    est = cache_bytes([len(x) for x in ids], target.spec.hidden_size, len(layer_ids), dtype)
    print(f"offline cache: {len(ids)} sequences, {sum(len(x) for x in ids)} tokens -> {human_bytes(est)} in {folder}",
          flush=True)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    shard_of = {}
    for s in tqdm(range(0, len(order), SHARD_SIZE), desc="cache hidden states", unit="shard"):
        members = order[s : s + SHARD_SIZE]
        tensors = {}
        for b in range(0, len(members), batch_size):
            chunk = members[b : b + batch_size]
            width = max(len(ids[i]) for i in chunk)
            batch = torch.zeros(len(chunk), width, dtype=torch.int64)
            for r, i in enumerate(chunk):
                batch[r, : len(ids[i])] = ids[i]
            out = target(batch.to(device), capture_layers=layer_ids, return_logits=False)
            for r, i in enumerate(chunk):
                n = len(ids[i])
                tensors[f"aux.{i}"] = out.aux_hidden[r, :n].to("cpu", dtype).contiguous()
                tensors[f"hidden.{i}"] = out.hidden[r, :n].to("cpu", dtype).contiguous()
        name = f"shard_{s // SHARD_SIZE:05d}.safetensors"
        save_file(tensors, str(folder / name))
        shard_of.update({str(i): name for i in members})
    index_path.write_text(json.dumps({"fingerprint": fingerprint, "shards": shard_of}))
    return folder


class ShardReader:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.shard_of = json.loads((self.folder / INDEX_FILE).read_text())["shards"]

    def batch(self, indices: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
        from safetensors import safe_open

        aux, hid = [], []
        by_shard: dict[str, list[int]] = {}
        for i in indices:
            by_shard.setdefault(self.shard_of[str(i)], []).append(i)
        got = {}
        for shard, members in by_shard.items():
            with safe_open(str(self.folder / shard), framework="pt") as f:
                for i in members:
                    got[i] = (f.get_tensor(f"aux.{i}"), f.get_tensor(f"hidden.{i}"))
        width = max(got[i][0].shape[0] for i in indices)
        for i in indices:
            a, h = got[i]
            pad = width - a.shape[0]
            aux.append(torch.nn.functional.pad(a, (0, 0, 0, pad)))
            hid.append(torch.nn.functional.pad(h, (0, 0, 0, pad)))
        return torch.stack(aux).to(device), torch.stack(hid).to(device)
