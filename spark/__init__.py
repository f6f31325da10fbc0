"""PySpark over a twistmq store: the ``twistmq`` data source and the device-stream jobs.

``from spark.datasource import TwistmqDataSource`` and register it with
``spark.dataSource.register(TwistmqDataSource)``; the jobs live in
``spark.jobs`` and the telemetry simulator in ``spark.simulator``. Run scripts
with ``./dev python`` or ``./dev spark-submit``: they set ``PYSPARK_PYTHON``,
``PYSPARK_DRIVER_PYTHON`` and ``SPARK_HOME`` so that Spark's workers get this
project's interpreter (with pyarrow and the checkout on its path). The README's
"In your own code" example is run by ``tests/docs/test_readme_spark.py``.
"""
