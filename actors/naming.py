"""Names of actors and tasks: ``<job>/<operator>[<i>/<n>]``, as the Ray dashboard shows them."""

from __future__ import annotations

import re

from actorflow.operators.errors import ConfigurationError

__all__ = ["instance_name", "task_name", "validate_job_name"]

_JOB_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def validate_job_name(job: str) -> str:
    if not isinstance(job, str) or not _JOB_NAME.match(job):
        raise ConfigurationError(
            f"job name must be 1-64 characters of letters, digits, '_', '.' or '-', got {job!r}"
        )
    return job


def instance_name(job: str, operator: str, index: int, parallelism: int, attempt: int = 0) -> str:
    """The name of one operator instance; after a restart the job's attempt number follows, so
    that the new actor never collides with the old one (``ray.kill`` is asynchronous).

    >>> instance_name("clicks", "enrich", 0, 2), instance_name("clicks", "enrich", 0, 2, attempt=1)
    ('clicks/enrich[0/2]', 'clicks/enrich[0/2]@1')
    """
    return f"{job}/{task_name(operator, index, parallelism)}" + (f"@{attempt}" if attempt else "")


def old_tasks(tasks: list[str], operator: str) -> list[str]:
    """The tasks of ``operator`` among a checkpoint's ``tasks``, in index order.

    >>> old_tasks(["window[1/2]", "source[0/1]", "window[0/2]"], "window")
    ['window[0/2]', 'window[1/2]']
    """
    found = []
    for task in tasks:
        name, _, rest = task.rpartition("[")
        if name == operator and rest.endswith("]") and "/" in rest:
            index, _, parallelism = rest[:-1].partition("/")
            found.append((int(parallelism), int(index), task))
    return [task for _, _, task in sorted(found)]


def task_name(operator: str, index: int, parallelism: int) -> str:
    """What names an instance's state in a checkpoint: the same in every attempt.

    >>> task_name("enrich", 0, 2)
    'enrich[0/2]'
    """
    return f"{operator}[{index}/{parallelism}]"
