"""Synthetic email-campaign sequence data with a planted, learnable conversion rule."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

__all__ = [
    "EVENING_HOURS",
    "FAST_FOLLOW_UP_DAYS",
    "MAX_GAP_DAYS",
    "NUM_HOURS",
    "OFFER_TOKENS",
    "EmailSequenceDataset",
    "majority_class_rate",
]

#: Token ids that mark a subject line as an "offer". Fixed across seeds so that
#: datasets built with different seeds share the same underlying rule.
OFFER_TOKENS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
#: Send hours (inclusive range) that count as "evening".
EVENING_HOURS: tuple[int, int] = (17, 21)
#: A follow-up within this many days (inclusive) counts as "fast".
FAST_FOLLOW_UP_DAYS: int = 3
#: Number of distinct send hours (0-23).
NUM_HOURS: int = 24
#: Largest gap in days between consecutive emails (gaps are 0-30).
MAX_GAP_DAYS: int = 30

_MIN_EMAILS = 3
_OFFER_EMAIL_PROB = 0.3
_EVENING_PROB = 0.35
_FAST_GAP_PROB = 0.45
_MIN_OFFER_EMAILS = 3
_LABEL_NOISE = 0.04


class EmailSequenceDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Per-recipient sequences of marketing emails with a binary conversion label.

    Each sample is one recipient who received between 3 and ``max_emails`` emails;
    the remaining slots are padding. ``inputs`` has shape
    ``[max_emails, subject_len + 2]`` (``torch.long``):

    * columns ``[:subject_len]``: subject token ids in ``1..vocab_size-1``;
    * column ``subject_len``: send hour, ``0..23``;
    * column ``subject_len + 1``: gap in days since the previous email, ``0..30``
      (always 0 for the first email).

    A padded (absent) email is all zeros, so an email is present exactly when its
    first token id is non-zero.

    Conversion rule (label 1 = converts). An email is an *offer* email when its
    subject contains any token in :data:`OFFER_TOKENS` (ids 1-8). The recipient
    converts if either

    * **(A) fast evening follow-up offer**: some offer email other than the first
      was sent in the evening (hour 17-21 inclusive) *and* within 3 days of the
      previous email (its gap is ``<= 3``); or
    * **(B) repeated offers**: at least 3 of the recipient's emails are offer
      emails.

    Finally about 4% of labels are flipped uniformly at random (label noise), so
    the best achievable accuracy is about 96%. The positive rate is roughly 40%.

    Everything is generated up front in ``__init__`` from a private
    :class:`torch.Generator` seeded with ``seed``; the global RNG is not used, so
    two datasets with the same arguments are identical.

    Args:
        num_samples: Number of recipients (samples), ``>= 1``.
        seed: Seed of the private generator.
        max_emails: Maximum (padded) sequence length, ``>= 3``.
        subject_len: Number of tokens per subject line, ``>= 1``.
        vocab_size: Token vocabulary size including padding id 0; must exceed
            the largest offer token id (``>= 10``).
    """

    def __init__(
        self,
        num_samples: int,
        seed: int = 0,
        max_emails: int = 8,
        subject_len: int = 6,
        vocab_size: int = 512,
    ) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples!r}")
        if max_emails < _MIN_EMAILS:
            raise ValueError(f"max_emails must be >= {_MIN_EMAILS}, got {max_emails!r}")
        if subject_len < 1:
            raise ValueError(f"subject_len must be >= 1, got {subject_len!r}")
        min_vocab = max(OFFER_TOKENS) + 2
        if vocab_size < min_vocab:
            raise ValueError(f"vocab_size must be >= {min_vocab}, got {vocab_size!r}")

        self.num_samples = num_samples
        self.seed = seed
        self.max_emails = max_emails
        self.subject_len = subject_len
        self.vocab_size = vocab_size

        gen = torch.Generator().manual_seed(seed)
        n, m, s = num_samples, max_emails, subject_len

        # Which email slots are present: the first ``count`` of each row.
        counts = torch.randint(_MIN_EMAILS, m + 1, (n,), generator=gen)
        present = torch.arange(m).unsqueeze(0) < counts.unsqueeze(1)  # [n, m]

        # Subject tokens: random ids, with an offer token planted at a random
        # position in a fraction of the emails.
        tokens = torch.randint(1, vocab_size, (n, m, s), generator=gen)
        plant = torch.rand(n, m, generator=gen) < _OFFER_EMAIL_PROB
        offer_ids = torch.tensor(OFFER_TOKENS, dtype=torch.long)
        planted_tok = offer_ids[torch.randint(0, len(OFFER_TOKENS), (n, m), generator=gen)]
        planted_pos = torch.randint(0, s, (n, m), generator=gen)
        slot = torch.nn.functional.one_hot(planted_pos, s).bool() & plant.unsqueeze(-1)
        tokens = torch.where(slot, planted_tok.unsqueeze(-1), tokens)

        # Send hours: evening with probability _EVENING_PROB, otherwise another hour.
        lo, hi = EVENING_HOURS
        n_evening = hi - lo + 1
        evening_hour = torch.randint(lo, hi + 1, (n, m), generator=gen)
        other_hour = torch.randint(0, NUM_HOURS - n_evening, (n, m), generator=gen)
        other_hour = torch.where(other_hour >= lo, other_hour + n_evening, other_hour)
        is_evening_draw = torch.rand(n, m, generator=gen) < _EVENING_PROB
        hours = torch.where(is_evening_draw, evening_hour, other_hour)

        # Gaps: fast (0-3 days) with probability _FAST_GAP_PROB, else 4-30 days.
        fast_gap = torch.randint(0, FAST_FOLLOW_UP_DAYS + 1, (n, m), generator=gen)
        slow_gap = torch.randint(FAST_FOLLOW_UP_DAYS + 1, MAX_GAP_DAYS + 1, (n, m), generator=gen)
        is_fast_draw = torch.rand(n, m, generator=gen) < _FAST_GAP_PROB
        gaps = torch.where(is_fast_draw, fast_gap, slow_gap)
        gaps[:, 0] = 0

        # Zero out absent emails.
        tokens = tokens * present.unsqueeze(-1)
        hours = hours * present
        gaps = gaps * present

        # Planted rule, computed from the final features.
        is_offer = torch.isin(tokens, offer_ids).any(dim=-1) & present  # [n, m]
        is_evening = (hours >= lo) & (hours <= hi) & present
        is_follow_up = present & (torch.arange(m) > 0).unsqueeze(0)
        is_fast = is_follow_up & (gaps <= FAST_FOLLOW_UP_DAYS)
        rule_a = (is_offer & is_evening & is_fast).any(dim=1)
        rule_b = is_offer.sum(dim=1) >= _MIN_OFFER_EMAILS
        clean = rule_a | rule_b

        flip = torch.rand(n, generator=gen) < _LABEL_NOISE
        labels = (clean ^ flip).long()

        self.inputs: torch.Tensor = torch.cat(
            [tokens, hours.unsqueeze(-1), gaps.unsqueeze(-1)], dim=-1
        ).long()
        self.labels: torch.Tensor = labels
        #: Labels before noise, useful for measuring the achievable accuracy.
        self.clean_labels: torch.Tensor = clean.long()

    def __len__(self) -> int:
        """Number of recipients."""
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(inputs, label)`` for one recipient."""
        return self.inputs[index], self.labels[index]


def majority_class_rate(dataset: EmailSequenceDataset) -> float:
    """Accuracy of always predicting the most frequent label of ``dataset``."""
    positive = float(dataset.labels.float().mean().item())
    return max(positive, 1.0 - positive)
