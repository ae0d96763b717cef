"""Model headers as the GGUF reader returns them, without files: the pure rules' inputs.

A plain 32-block llama, a model with an integrated MTP head, a separate head,
an ordinary draft model, EAGLE-3 and DFlash heads, a hybrid architecture.
The files themselves, for the tests that read them, are :mod:`support.models`.
"""

from __future__ import annotations

from dataclasses import replace

from lokid.core.model.modelinfo import ModelInfo

PLAIN = ModelInfo(path="/m/plain.gguf", file_size=8 * 2**30, arch="llama", name="plain",
                  block_count=32, context_length=32768, nextn_predict_layers=0,
                  has_nextn_tensor=False, hybrid=False, tensor_count=291)
MTP = replace(PLAIN, path="/m/mtp.gguf", arch="qwen35", nextn_predict_layers=1,
              has_nextn_tensor=True)
KEY_ONLY = replace(PLAIN, path="/m/keyonly.gguf", arch="qwen35", nextn_predict_layers=1)
HEAD = replace(MTP, path="/m/mtp-head.gguf", file_size=2**30)
DRAFT = replace(PLAIN, path="/m/small.gguf", block_count=4, file_size=2**28)
EAGLE = replace(PLAIN, path="/m/eagle.gguf", arch="eagle3", block_count=1)
DFLASH = replace(EAGLE, path="/m/dflash.gguf", arch="dflash")
QWEN4EXP = replace(MTP, arch="qwen4exp")
HYBRID = replace(PLAIN, arch="qwen3next", hybrid=True)
