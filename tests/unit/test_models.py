"""The seed's ConvModel: layer structure and a per-pixel mapping."""

import torch
from torch import nn

from amp_tutorial.models import ConvModel, course_models, seeded_conv_model
from amp_tutorial.presets import get_preset


def test_structure_matches_the_seed():
    model = ConvModel(hidden=8, n_hidden_layers=2)
    kinds = [type(m) for m in model.layers]
    assert kinds == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU] * 3 + [nn.Conv2d]
    convs = [m for m in model.layers if isinstance(m, nn.Conv2d)]
    assert [c.kernel_size for c in convs] == [(1, 1)] * 4
    assert (convs[0].in_channels, convs[-1].out_channels) == (2, 1)


def test_output_is_one_channel_image():
    out = ConvModel(hidden=4, n_hidden_layers=1)(torch.rand(1, 2, 6, 7))
    assert out.shape == (1, 1, 6, 7)


def test_pixels_are_independent_in_eval_mode():
    """1x1 convolutions: changing one pixel's input changes only that pixel's output."""
    torch.manual_seed(0)
    model = ConvModel(hidden=4, n_hidden_layers=1).eval()
    x = torch.rand(1, 2, 5, 5)
    y = x.clone()
    y[0, :, 2, 3] += 1.0
    changed = (model(x) != model(y))[0, 0]
    assert changed[2, 3] and changed.sum() == 1


def test_course_models_give_fresh_identical_models_on_their_own_data():
    preset = get_preset("smoke")
    models = course_models(preset, "cpu")
    assert list(models) == ["ConvModel", "transformer"]
    conv = models["ConvModel"]
    a, b = conv.make(), conv.make()
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    assert a is not b and all(torch.equal(x, y) for x, y in pairs)
    assert conv.inputs.is_contiguous(memory_format=torch.channels_last)
    seq = models["transformer"]
    assert seq.inputs.shape == (preset.transformer.batch, preset.transformer.seq_len)
    loss = seq.loss_fn(seq.make()(seq.inputs), seq.targets)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_seeded_conv_model_repeats_its_weights_per_seed_at_the_presets_sizes():
    preset = get_preset("smoke")
    first, again, other = (seeded_conv_model(preset, "cpu", seed) for seed in (3, 3, 4))
    convs = [m for m in first.layers if isinstance(m, nn.Conv2d)]
    assert len(convs) == preset.n_hidden_layers + 2 and convs[0].out_channels == preset.hidden
    pairs = zip(first.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)
    assert not torch.equal(first.layers[0].weight, other.layers[0].weight)
