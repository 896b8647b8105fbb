"""The lesson-11 transformer: output shapes, causality, and the config checks."""

import pytest
import torch

from amp_tutorial.transformer import DecoderTransformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=11, seq_len=12, d_model=16, n_layers=2, n_heads=2)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return DecoderTransformer(CONFIG).eval()


def test_logits_have_one_row_per_token_and_vocabulary_entry(model):
    tokens = torch.randint(0, CONFIG.vocab_size, (3, 7))
    assert model(tokens).shape == (3, 7, CONFIG.vocab_size)


def test_changing_a_future_token_never_changes_earlier_logits(model):
    tokens = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.seq_len), generator=torch.Generator()
                           .manual_seed(1))
    for t in (0, 5, CONFIG.seq_len - 1):
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] + 1) % CONFIG.vocab_size
        with torch.no_grad():
            before, after = model(tokens), model(changed)
        assert torch.equal(before[:, :t], after[:, :t])  # the past cannot see position t
        assert not torch.allclose(before[:, t], after[:, t])  # position t itself does


def test_sequence_longer_than_the_position_table_is_refused(model):
    with pytest.raises(ValueError, match="longer than seq_len"):
        model(torch.zeros(1, CONFIG.seq_len + 1, dtype=torch.long))


def test_width_must_split_into_heads():
    with pytest.raises(ValueError, match="not divisible"):
        TransformerConfig(vocab_size=5, seq_len=4, d_model=10, n_heads=3)


def test_autocast_runs_the_blocks_in_bf16_and_keeps_the_residual_fp32():
    model = DecoderTransformer(CONFIG)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 6))
    seen = {}

    def record(name):
        def hook(_module, _inputs, output):
            seen[name] = output.dtype
        return hook

    model.blocks[0].mlp.fc.register_forward_hook(record("fc"))
    model.blocks[0].register_forward_hook(record("block"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    assert seen == {"fc": torch.bfloat16, "block": torch.float32}
    assert logits.dtype == torch.bfloat16  # the head is a linear layer
