"""Synthetic campaign traffic with a known ground truth, shared by ``--simulate`` and the tests.

Recipients come from :class:`~examples.email_sequence.EmailSequenceDataset` (one subject
token per email, which becomes the campaign ``c<token>``; its send hour and gap in days
become the ``sent`` event's time), so whether a recipient converts follows that dataset's
planted rule (offer campaigns sent on fast evening follow-ups, or three offers), with its
4% label noise. Opens and clicks are drawn from a latent propensity: recipients who will
convert open and click more often. A converting recipient gets a ``convert`` event a day
after its last email.

Example::

    batch = synthetic_events(100, seed=0)
    len(batch.labels), batch.events[0].kind     # (100, 'sent')
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import httpx
import structlog
import torch

from examples.email_pipeline.store import MAX_EMAILS, Event
from examples.email_sequence import EmailSequenceDataset

__all__ = ("Synthetic", "simulate", "synthetic_events")

log = structlog.get_logger()

_FIRST_DAY = 19_675  # 2023-11-14, in days since the Unix epoch
_DAY_S, _HOUR_S, _MINUTE_S = 86_400.0, 3_600.0, 60.0
_CAMPAIGNS = 64  # campaign tokens 1..63, offers are c1..c8
_OPEN_P, _CLICK_P, _CONVERTER_LIFT = 0.35, 0.2, 0.2


@dataclass(frozen=True)
class Synthetic:
    """A batch of synthetic events and the truth behind them (recipient -> converted)."""

    events: list[Event]
    labels: dict[str, int]

    def payload(self) -> list[dict[str, object]]:
        """The events as ``POST /events`` takes them."""
        return [event.model_dump() for event in self.events]


def synthetic_events(num_recipients: int, *, seed: int, prefix: str = "r") -> Synthetic:
    """Events of ``num_recipients`` new recipients (ids ``<prefix><i>``), the same for the
    same ``seed``.

    >>> synthetic_events(3, seed=1).labels  # doctest: +SKIP
    {'r0': 1, 'r1': 0, 'r2': 1}
    """
    data = EmailSequenceDataset(
        num_recipients, seed=seed, max_emails=MAX_EMAILS, subject_len=1, vocab_size=_CAMPAIGNS
    )
    gen = torch.Generator().manual_seed(1_000_003 + seed)
    start_days = torch.randint(0, 60, (num_recipients,), generator=gen).tolist()
    draws = torch.rand(num_recipients, MAX_EMAILS, 4, generator=gen).tolist()
    events: list[Event] = []
    labels: dict[str, int] = {}
    rows = zip(data.inputs.tolist(), data.labels.tolist(), strict=True)
    for i, (inputs, label) in enumerate(rows):
        recipient = f"{prefix}{i}"
        labels[recipient] = label
        lift = _CONVERTER_LIFT * label
        day, last_t = _FIRST_DAY + start_days[i], 0.0
        for (token, hour, gap), draw in zip(inputs, draws[i], strict=True):
            minute, opened, clicked, delay = draw
            if token == 0:  # padding: this recipient got fewer emails
                break
            day += gap
            last_t = day * _DAY_S + hour * _HOUR_S + int(minute * 60) * _MINUTE_S
            campaign = f"c{token}"
            events.append(Event(recipient=recipient, campaign=campaign, kind="sent", t=last_t))
            if opened < _OPEN_P + lift:
                open_t = last_t + (5.0 + 175.0 * delay) * _MINUTE_S
                events.append(Event(recipient=recipient, campaign=campaign, kind="open", t=open_t))
                if clicked < _CLICK_P + lift:
                    events.append(
                        Event(recipient=recipient, campaign=campaign, kind="click", t=open_t + 60)
                    )
        if label:
            events.append(
                Event(recipient=recipient, campaign="site", kind="convert", t=last_t + _DAY_S)
            )
    return Synthetic(events=events, labels=labels)


async def simulate(
    client: httpx.AsyncClient,
    *,
    recipients_per_tick: int = 50,
    interval_s: float = 1.0,
    seed: int = 1_000,
) -> None:
    """Post a tick of new recipients' events to ``client``'s service every ``interval_s``
    until cancelled (``python -m examples.email_pipeline --simulate`` runs it).

    >>> async with httpx.AsyncClient(base_url=url) as client:  # doctest: +SKIP
    ...     await simulate(client, interval_s=0.5)
    """
    for tick in itertools.count():
        batch = synthetic_events(recipients_per_tick, seed=seed + tick, prefix=f"s{tick}-")
        try:
            response = await client.post("/events", json=batch.payload())
        except httpx.TransportError as exc:  # the service went away (it is shutting down)
            log.warning("simulator_stopped", error=repr(exc))
            return
        response.raise_for_status()
        await asyncio.sleep(interval_s)
