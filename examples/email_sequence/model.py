"""Small transformer classifier over per-recipient email sequences."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EmailSequenceModel", "TransformerBlock"]

_NUM_HOURS = 24
_NUM_GAP_BUCKETS = 31


class TransformerBlock(nn.Module):
    """Pre-norm transformer encoder block using ``scaled_dot_product_attention``.

    Args:
        d_model: Width of the residual stream.
        n_heads: Number of attention heads; must divide ``d_model``.
        dropout: Dropout probability for attention weights and residual branches.
        mlp_ratio: Hidden width of the feed-forward layer relative to ``d_model``.
    """

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.1, mlp_ratio: int = 4
    ) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Apply the block.

        Args:
            x: Residual stream, ``[B, L, d_model]``.
            key_mask: Boolean ``[B, L]``, ``True`` where the position is present
                (may be attended to).

        Returns:
            Updated residual stream, ``[B, L, d_model]``.
        """
        b, length, d = x.shape
        h = self.norm1(x)
        q, k, v = self.qkv(h).view(b, length, 3, self.n_heads, d // self.n_heads).unbind(dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, Dh]
        attn = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=key_mask[:, None, None, :],
            dropout_p=self.dropout if self.training else 0.0,
        )
        attn = attn.transpose(1, 2).reshape(b, length, d)
        x = x + self.drop(self.proj(attn))
        x = x + self.drop(self.mlp(self.norm2(x)))
        return x


class EmailSequenceModel(nn.Module):
    """Transformer that classifies a recipient's email sequence.

    Input is the ``inputs`` tensor produced by
    :class:`~examples.email_sequence.data.EmailSequenceDataset`, batched to
    ``[B, max_emails, subject_len + 2]`` (``torch.long``): subject token ids,
    then the send hour, then the gap in days. Each email is embedded as the mean
    of its subject-token embeddings (``padding_idx=0``) plus hour, gap and
    learned position embeddings. ``n_layers`` pre-norm transformer blocks (held
    in ``self.blocks``) attend only over present emails (first token id != 0);
    the result is mean-pooled over present emails, layer-normed, and mapped to
    ``num_classes`` logits.

    Args:
        vocab_size: Subject token vocabulary size (id 0 is padding).
        max_emails: Maximum sequence length (number of email slots).
        subject_len: Number of subject tokens per email.
        d_model: Embedding / residual width.
        n_heads: Attention heads per block.
        n_layers: Number of transformer blocks.
        dropout: Dropout probability.
        num_classes: Number of output logits.
    """

    def __init__(
        self,
        vocab_size: int = 512,
        max_emails: int = 8,
        subject_len: int = 6,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        dropout: float = 0.1,
        num_classes: int = 2,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_emails = max_emails
        self.subject_len = subject_len
        self.token_emb = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.hour_emb = nn.Embedding(_NUM_HOURS, d_model)
        self.gap_emb = nn.Embedding(_NUM_GAP_BUCKETS, d_model)
        self.pos_emb = nn.Embedding(max_emails, d_model)
        self.emb_drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, n_heads, dropout) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise embeddings with a small scale (std 0.02), keeping padding at zero.

        Small initial embeddings keep the many uninformative subject tokens from
        drowning out the few informative ones early in training.
        """
        for emb in (self.token_emb, self.hour_emb, self.gap_emb, self.pos_emb):
            nn.init.normal_(emb.weight, std=0.02)
        with torch.no_grad():
            self.token_emb.weight[0].zero_()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Compute class logits.

        Args:
            inputs: ``[B, max_emails, subject_len + 2]`` long tensor.

        Returns:
            Logits, ``[B, num_classes]`` (float).
        """
        s = self.subject_len
        tokens = inputs[..., :s]
        hours = inputs[..., s].clamp(0, _NUM_HOURS - 1)
        gaps = inputs[..., s + 1].clamp(0, _NUM_GAP_BUCKETS - 1)
        present = tokens[..., 0] != 0  # [B, L]

        n_tok = (tokens != 0).sum(dim=-1, keepdim=True).clamp(min=1)
        subject = self.token_emb(tokens).sum(dim=-2) / n_tok  # [B, L, D]
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = subject + self.hour_emb(hours) + self.gap_emb(gaps) + self.pos_emb(positions)
        x = self.emb_drop(x)

        for block in self.blocks:
            x = block(x, present)

        weights = present.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        logits: torch.Tensor = self.head(self.norm(pooled))
        return logits
