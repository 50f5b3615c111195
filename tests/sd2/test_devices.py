"""--dtype auto|bf16|fp32 and $SD2_DTYPE (sd2.devices)."""

import pytest
import torch

from sd2.cli import main
from sd2.devices import Placement, cpu_has_native_bf16, default_placement, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_explicit_precisions_and_auto(monkeypatch):
    monkeypatch.delenv("SD2_DTYPE", raising=False)
    assert resolve_dtype("bf16", CPU) is torch.bfloat16
    assert resolve_dtype("FP32", CPU) is torch.float32
    assert resolve_dtype(None, CPU) is (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)


@pytest.mark.parametrize(("has_bf16", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_on_cuda_is_bf16_only_where_the_gpu_computes_it(monkeypatch, has_bf16, expected):
    """A pre-Ampere GPU (V100, T4) only emulates bf16: auto must not pick it there."""
    monkeypatch.delenv("SD2_DTYPE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: has_bf16)
    assert resolve_dtype("auto", CUDA) is expected
    assert resolve_dtype("bf16", CUDA) is torch.bfloat16  # asked for explicitly: the user's choice


def test_a_requested_device_that_is_not_usable_is_refused_not_replaced(monkeypatch):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"--device 'cuda' was requested but no CUDA device is usable"):
            default_placement("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"--device 'cuda:3' was requested but this machine has 1 CUDA"):
        default_placement("cuda:3", "fp32")
    with pytest.raises(ValueError, match=r"--device must be cpu, cuda or cuda:N, got 'mps'"):
        default_placement("mps", "fp32")


def test_the_environment_sets_the_default_and_a_flag_overrides_it(monkeypatch):
    monkeypatch.setenv("SD2_DTYPE", "fp32")
    assert default_placement("cpu").dtype is torch.float32
    assert default_placement("cpu", "bf16").label == "cpu/bf16"


@pytest.mark.parametrize("bad", ["fp16", "float32", ""])
def test_a_bad_dtype_is_refused_naming_the_flag(bad, monkeypatch):
    monkeypatch.delenv("SD2_DTYPE", raising=False)
    with pytest.raises(ValueError, match=r"--dtype must be one of auto, bf16, fp32"):
        resolve_dtype(bad, CPU)
    monkeypatch.setenv("SD2_DTYPE", bad)
    with pytest.raises(ValueError, match=r"\$SD2_DTYPE"):
        resolve_dtype(None, CPU)


@pytest.mark.parametrize("command", ["generate", "bench", "serve", "data synth"])
def test_the_command_line_refuses_a_bad_dtype_before_loading_anything(command, capsys):
    from launcher.cli import main as console_script  # `sd2`: the library's commands plus serve

    with pytest.raises(SystemExit) as exit_info:
        console_script([*command.split(), "--dtype", "fp16"])
    assert exit_info.value.code == 2
    assert "--dtype: invalid choice: 'fp16'" in capsys.readouterr().err


def test_a_bad_environment_dtype_is_a_clear_cli_error(monkeypatch, capsys):
    monkeypatch.setenv("SD2_DTYPE", "half")
    assert main(["generate", "--prompt", "hi", "--max-new-tokens", "1"]) == 2
    assert "--dtype must be one of auto, bf16, fp32 (or $SD2_DTYPE), got 'half'" in capsys.readouterr().err


def test_a_model_too_large_for_its_one_device_is_refused_with_the_sizes():
    from sd2.models import check_fits, model_bytes
    from tests.tiny import tiny_llama

    model = tiny_llama()
    assert model_bytes(model) == 4 * sum(p.numel() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    gpu = Placement(torch.device("cuda", 0), torch.bfloat16)
    gib = 2**30
    check_fits("small", 8 * gib, free=10 * gib, total=80 * gib, placement=gpu)  # fits: nothing raised
    with pytest.raises(ValueError) as refused:
        check_fits("Qwen/Qwen3-8B", 16 * gib, free=15 * gib, total=24 * gib, placement=gpu)
    message = str(refused.value)
    assert "Qwen/Qwen3-8B needs 16.0 GiB for its weights in bf16" in message
    assert "cuda:0 has 15.0 GiB free of 24.0 GiB" in message and "one device" in message
