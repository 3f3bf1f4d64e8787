"""The Shakespeare character LSTM (Charles & Konecny App. E.1): embedding 8 -> 2 LSTM layers of 256
units -> dense logits over the vocabulary at each of the 80 positions.

Written from ``nn.Linear`` layers with a Python loop over time steps (``nn.LSTM`` does not run under
``torch.func.vmap``); the cell is the standard one (PyTorch gate order i, f, g, o):
i, f, g, o = split(W_ih x_t + W_hh h_{t-1} + b), c_t = s(f) c_{t-1} + s(i) tanh(g),
h_t = s(o) tanh(c_t) — equal to ``nn.LSTM`` with copied weights (tested; biases b_ih + b_hh are one
bias here). Inputs are token ids; the engine stores x as float, so ``forward`` casts with
``.long()``. Output logits are [B, V, T] (class dimension second) so ``F.cross_entropy(logits, y)``
works on targets y [B, T] directly, with -100 (ignore_index) at padded positions.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..checks import check_int


class CharLSTM(nn.Module):
    def __init__(self, vocab_size: int = 90, embed_dim: int = 8, hidden: int = 256, layers: int = 2):
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden", hidden), ("layers", layers)):
            check_int(name, v, 1, "a positive int")
        self.hidden, self.num_layers = hidden, layers
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.ih = nn.ModuleList(nn.Linear(embed_dim if i == 0 else hidden, 4 * hidden) for i in range(layers))
        self.hh = nn.ModuleList(nn.Linear(hidden, 4 * hidden, bias=False) for _ in range(layers))
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        seq = self.embed(x.long())  # [B, T, E]
        b, t = seq.shape[0], seq.shape[1]
        for ih, hh in zip(self.ih, self.hh):
            pre = ih(seq)  # input projections for all steps at once: [B, T, 4H]
            h = seq.new_zeros(b, self.hidden)
            c = seq.new_zeros(b, self.hidden)
            outs = []
            for s in range(t):
                i, f, g, o = (pre[:, s] + hh(h)).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outs.append(h)
            seq = torch.stack(outs, dim=1)  # [B, T, H]
        return self.out(seq).transpose(1, 2)  # [B, V, T]

    @torch.no_grad()
    def load_from_lstm(self, lstm: nn.LSTM, embed: nn.Embedding | None = None) -> "CharLSTM":
        """Copy an ``nn.LSTM`` (batch_first, same sizes) into this model (for tests / checkpoints)."""
        for i in range(self.num_layers):
            self.ih[i].weight.copy_(getattr(lstm, f"weight_ih_l{i}"))
            self.ih[i].bias.copy_(getattr(lstm, f"bias_ih_l{i}") + getattr(lstm, f"bias_hh_l{i}"))
            self.hh[i].weight.copy_(getattr(lstm, f"weight_hh_l{i}"))
        if embed is not None:
            self.embed.weight.copy_(embed.weight)
        return self


def char_lstm(vocab_size: int = 90, embed_dim: int = 8, hidden: int = 256, layers: int = 2) -> nn.Module:
    """The paper's model with ``hidden`` = 256 (CPU runs use fewer units; sequences stay 80 long)."""
    return CharLSTM(vocab_size, embed_dim, hidden, layers)
