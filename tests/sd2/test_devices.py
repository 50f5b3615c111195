"""--dtype auto|bf16|fp32 and $SD2_DTYPE (sd2.devices)."""

import pytest
import torch

from sd2.cli import main
from sd2.devices import cpu_has_native_bf16, default_placement, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_explicit_precisions_and_auto(monkeypatch):
    monkeypatch.delenv("SD2_DTYPE", raising=False)
    assert resolve_dtype("bf16", CPU) is torch.bfloat16
    assert resolve_dtype("FP32", CPU) is torch.float32
    assert resolve_dtype("auto", CUDA) is torch.bfloat16
    assert resolve_dtype(None, CPU) is (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)


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


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
def test_the_command_line_refuses_a_bad_dtype_before_loading_anything(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--dtype", "fp16"])
    assert exit_info.value.code == 2
    assert "--dtype: invalid choice: 'fp16'" in capsys.readouterr().err


def test_a_bad_environment_dtype_is_a_clear_cli_error(monkeypatch, capsys):
    monkeypatch.setenv("SD2_DTYPE", "half")
    assert main(["generate", "--prompt", "hi", "--max-new-tokens", "1"]) == 2
    assert "--dtype must be one of auto, bf16, fp32 (or $SD2_DTYPE), got 'half'" in capsys.readouterr().err
