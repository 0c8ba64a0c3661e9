"""A user's own package named ``operators``, as an Airflow repository has one."""

WHOSE = "the user's operators"


def double(x: int) -> int:
    return 2 * x
