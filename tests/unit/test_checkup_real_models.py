"""The check-up on real architectures built from configs (random weights, nothing downloaded):
a Hugging Face decoder and encoder, torchvision's ResNet and Vision Transformer (whose encoder is
nn.MultiheadAttention) and an LSTM. Each is passed as it comes; each test checks what the
check-up says against what the test finds itself with plain torch (fp32 against autocast, and
the loss curves of its own training loops). The models are cut to one block per stage and 32x32
images, so that each check-up takes seconds on a 2-core CPU."""


import copy

import pytest
import torch
import torchvision  # the test group's, as transformers: real architectures, from configs
import transformers
from torch import nn

from amp_tutorial.checkup import AGREEMENT, Checkup, NotChecked, checkup, recommended_dtype
from amp_tutorial.device import dtype_name, select_device
from tests.unit.test_checkup import CEILING

OPTIONS = {"steps": 2, "warmup": 1, "ceiling": CEILING, "blocks": 5}  # blocks: the fewest
CPU = select_device("cpu")
LOW = recommended_dtype(CPU)  # what the check-up checks by default here


def seeded(make):
    torch.manual_seed(0)
    return make()


def tokens(labels=None):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (2, 8), generator=g)
    return {"input_ids": ids, "labels": ids if labels is None else labels}


def rel_diff(model, call, dtype=LOW):
    """fp32 against autocast, from the same weights in eval mode: relative L2 difference of the
    output's main tensor, computed here without the check-up."""
    model.eval()
    with torch.no_grad():
        ref = call(model).float()
        with torch.autocast("cpu", dtype=dtype):
            low = call(model).float()
    model.train()
    return float(torch.linalg.vector_norm(low - ref) / torch.linalg.vector_norm(ref))


def the_default_dtype_is_recommended(report):
    assert report.amp_dtype == dtype_name(LOW)
    assert report.recommended.startswith(dtype_name(LOW) + ":")


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_a_hugging_face_model_is_checked_on_its_own_loss(kind):
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100,
                                         n_positions=16)
        model, batch = seeded(lambda: transformers.GPT2LMHeadModel(config)), tokens()
    else:
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64,
                                         num_attention_heads=2, intermediate_size=128,
                                         vocab_size=100, max_position_embeddings=16,
                                         num_labels=3)
        model = seeded(lambda: transformers.BertForSequenceClassification(config))
        batch = tokens(labels=torch.tensor([0, 2]))
    model.train()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        expected = float(model(**batch).loss)  # dropout: the check-up seeds 0 as well
    report = checkup(model, batch, **OPTIONS)  # the ModelOutput's .loss, no glue
    assert isinstance(report, Checkup), report
    the_default_dtype_is_recommended(report)
    assert report.losses["fp32"][0] == pytest.approx(expected, rel=1e-5)
    mine = rel_diff(model, lambda m: m(**batch).logits)
    assert mine < 0.05 and report.verdict == "agree" and report.flagged == []
    # the outputs compared are the logits, not the loss the output also carries
    assert report.output_rel_diff == pytest.approx(mine, rel=0.05)


def adamw_losses(model, initial, batch, dtype=None, steps=OPTIONS["steps"]):
    """The loss curve of a plain training loop, written here: AdamW at lr 1e-3 (the check-up's
    default optimizer) from ``initial``, autocast in ``dtype`` or fp32, seed 0 for dropout."""
    model.load_state_dict(initial)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels = batch
    losses = []
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for _ in range(steps):
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    model.load_state_dict(initial)
    return losses


def images(n=4):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize("kind", ["resnet", "vit"])
def test_a_torchvision_model_is_checked_as_it_comes(kind):
    """A ResNet (convolutions, batch norm, residual adds) and a Vision Transformer (patch
    convolution, nn.MultiheadAttention, layer norm), each with a cross-entropy loss_fn: their
    convolutions and matmuls run in the AMP dtype, nothing overflows, the check-up's loss curves
    are those of a plain training loop, and agreement is judged against fp32's own spread."""
    if kind == "resnet":
        make = lambda: torchvision.models.resnet.ResNet(  # noqa: E731
            torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=10)
        low = ["conv1", "layer4.0.conv2", "fc"]
        features = lambda m: m(batch[0])  # noqa: E731
    else:
        make = lambda: torchvision.models.VisionTransformer(  # noqa: E731
            image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64,
            mlp_dim=128, num_classes=10)
        low = ["conv_proj", "encoder.layers.encoder_layer_0.self_attention",
               "encoder.layers.encoder_layer_1.mlp", "heads"]
        # its head starts at zero (torchvision's init), so the logits from the initial weights
        # are all zero: the encoder's output is compared here instead
        def features(m):
            tokens = m._process_input(batch[0])
            cls = m.class_token.expand(tokens.shape[0], -1, -1)
            return m.encoder(torch.cat([cls, tokens], dim=1))
    model, batch = seeded(make), images()
    initial = copy.deepcopy(model.state_dict())
    report = checkup(model, batch, nn.functional.cross_entropy, **OPTIONS)
    assert isinstance(report, Checkup), report
    the_default_dtype_is_recommended(report)
    assert all(report.ran_low(module) for module in low), [m for m in low
                                                           if not report.ran_low(m)]
    assert report.flagged == [] and report.op_overflows == [] and report.first_nonfinite is None
    # the curves are a plain loop's, in fp32 and under autocast
    assert report.losses["fp32"] == pytest.approx(adamw_losses(model, initial, batch), rel=1e-5)
    assert report.losses[dtype_name(LOW)] == pytest.approx(
        adamw_losses(model, initial, batch, LOW), rel=1e-3)
    # the outputs from the same weights: the check-up's difference is the one found here
    mine = rel_diff(model, features)
    assert mine < AGREEMENT[LOW]
    assert report.outputs_all_zero == (kind == "vit")  # said, and not counted as agreement
    if kind == "resnet":
        assert report.output_rel_diff == pytest.approx(mine, rel=0.05)
    # fp32 itself moved when its weights moved by one rounding step (Adam's first steps on four
    # images: by more than AGREEMENT on the ResNet), and AMP's curve stays within that spread
    assert report.fp32_spread > 0
    assert report.loss_tolerance == max(AGREEMENT[LOW], 2 * report.fp32_spread)
    assert report.loss_rel_gap <= report.loss_tolerance and report.verdict == "agree", (
        report.loss_rel_gap, report.fp32_spread)


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(8, 32, batch_first=True), nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


def test_an_lstm_is_checked_or_named_as_what_autocast_cannot_run_here():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 12, 8, generator=g)
    model = seeded(Regressor)
    try:  # the test's own run of the LSTM under autocast
        with torch.no_grad(), torch.autocast("cpu", dtype=LOW):
            model.lstm(x)
        raised = None
    except RuntimeError as err:
        raised = str(err).splitlines()[0]
    report = checkup(model, (x, x.sum((1, 2))[:, None]), nn.functional.mse_loss, **OPTIONS)
    if raised is None:
        assert isinstance(report, Checkup) and report.ran_low("lstm")
    else:
        assert isinstance(report, NotChecked) and report.error == "RuntimeError"
        assert "lstm (LSTM) raised RuntimeError" in report.line
        assert "keep lstm in fp32" in report.line
