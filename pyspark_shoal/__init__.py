"""shoal's Spark data source under the name Spark looks for: ``format("shoal")`` with no register call.

pyspark 4 finds Python data sources by itself: the first time a session resolves a data source
name, a Python worker imports every top-level module named ``pyspark_*`` on its path and
registers each one's ``DefaultSource`` (a ``pyspark.sql.datasource.DataSource``) under the
class's ``name()``. Installing shoal installs this package next to ``shoal``, so

    spark.read.format("shoal").option("kafka.bootstrap.servers", ...).option("subscribe", ...).load()

works in any session whose Python (``PYSPARK_PYTHON``) has shoal installed.

Found this way, batch reads do not push filters down unless asked (``option("pushFilters",
"true")``): pyspark refuses a reader that can push filters while
``spark.sql.python.filterPushdown.enabled`` is false, its default, and that setting is what
``shoal.spark.register(spark)`` turns on. Registering still works (it replaces this source
with the same one, pushdown on, and also makes the workers run the caller's Python).
"""

from typing import Any

from shoal.spark.source import ShoalDataSource

__all__ = ["DefaultSource"]


class DefaultSource(ShoalDataSource):
    """:class:`shoal.spark.source.ShoalDataSource`, with ``pushFilters`` false unless given."""

    def reader(self, schema: Any) -> Any:
        if "pushFilters" not in self.options:  # pyspark's options map ignores case
            self.options["pushFilters"] = "false"
        return super().reader(schema)
