"""HTTP server entry point (the same as `specheads serve`):

    python serve/server.py --target HuggingFaceTB/SmolLM2-135M-Instruct --draft runs/smollm2-eagle3/final --port 8000
"""

import sys

from specheads.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
