"""The line under each instance in ``actorflow status``: whether its input waits and why, and its
mailbox, as a person watching a stuck job reads it."""

from __future__ import annotations

import doctest

import pytest

from actorflow import cli
from actorflow.operators.mailbox import MAX_PRIORITY, MIN_PRIORITY


@pytest.mark.parametrize(
    "name, figures, expected",
    [
        # A full async queue with results waiting in the mailbox, two operators' mails.
        ("j/slow+window[0/1]", {"suspended": "async_queue_full", "mailbox_depth": 64,
                                "mailbox_depth_by_priority": {0: 60, 1: 4}, "oldest_mail_age_ms": 1_234},
         "suspended: async_queue_full, 64 mails (slow 60, window 4), oldest 1.2 s"),
        # One operator's mails: no split by priority.
        ("j/slow[0/1]@2", {"suspended": "backpressure", "mailbox_depth": 3, "mailbox_depth_by_priority": {0: 3},
                           "oldest_mail_age_ms": 40},
         "suspended: backpressure, 3 mails, oldest 40 ms"),
        # Running, nothing waiting: no age.
        ("j/tag[1/2]", {"suspended": None, "mailbox_depth": 0, "mailbox_depth_by_priority": {}, "oldest_mail_age_ms": None},
         "running, 0 mails"),
        # Deferred mails and the control mail (a checkpoint, the end) by name, after a restart (@1).
        ("j/enrich[0/2]@1", {"suspended": "barrier_alignment", "mailbox_depth": 1_203,
                             "mailbox_depth_by_priority": {MIN_PRIORITY: 3, 0: 1_199, MAX_PRIORITY: 1},
                             "oldest_mail_age_ms": 61_000},
         "suspended: barrier_alignment, 1,203 mails (deferred 3, enrich 1,199, control 1), oldest 61.0 s"),
    ],
    ids=["async-queue-full", "backpressure", "running", "deferred-and-control"],
)
def test_the_mailbox_line_says_why_the_input_waits_and_what_waits(name, figures, expected):
    assert cli._mailbox_text(name, figures) == expected


def test_the_cli_examples_hold():
    result = doctest.testmod(cli)
    assert result.attempted >= 2 and result.failed == 0
