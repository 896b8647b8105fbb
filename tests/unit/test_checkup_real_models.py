"""The check-up on real architectures built from configs (random weights, nothing downloaded):
a Hugging Face decoder and encoder and an LSTM. Each is passed as it comes; each test checks what
the check-up says against what the test finds itself with plain torch (fp32 against autocast).
A torchvision CNN and ViT and an nn.MultiheadAttention model are not here yet (issue 43: the CNN
took over 2 minutes on the Zen 3, the ViT's and the attention model's findings are unsettled)."""


import pytest
import torch
import transformers  # the test group's: real architectures, from configs
from torch import nn

from amp_tutorial.checkup import Checkup, NotChecked, checkup, recommended_dtype
from amp_tutorial.device import dtype_name, select_device
from tests.unit.test_checkup import CEILING

OPTIONS = {"steps": 2, "warmup": 1, "ceiling": CEILING}
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
