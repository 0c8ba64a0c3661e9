"""Records that did not make the result, as DataFrames (``cluster.side_records`` makes their
tables): each record's own columns and types, then what happened to it. Dead letters say why they
failed (``dead_letters_to_dataframe`` in ``streams``); a window's late records say which windows
they missed, why, and the watermark they met (``operators.windows.LateRecord``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from actorflow.cluster.side_records import LATE_FIELDS, diagnostic_names, late_records_table

from .arrow_io import tables_to_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LATE_FIELDS", "diagnostic_names", "late_records_to_dataframe"]


def late_records_to_dataframe(spark: SparkSession, records: list[Any], input_schema: pa.Schema) -> DataFrame:
    """A late-data side output: each record's columns, then ``late_reason``, ``late_windows`` and
    ``late_watermark_ms``."""
    table = late_records_table(records, input_schema)
    return tables_to_dataframe(spark, [table], table.schema)
