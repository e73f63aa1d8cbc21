"""specheads: train, publish and serve speculative-decoding draft heads."""

__version__ = "0.1.0"
