"""ggml's tensor types, by the id a GGUF tensor info stores: how many elements one block
holds and how many bytes it takes (ggml's type traits, ``ggml/src/ggml.c`` of b11434)."""

# ggml type id -> (elements per block, bytes per block), from ggml's type traits.
# The header probe (lokid.core.model.modelinfo) uses it to find where each tensor's data ends
# (the partial-download and overlap checks) and to sum a model's weights by block; a
# type missing here (newer than this table) counts as zero bytes there.
GGML_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
    18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
    40: (64, 36), 41: (128, 18), 42: (64, 18),
}
