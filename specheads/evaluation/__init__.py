"""The evaluation suite: held-out prompts by category, and the decoding run that measures a
drafter's acceptance and speedup on them (`specheads evaluate`)."""
