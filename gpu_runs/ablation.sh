#!/usr/bin/env bash
# Issue 20's ablation for SmolLM2-135M-Instruct: EAGLE-3 heads that differ in one thing each, judged on
# the evaluation suite's validation part (gpu_runs/README.md, "An ablation on the validation split"):
#   eagle3           the baseline: 2 epochs on the saved ShareGPT regeneration (.dev/regen), as the kinds table
#   eagle3+code      more data: that plus the 3,115 code prompts answered by the target (DATA_)
#   eagle3+2layers   capacity: two draft decoder layers (ARGS_)
#   eagle3+4ep       longer training: 4 epochs (EPOCHS_)
#   mtp+6ep          another kind: MTP, 5 modules, 6 epochs (ask for it: KINDS="mtp+6ep"); at two epochs it
#                    served 3.22 tokens a step on chat against EAGLE-3's 2.62 (docs/benchmarks.md)
#   eagle3+codeself  still more data: eagle3+code's plus the target's own prompts, answered (ask for it:
#                    KINDS="eagle3+codeself", once gpu_runs/self_prompts.sh has returned .dev/regen-self-prompts)
# Each machine runs a subset (KINDS=...), repeating the call until "kinds: table ready"; the runs of
# several machines make one table here from their kinds.tgz. Every setting can be overridden from the
# environment; the rest are gpu_runs/kinds_pipeline.sh's.
export SPLIT=${SPLIT:-validation} EPOCHS=${EPOCHS:-2} BENCH_ARGS=${BENCH_ARGS---repeats 1} ROOT=${ROOT:-/tmp/ablation}
export KINDS=${KINDS:-eagle3 eagle3+code eagle3+2layers eagle3+4ep}
export DATA_eagle3_code=${DATA_eagle3_code-code-prompts:1}
export DATA_eagle3_codeself=${DATA_eagle3_codeself-code-prompts:1 self-prompts:1}
export ARGS_eagle3_2layers=${ARGS_eagle3_2layers---set head.num_layers=2}
export EPOCHS_eagle3_4ep=${EPOCHS_eagle3_4ep:-4}
export ARGS_mtp_6ep=${ARGS_mtp_6ep---set head.num_modules=5} EPOCHS_mtp_6ep=${EPOCHS_mtp_6ep:-6}
exec bash gpu_runs/kinds_pipeline.sh
