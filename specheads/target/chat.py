"""The target's chat format: its template rendered to text, and the tokens that end its turn.
Serving, evaluation and data preparation all use these."""

from __future__ import annotations


class ChatTemplateError(ValueError):
    """The target's chat template refused the messages (e.g. roles that do not alternate)."""


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja raises TemplateError for e.g. non-alternating roles
        raise ChatTemplateError(f"chat template rejected the conversation: {type(e).__name__}") from e


def stop_token_ids(tokenizer) -> set[int]:
    """The end-of-sequence token and the end-of-turn tokens of the common chat formats the
    tokenizer knows."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    return ids
