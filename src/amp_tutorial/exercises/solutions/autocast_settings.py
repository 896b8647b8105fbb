# Reference solution of the exercise in notebooks/01_autocast_basics.py.
# The test run puts this source in place of the learner's cell (see conftest.py); try the
# exercise before reading it.
import torch


def autocast_settings(device):
    """(device_type, dtype, use_scaler) for torch.autocast and a GradScaler on ``device``."""
    device_type = device.type  # "cuda" for torch.device("cuda", 0): autocast takes no index
    if device_type == "cpu":
        dtype = torch.bfloat16  # CPU autocast's default, native or emulated
    elif device_type == "cuda":  # NVIDIA; plain is_bf16_supported() also counts emulation
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        dtype = torch.bfloat16 if native else torch.float16
    elif device_type == "xpu":
        native = torch.xpu.is_bf16_supported(including_emulation=False)
        dtype = torch.bfloat16 if native else torch.float16
    else:  # mps: PyTorch cannot tell whether the chip computes bf16 natively
        dtype = torch.float16
    return device_type, dtype, dtype == torch.float16  # a GradScaler for float16 only
