"""What --dtype=auto and --compile=auto choose on this machine, and why: speed only, the same model either way.

| device                         | --dtype=auto              | --compile=auto (train.py) |
|--------------------------------|---------------------------|---------------------------|
| CUDA, compute capability >= 8  | bfloat16 (native units)   | compiled                  |
| CUDA, compute capability 7.x   | float16 + the loss scaler | compiled                  |
| CPU, MPS                       | float32                   | off                       |

Why not torch.cuda.is_bf16_supported(): it is true on a T4 or a V100 too, where bfloat16 runs emulated, slower
than float16 (no bf16 tensor cores), and MFU would not show it (its peak is measured in the same precision).
float32 matmuls on CUDA use TF32 (Ampere and later; nanoGPT does the same): 10 mantissa bits inside the matmul,
float32 everywhere else. On a CPU torch.compile builds C++ for a minute or two that a short run never repays;
sample.py's auto decides per generation (infra/decode_layout.compile_pays).
"""
import torch

from infra.configurator import UserError, check_compiler

COMPILE_CHOICES = {"auto": "auto", "True": True, "False": False}  # --compile's text, as typed


def compile_option(value):
    """--compile's value: "auto", True or False (a config file may write the bool, the command line the text)."""
    if isinstance(value, bool):
        return value
    if value not in COMPILE_CHOICES:
        raise UserError(f"--compile={value}: choose auto, True or False")
    return COMPILE_CHOICES[value]


def auto_dtype(device_type, capability=None):
    """(dtype, why) for --dtype=auto; capability: the CUDA device's (major, minor)."""
    if device_type != "cuda":
        return "float32", f"--dtype=auto on {device_type}: float32"
    major, minor = capability
    if major >= 8:
        return "bfloat16", f"--dtype=auto: bfloat16, native on compute capability {major}.{minor}"
    return "float16", (f"--dtype=auto: float16 with the loss scaler, compute capability {major}.{minor} has no "
                       f"bfloat16 units")


def compile_or_not(option, device_type):
    """(compile, why) for train.py's --compile: as given, or auto (on CUDA only)."""
    if option != "auto":
        return option, f"--compile={option}"
    if device_type == "cuda":
        return True, "--compile=auto: compiled on CUDA (the first step takes a minute or two)"
    return False, f"--compile=auto: not compiled on {device_type} (a short run does not repay the build)"


def run_choices(config, device):
    """(dtype, compile, line) for a training run on `device`: the precision and the compile decision, with the line
    the run prints to say what it chose and why. TF32 is turned on for float32 matmuls on CUDA."""
    device_type = str(device).split(":")[0]
    dtype, dtype_why = config["dtype"], f"--dtype={config['dtype']}"
    if dtype == "auto":
        capability = torch.cuda.get_device_capability(device) if device_type == "cuda" else None
        dtype, dtype_why = auto_dtype(device_type, capability)
    compiled, compile_why = compile_or_not(config["compile"], device_type)
    if compiled:
        check_compiler(device)
    if device_type == "cuda" and dtype == "float32":
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 inside float32 matmuls (Ampere and later)
        torch.backends.cudnn.allow_tf32 = True
        dtype_why += " (TF32 matmuls)"
    return dtype, compiled, f"{dtype_why}; {compile_why}"
