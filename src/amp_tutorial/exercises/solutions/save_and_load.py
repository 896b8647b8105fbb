# Reference solution of the checkpoint exercise in notebooks/05_amp_recipes.py.
# The test run puts this source in place of the learner's cell (see conftest.py); try the
# exercise before reading it.
import torch


def save(path, model, optimizer, scaler, step):
    """Write everything the next step depends on: three state dicts and the step."""
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "step": step}, path)


def load(path, model, optimizer, scaler):
    """Restore the state dicts into the objects given (fresh ones); return the saved step."""
    checkpoint = torch.load(path)  # weights_only=True by default: tensors and plain values only
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])
    return checkpoint["step"]
