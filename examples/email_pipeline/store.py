"""The event store: campaign events per recipient, and the model's view of them (features).

A recipient's features are its ``sent`` emails in time order (the last ``MAX_EMAILS``), in
the layout :class:`~examples.email_sequence.EmailSequenceModel` reads: per email, a
campaign token (the hashing trick: ``crc32(campaign)`` into ``CAMPAIGN_BUCKETS``) and an
engagement token (none, opened, clicked), then the send hour (UTC) and the gap in days
since the previous email. ``convert`` events are never features: they are the label
(a recipient converted or not). One recipient in five (by a hash of its id) is held out
for validation, so a recipient never moves between the splits as events arrive.

Events the service accepts (:class:`Event`; ``POST /events`` takes a JSON list of them)::

    {"recipient": "r42", "campaign": "spring-sale", "kind": "sent", "t": 1700000000.0}

=============  ======  =======================================================================
field          type    meaning
=============  ======  =======================================================================
``recipient``  string  who the email went to: any stable id, 1-128 characters
``campaign``   string  the campaign the email belongs to: any name, 1-128 characters (a
                       ``convert`` needs one too; it is not used)
``kind``       string  ``sent`` (an email went out), ``open`` or ``click`` (the recipient
                       engaged with this campaign's latest earlier email to them), ``convert``
                       (the recipient converted: the label, never a feature)
``t``          number  when it happened, in Unix seconds (UTC): finite, >= 0; any order
=============  ======  =======================================================================

Example::

    store = EventStore()
    store.add([Event(recipient="r1", campaign="c3", kind="sent", t=0.0)])
    store.features("r1").shape   # torch.Size([8, 4])
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.utils.data import TensorDataset

__all__ = (
    "CAMPAIGN_BUCKETS",
    "EXAMPLE_EVENT",
    "Event",
    "EventKind",
    "EventStore",
    "MAX_EMAILS",
    "SUBJECT_LEN",
    "Split",
    "VOCAB_SIZE",
    "build_split",
    "featurize",
    "is_validation",
)

#: Email slots a recipient's features keep (its newest ``sent`` emails).
MAX_EMAILS = 8
#: Tokens per email slot: the campaign's, then the engagement's.
SUBJECT_LEN = 2
#: Hash buckets for campaign names (token ids 1..CAMPAIGN_BUCKETS).
CAMPAIGN_BUCKETS = 4096
_OPENED = CAMPAIGN_BUCKETS + 1
_CLICKED = CAMPAIGN_BUCKETS + 2
#: Token vocabulary of the model: padding 0, the campaign buckets, opened, clicked.
VOCAB_SIZE = CAMPAIGN_BUCKETS + 3
_ENGAGEMENT = {"open": _OPENED, "click": _CLICKED}
_DAY_S, _HOUR_S, _MAX_GAP_DAYS = 86_400.0, 3_600.0, 30
_VALIDATION_ONE_IN = 5


EventKind = Literal["sent", "open", "click", "convert"]

#: An event as ``POST /events`` takes it (in a JSON list), shown in the service's ``/docs``.
EXAMPLE_EVENT: dict[str, str | float] = {
    "recipient": "r42",
    "campaign": "spring-sale",
    "kind": "sent",
    "t": 1700000000.0,
}


class Event(BaseModel):
    """One email-campaign event, as ``POST /events`` receives it (a JSON list of these).
    Unknown fields, an empty id, another ``kind``, or a negative or infinite ``t`` are
    refused (422, naming the field); events may arrive in any order.

    >>> Event(recipient="r42", campaign="c1", kind="open", t=1_700_000_000.0).kind
    'open'
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", json_schema_extra={"examples": [EXAMPLE_EVENT]}
    )

    recipient: str = Field(
        min_length=1,
        max_length=128,
        description="Who the email went to: any stable id of 1-128 characters.",
    )
    campaign: str = Field(
        min_length=1,
        max_length=128,
        description="The campaign the email belongs to: any name of 1-128 characters.",
    )
    kind: EventKind = Field(
        description="'sent': an email went out; 'open', 'click': the recipient engaged with "
        "this campaign's latest earlier email; 'convert': the recipient converted (the label).",
    )
    t: float = Field(
        ge=0.0,
        allow_inf_nan=False,
        description="When it happened, in Unix seconds (UTC): finite and >= 0.",
    )


def is_validation(recipient: str) -> bool:
    """Whether ``recipient`` is held out for validation (one in five, by a stable hash).

    >>> [is_validation(f"r{i}") for i in range(3)]  # doctest: +SKIP
    [False, True, False]
    """
    return zlib.crc32(recipient.encode()) % _VALIDATION_ONE_IN == 0


def _campaign_token(campaign: str) -> int:
    return 1 + zlib.crc32(campaign.encode()) % CAMPAIGN_BUCKETS


def featurize(events: Iterable[Event]) -> torch.Tensor:
    """The model's input for one recipient: ``[MAX_EMAILS, SUBJECT_LEN + 2]``, ``torch.long``.

    An ``open``/``click`` marks the latest earlier ``sent`` email of its campaign (a click
    outranks an open); absent slots are all zeros, as the model expects.

    >>> featurize([Event(recipient="r", campaign="c1", kind="sent", t=0.0)])[0, 1:].tolist()
    [0, 0, 0]
    """
    sends: list[list[int]] = []  # [campaign token, engagement token, hour, day]
    latest: dict[str, int] = {}
    for event in sorted(events, key=lambda e: e.t):
        if event.kind == "sent":
            latest[event.campaign] = len(sends)
            day, within = divmod(event.t, _DAY_S)
            sends.append([_campaign_token(event.campaign), 0, int(within // _HOUR_S), int(day)])
        elif event.kind in _ENGAGEMENT and event.campaign in latest:
            slot = sends[latest[event.campaign]]
            slot[1] = max(slot[1], _ENGAGEMENT[event.kind])
    rows = torch.zeros(MAX_EMAILS, SUBJECT_LEN + 2, dtype=torch.long)
    kept = sends[-MAX_EMAILS:]
    for i, (token, engagement, hour, day) in enumerate(kept):
        gap = 0 if i == 0 else min(max(day - kept[i - 1][3], 0), _MAX_GAP_DAYS)
        rows[i] = torch.tensor([token, engagement, hour, gap])
    return rows


def _label(events: Sequence[Event]) -> int:
    return int(any(event.kind == "convert" for event in events))


@dataclass(frozen=True)
class Split:
    """Training and validation sets built from one snapshot of the store."""

    train: TensorDataset
    val: TensorDataset
    events: int

    def describe(self) -> dict[str, int]:
        """Sizes for ``GET /model`` and the runs' summaries."""
        return {
            "events": self.events,
            "train_recipients": len(self.train),
            "val_recipients": len(self.val),
        }


def build_split(snapshot: Mapping[str, Sequence[Event]]) -> Split:
    """Features and labels (converted: 1) of every recipient with a ``sent`` email, split by
    :func:`is_validation`. Pure: run it in a worker thread on a :meth:`EventStore.snapshot`.
    """
    parts: dict[bool, tuple[list[torch.Tensor], list[int]]] = {True: ([], []), False: ([], [])}
    for recipient, events in sorted(snapshot.items()):
        if any(event.kind == "sent" for event in events):
            inputs, labels = parts[is_validation(recipient)]
            inputs.append(featurize(events))
            labels.append(_label(events))

    def dataset(held_out: bool) -> TensorDataset:
        inputs, labels = parts[held_out]
        if not inputs:
            return TensorDataset(
                torch.zeros(0, MAX_EMAILS, SUBJECT_LEN + 2, dtype=torch.long),
                torch.zeros(0, dtype=torch.long),
            )
        return TensorDataset(torch.stack(inputs), torch.tensor(labels))

    total = sum(len(events) for events in snapshot.values())
    return Split(train=dataset(False), val=dataset(True), events=total)


class EventStore:
    """Events by recipient, in memory, owned by the event loop (no locks: every method runs
    there; a retraining copies a :meth:`snapshot` and builds features in a worker thread).

    >>> store = EventStore()
    >>> store.add([Event(recipient="r1", campaign="c1", kind="sent", t=5.0)])
    1
    """

    def __init__(self) -> None:
        self._events: dict[str, list[Event]] = {}
        self.total = 0
        """Events ingested since the service started."""

    def add(self, events: Iterable[Event]) -> int:
        """Store ``events``; returns how many were added."""
        added = 0
        for event in events:
            self._events.setdefault(event.recipient, []).append(event)
            added += 1
        self.total += added
        return added

    def __contains__(self, recipient: object) -> bool:
        return recipient in self._events

    def __len__(self) -> int:
        """Recipients seen."""
        return len(self._events)

    def events_of(self, recipient: str) -> list[Event]:
        """A copy of ``recipient``'s events (KeyError if unknown)."""
        return list(self._events[recipient])

    def features(self, recipient: str) -> torch.Tensor:
        """:func:`featurize` of ``recipient``'s events (KeyError if unknown)."""
        return featurize(self._events[recipient])

    def snapshot(self) -> dict[str, list[Event]]:
        """A copy of every recipient's events as they are now (the lists, not the events:
        events are frozen)."""
        return {recipient: list(events) for recipient, events in self._events.items()}

    def labelled_counts(self) -> tuple[int, int]:
        """Recipients with a ``sent`` email in the training and validation splits (cheap
        enough for the event loop: it reads no tensors)."""
        counts = [0, 0]
        for recipient, events in self._events.items():
            if any(event.kind == "sent" for event in events):
                counts[is_validation(recipient)] += 1
        return counts[0], counts[1]
