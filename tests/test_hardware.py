"""--dtype=auto and --compile=auto (infra/hardware.py): what each device gets, and the line that says why. CI has
no GPU: the CUDA cases run with the device's compute capability stubbed."""
import pytest
import torch

import train
from conftest import run_script, tiny_args
from infra import hardware
from infra.configurator import UserError


@pytest.fixture
def cuda_of_capability(monkeypatch):
    """torch reports a CUDA device of the given compute capability; TF32 flags restored afterwards."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def stub(major, minor):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
    yield stub
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@pytest.mark.parametrize("capability, dtype", [((7, 0), "float16"), ((7, 5), "float16"), ((8, 0), "bfloat16"),
                                               ((8, 9), "bfloat16"), ((9, 0), "bfloat16")])
def test_auto_precision_is_bfloat16_only_where_the_card_computes_it_natively(cuda_of_capability, capability, dtype):
    """A T4 (7.5) or a V100 (7.0) would run bfloat16 emulated: float16 with the loss scaler there."""
    cuda_of_capability(*capability)
    chosen, compiled, line = hardware.run_choices(train.resolve_config([]), "cuda")  # the defaults: auto, auto
    assert chosen == dtype and compiled is True
    assert f"{capability[0]}.{capability[1]}" in line and "compiled on CUDA" in line


def test_float32_on_cuda_turns_tf32_on_and_the_cpu_gets_float32_uncompiled(cuda_of_capability):
    cuda_of_capability(8, 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    chosen, _, line = hardware.run_choices(dict(dtype="float32", compile=False), "cuda:0")
    assert chosen == "float32" and torch.backends.cuda.matmul.allow_tf32 and "TF32" in line
    torch.backends.cuda.matmul.allow_tf32 = False
    assert hardware.run_choices(dict(dtype="auto", compile="auto"), "cpu") == \
        ("float32", False, "--dtype=auto on cpu: float32; --compile=auto: not compiled on cpu (a short run does "
                           "not repay the build)")
    assert not torch.backends.cuda.matmul.allow_tf32  # only float32 on CUDA turns it on


def test_compile_takes_auto_true_false_from_the_command_line_or_a_config_file(char_dataset, tmp_path):
    assert [hardware.compile_option(v) for v in ("auto", "True", "False", True, False)] == \
        ["auto", True, False, True, False]
    with pytest.raises(UserError, match="choose auto, True or False"):
        train.resolve_config(["--compile=yes"])
    config = tmp_path / "config.py"
    config.write_text("compile = False\n")  # as config/train_shakespeare_char_cpu.py writes it
    assert train.resolve_config([str(config)])["compile"] is False
    assert train.resolve_config([])["compile"] == "auto"


def test_the_run_says_what_auto_chose_in_its_second_line(char_dataset, tmp_path):
    result = run_script("train.py", *tiny_args(char_dataset, str(tmp_path / "run"), quiet=False, max_iters=2))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "device cpu (float32)" in lines[0]
    assert lines[1] == ("--dtype=auto on cpu: float32; --compile=auto: not compiled on cpu (a short run does not "
                        "repay the build)")
