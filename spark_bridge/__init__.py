"""Ring 3 of actorflow on Spark: the Spark-on-Ray session, ``from_spark``/``to_spark``, ``enrich()``.

Importing it patches nothing: ``ensure_ray`` and ``on_spark_cluster`` start the driver's workarounds
(``actors.upstream``).
"""

from .dead_letters import rerun_dead_letters
from .enrich import enrich, enrich_async, enrich_stream
from .session import ensure_ray, spark_session, stop_spark
from .spark_cluster import SparkCluster, on_spark_cluster
from .streams import SparkDataStream, from_spark, last_job, to_arrow_schema

__all__ = [
    "SparkCluster", "SparkDataStream", "enrich", "enrich_async", "enrich_stream", "ensure_ray", "from_spark", "last_job", "on_spark_cluster", "rerun_dead_letters",
    "spark_session", "stop_spark",
    "to_arrow_schema",
]
