"""Training entry point for `deepspeed`, `torchrun` and plain `python`:

    deepspeed --num_gpus 2 train/train.py --config configs/smollm2-135m-eagle3.yaml
    python train/train.py --config configs/smollm2-135m-eagle3.yaml --set train.deepspeed=null
"""

import sys

from specheads.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
